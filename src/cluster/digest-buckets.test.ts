/** The digest buckets: stable placement, hashes that move only with their own bucket, parsing. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { bucketize, bucketOf, DIGEST_BUCKETS, differingBuckets, scopeOf } from './digest-buckets.js';

const keys = Array.from({ length: 650 }, (_, i) => `service:${i.toString(16).padStart(32, '0')}`);
const state = new Map(keys.map((k, i) => [k, `000000.00000000.${i}`]));

describe('digest buckets', () => {
  it('places a key in the same bucket every time, within range, and spreads keys over all buckets', () => {
    const used = new Set<number>();
    for (const k of keys) {
      const b = bucketOf(k);
      assert.equal(bucketOf(k), b);
      assert.ok(Number.isInteger(b) && b >= 0 && b < DIGEST_BUCKETS);
      used.add(b);
    }
    assert.equal(used.size, DIGEST_BUCKETS, '650 keys reach every one of the 64 buckets');
  });

  it('splits the entries into their buckets, each exactly once', () => {
    const { entries } = bucketize(state);
    assert.equal(entries.length, DIGEST_BUCKETS);
    assert.equal(entries.flat().length, state.size);
    for (const [b, bucket] of entries.entries()) {
      for (const [key, vkey] of bucket) {
        assert.equal(bucketOf(key), b);
        assert.equal(state.get(key), vkey);
      }
    }
  });

  it('equal states have equal bucket lists, whatever the insertion order', () => {
    const reversed = new Map([...state].reverse());
    assert.deepEqual(bucketize(reversed).hashes, bucketize(state).hashes);
    assert.equal(bucketize(state).hashes.length, DIGEST_BUCKETS);
  });

  it('a changed, added or removed entry changes exactly its own bucket (property)', () => {
    const base = bucketize(state).hashes;
    fc.assert(
      fc.property(fc.nat(keys.length - 1), fc.constantFrom('change', 'add', 'remove'), (i, what) => {
        const next = new Map(state);
        const key = what === 'add' ? `route:${i}` : keys[i]!;
        if (what === 'remove') next.delete(key);
        else next.set(key, `000001.00000000.${i}`);
        assert.deepEqual(differingBuckets(base, bucketize(next).hashes), [bucketOf(key)]);
      }),
      { numRuns: 60 },
    );
  });

  it('built from an earlier digest, gives what a build from scratch gives (property)', () => {
    const earlier = { entries: state, buckets: bucketize(state) };
    const edit = fc.tuple(fc.nat(keys.length - 1), fc.constantFrom('change', 'add', 'remove', 'same'));
    fc.assert(
      fc.property(fc.array(edit, { maxLength: 8 }), (edits) => {
        const next = new Map(state);
        for (const [i, what] of edits) {
          const key = what === 'add' ? `route:${i}` : keys[i]!;
          if (what === 'remove') next.delete(key);
          else if (what !== 'same') next.set(key, `000002.00000000.${i}`);
        }
        assert.deepEqual(bucketize(next, earlier), bucketize(next));
      }),
      { numRuns: 100 },
    );
  });

  it('differingBuckets refuses a list that is not 64 strings (the caller exchanges everything)', () => {
    const mine = bucketize(state).hashes;
    assert.deepEqual(differingBuckets(mine, [...mine]), []);
    for (const bad of [undefined, null, 'x', {}, mine.slice(1), [...mine, 'x'], [...mine.slice(1), 7]]) {
      assert.equal(differingBuckets(mine, bad), undefined, JSON.stringify(bad)?.slice(0, 40));
    }
  });

  it('scopeOf takes only a list of bucket numbers', () => {
    assert.deepEqual(scopeOf([3, 0, 63]), new Set([0, 3, 63]));
    assert.deepEqual(scopeOf([]), new Set());
    for (const bad of [undefined, 'x', [64], [-1], [1.5], ['1'], Array(65).fill(0)]) {
      assert.equal(scopeOf(bad), undefined, JSON.stringify(bad));
    }
  });
});
