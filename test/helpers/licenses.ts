/**
 * Test licenses: a vendor key pair per test run and licenses signed with it, the way
 * `mesh-agent license sign` makes them.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { License } from '../../src/domain/license.js';
import { generateLicenseKeyPair, loadLicenseSigningKey, signLicense } from '../../src/license/sign.js';

export interface Vendor {
  publicKeyFile: string;
  privateKeyFile: string;
  sign(overrides?: Partial<Omit<License, 'signature'>>): License;
}

export function makeVendor(): Vendor {
  const dir = mkdtempSync(join(tmpdir(), 'mesh-vendor-'));
  const pair = generateLicenseKeyPair();
  const publicKeyFile = join(dir, 'license-signing.pub');
  const privateKeyFile = join(dir, 'license-signing.key');
  writeFileSync(publicKeyFile, pair.publicPem);
  writeFileSync(privateKeyFile, pair.privatePem, { mode: 0o600 });
  const key = loadLicenseSigningKey(pair.privatePem);
  return {
    publicKeyFile,
    privateKeyFile,
    sign(overrides = {}) {
      const now = Date.now();
      return signLicense(
        {
          customer_id: 'customer-test',
          license_id: 'license-test',
          issued_at: new Date(now - 60_000).toISOString(),
          expires_at: new Date(now + 30 * 86_400_000).toISOString(),
          max_nodes: 5,
          max_services: 10,
          ...overrides,
        },
        key,
      );
    },
  };
}
