/**
 * `/v1/webhooks` (extension, admin; docs/events.md "Webhooks"): signed deliveries of this agent's
 * event log. The secret is shown once, in the create answer; no other answer, log line or event
 * holds it.
 */
import type { Static } from '@sinclair/typebox';
import { Type } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import { MAX_TYPE_PREFIXES, MAX_URL_LENGTH, TYPE_PREFIX_FORMAT } from '../../webhooks/webhooks.js';
import type { AppDeps } from '../app.js';
import { requestActor } from '../authorize.js';
import { Deleted, errorResponses, NullableString, NullableTimestamp, Timestamp } from '../schemas.js';

const NullableInteger = Type.Unsafe<number | null>({ type: ['integer', 'null'] });

const WebhookCreateBody = Type.Object({
  url: Type.String({
    minLength: 1,
    maxLength: MAX_URL_LENGTH,
    description: 'Where to POST the events: http or https (private and loopback addresses allowed)',
  }),
  types: Type.Optional(
    Type.Array(Type.String({ pattern: TYPE_PREFIX_FORMAT.source }), {
      maxItems: MAX_TYPE_PREFIXES,
      description:
        'Event type prefixes (`peer.`, `service.created`); an event matching one is delivered. Absent or empty: every event',
    }),
  ),
});

const Webhook = Type.Object({
  id: Type.String(),
  url: Type.String(),
  types: Type.Array(Type.String()),
  created_at: Timestamp,
  delivery: Type.Object({
    pending: Type.Integer({ description: 'events waiting for this endpoint' }),
    cursor: Type.Integer({ description: 'the event seq up to which this endpoint is done' }),
    delivered: Type.Integer(),
    given_up: Type.Integer({ description: 'events abandoned after their last attempt (about 24 h)' }),
    last_given_up_seq: NullableInteger,
    last_delivered_at: NullableTimestamp,
    failing_since: NullableTimestamp,
    failures: Type.Integer({ description: 'failed attempts in a row' }),
    last_error: NullableString,
    last_error_at: NullableTimestamp,
    next_attempt_at: NullableTimestamp,
  }),
});

const WebhookCreated = Type.Object({
  ...Webhook.properties,
  secret: Type.String({
    description: 'The signing secret (`whsec_` + base64, Standard Webhooks); shown only in this response',
  }),
});

const WebhookTestResult = Type.Object({
  delivered: Type.Boolean({ description: 'the receiver answered 2xx in time' }),
  status: NullableInteger,
  error: NullableString,
  duration_ms: Type.Integer(),
});

const idParams = Type.Object({ id: Type.String({ minLength: 1, maxLength: 256 }) });

export function registerWebhookRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.get(
    '/v1/webhooks',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'List webhooks and how their deliveries stand (never their secrets)',
        response: { 200: Type.Array(Webhook), ...errorResponses(401, 403) },
      },
    },
    async () => deps.webhooks.list(),
  );

  app.post(
    '/v1/webhooks',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'Create a webhook; its signing secret is shown only in this response',
        description: 'Only events recorded after its creation are delivered to it.',
        body: WebhookCreateBody,
        response: { 201: WebhookCreated, ...errorResponses(400, 401, 403, 413, 422) },
      },
    },
    async (request, reply) => {
      const body = request.body as Static<typeof WebhookCreateBody>;
      const created = deps.webhooks.create(body.url, body.types ?? [], requestActor(deps.events, request));
      request.log.info({ webhook_id: created.id, types: created.types }, 'webhook created');
      return reply.code(201).send(created);
    },
  );

  app.get(
    '/v1/webhooks/:id',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'One webhook and how its deliveries stand (never its secret)',
        params: idParams,
        response: { 200: Webhook, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => deps.webhooks.get((request.params as { id: string }).id),
  );

  app.delete(
    '/v1/webhooks/:id',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'Delete a webhook; what was not yet delivered to it is dropped',
        params: idParams,
        response: { 200: Deleted, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const { id } = request.params as { id: string };
      deps.webhooks.delete(id, requestActor(deps.events, request));
      request.log.info({ webhook_id: id }, 'webhook deleted');
      return { deleted: true as const };
    },
  );

  app.post(
    '/v1/webhooks/:id/test',
    {
      schema: {
        tags: ['webhooks'],
        summary: 'Send one signed `webhook.test` event now and say how the receiver answered',
        description: 'Outside the queue: the test event is not in the log (seq 0) and delays no delivery.',
        params: idParams,
        response: { 200: WebhookTestResult, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) =>
      deps.webhooks.test((request.params as { id: string }).id, requestActor(deps.events, request)),
  );
}
