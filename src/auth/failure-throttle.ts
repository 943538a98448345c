/**
 * Slows repeated client-authentication failures at the token endpoint (docs/decisions.md §4): from the
 * 11th failure within a minute, per source address and per (client, address) pair, the answer is
 * 429 with Retry-After. Keyed by address, so an attacker elsewhere cannot lock the real client
 * out. Memory is bounded: windows are pruned as they age and the table has a hard cap.
 */
import { createHash } from 'node:crypto';
import type { Clock } from '../domain/clock.js';

export interface ThrottleVerdict {
  limited: boolean;
  /** Whole seconds until the oldest counted failure leaves the window. */
  retryAfterSeconds: number;
}

export class FailureThrottle {
  private readonly failures = new Map<string, number[]>();

  constructor(
    private readonly clock: Clock,
    private readonly maxFailures = 10,
    private readonly windowMs = 60_000,
    private readonly maxKeys = 100_000,
  ) {}

  /** How many addresses and pairs are being tracked (bounded by maxKeys). */
  get trackedKeys(): number {
    return this.failures.size;
  }

  check(address: string, clientId: string | undefined): ThrottleVerdict {
    const now = this.clock.now();
    let retryAfterMs = 0;
    for (const key of this.keys(address, clientId)) {
      const times = this.recent(key, now);
      if (times.length >= this.maxFailures) {
        retryAfterMs = Math.max(retryAfterMs, times[0]! + this.windowMs - now);
      }
    }
    return { limited: retryAfterMs > 0, retryAfterSeconds: Math.max(1, Math.ceil(retryAfterMs / 1000)) };
  }

  recordFailure(address: string, clientId: string | undefined): void {
    const now = this.clock.now();
    if (this.failures.size >= this.maxKeys) this.prune(now);
    for (const key of this.keys(address, clientId)) {
      const times = this.recent(key, now);
      times.push(now);
      this.failures.set(key, times);
    }
  }

  private keys(address: string, clientId: string | undefined): string[] {
    if (clientId === undefined) return [`a|${address}`];
    // Hashed: a client_id is caller-chosen text of any length, and the table keeps many keys.
    const client = createHash('sha256').update(clientId).digest('base64url').slice(0, 22);
    return [`a|${address}`, `c|${client}|${address}`];
  }

  private recent(key: string, now: number): number[] {
    const times = this.failures.get(key);
    if (!times) return [];
    const fresh = times.filter((t) => t > now - this.windowMs);
    if (fresh.length === 0) this.failures.delete(key);
    else if (fresh.length !== times.length) this.failures.set(key, fresh);
    return fresh;
  }

  private prune(now: number): void {
    for (const key of [...this.failures.keys()]) this.recent(key, now);
    // Still full: everything is recent. Forget the oldest entries rather than grow without bound.
    const excess = this.failures.size - Math.floor(this.maxKeys / 2);
    if (excess > 0) {
      let dropped = 0;
      for (const key of this.failures.keys()) {
        if (dropped++ >= excess) break;
        this.failures.delete(key);
      }
    }
  }
}
