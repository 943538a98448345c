/**
 * Keeps the event log within its bounds (docs/events.md, "Retention"): events older than
 * `maxAgeMs`, and the oldest beyond the newest `maxCount`, are deleted on a timer, in batches of
 * `BATCH` with the event loop free between them, so that no delete holds the write lock (or the
 * single thread) for long. A stream or a reader whose cursor falls behind what is kept is told
 * with a `resync` event (api/event-stream.ts).
 */
import { type Clock, isoTime } from '../domain/clock.js';
import type { Store } from '../store/store.js';

export interface RetentionLimits {
  maxAgeMs: number;
  maxCount: number;
}

export const DEFAULT_RETENTION: RetentionLimits = { maxAgeMs: 30 * 86_400_000, maxCount: 1_000_000 };
/** 500 deletes take 4 to 10 ms on the benchmark machine (docs/benchmarks.md, "Events"). */
const BATCH = 500;
const INTERVAL_MS = 60_000;

export class EventRetention {
  private timer: NodeJS.Timeout | undefined;
  private running = false;
  private stopped = false;

  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    private readonly limits: RetentionLimits = DEFAULT_RETENTION,
  ) {}

  /** Prunes now and then every minute until stop(). */
  start(): void {
    this.stopped = false;
    void this.prune();
    this.timer = setInterval(() => void this.prune(), INTERVAL_MS);
    this.timer.unref();
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
  }

  /** One pass: deletes batch after batch until both limits hold; returns how many went. */
  async prune(): Promise<number> {
    if (this.running) return 0;
    this.running = true;
    let deleted = 0;
    try {
      for (;;) {
        if (this.stopped) break;
        const n = this.pruneBatch();
        deleted += n;
        if (n === 0) break;
        await new Promise((r) => setImmediate(r));
      }
    } finally {
      this.running = false;
    }
    return deleted;
  }

  /** At most one batch, in one short transaction; 0 when nothing is over the limits. */
  pruneBatch(): number {
    const events = this.store.eventTable;
    const bySeq = events.deleteUpTo(events.lastSeq() - this.limits.maxCount, BATCH);
    if (bySeq > 0) return bySeq;
    return events.deleteBefore(isoTime(this.clock.now() - this.limits.maxAgeMs), BATCH);
  }
}
