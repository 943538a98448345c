import assert from 'node:assert/strict';
import { describe, it, mock } from 'node:test';
import { ManualClock } from '../domain/clock.js';
import type { ObservedEvent } from '../domain/observed-event.js';
import { type AuthFailure, AuthFailureReporter, AuthFailureWindow } from './failure-report.js';

const CLIENT = 'mc_AAAAAAAAAAAAAAAAAAAAAA';
const bad = (
  source: string,
  reason: AuthFailure['reason'],
  clientId: string | null = CLIENT,
): AuthFailure => ({
  clientId,
  source,
  reason,
});

describe('AuthFailureWindow: failures aggregated per window', () => {
  it('50 failures in a window are one summary, given once the window has ended', () => {
    const w = new AuthFailureWindow(60_000);
    const t0 = Date.UTC(2026, 0, 1);
    for (let i = 0; i < 50; i++) w.add(bad('10.0.0.1', i < 10 ? 'wrong_secret' : 'throttled'), t0 + i * 100);
    assert.equal(w.take(t0 + 59_999), undefined, 'not before the window ends');
    const s = w.take(t0 + 60_000);
    assert.ok(s);
    assert.equal(s.total, 50);
    assert.deepEqual(s.failures, [
      { client_id: CLIENT, source: '10.0.0.1', reason: 'throttled', count: 40 },
      { client_id: CLIENT, source: '10.0.0.1', reason: 'wrong_secret', count: 10 },
    ]);
    assert.equal(s.window_start, '2026-01-01T00:00:00.000Z');
    assert.equal(s.window_end, '2026-01-01T00:01:00.000Z');
    assert.equal(w.take(t0 + 120_000), undefined, 'nothing more: the next window opens at the next failure');
    assert.equal(w.endsAt, null);
  });

  it('a new failure after the report opens a new window of its own', () => {
    const w = new AuthFailureWindow(1000);
    w.add(bad('a', 'invalid_token', null), 0);
    assert.equal(w.take(1000)?.total, 1);
    w.add(bad('a', 'invalid_token', null), 5000);
    assert.equal(w.endsAt, 6000);
    assert.equal(w.take(5999), undefined);
    assert.equal(w.take(6000)?.total, 1);
  });

  it('keeps only client ids of the issued form: a secret given as client_id is never kept', () => {
    const w = new AuthFailureWindow(1000);
    const secret = 'x'.repeat(43);
    w.add(bad('a', 'unknown_client', secret), 0);
    w.add(bad('a', 'unknown_client', `${CLIENT}x`), 0);
    w.add(bad('a', 'unknown_client', 'mcc_BBBBBBBBBBBBBBBBBBBBBB'), 0);
    const s = w.take(1000)!;
    assert.ok(!JSON.stringify(s).includes(secret));
    assert.deepEqual(
      s.failures.map((f) => [f.client_id, f.count]),
      [
        [null, 2],
        ['mcc_BBBBBBBBBBBBBBBBBBBBBB', 1],
      ],
    );
  });

  it('bounds its groups: failures beyond maxGroups are counted as omitted', () => {
    const w = new AuthFailureWindow(1000, 3);
    for (let i = 0; i < 10; i++) w.add(bad(`10.0.0.${i}`, 'wrong_secret'), 0);
    w.add(bad('10.0.0.0', 'wrong_secret'), 0);
    const s = w.take(1000)!;
    assert.equal(s.total, 11);
    assert.equal(s.failures.length, 3);
    assert.equal(s.failures[0]!.count, 2, 'a known group still counts');
    assert.equal(s.omitted, 7);
  });
});

describe('AuthFailureReporter: one auth.failures event per window', () => {
  it('reports a window once its time has passed on the clock, and what is open at stop', () => {
    mock.timers.enable({ apis: ['setInterval'] });
    try {
      const clock = new ManualClock();
      const events: ObservedEvent[] = [];
      const reporter = new AuthFailureReporter(clock, (e) => events.push(e), 'peer-a', 60_000);
      for (let i = 0; i < 50; i++) reporter.report(bad('10.0.0.1', 'wrong_secret'));
      mock.timers.tick(5000);
      assert.equal(events.length, 0);
      clock.advance(60_000);
      mock.timers.tick(1000);
      assert.equal(events.length, 1);
      assert.equal(events[0]!.type, 'auth.failures');
      assert.deepEqual(events[0]!.resource, { kind: 'agent', id: 'peer-a' });
      assert.equal(events[0]!.data.total, 50);
      clock.advance(600_000);
      mock.timers.tick(10_000);
      assert.equal(events.length, 1, 'a quiet window reports nothing');

      reporter.report(bad('10.0.0.2', 'invalid_token', null));
      reporter.stop();
      assert.equal(events.length, 2);
      assert.equal(events[1]!.data.total, 1);
      reporter.stop();
      assert.equal(events.length, 2);
    } finally {
      mock.timers.reset();
    }
  });
});
