/**
 * GET /v1/events/stream: the event log as Server-Sent Events (docs/events.md). Written by hand,
 * not with @fastify/sse or better-sse (docs/architecture.md, "Event stream"): the framing is a
 * few lines, and what matters here is ours whichever library frames it: the catch-up read and
 * live delivery joined without a gap or a duplicate, a bounded buffer for a slow reader, and
 * every stream ended when the agent stops.
 *
 * Order of a stream: subscribe (live events buffer from here), send `resync` if the cursor is
 * older than the oldest event kept, send the backlog after the cursor in pages, then the buffer
 * and live events, each only if its seq is above the last one sent.
 */
import type { ServerResponse } from 'node:http';
import type { EventLog, MeshEvent } from '../events/event-log.js';

/** A comment line every this often keeps proxies and the client's read timeout from closing an idle stream. */
export const HEARTBEAT_MS = 15_000;
/**
 * A reader this far behind is cut off (it resumes with Last-Event-ID): bytes queued in the
 * socket beyond what it has taken, or events buffered while the backlog is sent.
 */
export const MAX_QUEUED_BYTES = 4 * 1024 * 1024;
export const MAX_BUFFERED_EVENTS = 10_000;
const PAGE = 1000;

export interface StreamFilter {
  type?: string | undefined;
  resource?: string | undefined;
}

const matches = (e: MeshEvent, f: StreamFilter) =>
  (f.type === undefined || e.type.startsWith(f.type)) &&
  (f.resource === undefined || e.resource.id === f.resource);

/** One SSE message: `id` the seq, `event` the type, `data` the event as one JSON line. */
export const frame = (e: MeshEvent): string =>
  `id: ${e.seq}\nevent: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`;

/**
 * The seq of the first event kept, or the next to be given when none is kept: a cursor below
 * this minus one asks for events that retention has deleted.
 */
export function firstKept(log: EventLog): number {
  return log.oldestSeq() ?? log.lastSeq() + 1;
}

export class EventStreams {
  private readonly open = new Set<() => void>();

  constructor(private readonly log: EventLog) {}

  get count(): number {
    return this.open.size;
  }

  /** Ends every stream: the agent is stopping (clients resume elsewhere or later). */
  closeAll(): void {
    for (const close of [...this.open]) close();
  }

  /**
   * Serves one stream on `res` (headers not yet sent) from after `since` until the client goes,
   * the reader falls too far behind, or closeAll().
   */
  serve(res: ServerResponse, since: number, filter: StreamFilter): void {
    const log = this.log;
    let cursor = since;
    let live = false;
    const buffered: MeshEvent[] = [];
    let closed = false;
    const send = (e: MeshEvent) => {
      if (e.seq <= cursor || closed) return;
      cursor = e.seq;
      if (!matches(e, filter)) return;
      res.write(frame(e));
      if (res.writableLength > MAX_QUEUED_BYTES) close();
    };
    // Subscribed before the backlog is read: an event committed meanwhile is buffered, not lost.
    const unsubscribe = log.subscribe((e) => {
      if (live) send(e);
      else if (buffered.push(e) > MAX_BUFFERED_EVENTS) close();
    });
    const heartbeat = setInterval(() => res.write(': heartbeat\n\n'), HEARTBEAT_MS);
    heartbeat.unref();
    const close = () => {
      if (closed) return;
      closed = true;
      this.open.delete(close);
      unsubscribe();
      clearInterval(heartbeat);
      res.end();
    };
    this.open.add(close);
    res.on('close', close);

    res.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      // nginx buffers responses unless told not to.
      'x-accel-buffering': 'no',
    });
    const first = firstKept(log);
    if (cursor + 1 < first) {
      // Exactly one, then the stream goes on from the oldest kept; its id lets a client that
      // reconnects now resume there and not be told again.
      cursor = first - 1;
      res.write(
        `id: ${cursor}\nevent: resync\ndata: ${JSON.stringify({ oldest_seq: log.oldestSeq() ?? null, requested: since })}\n\n`,
      );
    } else {
      // Something written at once tells the client the stream is open (and flushes the headers).
      res.write(': connected\n\n');
    }
    const catchUp = () => {
      while (!closed) {
        const page = log.after(cursor, { limit: PAGE });
        for (const e of page) send(e);
        if (page.length < PAGE) break;
        // A large backlog goes out as the reader takes it, not all into memory at once.
        if (res.writableLength > MAX_QUEUED_BYTES / 4) {
          res.once('drain', catchUp);
          return;
        }
      }
      if (closed) return;
      live = true;
      for (const e of buffered.splice(0)) send(e);
    };
    catchUp();
  }
}
