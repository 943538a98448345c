/**
 * The agent-to-agent handshake endpoints (internal, docs/decisions.md §5). They take no OAuth token: a
 * joining agent has no credential of this cluster yet. Each message is authenticated instead by
 * an Ed25519 signature over a nonce the other side chose (cluster/handshake-protocol.ts), and
 * only agents under the same license get past the first step.
 */
import type { FastifyInstance } from 'fastify';
import type { ConfirmRequest, HelloRequest } from '../../cluster/handshake-protocol.js';
import type { AppDeps } from '../app.js';
import { ConfirmBody, ConfirmReply, errorResponses, HelloBody, HelloReply } from '../schemas.js';

export function registerHandshakeRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.post(
    '/internal/v1/handshake/hello',
    {
      schema: {
        tags: ['internal'],
        summary: 'Handshake step 1 (agent to agent): authenticated by Ed25519 signatures, no token',
        body: HelloBody,
        response: { 200: HelloReply, ...errorResponses(400, 409, 413, 422, 503) },
      },
    },
    async (request) => deps.peers.hello(request.body as HelloRequest),
  );

  app.post(
    '/internal/v1/handshake/confirm',
    {
      schema: {
        tags: ['internal'],
        summary: 'Handshake step 2 (agent to agent): authenticated by Ed25519 signatures, no token',
        body: ConfirmBody,
        response: { 200: ConfirmReply, ...errorResponses(400, 409, 413, 422) },
      },
    },
    async (request) => deps.peers.confirm(request.body as ConfirmRequest),
  );
}
