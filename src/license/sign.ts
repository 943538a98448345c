/**
 * The vendor side of licenses, for `mesh-agent license keygen|sign` and for `serve --dev`:
 * make a signing key pair and sign License objects (docs/decisions.md §1 and §2).
 */
import { createPrivateKey, generateKeyPairSync, type KeyObject, sign } from 'node:crypto';
import { type License, licenseSigningInput } from '../domain/license.js';

export interface LicenseKeyPair {
  privatePem: string;
  publicPem: string;
}

export function generateLicenseKeyPair(): LicenseKeyPair {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  return {
    privatePem: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
    publicPem: publicKey.export({ type: 'spki', format: 'pem' }).toString(),
  };
}

export function loadLicenseSigningKey(pem: string): KeyObject {
  const key = createPrivateKey(pem);
  if (key.asymmetricKeyType !== 'ed25519') throw new Error('license signing key is not Ed25519');
  return key;
}

export type UnsignedLicense = Omit<License, 'signature'>;

export function signLicense(fields: UnsignedLicense, key: KeyObject): License {
  const unsigned = { ...fields };
  const signature = sign(
    null,
    licenseSigningInput(unsigned as unknown as Record<string, unknown>),
    key,
  ).toString('base64');
  return { ...unsigned, signature };
}
