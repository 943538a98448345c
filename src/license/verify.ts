/**
 * License verification (docs/decisions.md §2): signature against the trusted vendor keys, then expiry.
 * Shape is checked before this, by the request schema. Used by bootstrap and, later, by joins.
 */
import { createPublicKey, type KeyObject, verify } from 'node:crypto';
import { ApiError } from '../domain/errors.js';
import { type License, licenseSigningInput, parseTimestamp } from '../domain/license.js';

/**
 * Reads a trusted key as the command line gives it: a PEM (SPKI) text, or base64 of the 32 raw
 * Ed25519 bytes. Throws on anything else, so a typo in a flag stops the start-up.
 */
export function parseLicensePublicKey(text: string): KeyObject {
  const trimmed = text.trim();
  if (trimmed.startsWith('-----BEGIN')) {
    const key = createPublicKey(trimmed);
    if (key.asymmetricKeyType !== 'ed25519') throw new Error('license public key is not Ed25519');
    return key;
  }
  const raw = Buffer.from(trimmed, 'base64');
  if (raw.length !== 32 || raw.toString('base64').replace(/=+$/, '') !== trimmed.replace(/=+$/, '')) {
    throw new Error('license public key is neither a PEM file nor base64 of 32 raw Ed25519 bytes');
  }
  return createPublicKey({
    key: { kty: 'OKP', crv: 'Ed25519', x: raw.toString('base64url') },
    format: 'jwk',
  });
}

/** Throws 422 LICENSE_INVALID or LICENSE_EXPIRED; returns the expiry time on success. */
export function verifyLicense(
  license: License,
  trustedKeys: readonly KeyObject[],
  nowMs: number,
): { expiresAtMs: number; issuedAtMs: number } {
  if (trustedKeys.length === 0) {
    throw new ApiError(
      'LICENSE_INVALID',
      'this agent trusts no license signing key: start it with --license-public-key (or --dev for a local trial)',
    );
  }
  const signature = Buffer.from(license.signature, 'base64');
  // The object as received, extra fields included: they are covered by the signature too.
  const signed = licenseSigningInput(license as unknown as Record<string, unknown>);
  const valid =
    signature.length === 64 &&
    signature.toString('base64') === license.signature &&
    trustedKeys.some((key) => verify(null, signed, key, signature));
  if (!valid)
    throw new ApiError('LICENSE_INVALID', 'license signature does not verify against any trusted key');
  const expiresAtMs = parseTimestamp(license.expires_at);
  const issuedAtMs = parseTimestamp(license.issued_at);
  // The schema already checked the format; a signed license with an unparseable date is invalid.
  if (expiresAtMs === undefined || issuedAtMs === undefined) {
    throw new ApiError('LICENSE_INVALID', 'license timestamps are not ISO 8601');
  }
  if (expiresAtMs <= nowMs) throw new ApiError('LICENSE_EXPIRED', `license expired at ${license.expires_at}`);
  return { expiresAtMs, issuedAtMs };
}
