import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { pino } from 'pino';
import { ManualClock } from '../domain/clock.js';
import type { License } from '../domain/license.js';
import { Store } from '../store/store.js';
import { EventLog } from './event-log.js';
import { alreadyRecorded, LicenseWatch, licenseEventDue } from './license-watch.js';
import { RuntimeEvents } from './runtime-events.js';

const DAY = 86_400_000;
const T0 = Date.UTC(2026, 0, 1);
const license = (id: string, expiresAt: number): License => ({
  customer_id: 'c',
  license_id: id,
  issued_at: new Date(T0 - DAY).toISOString(),
  expires_at: new Date(expiresAt).toISOString(),
  max_nodes: 3,
  max_services: 3,
  signature: 'sig',
});

describe('license.expiring and license.expired', () => {
  it('licenseEventDue: the tightest warning passed, then expired', () => {
    const at = new Date(T0 + 40 * DAY).toISOString();
    assert.equal(licenseEventDue(at, T0), undefined);
    assert.deepEqual(licenseEventDue(at, T0 + 10 * DAY), {
      type: 'license.expiring',
      thresholdDays: 30,
      daysLeft: 30,
    });
    assert.deepEqual(licenseEventDue(at, T0 + 35 * DAY), {
      type: 'license.expiring',
      thresholdDays: 7,
      daysLeft: 5,
    });
    assert.deepEqual(licenseEventDue(at, T0 + 39.5 * DAY), {
      type: 'license.expiring',
      thresholdDays: 1,
      daysLeft: 0,
    });
    assert.deepEqual(licenseEventDue(at, T0 + 40 * DAY), { type: 'license.expired' });
  });

  it('alreadyRecorded: the same expiry, at that threshold or a tighter one', () => {
    const at = '2026-02-10T00:00:00.000Z';
    const e = (threshold: number, expires = at) => ({
      type: 'license.expiring',
      data: { threshold_days: threshold, expires_at: expires },
    });
    const due = { type: 'license.expiring' as const, thresholdDays: 7, daysLeft: 6 };
    assert.equal(alreadyRecorded(due, at, [e(30)]), false);
    assert.equal(alreadyRecorded(due, at, [e(30), e(7)]), true);
    assert.equal(alreadyRecorded(due, at, [e(1)]), true);
    assert.equal(
      alreadyRecorded(due, at, [e(7, '2025-02-10T00:00:00.000Z')]),
      false,
      'a renewed expiry warns again',
    );
  });

  it('records each threshold once as time passes, once across restarts, and expiry once', () => {
    const store = new Store(join(mkdtempSync(join(tmpdir(), 'license-watch-')), 'db'));
    const clock = new ManualClock(T0);
    const log = new EventLog(store, 'self', clock);
    const recorded = () => log.after(0);
    let current: License | undefined;
    const watch = () =>
      new LicenseWatch(() => current, log, new RuntimeEvents(log, pino({ level: 'silent' })).record, clock);
    let w = watch();
    w.check();
    assert.equal(recorded().length, 0, 'before bootstrap: no license, nothing');
    current = license('L1', T0 + 40 * DAY);
    for (const step of [0, 5, 10, 11, 20, 33, 34]) {
      clock.set(T0 + step * DAY);
      w.check();
      w.check();
    }
    // A restart (a new watch over the same log) in the 7-day window records nothing new.
    w = watch();
    w.check();
    for (const step of [39.2, 39.5, 40, 41, 100]) {
      clock.set(T0 + step * DAY);
      w.check();
    }
    w = watch();
    w.check();
    assert.deepEqual(
      recorded().map((e) => [e.type, e.resource.id, e.data.threshold_days ?? null]),
      [
        ['license.expiring', 'L1', 30],
        ['license.expiring', 'L1', 7],
        ['license.expiring', 'L1', 1],
        ['license.expired', 'L1', null],
      ],
    );
    assert.equal(recorded()[0]!.data.expires_at, current.expires_at);
    assert.equal(recorded()[1]!.data.days_left, 7, 'seen at exactly 7 days left');

    // A new license starts its own count; one first seen with 3 days left says 7, not 30 too.
    current = license('L2', clock.now() + 3 * DAY);
    w.check();
    assert.deepEqual(
      recorded()
        .slice(4)
        .map((e) => [e.type, e.resource.id, e.data.threshold_days]),
      [['license.expiring', 'L2', 7]],
    );
  });
});
