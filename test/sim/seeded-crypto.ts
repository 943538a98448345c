/**
 * Runs code with node:crypto's random sources (randomBytes, randomUUID) drawn from a seeded
 * source: ids, nonces and secrets made by the real code are then the same on every run of a
 * seed. Only the simulator does this, for the span of one run; the product never.
 */
import crypto from 'node:crypto';
import { syncBuiltinESMExports } from 'node:module';
import type { Prng } from './prng.js';

export async function withSeededCrypto<T>(random: Prng, run: () => Promise<T>): Promise<T> {
  const saved = { randomBytes: crypto.randomBytes, randomUUID: crypto.randomUUID };
  const patched = crypto as unknown as Record<string, unknown>;
  patched.randomBytes = (n: number) => random.bytes(n);
  patched.randomUUID = () => {
    const b = random.bytes(16);
    b[6] = (b[6]! & 0x0f) | 0x40;
    b[8] = (b[8]! & 0x3f) | 0x80;
    const h = b.toString('hex');
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  };
  syncBuiltinESMExports();
  try {
    return await run();
  } finally {
    patched.randomBytes = saved.randomBytes;
    patched.randomUUID = saved.randomUUID;
    syncBuiltinESMExports();
  }
}

/** An Ed25519 private key (PKCS#8 PEM) from 32 seeded bytes. */
export function seededEd25519Pem(random: Prng): string {
  const der = Buffer.concat([Buffer.from('302e020100300506032b657004220420', 'hex'), random.bytes(32)]);
  return crypto
    .createPrivateKey({ key: der, format: 'der', type: 'pkcs8' })
    .export({ type: 'pkcs8', format: 'pem' })
    .toString();
}
