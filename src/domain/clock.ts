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

/** ISO 8601 UTC with milliseconds and a `Z` suffix (DECISIONS §3). */
export const isoTime = (ms: number): string => new Date(ms).toISOString();
