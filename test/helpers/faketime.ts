/**
 * A movable clock for an agent process, outside the product: the agent runs under libfaketime
 * (Debian package `libfaketime`), which offsets what the process reads as the wall clock by the
 * amount written in a file. Timers and other monotonic time are not moved (the agent's intervals
 * and timeouts keep real pace); Date.now() and everything built on it (tokens, licenses, grace
 * periods, tombstone horizons, one-time codes) jumps. The clock only moves forward.
 *
 * libfaketime reads the file again at most once per FAKETIME_CACHE_DURATION (1 s), so advance()
 * waits until the agent's answers carry the new time.
 */
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ApiClient } from './api-client.js';

export const LIBFAKETIME = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';

/** Above this much of a move, the agent's Date header tells it from the time before the move. */
const VISIBLE_MOVE_MS = 4000;
/** libfaketime's cache (1 s) plus Node's per-second Date header cache, with room. */
const SETTLE_MS = 2500;

export class MovableClock {
  private offset = 0;
  private readonly file: string;

  constructor() {
    if (!existsSync(LIBFAKETIME)) {
      throw new Error(
        `${LIBFAKETIME} is missing: install the Debian package libfaketime (scripts/test-setup.mjs installs it)`,
      );
    }
    this.file = join(mkdtempSync(join(tmpdir(), 'mesh-agent-clock-')), 'offset');
    this.write();
  }

  /** How far the agent's clock is ahead of the test's (it stays so across restarts). */
  get offsetMs(): number {
    return this.offset;
  }

  /** The environment that runs a process on this clock. */
  get env(): Record<string, string> {
    return {
      LD_PRELOAD: LIBFAKETIME,
      FAKETIME_TIMESTAMP_FILE: this.file,
      FAKETIME_DONT_FAKE_MONOTONIC: '1',
      FAKETIME_CACHE_DURATION: '1',
    };
  }

  /** The agent's time, as its clock reads it now. */
  now(): number {
    return Date.now() + this.offset;
  }

  /** Moves the clock forward by `ms` and waits until `client`'s agent answers on the new time. */
  async advance(ms: number, client: ApiClient): Promise<void> {
    if (!(ms >= 0)) throw new Error(`the clock only moves forward, not by ${ms} ms`);
    this.offset += ms;
    this.write();
    if (ms < VISIBLE_MOVE_MS) {
      await new Promise((r) => setTimeout(r, SETTLE_MS));
      return;
    }
    const deadline = Date.now() + 10_000;
    for (;;) {
      const res = await client.raw('GET', '/readyz', { timeoutMs: 2000 });
      const shown = Date.parse(String(res.headers.date));
      // The header is whole seconds and cached for up to one: 2 s of slack, well below the move.
      if (shown >= this.now() - 2000) return;
      if (Date.now() > deadline) {
        throw new Error(`the agent's clock did not move by ${ms} ms within 10 s (Date: ${res.headers.date})`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  private write(): void {
    writeFileSync(this.file, `+${(this.offset / 1000).toFixed(3)}s\n`);
  }
}
