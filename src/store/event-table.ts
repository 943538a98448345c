/**
 * The `events` table (migration 6): the SQL of the event log, which src/events/event-log.ts
 * drives. Used through Store.eventTable, on the Store's one connection, so an event inserted
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

export class EventTable {
  private readonly stmts;
  /** One statement per combination of filters, each with its own index plan. */
  private readonly afterStmts;

  constructor(db: Db) {
    this.stmts = {
      insert: db.prepare(
        `INSERT INTO events (id, type, time, actor, resource_kind, resource_id, data)
         VALUES (@id, @type, @time, @actor, @resourceKind, @resourceId, @data)`,
      ),
      byId: db.prepare('SELECT * FROM events WHERE id = ?'),
      actorById: db.prepare('SELECT actor FROM events WHERE id = ?').pluck(),
      oldest: db.prepare('SELECT min(seq) FROM events').pluck(),
      // The highest seq ever given, deleted or not: AUTOINCREMENT keeps it here.
      last: db.prepare(`SELECT seq FROM sqlite_sequence WHERE name = 'events'`).pluck(),
      pruneUpTo: db.prepare(
        'DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq <= ? ORDER BY seq LIMIT ?)',
      ),
      pruneBefore: db.prepare(
        'DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE time < ? ORDER BY time LIMIT ?)',
      ),
    };
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
    // Looked up first: a conflicting INSERT would still use up a seq, leaving a gap.
    const kept = this.stmts.byId.get(e.id) as EventRow | undefined;
    if (kept) return { event: toEvent(kept), inserted: false };
    const { lastInsertRowid } = this.stmts.insert.run({
      id: e.id,
      type: e.type,
      time: e.time,
      actor: JSON.stringify(e.actor),
      resourceKind: e.resource.kind,
      resourceId: e.resource.id,
      data: JSON.stringify(e.data),
    });
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
    return (this.stmts.last.get() as number | undefined) ?? 0;
  }

  /** Deletes at most `batch` events with seq <= `seq`, oldest first; returns how many. */
  deleteUpTo(seq: number, batch: number): number {
    return this.stmts.pruneUpTo.run(seq, batch).changes;
  }

  /** Deletes at most `batch` events whose time is before `time`; returns how many. */
  deleteBefore(time: string, batch: number): number {
    return this.stmts.pruneBefore.run(time, batch).changes;
  }
}
