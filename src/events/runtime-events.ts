/**
 * The runtime events of this agent (docs/events.md "Runtime events"): what the cluster, the data
 * plane, auth and the API observe and report through a `RecordObserved` function, recorded in the
 * event log with this agent as the actor. Only agent.ts builds it.
 *
 * Reachability (`peer.reachable` / `peer.unreachable`) and health (`service.health_changed`) are
 * states, not happenings: an observation is recorded only when it differs from the last state the
 * log holds for that peer or service, or from the default (reachable, healthy) when it holds none.
 * The last state is read from the log once per peer or service, so a restart neither repeats a
 * state the log already says nor leaves a stale one standing when the first observation after it
 * differs. Everything else is recorded as reported: its sources report once per change.
 *
 * Recording never throws into its caller: an observation arrives from a failure detector's
 * listener or a data plane timer, where an exception would stop more than this event.
 */
import type { Logger } from 'pino';
import type { ObservedEvent } from '../domain/observed-event.js';
import type { EventLog, MeshEvent } from './event-log.js';

/** Every runtime event type, as docs/events.md "Runtime events" lists them (a test checks). */
export const RUNTIME_EVENT_TYPES = [
  'peer.reachable',
  'peer.unreachable',
  'tunnel.up',
  'tunnel.down',
  'service.health_changed',
  'service.failover',
  'dataplane.drift_repaired',
  'license.expiring',
  'license.expired',
  'license.limit_refused',
  'auth.failures',
] as const;

/** A state kept per resource: its event types, the state an event says, and the state assumed. */
interface StateFamily {
  types: readonly string[];
  /** The state an event of this family says; null: it says none (not recorded). */
  stateOf(event: Pick<ObservedEvent, 'type' | 'data'>): string | null;
  /** What holds when the log says nothing: the default that needs no event. */
  initial: string;
}

const healthState = (data: Record<string, unknown>): string | null =>
  data.state === 'unknown' || typeof data.state !== 'string'
    ? null
    : typeof data.reason === 'string'
      ? `${data.state}/${data.reason}`
      : data.state;

const FAMILIES: readonly StateFamily[] = [
  {
    types: ['peer.reachable', 'peer.unreachable'],
    stateOf: (e) => e.type,
    initial: 'peer.reachable',
  },
  {
    types: ['service.health_changed'],
    // `unknown` is what a service is before its tunnel first answers: not an observation.
    stateOf: (e) => healthState(e.data),
    initial: 'healthy',
  },
];

/** Page size of the log reads that look for a resource's events (the contract's maximum). */
const PAGE = 1000;

/** The events of `type` (exact) about `resource`, oldest first, read from the log's start. */
export function* eventsAbout(
  log: Pick<EventLog, 'after'>,
  type: string,
  resource: string,
): Generator<MeshEvent> {
  let since = 0;
  for (;;) {
    const page = log.after(since, { type, resource, limit: PAGE });
    for (const e of page) if (e.type === type) yield e;
    if (page.length < PAGE) return;
    since = page[page.length - 1]!.seq;
  }
}

/** The last event of `type` (exact) about `resource`, or undefined. */
export function lastEventOf(
  log: Pick<EventLog, 'after'>,
  type: string,
  resource: string,
): MeshEvent | undefined {
  let last: MeshEvent | undefined;
  for (const e of eventsAbout(log, type, resource)) last = e;
  return last;
}

export class RuntimeEvents {
  /** The last state recorded, by family and resource id (filled from the log on first use). */
  private readonly states = new Map<string, string>();

  constructor(
    private readonly log: Pick<EventLog, 'record' | 'after'>,
    private readonly logger: Logger,
  ) {}

  /** The RecordObserved given to the parts that observe. */
  readonly record = (event: ObservedEvent): void => {
    try {
      this.recordOrSkip(event);
    } catch (err) {
      this.logger.error({ err, type: event.type }, 'a runtime event could not be recorded');
    }
  };

  private recordOrSkip(event: ObservedEvent): void {
    const family = FAMILIES.find((f) => f.types.includes(event.type));
    if (family) {
      const state = family.stateOf(event);
      if (state === null) return;
      const key = `${FAMILIES.indexOf(family)}|${event.resource.id}`;
      const last = this.states.get(key) ?? this.lastRecorded(family, event.resource.id);
      if (state === last) {
        this.states.set(key, last);
        return;
      }
      this.log.record({ type: event.type, resource: event.resource, data: event.data });
      this.states.set(key, state);
      return;
    }
    this.log.record({ type: event.type, resource: event.resource, data: event.data });
  }

  private lastRecorded(family: StateFamily, resource: string): string {
    let last: MeshEvent | undefined;
    for (const type of family.types) {
      const e = lastEventOf(this.log, type, resource);
      if (e && (!last || e.seq > last.seq)) last = e;
    }
    return (last && family.stateOf(last)) ?? family.initial;
  }
}
