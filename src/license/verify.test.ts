import assert from 'node:assert/strict';
import { createPublicKey } from 'node:crypto';
import { describe, it } from 'node:test';
import type { ApiError } from '../domain/errors.js';
import type { License } from '../domain/license.js';
import { generateLicenseKeyPair, loadLicenseSigningKey, signLicense } from './sign.js';
import { parseLicensePublicKey, verifyLicense } from './verify.js';

const NOW = Date.UTC(2026, 5, 1);
const pair = generateLicenseKeyPair();
const trusted = [createPublicKey(pair.publicPem)];
const license = signLicense(
  {
    customer_id: 'c',
    license_id: 'l',
    issued_at: '2026-01-01T00:00:00.000Z',
    expires_at: '2027-01-01T00:00:00.000Z',
    max_nodes: 3,
    max_services: 5,
  },
  loadLicenseSigningKey(pair.privatePem),
);
const codeOf = (fn: () => unknown) => {
  try {
    fn();
    return 'ok';
  } catch (err) {
    return (err as ApiError).code;
  }
};

describe('verifyLicense', () => {
  it('accepts a license signed by a trusted key', () => {
    assert.equal(
      codeOf(() => verifyLicense(license, trusted, NOW)),
      'ok',
    );
  });
  it('refuses a changed field, an added field, another key: LICENSE_INVALID', () => {
    assert.equal(
      codeOf(() => verifyLicense({ ...license, max_nodes: 4 }, trusted, NOW)),
      'LICENSE_INVALID',
    );
    const added = { ...license, extra: 1 } as unknown as License;
    assert.equal(
      codeOf(() => verifyLicense(added, trusted, NOW)),
      'LICENSE_INVALID',
    );
    const other = [createPublicKey(generateLicenseKeyPair().publicPem)];
    assert.equal(
      codeOf(() => verifyLicense(license, other, NOW)),
      'LICENSE_INVALID',
    );
  });
  it('refuses a non-canonical base64 signature', () => {
    assert.equal(
      codeOf(() => verifyLicense({ ...license, signature: `${license.signature}\n` }, trusted, NOW)),
      'LICENSE_INVALID',
    );
  });
  it('refuses an expired license: LICENSE_EXPIRED', () => {
    assert.equal(
      codeOf(() => verifyLicense(license, trusted, Date.UTC(2027, 0, 2))),
      'LICENSE_EXPIRED',
    );
  });
  it('refuses every license when no key is trusted, saying why', () => {
    assert.throws(
      () => verifyLicense(license, [], NOW),
      (e: ApiError) => /trusts no license/.test(e.message),
    );
  });
  it('is independent of field order (JCS)', () => {
    const reordered = Object.fromEntries(Object.entries(license).reverse()) as unknown as License;
    assert.equal(
      codeOf(() => verifyLicense(reordered, trusted, NOW)),
      'ok',
    );
  });
});

describe('parseLicensePublicKey', () => {
  it('reads PEM and base64 of the 32 raw bytes alike', () => {
    const raw = Buffer.from(
      createPublicKey(pair.publicPem).export({ format: 'jwk' }).x as string,
      'base64url',
    );
    const a = parseLicensePublicKey(pair.publicPem).export({ format: 'jwk' });
    const b = parseLicensePublicKey(raw.toString('base64')).export({ format: 'jwk' });
    assert.deepEqual(a, b);
  });
  it('refuses anything else', () => {
    assert.throws(() => parseLicensePublicKey('not a key'));
    assert.throws(() => parseLicensePublicKey(Buffer.alloc(31).toString('base64')));
  });
});
