/**
 * Authentication failures, aggregated into at most one `auth.failures` event per window
 * (docs/events.md "Runtime events"): refused client authentications at the token endpoint and
 * refused bearer tokens at the API, counted by client id, source address and reason. A window
 * opens at the first failure and is reported when it ends, so a flood of bad requests costs one
 * event a minute, never one per request. Nothing presented is kept but a client id of the form
 * this agent issues: a caller that swaps its id and secret must not have its secret recorded.
 * Memory is bounded by `maxGroups`; failures beyond it are counted in `omitted`.
 *
 * `AuthFailureWindow` is pure (time comes in); `AuthFailureReporter` is its shell with a timer.
 * The token endpoint and the API's authorize hook report; agent.ts wires the reporter.
 */
import type { Clock } from '../domain/clock.js';
import { isoTime } from '../domain/clock.js';
import type { RecordObserved } from '../domain/observed-event.js';

export type AuthFailureReason =
  | 'malformed_credentials'
  | 'unknown_client'
  | 'wrong_secret'
  | 'throttled'
  | 'invalid_token';

export interface AuthFailure {
  /** The client id presented, if any; kept only when it has the form of an issued one. */
  clientId: string | null;
  /** The caller's address. */
  source: string;
  reason: AuthFailureReason;
}

export type ReportAuthFailure = (failure: AuthFailure) => void;

export interface AuthFailureGroup {
  client_id: string | null;
  source: string;
  reason: AuthFailureReason;
  count: number;
}

export interface AuthFailureSummary {
  window_start: string;
  window_end: string;
  total: number;
  /** Largest count first. */
  failures: AuthFailureGroup[];
  /** Failures not in `failures`: their groups came after maxGroups were full. */
  omitted: number;
}

export const AUTH_FAILURE_WINDOW_MS = 60_000;

/** `mc_` / `mcc_` and 16 bytes base64url (domain/ids.ts): the only client ids ever recorded. */
const ISSUED_CLIENT_ID = /^mcc?_[A-Za-z0-9_-]{22}$/;

export class AuthFailureWindow {
  private startedAt: number | null = null;
  private readonly groups = new Map<string, AuthFailureGroup>();
  private total = 0;
  private omitted = 0;

  constructor(
    private readonly windowMs = AUTH_FAILURE_WINDOW_MS,
    private readonly maxGroups = 100,
  ) {}

  /** When the open window ends, or null when none is open. */
  get endsAt(): number | null {
    return this.startedAt === null ? null : this.startedAt + this.windowMs;
  }

  add(failure: AuthFailure, now: number): void {
    this.startedAt ??= now;
    this.total++;
    const clientId =
      failure.clientId !== null && ISSUED_CLIENT_ID.test(failure.clientId) ? failure.clientId : null;
    const key = JSON.stringify([clientId, failure.source, failure.reason]);
    const group = this.groups.get(key);
    if (group) group.count++;
    else if (this.groups.size < this.maxGroups)
      this.groups.set(key, { client_id: clientId, source: failure.source, reason: failure.reason, count: 1 });
    else this.omitted++;
  }

  /** The summary of the window once it has ended at `now` (and a fresh start), else undefined. */
  take(now: number): AuthFailureSummary | undefined {
    const endsAt = this.endsAt;
    if (endsAt === null || now < endsAt) return undefined;
    return this.flush(now);
  }

  /** The open window's summary whatever the time (at stop), or undefined when none is open. */
  flush(now: number): AuthFailureSummary | undefined {
    if (this.startedAt === null) return undefined;
    const summary: AuthFailureSummary = {
      window_start: isoTime(this.startedAt),
      window_end: isoTime(Math.min(now, this.startedAt + this.windowMs)),
      total: this.total,
      failures: [...this.groups.values()].sort((a, b) => b.count - a.count),
      omitted: this.omitted,
    };
    this.startedAt = null;
    this.groups.clear();
    this.total = 0;
    this.omitted = 0;
    return summary;
  }
}

/** How often an open window is looked at: the clock may move by more than the timer (tests). */
const CHECK_MS = 1000;

export class AuthFailureReporter {
  private readonly window: AuthFailureWindow;
  private timer: NodeJS.Timeout | undefined;

  /** @param agent this agent's peer id: the resource of its `auth.failures` events. */
  constructor(
    private readonly clock: Clock,
    private readonly record: RecordObserved,
    private readonly agent: string,
    windowMs = AUTH_FAILURE_WINDOW_MS,
  ) {
    this.window = new AuthFailureWindow(windowMs);
  }

  readonly report: ReportAuthFailure = (failure) => {
    this.window.add(failure, this.clock.now());
    if (!this.timer) {
      this.timer = setInterval(() => this.check(), CHECK_MS);
      this.timer.unref();
    }
  };

  /** Reports the open window now (the agent stops: what was counted is not lost). */
  stop(): void {
    this.stopTimer();
    this.emit(this.window.flush(this.clock.now()));
  }

  private check(): void {
    const summary = this.window.take(this.clock.now());
    if (!summary) return;
    this.stopTimer();
    this.emit(summary);
  }

  private stopTimer(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  private emit(summary: AuthFailureSummary | undefined): void {
    if (!summary) return;
    this.record({
      type: 'auth.failures',
      resource: { kind: 'agent', id: this.agent },
      data: { ...summary },
    });
  }
}
