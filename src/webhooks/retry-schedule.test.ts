import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { GIVE_UP_AFTER_MS, giveUpAt, nextAttemptAt, RETRY_DELAYS_MS } from './retry-schedule.js';

const S = 1000;
const H = 3600 * S;

/** The attempts an endpoint that never answers makes for one event recorded at 0, failing from 0. */
function attemptsForDeadEndpoint(): number[] {
  const deadline = giveUpAt(0, 0);
  const times = [0];
  for (let failures = 1; ; failures++) {
    const now = times.at(-1)!;
    if (now >= deadline) return times;
    times.push(nextAttemptAt(failures, now, deadline));
  }
}

describe('webhook retry schedule', () => {
  it('retries within seconds first (5 s, then 30 s later), then ever more slowly', () => {
    const t = attemptsForDeadEndpoint();
    assert.deepEqual(t.slice(0, 7), [0, 5 * S, 35 * S, 155 * S, 755 * S, 755 * S + H, 755 * S + 7 * H]);
    const gaps = t.slice(1).map((x, i) => x - t[i]!);
    for (let i = 1; i < gaps.length - 1; i++) assert.ok(gaps[i]! >= gaps[i - 1]!, `gap ${i} does not shrink`);
    assert.ok(Math.max(...gaps) <= 6 * H);
  });

  it('makes the last attempt 24 h after the event, not up to 6 h later', () => {
    const t = attemptsForDeadEndpoint();
    assert.equal(t.at(-1), GIVE_UP_AFTER_MS);
    assert.equal(GIVE_UP_AFTER_MS, 24 * H);
    assert.ok(t.length <= 12, `${t.length} attempts in 24 h`);
  });

  it('gives an event that reached the log late the endpoint’s 24 h from when it began to fail', () => {
    assert.equal(giveUpAt(0, 10 * H), 34 * H);
    assert.equal(giveUpAt(10 * H, 0), 34 * H);
  });

  it('never schedules in the past, and repeats the longest wait past the table', () => {
    assert.equal(nextAttemptAt(1, 100 * H, 50 * H), 100 * H);
    const far = Number.POSITIVE_INFINITY;
    assert.equal(nextAttemptAt(RETRY_DELAYS_MS.length + 5, 0, far), RETRY_DELAYS_MS.at(-1));
  });
});
