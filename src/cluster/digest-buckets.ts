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

/**
 * Splits a digest's entries into buckets, hashing each once. Given the buckets of an earlier
 * digest, a key it held keeps its bucket unhashed and a bucket whose entries are the same keeps
 * its hash: a merge changes a few keys, and rehashing every key and bucket after each one was
 * a twentieth of a simulated cluster's CPU (test/sim).
 */
export function bucketize(
  entries: ReadonlyMap<string, string>,
  previous?: { entries: ReadonlyMap<string, string>; buckets: DigestBuckets },
): DigestBuckets {
  const split: [string, string][][] = Array.from({ length: DIGEST_BUCKETS }, () => []);
  const changed = new Array<boolean>(DIGEST_BUCKETS).fill(previous === undefined);
  const bucketOfHeld = previous && bucketIndex(previous.buckets);
  for (const entry of entries) {
    const held = bucketOfHeld?.get(entry[0]);
    const b = held ?? bucketOf(entry[0]);
    split[b]!.push(entry);
    if (held === undefined || previous!.entries.get(entry[0]) !== entry[1]) changed[b] = true;
  }
  const hashes = split.map((bucket, b) => {
    // Same count and no key new or changed: the same lines, so the same hash.
    if (!changed[b] && bucket.length === previous!.buckets.entries[b]!.length) {
      return previous!.buckets.hashes[b]!;
    }
    const lines = bucket.map(([key, vkey]) => `${key} ${vkey}\n`).sort();
    return createHash('sha256').update(lines.join('')).digest().subarray(0, 9).toString('base64url');
  });
  return { hashes, entries: split };
}

/** Each key of some buckets' entries, with its bucket. */
function bucketIndex(buckets: DigestBuckets): Map<string, number> {
  const index = new Map<string, number>();
  buckets.entries.forEach((bucket, b) => {
    for (const [key] of bucket) index.set(key, b);
  });
  return index;
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
