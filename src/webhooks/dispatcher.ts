/**
 * Delivers the event log to every webhook endpoint (docs/events.md, "Webhooks"): at least once,
 * in order per endpoint, retried on the schedule of retry-schedule.ts. Each endpoint has its own
 * worker and its own queue in the store (its cursor over the log's seq, store/webhook-table.ts),
 * so a slow or dead receiver holds back only its own deliveries. A failure is written at once; the
 * cursor after successes at most once a second (PROGRESS_WRITE_MS), so a restart (kill -9
 * included) goes on from at most a second's deliveries back: those, and an attempt that was under
 * way, are sent again (at least once; receivers dedupe by `webhook-id`). Nothing undelivered is
 * ever skipped. Built and stopped by the agent (src/agent.ts); webhooks.ts tells it of endpoints made and deleted.
 */
import type { Logger } from 'pino';
import { type Clock, isoTime } from '../domain/clock.js';
import type { EventLog, MeshEvent } from '../events/event-log.js';
import { progressOf, type WebhookRecord, type WebhookTable } from '../store/webhook-table.js';
import { attemptDelivery, DeliveryAgents } from './delivery.js';
import { giveUpAt, nextAttemptAt } from './retry-schedule.js';
import type { WebhookMetrics } from './webhook-metrics.js';

/** Whether an event of `type` is for an endpoint with these type prefixes (none: all). */
export const typeMatches = (prefixes: readonly string[], type: string): boolean =>
  prefixes.length === 0 || prefixes.some((p) => type.startsWith(p));

/**
 * A worker sleeps at most this long between looks at the clock: the retry waits reach 6 h, and a
 * timer that long would not notice the clock moving under it.
 */
const MAX_SLEEP_MS = 60_000;
/** How long a worker that failed waits before it is started again. */
const WORKER_RESTART_MS = 5000;
/** Events given up per read when an endpoint's deadline passes for many at once. */
const GIVE_UP_BATCH = 1000;
/**
 * The longest a delivered event's cursor waits in memory before it is written. A write per
 * delivery (one fsync under synchronous=FULL) took 35 % of the event loop while two endpoints
 * took a burst of 2000 events (bench/webhooks/throughput.ts); what a crash loses is only a
 * second of re-sent events, never an unsent one.
 */
export const PROGRESS_WRITE_MS = 1000;

export interface DispatcherDeps {
  table: WebhookTable;
  events: EventLog;
  clock: Clock;
  logger: Logger;
  metrics: WebhookMetrics;
  userAgent: string;
}

export class WebhookDispatcher {
  private readonly workers = new Map<string, EndpointWorker>();
  readonly agents = new DeliveryAgents();
  private unsubscribe: (() => void) | undefined;

  constructor(private readonly deps: DispatcherDeps) {}

  /** Starts a worker for every stored endpoint; each goes on from its cursor. */
  start(): void {
    // A new event wakes only the endpoints it is for; the others' cursors lag behind over events
    // they skip, which their next read passes in one query.
    this.unsubscribe = this.deps.events.subscribe((e) => {
      for (const w of this.workers.values()) if (typeMatches(w.types, e.type)) w.wake();
    });
    for (const w of this.deps.table.all()) this.added(w);
  }

  /** A webhook was created: its worker starts (nothing is queued for it yet). */
  added(w: Pick<WebhookRecord, 'id' | 'types'>): void {
    if (!this.unsubscribe || this.workers.has(w.id)) return;
    const worker = new EndpointWorker(w.id, w.types, this.deps, this.agents);
    this.workers.set(w.id, worker);
    worker.run().catch((err: unknown) => {
      // A store that failed under it (disk full, say): its queue is intact in the store, so a
      // new worker goes on from there once the store may answer again.
      this.deps.logger.error({ err, webhook_id: w.id }, 'webhook worker failed; restarting it');
      setTimeout(() => {
        if (this.workers.get(w.id) !== worker) return;
        this.workers.delete(w.id);
        this.added(w);
      }, WORKER_RESTART_MS).unref();
    });
  }

  /** An endpoint's delivery state as it is now, its latest successes included (the row may lag by a second). */
  progress(id: string): WebhookRecord | undefined {
    return this.workers.get(id)?.current;
  }

  /** A webhook was deleted: its attempt under way is aborted and its worker ends. */
  removed(id: string): void {
    this.workers.get(id)?.stop(false);
    this.workers.delete(id);
  }

  /** Aborts the attempts under way (their events are sent again after a restart) and waits for the workers. */
  async stop(): Promise<void> {
    this.unsubscribe?.();
    this.unsubscribe = undefined;
    const running = [...this.workers.values()].map((w) => w.stop());
    this.workers.clear();
    await Promise.all(running);
    this.agents.destroy();
  }
}

class EndpointWorker {
  private stopped = false;
  private readonly abort = new AbortController();
  private woken = false;
  /** Ends the current sleep: set while sleeping; `byEvents` while waiting for new events. */
  private sleeper: { end: () => void; byEvents: boolean } | undefined;
  private done: Promise<void> = Promise.resolve();
  /** The row as of the last look, with the successes not yet written. */
  current: WebhookRecord | undefined;
  private unwritten = false;
  private lastWriteAt = 0;
  private writeTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly id: string,
    readonly types: readonly string[],
    private readonly deps: DispatcherDeps,
    private readonly agents: DeliveryAgents,
  ) {}

  wake(): void {
    this.woken = true;
    if (this.sleeper?.byEvents) this.sleeper.end();
  }

  /** `keep`: write what is held in memory (false once the webhook is deleted). */
  async stop(keep = true): Promise<void> {
    this.stopped = true;
    this.abort.abort();
    this.sleeper?.end();
    await this.done;
    clearTimeout(this.writeTimer);
    if (keep) this.write();
  }

  run(): Promise<void> {
    this.done = this.loop();
    return this.done;
  }

  private async loop(): Promise<void> {
    const { table, events, clock } = this.deps;
    this.current = table.get(this.id);
    while (!this.stopped) {
      const w = this.current;
      if (!w) return;
      const now = clock.now();
      if (w.nextAttemptAt > now) {
        // New events wait behind the head as well: only the time (or stop) ends this.
        await this.sleep(w.nextAttemptAt - now, false);
        continue;
      }
      this.woken = false;
      const [head] = table.queued(w.cursor, w.types, 1);
      // Read synchronously after the queue: nothing can delete it in between.
      const event = head && events.after(head.seq - 1, { limit: 1 })[0];
      if (!event) {
        await this.sleep(Number.POSITIVE_INFINITY, true);
        continue;
      }
      const outcome = await attemptDelivery(w, event.id, JSON.stringify(event), {
        agents: this.agents,
        userAgent: this.deps.userAgent,
        signal: this.abort.signal,
      });
      // Stopped or deleted meanwhile: nothing is recorded, and after a restart it is sent again.
      if (this.stopped) return;
      if (outcome.delivered) this.delivered(w, event);
      else this.failed(w, event, outcome.error ?? 'failed');
    }
  }

  private delivered(w: WebhookRecord, event: MeshEvent): void {
    const { clock, logger, metrics } = this.deps;
    if (w.failingSince !== null) {
      logger.info({ webhook_id: w.id, failing_since: w.failingSince }, 'webhook receiver answers again');
    }
    this.current = {
      ...w,
      cursor: event.seq,
      failures: 0,
      nextAttemptAt: 0,
      failingSince: null,
      lastDeliveredAt: isoTime(clock.now()),
      delivered: w.delivered + 1,
    };
    this.unwritten = true;
    // A recovery is written at once, as a failure is; a run of successes once a second.
    if (w.failingSince !== null || performance.now() - this.lastWriteAt >= PROGRESS_WRITE_MS) this.write();
    else this.writeTimer ??= setTimeout(() => this.write(), PROGRESS_WRITE_MS);
    metrics.count('delivered');
  }

  private failed(w: WebhookRecord, event: MeshEvent, error: string): void {
    const { clock, logger, metrics, table } = this.deps;
    const now = clock.now();
    const failingSince = w.failingSince ?? isoTime(now);
    const since = Date.parse(failingSince);
    // One line when the failures begin, not one per attempt: a dead receiver must not flood the log.
    if (w.failingSince === null) {
      logger.warn(
        { webhook_id: w.id, seq: event.seq, error },
        'webhook delivery failed; retrying with backoff',
      );
    } else {
      logger.debug(
        { webhook_id: w.id, seq: event.seq, error, failures: w.failures + 1 },
        'webhook delivery failed',
      );
    }
    let cursor = w.cursor;
    let givenUp = 0;
    let lastGivenUpSeq = w.lastGivenUpSeq;
    // The head's last attempt has failed: it is given up, and with it every event behind it
    // whose own 24 h are over too (without one attempt each, which for a receiver that times out
    // would take 10 s per event, longer than events may keep arriving).
    if (now >= giveUpAt(Date.parse(event.time), since)) {
      for (;;) {
        const batch = table.queued(cursor, w.types, GIVE_UP_BATCH);
        const expired = batch.findIndex((q) => now < giveUpAt(Date.parse(q.time), since));
        const over = expired === -1 ? batch : batch.slice(0, expired);
        if (over.length > 0) {
          cursor = over.at(-1)!.seq;
          lastGivenUpSeq = cursor;
          givenUp += over.length;
        }
        if (expired !== -1 || batch.length < GIVE_UP_BATCH) break;
      }
      logger.warn(
        { webhook_id: w.id, events: givenUp, first_seq: event.seq, last_seq: cursor, error },
        'webhook events given up after their last attempt',
      );
      metrics.count('given_up', givenUp);
    }
    const [next] = table.queued(cursor, w.types, 1);
    const deadline = next ? giveUpAt(Date.parse(next.time), since) : Number.POSITIVE_INFINITY;
    this.current = {
      ...w,
      cursor,
      failures: w.failures + 1,
      nextAttemptAt: nextAttemptAt(w.failures + 1, now, deadline),
      failingSince,
      lastError: error,
      lastErrorAt: isoTime(now),
      givenUp: w.givenUp + givenUp,
      lastGivenUpSeq,
    };
    this.unwritten = true;
    this.write();
    metrics.count('failed');
  }

  /** Writes the state held in memory; a deleted webhook's row is gone, and its worker stops. */
  private write(): void {
    clearTimeout(this.writeTimer);
    this.writeTimer = undefined;
    const w = this.current;
    if (!w || !this.unwritten) return;
    this.unwritten = false;
    this.lastWriteAt = performance.now();
    if (!this.deps.table.saveProgress(w.id, progressOf(w))) {
      this.stopped = true;
      this.current = undefined;
    }
  }

  /**
   * Until `ms` pass or stop(); with `byEvents`, also until wake(), and at once when one came
   * since the queue was last read.
   */
  private sleep(ms: number, byEvents: boolean): Promise<void> {
    if (this.stopped || (byEvents && this.woken)) return Promise.resolve();
    return new Promise((resolve) => {
      const end = () => {
        clearTimeout(timer);
        this.sleeper = undefined;
        resolve();
      };
      const timer = setTimeout(end, Math.min(ms, MAX_SLEEP_MS));
      this.sleeper = { end, byEvents };
    });
  }
}
