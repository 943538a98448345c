/**
 * The `webhooks` table (migration 7): the SQL of the webhook endpoints and of their queues, which
 * src/webhooks/ drives. Each endpoint's queue is the event log itself read from its `cursor`
 * through its type filter, so the queries here also read the `events` table (migration 6).
 * Used through Store.webhookTable, on the Store's one connection.
 */
import type { Statement } from 'better-sqlite3';
import type { Db } from './database.js';

export interface WebhookRecord {
  id: string;
  url: string;
  /** Type prefixes an event must start with (one is enough); empty: every event. */
  types: string[];
  /** `whsec_` + base64 (Standard Webhooks): the HMAC key of the signatures. */
  secret: string;
  createdAt: string;
  /** Events up to this seq are done for this endpoint: delivered, given up, or not matching. */
  cursor: number;
  /** Failed attempts in a row (0 while deliveries succeed). */
  failures: number;
  /** No attempt before this (ms since the epoch). */
  nextAttemptAt: number;
  failingSince: string | null;
  lastError: string | null;
  lastErrorAt: string | null;
  lastDeliveredAt: string | null;
  delivered: number;
  givenUp: number;
  lastGivenUpSeq: number | null;
}

/** What a delivery attempt changes in a row. */
export type WebhookProgress = Omit<WebhookRecord, 'id' | 'url' | 'types' | 'secret' | 'createdAt'>;

/** The part of a webhook that its deliveries change, as saveProgress() takes it. */
export function progressOf(w: WebhookRecord): WebhookProgress {
  const { id: _id, url: _url, types: _types, secret: _secret, createdAt: _createdAt, ...progress } = w;
  return progress;
}

interface WebhookRow {
  id: string;
  url: string;
  types: string;
  secret: string;
  created_at: string;
  cursor: number;
  failures: number;
  next_attempt_at: number;
  failing_since: string | null;
  last_error: string | null;
  last_error_at: string | null;
  last_delivered_at: string | null;
  delivered: number;
  given_up: number;
  last_given_up_seq: number | null;
}

const toWebhook = (r: WebhookRow): WebhookRecord => ({
  id: r.id,
  url: r.url,
  types: JSON.parse(r.types) as string[],
  secret: r.secret,
  createdAt: r.created_at,
  cursor: r.cursor,
  failures: r.failures,
  nextAttemptAt: r.next_attempt_at,
  failingSince: r.failing_since,
  lastError: r.last_error,
  lastErrorAt: r.last_error_at,
  lastDeliveredAt: r.last_delivered_at,
  delivered: r.delivered,
  givenUp: r.given_up,
  lastGivenUpSeq: r.last_given_up_seq,
});

/** Above every character a type may hold: the prefix match as a range (event-table.ts). */
const MAX_CHAR = '\u{10FFFF}';

/** Pending events are counted up to this many (docs/events.md, "Webhooks"). */
export const MAX_COUNTED = 10_000;

/** An event of an endpoint's queue: enough to pick it and to judge its age. */
export interface QueuedEvent {
  seq: number;
  time: string;
}

export class WebhookTable {
  private readonly stmts;
  /** Queue reads by number of type prefixes: each filter shape has its own statement. */
  private readonly queueStmts = new Map<number, { list: Statement; count: Statement }>();

  constructor(private readonly db: Db) {
    this.stmts = {
      insert: db.prepare(
        `INSERT INTO webhooks (id, url, types, secret, created_at, cursor)
         VALUES (@id, @url, @types, @secret, @createdAt, @cursor)`,
      ),
      all: db.prepare('SELECT * FROM webhooks ORDER BY created_at, id'),
      byId: db.prepare('SELECT * FROM webhooks WHERE id = ?'),
      delete: db.prepare('DELETE FROM webhooks WHERE id = ?'),
      progress: db.prepare(
        `UPDATE webhooks SET cursor = @cursor, failures = @failures, next_attempt_at = @nextAttemptAt,
           failing_since = @failingSince, last_error = @lastError, last_error_at = @lastErrorAt,
           last_delivered_at = @lastDeliveredAt, delivered = @delivered, given_up = @givenUp,
           last_given_up_seq = @lastGivenUpSeq
         WHERE id = @id`,
      ),
    };
  }

  insert(w: Pick<WebhookRecord, 'id' | 'url' | 'types' | 'secret' | 'createdAt' | 'cursor'>): void {
    this.stmts.insert.run({ ...w, types: JSON.stringify(w.types) });
  }

  /** Oldest first. */
  all(): WebhookRecord[] {
    return (this.stmts.all.all() as WebhookRow[]).map(toWebhook);
  }

  get(id: string): WebhookRecord | undefined {
    const row = this.stmts.byId.get(id) as WebhookRow | undefined;
    return row && toWebhook(row);
  }

  /** Returns false when there was no such webhook. */
  delete(id: string): boolean {
    return this.stmts.delete.run(id).changes === 1;
  }

  /** Returns false when the webhook is gone (deleted while its attempt ran). */
  saveProgress(id: string, p: WebhookProgress): boolean {
    return this.stmts.progress.run({ id, ...p }).changes === 1;
  }

  /** The events after `cursor` that match `types`, oldest first, at most `limit`. */
  queued(cursor: number, types: readonly string[], limit: number): QueuedEvent[] {
    return this.queueStatements(types.length).list.all(this.params(cursor, types, limit)) as QueuedEvent[];
  }

  /** How many events after `cursor` match `types`, up to MAX_COUNTED: the endpoint's pending events. */
  queuedCount(cursor: number, types: readonly string[]): number {
    return this.queueStatements(types.length).count.get(this.params(cursor, types, 0)) as number;
  }

  private params(cursor: number, types: readonly string[], limit: number): Record<string, unknown> {
    const params: Record<string, unknown> = { cursor, limit };
    types.forEach((t, i) => {
      params[`lo${i}`] = t;
      params[`hi${i}`] = t + MAX_CHAR;
    });
    return params;
  }

  private queueStatements(prefixes: number) {
    let s = this.queueStmts.get(prefixes);
    if (!s) {
      const match = (column: string) =>
        prefixes === 0
          ? ''
          : `AND (${Array.from({ length: prefixes }, (_, i) => `(${column} >= @lo${i} AND ${column} < @hi${i})`).join(' OR ')})`;
      s = {
        // In seq order from the cursor (the key), never by the type index (`+type` is the same
        // value but keeps the planner off it): the head is near the cursor, where the index
        // would gather and sort every match after it (37 ms for one prefix over 1M events).
        list: this.db.prepare(
          `SELECT seq, time FROM events WHERE seq > @cursor ${match('+type')} ORDER BY seq LIMIT @limit`,
        ),
        // Counted up to a cap: an endpoint dead for long has as many pending as the log keeps,
        // and counting 1M took 150 to 470 ms of the event loop per list or scrape.
        count: this.db
          .prepare(
            `SELECT count(*) FROM (SELECT 1 FROM events WHERE seq > @cursor ${match('type')} LIMIT ${MAX_COUNTED})`,
          )
          .pluck(),
      };
      this.queueStmts.set(prefixes, s);
    }
    return s;
  }
}
