/**
 * The event log of this agent (docs/events.md): what changed in the configuration, and what the
 * agent observed, in the order this agent recorded it. Each event has a per-agent `seq` that is
 * never reused and a cluster-wide `id` (the same config change has the same id on every agent).
 * The running agent holds one EventLog (src/agent.ts); the API reads it, webhooks and the SSE
 * stream subscribe to it, and whatever changes the configuration or observes the runtime records
 * into it. Storage is the `events` table (src/store/event-table.ts) on the Store's connection.
 */
import { randomUUID } from 'node:crypto';
import { type Clock, isoTime } from '../domain/clock.js';
import type { Store } from '../store/store.js';

/** Who caused an event: for API writes the OAuth2 client and the agent (peer id) that took the
 *  request; for what an agent observes, client_id null and agent = that agent's peer id. */
export interface EventActor {
  client_id: string | null;
  agent: string;
}

export interface MeshEvent {
  /** Per agent, strictly increasing, never reused (src/store/event-table.ts, LAST_SEQ). */
  seq: number;
  /** Unique in the cluster: the same config change has the same id on every agent. */
  id: string;
  /** `<resource>.<what happened>`, e.g. `service.created`, `peer.unreachable`. */
  type: string;
  /** RFC 3339 UTC with milliseconds. */
  time: string;
  actor: EventActor;
  resource: { kind: string; id: string };
  /** Config events: { before, after } of the changed fields; never a secret. */
  data: Record<string, unknown>;
}

export interface NewEvent {
  type: string;
  resource: { kind: string; id: string };
  data: Record<string, unknown>;
  /** Default: this agent, client_id null. */
  actor?: EventActor;
  /** Default: a random UUID. */
  id?: string;
  /**
   * When it happened; default now. A config change gossiped from another agent keeps the time
   * its origin made it, so that one change reads the same on every agent.
   */
  time?: string;
}

export const MAX_EVENTS_PER_READ = 1000;
/** Lower-case words joined by dots, at least two: `service.created`, `peer.health_changed`. */
const TYPE_FORMAT = /^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$/;

export class EventLog {
  private readonly listeners = new Set<(e: MeshEvent) => void>();
  /** Committed events not yet handed to every listener: see deliver(). */
  private readonly undelivered: MeshEvent[] = [];
  private delivering = false;

  /**
   * `agent` is this agent's peer id (the default actor); `onListenerError` hears what a
   * listener threw, which must not undo or stop a write that has already committed.
   */
  constructor(
    private readonly store: Store,
    private readonly agent: string,
    private readonly clock: Clock,
    private readonly onListenerError: (err: unknown) => void = () => {},
  ) {}

  /**
   * Appends; durable when it returns. Inside a Store transaction, it commits with that
   * transaction (listeners are told after the commit, never for a rolled-back one). An id the
   * log already holds is not recorded twice: the kept event is returned and nobody is told.
   */
  record(e: NewEvent): MeshEvent {
    if (!TYPE_FORMAT.test(e.type))
      throw new Error(`event type ${JSON.stringify(e.type)} is not <resource>.<what>`);
    const { event, inserted } = this.store.eventTable.insert({
      id: e.id ?? randomUUID(),
      type: e.type,
      time: e.time ?? isoTime(this.clock.now()),
      actor: e.actor ?? { client_id: null, agent: this.agent },
      resource: e.resource,
      data: e.data,
    });
    if (inserted) this.store.afterCommit(() => this.deliver(event));
    return event;
  }

  /** The actor of a request this agent took from the API client `clientId` (null: none). */
  actorFor(clientId: string | null): EventActor {
    return { client_id: clientId, agent: this.agent };
  }

  /** Events with seq > since, oldest first; `type` is a prefix (`peer.` matches all peer events);
   *  `resource` an exact resource id; limit 1..1000 (default 1000). */
  after(since: number, opts: { type?: string; resource?: string; limit?: number } = {}): MeshEvent[] {
    const limit = opts.limit ?? MAX_EVENTS_PER_READ;
    if (!Number.isInteger(limit) || limit < 1 || limit > MAX_EVENTS_PER_READ) {
      throw new RangeError(`limit must be an integer from 1 to ${MAX_EVENTS_PER_READ}`);
    }
    return this.store.eventTable.after(since, limit, { type: opts.type, resource: opts.resource });
  }

  /** The oldest kept (retention deletes older ones); undefined when none is kept. */
  oldestSeq(): number | undefined {
    return this.store.eventTable.oldestSeq();
  }

  /** The newest seq ever given (0 when none yet), even if retention has deleted it since. */
  lastSeq(): number {
    return this.store.eventTable.lastSeq();
  }

  /** Called once per event, in seq order, after its commit. Returns the unsubscribe function. */
  subscribe(listener: (e: MeshEvent) => void): () => void {
    // A wrapper, so one function subscribed twice is told twice and unsubscribed once each.
    const entry = (e: MeshEvent) => listener(e);
    this.listeners.add(entry);
    return () => {
      this.listeners.delete(entry);
    };
  }

  /**
   * A listener that records an event (in its own transaction, say) is called from in here; the
   * queue makes every listener hear the first event before any hears the second.
   */
  private deliver(event: MeshEvent): void {
    this.undelivered.push(event);
    if (this.delivering) return;
    this.delivering = true;
    try {
      for (let e = this.undelivered.shift(); e; e = this.undelivered.shift()) {
        for (const l of [...this.listeners]) {
          // One that unsubscribed while an earlier listener ran hears nothing more.
          if (!this.listeners.has(l)) continue;
          try {
            l(e);
          } catch (err) {
            this.onListenerError(err);
          }
        }
      }
    } finally {
      this.delivering = false;
    }
  }
}
