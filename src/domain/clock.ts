/**
 * Time as an input: everything that expires (tokens, grace periods, throttling windows) takes a
 * Clock, so tests move time instead of sleeping.
 */

export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number;
}

export const systemClock: Clock = { now: () => Date.now() };

/** A clock that tests move by hand. */
export class ManualClock implements Clock {
  constructor(private ms: number = Date.UTC(2026, 0, 1)) {}
  now(): number {
    return this.ms;
  }
  advance(ms: number): void {
    this.ms += ms;
  }
  set(ms: number): void {
    this.ms = ms;
  }
}

/** ISO 8601 UTC with milliseconds and a `Z` suffix (docs/decisions.md §3). */
export const isoTime = (ms: number): string => new Date(ms).toISOString();

/**
 * The system clock plus an offset that only grows: `--test-hooks` lets tests move a running
 * agent's time forward (across a 24-hour grace period, say) without waiting.
 */
export class OffsetClock implements Clock {
  private offsetMs = 0;
  now(): number {
    return Date.now() + this.offsetMs;
  }
  advance(ms: number): void {
    this.offsetMs += ms;
  }
  get offset(): number {
    return this.offsetMs;
  }
}
