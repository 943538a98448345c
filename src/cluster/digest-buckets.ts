/**
 * Buckets of the anti-entropy digest (pure; used by replica.ts to build them and gossip.ts to
 * compare them). Each `key vkey` entry falls in one of DIGEST_BUCKETS buckets by a hash of its
 * key; a bucket's hash covers its sorted lines. Two agents whose roots differ first swap the
 * bucket hashes (about 1 KB) and then exchange `key vkey` lists for the differing buckets only:
 * while a change is still spreading that is a handful of entries instead of the whole state
 * (about 72 KB at 650 records).
 */
import { createHash } from 'node:crypto';

/** Enough that a few changed keys touch a few buckets; few enough that the list stays ~1 KB. */
export const DIGEST_BUCKETS = 64;

/** The bucket of a record key: the first byte of SHA-256(key), folded to DIGEST_BUCKETS. */
export function bucketOf(key: string): number {
  return createHash('sha256').update(key).digest()[0]! % DIGEST_BUCKETS;
}

/** A digest split into its buckets: each bucket's hash and its `[key, vkey]` entries. */
export interface DigestBuckets {
  /**
   * Per bucket, in bucket order: base64url of the first 9 bytes of SHA-256 over the bucket's
   * sorted `key vkey\n` lines (an empty bucket hashes nothing).
   */
  hashes: string[];
  /** Per bucket, its entries: what an exchange scoped to that bucket sends or compares. */
  entries: [string, string][][];
}

/** Splits a digest's entries into buckets, hashing each once. */
export function bucketize(entries: ReadonlyMap<string, string>): DigestBuckets {
  const split: [string, string][][] = Array.from({ length: DIGEST_BUCKETS }, () => []);
  for (const entry of entries) split[bucketOf(entry[0])]!.push(entry);
  const hashes = split.map((bucket) => {
    const lines = bucket.map(([key, vkey]) => `${key} ${vkey}\n`).sort();
    return createHash('sha256').update(lines.join('')).digest().subarray(0, 9).toString('base64url');
  });
  return { hashes, entries: split };
}

/**
 * The buckets whose hashes differ, or undefined when `theirs` is not a list of DIGEST_BUCKETS
 * strings (an agent from before buckets, or a malformed message: the caller falls back to the
 * whole digest).
 */
export function differingBuckets(mine: readonly string[], theirs: unknown): number[] | undefined {
  if (
    !Array.isArray(theirs) ||
    theirs.length !== DIGEST_BUCKETS ||
    !theirs.every((h) => typeof h === 'string')
  ) {
    return undefined;
  }
  const differ: number[] = [];
  for (let i = 0; i < DIGEST_BUCKETS; i++) if (mine[i] !== theirs[i]) differ.push(i);
  return differ;
}

/**
 * The set of bucket numbers a `scope` field names, or undefined (no scope: every bucket) when it
 * is absent or not a list of bucket numbers.
 */
export function scopeOf(scope: unknown): ReadonlySet<number> | undefined {
  if (!Array.isArray(scope) || scope.length > DIGEST_BUCKETS) return undefined;
  if (!scope.every((b) => Number.isInteger(b) && b >= 0 && b < DIGEST_BUCKETS)) return undefined;
  return new Set(scope as number[]);
}
