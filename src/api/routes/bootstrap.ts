/** `POST /v1/bootstrap`: the one-time initialisation with a signed license. */
import type { Static } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import { bootstrapAgent } from '../../cluster/bootstrap.js';
import type { AppDeps } from '../app.js';
import { BootstrapBody, BootstrapResponse, errorResponses } from '../schemas.js';

export function registerBootstrapRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.post(
    '/v1/bootstrap',
    {
      schema: {
        tags: ['bootstrap'],
        summary: 'Initialise the agent with a signed license; returns the first admin credential once',
        body: BootstrapBody,
        response: { 201: BootstrapResponse, ...errorResponses(400, 409, 413, 422) },
      },
    },
    async (request, reply) => {
      const result = bootstrapAgent(deps.bootstrap, request.body as Static<typeof BootstrapBody>);
      request.log.info({ peer_id: result.peer_id, cluster_id: result.cluster_id }, 'agent bootstrapped');
      return reply.code(201).send(result);
    },
  );
}
