/**
 * `/v1/events` and `/v1/events/stream` (extensions, docs/events.md): this agent's event log,
 * read a page at a time or followed as Server-Sent Events. `admin` or `events.read`.
 */
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import { invalidRequest } from '../../domain/errors.js';
import { MAX_EVENTS_PER_READ } from '../../events/event-log.js';
import type { AppDeps } from '../app.js';
import { EventStreams } from '../event-stream.js';
import { errorResponses } from '../schemas.js';

const DEFAULT_LIMIT = 100;
const Seq = Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER });
const Filters = {
  type: Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 128,
      pattern: '^[a-z0-9_.]+$',
      description: 'a prefix of the event type: `peer.` matches every peer event',
    }),
  ),
  resource: Type.Optional(Type.String({ minLength: 1, maxLength: 128, description: 'an exact resource id' })),
};
const ListQuery = Type.Object({
  since: Type.Optional({ ...Seq, description: 'events after this seq; default 0 (from the oldest kept)' }),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_EVENTS_PER_READ, default: DEFAULT_LIMIT })),
  ...Filters,
});
const StreamQuery = Type.Object({
  since: Type.Optional({
    ...Seq,
    description: 'resume after this seq (the Last-Event-ID header wins); absent: new events only',
  }),
  ...Filters,
});

const EventBody = Type.Object({
  seq: Type.Integer(),
  id: Type.String(),
  type: Type.String(),
  time: Type.String(),
  actor: Type.Object({ client_id: Type.Union([Type.String(), Type.Null()]), agent: Type.String() }),
  resource: Type.Object({ kind: Type.String(), id: Type.String() }),
  data: Type.Record(Type.String(), Type.Unknown()),
});

export function registerEventRoutes(app: FastifyInstance, deps: AppDeps): void {
  const { events } = deps;
  const streams = new EventStreams(events);
  // Before the server stops taking connections: an open stream would hold the close forever.
  app.addHook('preClose', (done) => {
    streams.closeAll();
    done();
  });

  app.get(
    '/v1/events',
    {
      schema: {
        tags: ['events'],
        summary: 'Events after a seq, oldest first (extension, docs/events.md)',
        description:
          '`next` is the `since` of the next read: the last event returned, or, when fewer than ' +
          '`limit` came, the newest seq this agent had given (so a filtered read does not scan ' +
          'the same events again). `oldest_seq` is the oldest kept (null: none kept); a `since` ' +
          'below oldest_seq - 1 asks for events that retention has deleted.',
        querystring: ListQuery,
        response: {
          200: Type.Object({
            events: Type.Array(EventBody),
            next: Type.Integer(),
            oldest_seq: Type.Union([Type.Integer(), Type.Null()]),
          }),
          ...errorResponses(400, 401, 403),
        },
      },
    },
    async (request) => {
      const q = request.query as Static<typeof ListQuery>;
      const since = q.since ?? 0;
      const limit = q.limit ?? DEFAULT_LIMIT;
      const newest = events.lastSeq();
      const page = events.after(since, { type: q.type, resource: q.resource, limit });
      const next = page.length === limit ? page[page.length - 1]!.seq : Math.max(since, newest);
      return { events: page, next, oldest_seq: events.oldestSeq() ?? null };
    },
  );

  app.get(
    '/v1/events/stream',
    {
      schema: {
        tags: ['events'],
        summary: 'Events as Server-Sent Events (extension, docs/events.md)',
        description:
          '`id:` is the seq, `event:` the type, `data:` the event as JSON. Resume with the ' +
          'Last-Event-ID header (or `since`); a cursor older than the oldest kept gets one ' +
          '`resync` event first. A comment every 15 s; a reader too far behind is disconnected ' +
          'and resumes with Last-Event-ID.',
        querystring: StreamQuery,
        produces: ['text/event-stream'],
        response: {
          200: Type.String({ description: 'text/event-stream' }),
          ...errorResponses(400, 401, 403),
        },
      },
    },
    async (request, reply) => {
      const q = request.query as Static<typeof StreamQuery>;
      const header = request.headers['last-event-id'];
      let since: number;
      if (header !== undefined) {
        if (typeof header !== 'string' || !/^(0|[1-9][0-9]{0,15})$/.test(header.trim())) {
          throw invalidRequest('Last-Event-ID must be an event seq: a whole number');
        }
        since = Number(header.trim());
      } else {
        since = q.since ?? events.lastSeq();
      }
      if (!Number.isSafeInteger(since)) throw invalidRequest('the cursor is out of range');
      reply.hijack();
      streams.serve(reply.raw, since, { type: q.type, resource: q.resource });
    },
  );
}
