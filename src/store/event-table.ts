/**
 * The `events` table (migrations 6 and 8) and `event_seq_floor`: the SQL of the event log, which
 * src/events/event-log.ts drives. Used through Store.eventTable, on the Store's one connection, so an event inserted
 * inside a Store transaction commits or rolls back with it.
 */
import type { Db } from './database.js';
import type { EventRecord } from './records.js';

interface EventRow {
  seq: number;
  id: string;
  type: string;
  time: string;
  actor: string;
  resource_kind: string;
  resource_id: string;
  data: string;
}

const toEvent = (r: EventRow): EventRecord => ({
  seq: r.seq,
  id: r.id,
  type: r.type,
  time: r.time,
  actor: JSON.parse(r.actor) as EventRecord['actor'],
  resource: { kind: r.resource_kind, id: r.resource_id },
  data: JSON.parse(r.data) as EventRecord['data'],
});

export interface EventFilter {
  /** A prefix of the type. */
  type?: string | undefined;
  /** The exact resource id. */
  resource?: string | undefined;
}

/**
 * Above every character a type may hold: `type >= p AND type < p || MAX` is the prefix match
 * that the (type, seq) index can serve, where LIKE could not (it ignores case by default).
 */
const MAX_CHAR = '\u{10FFFF}';

/**
 * The newest seq ever given: the newest kept, or the highest that retention deleted
 * (`event_seq_floor`), whichever is greater. A new event takes it plus one, so a seq is never
 * given twice, not even after every event is deleted (migration 8 says why not AUTOINCREMENT).
 */
const LAST_SEQ = `max(coalesce((SELECT max(seq) FROM events), 0), (SELECT seq FROM event_seq_floor))`;

export class EventTable {
  private readonly stmts;
  private readonly deleteBatch;
  /** One statement per combination of filters, each with its own index plan. */
  private readonly afterStmts;

  constructor(db: Db) {
    this.stmts = {
      // An id already kept inserts nothing (changes 0), and with the seq given here, uses none up.
      insert: db.prepare(
        `INSERT INTO events (seq, id, type, time, actor, resource_kind, resource_id, data)
         VALUES ((SELECT ${LAST_SEQ} + 1), @id, @type, @time, @actor, @resourceKind, @resourceId, @data)
         ON CONFLICT (id) DO NOTHING`,
      ),
      byId: db.prepare('SELECT * FROM events WHERE id = ?'),
      actorById: db.prepare('SELECT actor FROM events WHERE id = ?').pluck(),
      oldest: db.prepare('SELECT min(seq) FROM events').pluck(),
      last: db.prepare(`SELECT ${LAST_SEQ}`).pluck(),
      pruneUpTo: db
        .prepare(
          `DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq <= ? ORDER BY seq LIMIT ?)
           RETURNING seq`,
        )
        .pluck(),
      // Oldest seq first, up to the first event not older than the limit: no index on time
      // (migration 8), and what a batch reads is the batch. An event recorded late with an old
      // time (a replicated change learned after a partition) goes when those before it go.
      pruneBefore: db
        .prepare(
          `WITH head AS (SELECT seq, time FROM events ORDER BY seq LIMIT @batch)
           DELETE FROM events WHERE seq IN (SELECT seq FROM head WHERE seq <
             coalesce((SELECT min(seq) FROM head WHERE time >= @time), 9007199254740991))
           RETURNING seq`,
        )
        .pluck(),
      raiseFloor: db.prepare('UPDATE event_seq_floor SET seq = max(seq, ?)'),
    };
    // The floor is raised in the delete's transaction, so the highest seq given is never lost.
    this.deleteBatch = db.transaction((deleted: () => number[]) => {
      const seqs = deleted();
      if (seqs.length > 0) this.stmts.raiseFloor.run(Math.max(...seqs));
      return seqs.length;
    });
    const where = (filter: string) =>
      db.prepare(`SELECT * FROM events WHERE seq > @since ${filter} ORDER BY seq LIMIT @limit`);
    this.afterStmts = {
      all: where(''),
      type: where('AND type >= @lo AND type < @hi'),
      resource: where('AND resource_id = @resource'),
      both: where('AND resource_id = @resource AND type >= @lo AND type < @hi'),
    };
  }

  /**
   * Inserts the event and returns it with its seq; an event whose id is already kept is not
   * inserted again: `inserted` is false and the kept one is returned.
   */
  insert(e: Omit<EventRecord, 'seq'>): { event: EventRecord; inserted: boolean } {
    const { changes, lastInsertRowid } = this.stmts.insert.run({
      id: e.id,
      type: e.type,
      time: e.time,
      actor: JSON.stringify(e.actor),
      resourceKind: e.resource.kind,
      resourceId: e.resource.id,
      data: JSON.stringify(e.data),
    });
    if (changes === 0) return { event: toEvent(this.stmts.byId.get(e.id) as EventRow), inserted: false };
    return { event: { seq: Number(lastInsertRowid), ...e }, inserted: true };
  }

  /** The actor of the event with this id, if it is kept. */
  actorOf(id: string): EventRecord['actor'] | undefined {
    const actor = this.stmts.actorById.get(id) as string | undefined;
    return actor === undefined ? undefined : (JSON.parse(actor) as EventRecord['actor']);
  }

  after(since: number, limit: number, filter: EventFilter = {}): EventRecord[] {
    const params: Record<string, unknown> = { since, limit };
    if (filter.type !== undefined) {
      params.lo = filter.type;
      params.hi = filter.type + MAX_CHAR;
    }
    if (filter.resource !== undefined) params.resource = filter.resource;
    const stmt =
      filter.type !== undefined
        ? filter.resource !== undefined
          ? this.afterStmts.both
          : this.afterStmts.type
        : filter.resource !== undefined
          ? this.afterStmts.resource
          : this.afterStmts.all;
    return (stmt.all(params) as EventRow[]).map(toEvent);
  }

  oldestSeq(): number | undefined {
    return (this.stmts.oldest.get() as number | null) ?? undefined;
  }

  lastSeq(): number {
    return this.stmts.last.get() as number;
  }

  /** Deletes at most `batch` events with seq <= `seq`, oldest first; returns how many. */
  deleteUpTo(seq: number, batch: number): number {
    return this.deleteBatch(() => this.stmts.pruneUpTo.all(seq, batch) as number[]);
  }

  /**
   * Deletes at most `batch` events whose time is before `time`, in seq order from the oldest,
   * stopping at the first that is not; returns how many.
   */
  deleteBefore(time: string, batch: number): number {
    return this.deleteBatch(() => this.stmts.pruneBefore.all({ time, batch }) as number[]);
  }
}
