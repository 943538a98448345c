/**
 * Time as an input: everything that expires (tokens, grace periods, throttling windows) takes a
 * Clock, so tests move time instead of sleeping.
 */

export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number;
}

export const systemClock: Clock = { now: () => Date.now() };

/**
 * Timers as an input beside the clock: the parts that wait or repeat take Timers, so the cluster
 * simulator (test/sim) runs many agents in one process on virtual time.
 */
export interface Timers {
  /** Calls `fn` every `ms`; the returned function stops it. */
  every(ms: number, fn: () => void): () => void;
  /** Resolves after `ms`; does not keep the process alive. */
  sleep(ms: number): Promise<void>;
}

export const systemTimers: Timers = {
  every(ms, fn) {
    const timer = setInterval(fn, ms);
    return () => clearInterval(timer);
  },
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms).unref()),
};

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
