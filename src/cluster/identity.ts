/**
 * The agent's Ed25519 identity: its key pair, the peer id derived from the public key, and
 * signing of handshake challenges. The private key never leaves this module.
 */
import {
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  type KeyObject,
  sign,
  verify,
} from 'node:crypto';
import { peerIdFromPublicKey } from '../domain/ids.js';

export class Identity {
  readonly peerId: string;
  /** Standard base64 of the 32 raw public key bytes, as the API shows it. */
  readonly publicKeyBase64: string;
  private readonly privateKey: KeyObject;
  readonly publicKey: KeyObject;

  constructor(privatePem: string) {
    this.privateKey = createPrivateKey(privatePem);
    if (this.privateKey.asymmetricKeyType !== 'ed25519') throw new Error('identity key is not Ed25519');
    this.publicKey = createPublicKey(this.privateKey);
    const raw = rawPublicKey(this.publicKey);
    this.peerId = peerIdFromPublicKey(raw);
    this.publicKeyBase64 = raw.toString('base64');
  }

  static generatePem(): string {
    return generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  }

  sign(message: Buffer): Buffer {
    return sign(null, message, this.privateKey);
  }
}

export function rawPublicKey(key: KeyObject): Buffer {
  const jwk = key.export({ format: 'jwk' });
  return Buffer.from(jwk.x as string, 'base64url');
}

/** Verifies an Ed25519 signature by a peer's base64 public key; false for any malformed input. */
export function verifyPeerSignature(publicKeyBase64: string, message: Buffer, signature: Buffer): boolean {
  try {
    const raw = Buffer.from(publicKeyBase64, 'base64');
    if (raw.length !== 32) return false;
    const key = createPublicKey({
      key: { kty: 'OKP', crv: 'Ed25519', x: raw.toString('base64url') },
      format: 'jwk',
    });
    return signature.length === 64 && verify(null, message, key, signature);
  } catch {
    return false;
  }
}
