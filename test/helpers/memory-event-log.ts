/**
 * An in-memory twin of the event log's record/after (src/events/event-log.ts contract: seq from 1,
 * `type` a prefix, `resource` exact, `limit`), for unit tests of what reads and writes the log.
 */
import type { MeshEvent, NewEvent } from '../../src/events/event-log.js';

export class MemoryLog {
  readonly events: MeshEvent[] = [];
  reads = 0;
  record(e: NewEvent): MeshEvent {
    const event: MeshEvent = {
      seq: this.events.length + 1,
      id: `id-${this.events.length + 1}`,
      type: e.type,
      time: new Date().toISOString(),
      actor: e.actor ?? { client_id: null, agent: 'self' },
      resource: e.resource,
      data: e.data,
    };
    this.events.push(event);
    return event;
  }
  after(since: number, opts: { type?: string; resource?: string; limit?: number } = {}): MeshEvent[] {
    this.reads++;
    return this.events
      .filter(
        (e) =>
          e.seq > since &&
          (opts.type === undefined || e.type.startsWith(opts.type)) &&
          (opts.resource === undefined || e.resource.id === opts.resource),
      )
      .slice(0, opts.limit ?? 100);
  }
}
