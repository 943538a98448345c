import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ManualClock } from '../domain/clock.js';
import { FailureThrottle } from './failure-throttle.js';

describe('FailureThrottle', () => {
  it('limits from the 11th failure within a minute and says when to retry', () => {
    const clock = new ManualClock();
    const t = new FailureThrottle(clock);
    for (let i = 0; i < 10; i++) {
      assert.equal(t.check('10.0.0.1', 'c1').limited, false, `attempt ${i + 1}`);
      t.recordFailure('10.0.0.1', 'c1');
      clock.advance(1000);
    }
    const verdict = t.check('10.0.0.1', 'c1');
    assert.equal(verdict.limited, true);
    assert.equal(verdict.retryAfterSeconds, 50);
  });

  it('does not limit the same client from another address', () => {
    const clock = new ManualClock();
    const t = new FailureThrottle(clock);
    for (let i = 0; i < 20; i++) t.recordFailure('10.0.0.1', 'c1');
    assert.equal(t.check('10.0.0.1', 'c1').limited, true);
    assert.equal(t.check('10.0.0.2', 'c1').limited, false);
  });

  it('limits an address that sprays many client ids', () => {
    const t = new FailureThrottle(new ManualClock());
    for (let i = 0; i < 10; i++) t.recordFailure('10.0.0.9', `client-${i}`);
    assert.equal(t.check('10.0.0.9', 'client-new').limited, true);
  });

  it('forgets failures older than the window', () => {
    const clock = new ManualClock();
    const t = new FailureThrottle(clock);
    for (let i = 0; i < 10; i++) t.recordFailure('10.0.0.1', 'c1');
    clock.advance(60_001);
    assert.equal(t.check('10.0.0.1', 'c1').limited, false);
  });

  it('keeps its table bounded under a flood of distinct addresses', () => {
    const t = new FailureThrottle(new ManualClock(), 10, 60_000, 1000);
    for (let i = 0; i < 5000; i++) t.recordFailure(`10.1.${i >> 8}.${i & 255}`, undefined);
    assert.ok(t.trackedKeys <= 1000, `${t.trackedKeys} keys tracked`);
  });
});
