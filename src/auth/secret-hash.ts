/**
 * Client secrets are stored only as a keyed hash (HMAC-SHA-256 under a key that never leaves
 * the data dir) and compared in constant time. Secrets are 32 random bytes, so a slow
 * password hash would add latency without adding strength; the key makes a stolen database
 * useless for offline guessing on its own.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';

export class SecretHasher {
  constructor(private readonly key: Buffer) {
    if (key.length < 32) throw new Error('secret hash key must be at least 32 bytes');
  }

  hash(secret: string): Buffer {
    return createHmac('sha256', this.key).update(secret, 'utf8').digest();
  }

  /** Constant time in the secret and the stored hash. */
  matches(secret: string, storedHash: Buffer): boolean {
    const candidate = this.hash(secret);
    return candidate.length === storedHash.length && timingSafeEqual(candidate, storedHash);
  }
}
