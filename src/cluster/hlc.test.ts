import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { ManualClock } from '../domain/clock.js';
import { decodeStamp, encodeStamp, HybridClock, MAX_FORWARD_DRIFT_MS, type Stamp } from './hlc.js';

const ORIGIN = 'aa11';

const stampArb: fc.Arbitrary<Stamp> = fc.record({
  wall: fc.integer({ min: 0, max: 16 ** 12 - 1 }),
  counter: fc.integer({ min: 0, max: 16 ** 6 - 1 }),
  origin: fc.stringMatching(/^[0-9a-f]{1,64}$/),
});

const compareTuples = (a: Stamp, b: Stamp): number =>
  a.wall !== b.wall
    ? Math.sign(a.wall - b.wall)
    : a.counter !== b.counter
      ? Math.sign(a.counter - b.counter)
      : a.origin < b.origin
        ? -1
        : a.origin > b.origin
          ? 1
          : 0;

const compareText = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

describe('HybridClock', { timeout: 30_000 }, () => {
  it('follows the wall clock when it moves forward', () => {
    const clock = new ManualClock(1_000_000);
    const hlc = new HybridClock(ORIGIN, clock);
    assert.deepEqual(decodeStamp(hlc.tick()), { wall: 1_000_000, counter: 0, origin: ORIGIN });
    clock.advance(5);
    assert.deepEqual(decodeStamp(hlc.tick()), { wall: 1_000_005, counter: 0, origin: ORIGIN });
  });

  it('ticks strictly increase while the wall clock stands still', () => {
    const clock = new ManualClock(1_000_000);
    const hlc = new HybridClock(ORIGIN, clock);
    const stamps = Array.from({ length: 50 }, () => hlc.tick());
    for (let i = 1; i < stamps.length; i++) assert.ok(stamps[i - 1]! < stamps[i]!, `${i}`);
    assert.deepEqual(decodeStamp(stamps.at(-1)!), { wall: 1_000_000, counter: 49, origin: ORIGIN });
  });

  it('ticks strictly increase when the wall clock goes backwards', () => {
    const clock = new ManualClock(1_000_000);
    const hlc = new HybridClock(ORIGIN, clock);
    const before = hlc.tick();
    clock.set(900_000);
    const after = hlc.tick();
    assert.ok(before < after);
    // The clock keeps the wall time it had reached rather than follow the step back.
    assert.deepEqual(decodeStamp(after), { wall: 1_000_000, counter: 1, origin: ORIGIN });
    clock.set(1_000_001);
    assert.deepEqual(decodeStamp(hlc.tick()), { wall: 1_000_001, counter: 0, origin: ORIGIN });
  });

  it('ticks strictly increase whatever the wall clock does (property)', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: -5_000, max: 5_000 }), { minLength: 1, maxLength: 200 }),
        (moves) => {
          const clock = new ManualClock(10_000_000);
          const hlc = new HybridClock(ORIGIN, clock);
          let last = hlc.tick();
          for (const move of moves) {
            clock.advance(move);
            const next = hlc.tick();
            if (!(last < next)) return false;
            last = next;
          }
          return true;
        },
      ),
    );
  });

  it('after observing a later stamp, the next tick is greater than it', () => {
    const clock = new ManualClock(1_000_000);
    const hlc = new HybridClock(ORIGIN, clock);
    hlc.tick();
    const later = encodeStamp({ wall: 1_030_000, counter: 7, origin: 'ff' });
    assert.equal(hlc.observe(later), true);
    const next = hlc.tick();
    assert.ok(next > later, `${next} > ${later}`);
    assert.deepEqual(decodeStamp(next), { wall: 1_030_000, counter: 8, origin: ORIGIN });
  });

  it('observing then ticking beats every observed stamp (property)', () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.record({
            offset: fc.integer({ min: -100_000, max: MAX_FORWARD_DRIFT_MS }),
            counter: fc.integer({ min: 0, max: 1000 }),
            origin: fc.stringMatching(/^[0-9a-f]{1,32}$/),
            move: fc.integer({ min: -1000, max: 1000 }),
          }),
          { minLength: 1, maxLength: 50 },
        ),
        (events) => {
          const clock = new ManualClock(10_000_000);
          const hlc = new HybridClock(ORIGIN, clock);
          let max = hlc.tick();
          for (const e of events) {
            clock.advance(e.move);
            const seen = encodeStamp({ wall: clock.now() + e.offset, counter: e.counter, origin: e.origin });
            if (!hlc.observe(seen)) return false;
            if (seen > max) max = seen;
            const next = hlc.tick();
            if (!(next > max)) return false;
            max = next;
          }
          return true;
        },
      ),
    );
  });

  it('refuses a stamp more than MAX_FORWARD_DRIFT_MS ahead and does not move', () => {
    const clock = new ManualClock(1_000_000);
    const hlc = new HybridClock(ORIGIN, clock);
    hlc.tick();
    const tooFar = encodeStamp({ wall: 1_000_000 + MAX_FORWARD_DRIFT_MS + 1, counter: 0, origin: 'ff' });
    assert.equal(hlc.observe(tooFar), false);
    // Not moved: the next tick continues from our own last stamp.
    assert.deepEqual(decodeStamp(hlc.tick()), { wall: 1_000_000, counter: 1, origin: ORIGIN });
    // Exactly at the limit is still accepted.
    const atLimit = encodeStamp({ wall: 1_000_000 + MAX_FORWARD_DRIFT_MS, counter: 3, origin: 'ff' });
    assert.equal(hlc.observe(atLimit), true);
    assert.deepEqual(decodeStamp(hlc.tick()), {
      wall: 1_000_000 + MAX_FORWARD_DRIFT_MS,
      counter: 4,
      origin: ORIGIN,
    });
  });

  it('passes a stored stamp however far ahead it is (its own writes, after the clock went back)', () => {
    const clock = new ManualClock(1_000_000);
    const hlc = new HybridClock(ORIGIN, clock);
    const stored = encodeStamp({ wall: 1_000_000 + 10 * MAX_FORWARD_DRIFT_MS, counter: 2, origin: ORIGIN });
    assert.equal(hlc.observe(stored), false, 'as a received stamp it is refused');
    assert.equal(hlc.observe(stored, true), true);
    const next = hlc.tick();
    assert.ok(next > stored);
    assert.deepEqual(decodeStamp(next), {
      wall: 1_000_000 + 10 * MAX_FORWARD_DRIFT_MS,
      counter: 3,
      origin: ORIGIN,
    });
    assert.equal(hlc.observe('garbage', true), false);
  });

  it('refuses a malformed stamp', () => {
    const hlc = new HybridClock(ORIGIN, new ManualClock(1_000_000));
    for (const bad of ['', 'x', '0000000f4240.000000', '0000000F4240.000000.aa', '0f4240.000000.aa']) {
      assert.equal(hlc.observe(bad), false, bad);
    }
  });

  it('an older observed stamp does not move the clock', () => {
    const clock = new ManualClock(1_000_000);
    const hlc = new HybridClock(ORIGIN, clock);
    hlc.tick();
    assert.equal(hlc.observe(encodeStamp({ wall: 10, counter: 99, origin: 'ff' })), true);
    assert.deepEqual(decodeStamp(hlc.tick()), { wall: 1_000_000, counter: 1, origin: ORIGIN });
  });

  it('refuses to wrap its counter', () => {
    const clock = new ManualClock(1_000_000);
    const hlc = new HybridClock(ORIGIN, clock);
    assert.equal(hlc.observe(encodeStamp({ wall: 1_000_000, counter: 16 ** 6 - 1, origin: 'ff' })), true);
    assert.throws(() => hlc.tick(), /overflow/);
  });
});

describe('stamp encoding', { timeout: 30_000 }, () => {
  it('decodeStamp(encodeStamp(s)) is s (property)', () => {
    fc.assert(fc.property(stampArb, (s) => assert.deepEqual(decodeStamp(encodeStamp(s)), { ...s })));
  });

  it('string order equals tuple order (property)', () => {
    fc.assert(
      fc.property(stampArb, stampArb, (a, b) => {
        assert.equal(compareText(encodeStamp(a), encodeStamp(b)), compareTuples(a, b));
      }),
    );
  });

  it('string order equals tuple order for close stamps (property)', () => {
    // Random 48-bit walls almost never tie; these do, so counters and origins get compared.
    const close = fc.record({
      wall: fc.integer({ min: 0, max: 3 }),
      counter: fc.integer({ min: 0, max: 3 }),
      origin: fc.constantFrom('a', 'ab', 'b', '0', 'ff'),
    });
    fc.assert(
      fc.property(close, close, (a, b) => {
        assert.equal(compareText(encodeStamp(a), encodeStamp(b)), compareTuples(a, b));
      }),
    );
  });

  it('decodeStamp refuses text that is not a stamp', () => {
    for (const bad of [
      '',
      '000000000001.000001',
      '000000000001.000001.',
      '00000000001.000001.aa',
      '000000000001.0000001.aa',
      '000000000001.000001.AA',
      '000000000001.000001.zz',
      `000000000001.000001.${'a'.repeat(65)}`,
      ' 000000000001.000001.aa',
    ]) {
      assert.equal(decodeStamp(bad), undefined, bad);
    }
  });
});
