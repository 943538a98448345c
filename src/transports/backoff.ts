/**
 * Redial delays for a transport's dialing side: exponential from `minMs` to `maxMs`, each delay
 * shortened by a random part of up to `jitter` of itself, so that peers that lost each other at
 * the same moment (a restart, a partition healing) do not redial in lockstep. Reset after a
 * connection comes up. Used by src/transports only.
 */

export interface BackoffOptions {
  /** First delay. Default 250 ms. */
  minMs?: number;
  /** Ceiling. Default 10 s. */
  maxMs?: number;
  /** Fraction (0..1) of each delay that is random. Default 0.2. */
  jitter?: number;
}

export class Backoff {
  readonly minMs: number;
  readonly maxMs: number;
  readonly jitter: number;
  private attempt = 0;

  constructor(
    options: BackoffOptions = {},
    private readonly random: () => number = Math.random,
  ) {
    this.minMs = options.minMs ?? 250;
    this.maxMs = options.maxMs ?? 10_000;
    this.jitter = options.jitter ?? 0.2;
    if (!(this.minMs > 0) || !(this.maxMs >= this.minMs))
      throw new RangeError('backoff needs 0 < minMs <= maxMs');
    if (!(this.jitter >= 0 && this.jitter <= 1)) throw new RangeError('backoff jitter must be within 0..1');
  }

  /** The delay before the next attempt: within [base * (1 - jitter), base], base = min * 2^n capped. */
  next(): number {
    // 2^attempt overflows nothing: attempt stops growing once the ceiling is reached.
    const base = Math.min(this.maxMs, this.minMs * 2 ** this.attempt);
    if (base < this.maxMs) this.attempt++;
    return Math.round(base * (1 - this.jitter * this.random()));
  }

  reset(): void {
    this.attempt = 0;
  }
}
