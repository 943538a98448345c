/**
 * A hybrid logical clock (Kulkarni et al., 2014): stamps that follow wall time when clocks agree
 * and still order causally when they do not. Every replicated write is stamped here, and every
 * stamp received by gossip pushes the clock forward, so a write made after seeing another write
 * always sorts after it even if this host's clock is behind. Ties between concurrent writes are
 * broken by the origin peer id, so every agent picks the same winner without trusting clocks.
 *
 * Stamps are fixed-width strings that sort like the tuples they encode, so SQLite and plain
 * string comparison order them without decoding.
 */
import type { Clock } from '../domain/clock.js';

/** 12 hex digits of milliseconds last until the year 10889. */
const WALL_DIGITS = 12;
const COUNTER_DIGITS = 6;
const MAX_COUNTER = 16 ** COUNTER_DIGITS - 1;

/**
 * How far ahead of our own clock a received stamp may be and still move it. A peer with a clock
 * a day fast would otherwise drag every stamp of the cluster a day into the future.
 */
export const MAX_FORWARD_DRIFT_MS = 60_000;

export interface Stamp {
  wall: number;
  counter: number;
  origin: string;
}

export function encodeStamp(s: Stamp): string {
  return `${s.wall.toString(16).padStart(WALL_DIGITS, '0')}.${s.counter
    .toString(16)
    .padStart(COUNTER_DIGITS, '0')}.${s.origin}`;
}

const STAMP_PATTERN = /^([0-9a-f]{12})\.([0-9a-f]{6})\.([0-9a-f]{1,64})$/;

export function decodeStamp(text: string): Stamp | undefined {
  const m = STAMP_PATTERN.exec(text);
  if (!m) return undefined;
  return { wall: Number.parseInt(m[1]!, 16), counter: Number.parseInt(m[2]!, 16), origin: m[3]! };
}

export class HybridClock {
  private last: Stamp;

  constructor(
    private readonly origin: string,
    private readonly clock: Clock,
  ) {
    this.last = { wall: 0, counter: 0, origin };
  }

  /** A stamp for a local write, later than every stamp issued or observed so far. */
  tick(): string {
    const now = this.clock.now();
    if (now > this.last.wall) this.last = { wall: now, counter: 0, origin: this.origin };
    else this.last = { wall: this.last.wall, counter: this.bump(this.last.counter), origin: this.origin };
    return encodeStamp(this.last);
  }

  /**
   * Moves the clock past a stamp seen in a received record. Returns false (and moves nothing)
   * for a stamp further ahead of our wall clock than MAX_FORWARD_DRIFT_MS, unless `stored`: a
   * stamp already in this agent's store was accepted once, and must be passed however far the
   * wall clock has gone back since (a restart after the clock was corrected).
   */
  observe(text: string, stored = false): boolean {
    const seen = decodeStamp(text);
    if (!seen) return false;
    if (!stored && seen.wall > this.clock.now() + MAX_FORWARD_DRIFT_MS) return false;
    if (seen.wall > this.last.wall || (seen.wall === this.last.wall && seen.counter > this.last.counter)) {
      this.last = { wall: seen.wall, counter: seen.counter, origin: this.origin };
    }
    return true;
  }

  private bump(counter: number): number {
    // 16 million writes within one millisecond cannot happen here; refuse rather than wrap.
    if (counter >= MAX_COUNTER) throw new Error('hybrid clock counter overflow');
    return counter + 1;
  }
}
