/**
 * POST /internal/v1/gossip: agent-to-agent gossip (docs/gossip.md). No OAuth token: every
 * message is an envelope signed by a member's Ed25519 key and MACed with a live cluster key,
 * checked by cluster/gossip.ts before anything is read; a refused message changes nothing and
 * is counted in mesh_gossip_rejected_total.
 */
import type { FastifyInstance } from 'fastify';
import type { AppDeps } from '../app.js';
import { errorResponses, GossipEnvelopeSchema } from '../schemas.js';

/** A full state transfer is the largest message: a license's worth of records. */
const GOSSIP_BODY_LIMIT_BYTES = 16 * 1024 * 1024;

export function registerGossipRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.post(
    '/internal/v1/gossip',
    {
      bodyLimit: GOSSIP_BODY_LIMIT_BYTES,
      schema: {
        tags: ['internal'],
        summary: 'Gossip between agents: signed and MACed envelopes, no token',
        body: GossipEnvelopeSchema,
        response: { 200: GossipEnvelopeSchema, ...errorResponses(400, 401, 403, 413, 503) },
      },
      // Probes arrive every interval from every peer: logging each would drown the log.
      logLevel: 'warn',
      // Refused before the engine could read it (too large, not JSON, another content type, not
      // an envelope): still a refused message, so it is counted like the engine's refusals.
      onError: async (_request, reply) => {
        if (reply.statusCode < 500) deps.gossipUnreadable();
      },
    },
    async (request, reply) => {
      const answer = await deps.gossip(request.body);
      // Typed per status by the schema; the engine picks the status and shapes the body to match.
      return reply.code(answer.status as 200).send(answer.body as never);
    },
  );
}
