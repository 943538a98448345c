/**
 * `license.expiring` (30, 7 and 1 days before expiry) and `license.expired` (docs/events.md
 * "Runtime events"): looked at when the agent starts, when its license arrives (bootstrap) and
 * then every few seconds; each recorded once per license and expiry, across restarts too: before
 * recording, the log is asked whether it already holds that event. An agent that was down when a threshold passed records only the
 * tightest one passed (a 30-day warning with 5 days left would say less than the 7-day one).
 * Only agent.ts builds it.
 */
import type { Clock } from '../domain/clock.js';
import type { License } from '../domain/license.js';
import type { RecordObserved } from '../domain/observed-event.js';
import type { EventLog, MeshEvent } from './event-log.js';
import { eventsAbout } from './runtime-events.js';

export const EXPIRY_WARNING_DAYS = [30, 7, 1] as const;
const DAY_MS = 86_400_000;
/** How often the license is looked at: the clock may jump (a test's), so not once a day. */
const CHECK_MS = 5000;

export type LicenseEventDue =
  | { type: 'license.expiring'; thresholdDays: number; daysLeft: number }
  | { type: 'license.expired' };

/** What the license calls for at `now`: the tightest warning passed, expiry, or nothing. Pure. */
export function licenseEventDue(expiresAt: string, now: number): LicenseEventDue | undefined {
  const left = Date.parse(expiresAt) - now;
  if (!Number.isFinite(left)) return undefined;
  if (left <= 0) return { type: 'license.expired' };
  let threshold: number | undefined;
  for (const days of EXPIRY_WARNING_DAYS) if (left <= days * DAY_MS) threshold = days;
  return threshold === undefined
    ? undefined
    : { type: 'license.expiring', thresholdDays: threshold, daysLeft: Math.floor(left / DAY_MS) };
}

/**
 * Whether `recorded` (the events of one license, any order) already covers `due`: the same
 * expiry, and for a warning one at that threshold or a tighter one.
 */
export function alreadyRecorded(
  due: LicenseEventDue,
  expiresAt: string,
  recorded: readonly Pick<MeshEvent, 'type' | 'data'>[],
): boolean {
  return recorded.some(
    (e) =>
      e.type === due.type &&
      e.data.expires_at === expiresAt &&
      (due.type === 'license.expired' ||
        (typeof e.data.threshold_days === 'number' && e.data.threshold_days <= due.thresholdDays)),
  );
}

export class LicenseWatch {
  private timer: NodeJS.Timeout | undefined;
  /** What was last found recorded (or recorded here), so the log is asked once per step. */
  private settled = '';
  private seenLicense = false;
  private poked = false;

  constructor(
    private readonly license: () => License | undefined,
    private readonly log: Pick<EventLog, 'after'>,
    private readonly record: RecordObserved,
    private readonly clock: Clock,
  ) {}

  /**
   * A write happened: until this agent holds a license (bootstrap), look at once, so that a
   * license already within a warning says so when it arrives, not seconds later. Deferred:
   * write listeners must not write synchronously (store.ts).
   */
  poke(): void {
    if (this.seenLicense || this.poked || !this.timer) return;
    this.poked = true;
    setImmediate(() => {
      this.poked = false;
      this.check();
    });
  }

  start(): void {
    this.check();
    this.timer = setInterval(() => this.check(), CHECK_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  check(): void {
    const license = this.license();
    if (!license) return;
    this.seenLicense = true;
    const due = licenseEventDue(license.expires_at, this.clock.now());
    if (!due) return;
    const step = JSON.stringify([
      license.license_id,
      license.expires_at,
      due.type,
      'thresholdDays' in due ? due.thresholdDays : 0,
    ]);
    if (step === this.settled) return;
    if (!alreadyRecorded(due, license.expires_at, [...eventsAbout(this.log, due.type, license.license_id)])) {
      this.record({
        type: due.type,
        resource: { kind: 'license', id: license.license_id },
        data:
          due.type === 'license.expired'
            ? { expires_at: license.expires_at }
            : { threshold_days: due.thresholdDays, days_left: due.daysLeft, expires_at: license.expires_at },
      });
    }
    this.settled = step;
  }
}
