import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Backoff } from './backoff.js';

describe('Backoff', () => {
  it('doubles from min to max without jitter, and starts over after reset', () => {
    const b = new Backoff({ minMs: 250, maxMs: 10_000, jitter: 0 });
    assert.deepEqual(
      Array.from({ length: 9 }, () => b.next()),
      [250, 500, 1000, 2000, 4000, 8000, 10_000, 10_000, 10_000],
    );
    b.reset();
    assert.equal(b.next(), 250);
  });

  it('takes up to `jitter` of each delay off at random, never adding', () => {
    const lowest = new Backoff({ minMs: 1000, maxMs: 4000, jitter: 0.2 }, () => 0.999_999);
    const highest = new Backoff({ minMs: 1000, maxMs: 4000, jitter: 0.2 }, () => 0);
    assert.deepEqual([lowest.next(), lowest.next(), lowest.next(), lowest.next()], [800, 1600, 3200, 3200]);
    assert.deepEqual(
      [highest.next(), highest.next(), highest.next(), highest.next()],
      [1000, 2000, 4000, 4000],
    );
    const random = new Backoff({}, Math.random);
    for (let i = 0; i < 100; i++) {
      const ms = random.next();
      assert.ok(ms >= 200 && ms <= 10_000, String(ms));
    }
  });

  it('defaults to 250 ms .. 10 s with 20 % jitter, and refuses nonsense', () => {
    const b = new Backoff();
    assert.deepEqual([b.minMs, b.maxMs, b.jitter], [250, 10_000, 0.2]);
    assert.throws(() => new Backoff({ minMs: 0 }), RangeError);
    assert.throws(() => new Backoff({ minMs: 500, maxMs: 100 }), RangeError);
    assert.throws(() => new Backoff({ jitter: 1.5 }), RangeError);
  });
});
