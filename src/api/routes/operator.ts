/**
 * What an operator reads beyond the API document (docs/decisions.md §7): Prometheus metrics and the
 * license with its usage against the limits.
 */
import { Type } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import { notFound } from '../../domain/errors.js';
import type { AppDeps } from '../app.js';
import { errorResponses } from '../schemas.js';

const DAY_MS = 86_400_000;

export const LicenseUsage = Type.Object({
  customer_id: Type.String(),
  license_id: Type.String(),
  issued_at: Type.String(),
  expires_at: Type.String(),
  max_nodes: Type.Integer(),
  max_services: Type.Integer(),
  nodes_used: Type.Integer({ description: 'active peers of the cluster' }),
  services_used: Type.Integer({ description: 'services, inactive ones included (docs/decisions.md §5)' }),
  days_to_expiry: Type.Integer({ description: 'whole days left; negative once expired' }),
  expired: Type.Boolean(),
});

export function registerOperatorRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.get(
    '/metrics',
    {
      schema: {
        tags: ['operator'],
        summary: 'Prometheus metrics',
        description: 'A token with any *.read scope or admin, unless the agent runs with --metrics-public.',
        produces: ['text/plain'],
        response: {
          200: Type.String({ description: 'Prometheus text format 0.0.4' }),
          ...errorResponses(401, 403),
        },
      },
    },
    async (_request, reply) => {
      const text = await deps.metrics.registry.metrics();
      return reply.type(deps.metrics.registry.contentType).send(text);
    },
  );

  app.get(
    '/v1/cluster/license',
    {
      schema: {
        tags: ['cluster'],
        summary: 'The license, its usage against the limits and the days to expiry',
        response: { 200: LicenseUsage, ...errorResponses(401, 403, 404) },
      },
    },
    async () => {
      const state = deps.store.agentState();
      if (!state) throw notFound('this agent is not bootstrapped');
      const license = state.license;
      const left = Date.parse(license.expires_at) - deps.clock.now();
      return {
        customer_id: license.customer_id,
        license_id: license.license_id,
        issued_at: license.issued_at,
        expires_at: license.expires_at,
        max_nodes: license.max_nodes,
        max_services: license.max_services,
        nodes_used: deps.store.activePeerIds().length,
        services_used: deps.store.serviceCount(),
        days_to_expiry: Math.floor(left / DAY_MS),
        expired: left <= 0,
      };
    },
  );
}
