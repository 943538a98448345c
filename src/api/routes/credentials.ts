/** `/v1/credentials`: API credentials, local to this agent. */
import type { Static } from '@sinclair/typebox';
import { Type } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import type { Scope } from '../../domain/scopes.js';
import type { AppDeps } from '../app.js';
import {
  CredentialCreateBody,
  CredentialCreated,
  CredentialListItem,
  Deleted,
  errorResponses,
} from '../schemas.js';

export function registerCredentialRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.get(
    '/v1/credentials',
    {
      schema: {
        tags: ['credentials'],
        summary: 'List API credentials (never their secrets)',
        response: { 200: Type.Array(CredentialListItem), ...errorResponses(401, 403) },
      },
    },
    async () => deps.credentials.list(),
  );

  app.post(
    '/v1/credentials',
    {
      schema: {
        tags: ['credentials'],
        summary: 'Create an API credential; its secret is shown only in this response',
        description: "Scopes no wider than the caller's token (403 otherwise); empty or absent means admin.",
        body: CredentialCreateBody,
        response: { 201: CredentialCreated, ...errorResponses(400, 401, 403, 413, 422) },
      },
    },
    async (request, reply) => {
      const body = request.body as Static<typeof CredentialCreateBody>;
      const licenseId = deps.store.agentState()?.license.license_id ?? '';
      const created = deps.credentials.create(request.caller!, body.scopes as Scope[] | undefined, licenseId);
      request.log.info({ client_id: created.client_id, scopes: created.scopes }, 'credential created');
      return reply.code(201).send(created);
    },
  );

  app.delete(
    '/v1/credentials/:client_id',
    {
      schema: {
        tags: ['credentials'],
        summary: 'Revoke an API credential; its tokens stop working at once',
        params: Type.Object({ client_id: Type.String({ maxLength: 256 }) }),
        response: { 200: Deleted, ...errorResponses(400, 401, 403, 404, 422) },
      },
    },
    async (request) => {
      const { client_id } = request.params as { client_id: string };
      deps.credentials.revoke(request.caller!, client_id);
      request.log.info({ client_id }, 'credential revoked');
      return { deleted: true as const };
    },
  );
}
