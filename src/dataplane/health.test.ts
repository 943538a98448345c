import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { assess, type HealthEvidence, HealthTracker } from './health.js';

const GOOD: HealthEvidence = {
  active: true,
  tunnelAnswering: true,
  exitCanForward: true,
  probePassing: null,
};
const with_ = (change: Partial<HealthEvidence>): HealthEvidence => ({ ...GOOD, ...change });
const S = 'service-1';

describe('assess', () => {
  it('names the first failing check, in order: inactive, tunnel, exit route, probe', () => {
    assert.deepEqual(assess(GOOD), { state: 'healthy', reason: null });
    assert.deepEqual(assess(with_({ probePassing: true })), { state: 'healthy', reason: null });
    assert.deepEqual(assess(with_({ probePassing: false })), { state: 'unhealthy', reason: 'probe_failed' });
    assert.deepEqual(assess(with_({ exitCanForward: false, probePassing: false })), {
      state: 'unhealthy',
      reason: 'exit_no_route',
    });
    assert.deepEqual(assess(with_({ tunnelAnswering: false, exitCanForward: false })), {
      state: 'unhealthy',
      reason: 'tunnel_silent',
    });
    assert.deepEqual(assess(with_({ active: false, tunnelAnswering: false })), {
      state: 'unhealthy',
      reason: 'inactive',
    });
  });

  it('is unknown until the tunnel has answered, unless something already fails', () => {
    assert.deepEqual(assess(with_({ tunnelAnswering: null })), { state: 'unknown', reason: null });
    assert.deepEqual(assess(with_({ tunnelAnswering: null, exitCanForward: null })), {
      state: 'unknown',
      reason: null,
    });
    assert.deepEqual(assess(with_({ tunnelAnswering: null, active: false })), {
      state: 'unhealthy',
      reason: 'inactive',
    });
  });

  it('treats an exit or probe not heard from yet as no evidence against the service', () => {
    assert.deepEqual(assess(with_({ exitCanForward: null, probePassing: null })), {
      state: 'healthy',
      reason: null,
    });
  });
});

describe('HealthTracker', () => {
  it('a service healthy from the start carries at once; unknown and never-seen ones do not', () => {
    const h = new HealthTracker(30_000);
    assert.equal(h.verdict(S, 0).carrying, false);
    assert.equal(h.verdict(S, 0).standbyReason, 'unknown');
    assert.deepEqual(h.observe(S, with_({ tunnelAnswering: null }), 0), { state: true, carrying: false });
    assert.equal(h.verdict(S, 0).standbyReason, 'unknown');
    assert.deepEqual(h.observe(S, GOOD, 100), { state: true, carrying: true });
    assert.deepEqual(h.verdict(S, 100), {
      state: 'healthy',
      reason: null,
      since: 100,
      carrying: true,
      standbyReason: null,
      holdDownUntil: null,
    });
  });

  it('stands aside at once when unhealthy, and takes traffic back only after the hold-down', () => {
    const h = new HealthTracker(30_000);
    h.observe(S, GOOD, 0);
    assert.deepEqual(h.observe(S, with_({ tunnelAnswering: false }), 1000), { state: true, carrying: true });
    const down = h.verdict(S, 1000);
    assert.equal(down.carrying, false);
    assert.equal(down.state, 'unhealthy');
    assert.equal(down.reason, 'tunnel_silent');
    assert.equal(down.standbyReason, 'tunnel_silent');
    assert.equal(down.since, 1000);

    // Healthy again at 5 s: it waits until 35 s.
    assert.deepEqual(h.observe(S, GOOD, 5000), { state: true, carrying: false });
    const holding = h.verdict(S, 5000);
    assert.equal(holding.state, 'healthy');
    assert.equal(holding.carrying, false);
    assert.equal(holding.standbyReason, 'hold_down');
    assert.equal(holding.holdDownUntil, 35_000);
    assert.equal(h.nextChange(5000), 35_000);
    assert.equal(h.verdict(S, 34_999).carrying, false);
    assert.equal(h.verdict(S, 35_000).carrying, true);
    assert.equal(h.nextChange(35_000), null);
    // The same evidence at the deadline reports the change (carrying now), not a new state; once.
    assert.deepEqual(h.observe(S, GOOD, 35_000), { state: false, carrying: true });
    assert.deepEqual(h.observe(S, GOOD, 36_000), { state: false, carrying: false });
  });

  it('a flapping exit never carries: each failure during the hold-down starts it again', () => {
    const h = new HealthTracker(30_000);
    h.observe(S, GOOD, 0);
    let now = 0;
    for (let i = 0; i < 10; i++) {
      now += 10_000;
      h.observe(S, with_({ tunnelAnswering: false }), now);
      assert.equal(h.verdict(S, now).carrying, false);
      now += 10_000;
      h.observe(S, GOOD, now);
      assert.equal(h.verdict(S, now + 29_999).carrying, false, `flap ${i}`);
    }
    assert.equal(h.verdict(S, now + 30_000).carrying, true);
  });

  it('with a hold-down of 0 it carries again at once', () => {
    const h = new HealthTracker(0);
    h.observe(S, GOOD, 0);
    h.observe(S, with_({ exitCanForward: false }), 10);
    assert.equal(h.verdict(S, 10).carrying, false);
    assert.deepEqual(h.observe(S, GOOD, 20), { state: true, carrying: true });
    assert.equal(h.verdict(S, 20).carrying, true);
  });

  it('an exit that comes back through unknown (restarted, tunnel not up yet) still owes the hold-down', () => {
    const h = new HealthTracker(30_000);
    h.observe(S, GOOD, 0);
    h.observe(S, with_({ tunnelAnswering: false }), 1000);
    h.observe(S, with_({ tunnelAnswering: null }), 2000);
    assert.equal(h.verdict(S, 2000).standbyReason, 'unknown');
    h.observe(S, GOOD, 3000);
    assert.equal(h.verdict(S, 3000).standbyReason, 'hold_down');
    assert.equal(h.verdict(S, 33_000).carrying, true);
  });

  it('a service first seen unhealthy waits out the hold-down once healthy', () => {
    const h = new HealthTracker(30_000);
    h.observe(S, with_({ probePassing: false }), 0);
    assert.equal(h.verdict(S, 0).standbyReason, 'probe_failed');
    h.observe(S, GOOD, 1000);
    assert.equal(h.verdict(S, 1000).carrying, false);
    assert.equal(h.verdict(S, 31_000).carrying, true);
  });

  it('a new reason while unhealthy is a state change to report, not a second switch', () => {
    const h = new HealthTracker(30_000);
    h.observe(S, GOOD, 0);
    h.observe(S, with_({ probePassing: false }), 1000);
    assert.deepEqual(h.observe(S, with_({ probePassing: false }), 1500), { state: false, carrying: false });
    assert.deepEqual(h.observe(S, with_({ active: false }), 2000), { state: true, carrying: false });
    const v = h.verdict(S, 2000);
    assert.equal(v.reason, 'inactive');
    assert.equal(v.since, 1000, 'since counts from the state, not the reason');
  });

  it('judges each service alone, and forgets those it no longer carries', () => {
    const h = new HealthTracker(30_000);
    h.observe('a', GOOD, 0);
    h.observe('b', GOOD, 0);
    h.observe('b', with_({ tunnelAnswering: false }), 10);
    h.observe('b', GOOD, 20);
    assert.equal(h.verdict('a', 20).carrying, true);
    assert.equal(h.verdict('b', 20).carrying, false);
    assert.equal(h.nextChange(20), 30_020);
    h.retain(new Set(['a']));
    assert.equal(h.size, 1);
    assert.equal(h.verdict('b', 40_000).carrying, false, 'forgotten: unknown again');
  });

  it('refuses a negative or non-finite hold-down', () => {
    assert.throws(() => new HealthTracker(-1));
    assert.throws(() => new HealthTracker(Number.NaN));
  });
});
