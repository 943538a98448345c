/** `/v1/peers` reads. Adding, renaming and removing peers arrive with the handshake (part 2). */
import { Type } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import { notFound } from '../../domain/errors.js';
import type { AppDeps } from '../app.js';
import { errorResponses, Peer } from '../schemas.js';
import { peerView } from '../views.js';

export function registerPeerRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.get(
    '/v1/peers',
    {
      schema: {
        tags: ['peers'],
        summary: 'List peers of the cluster',
        security: [{ oauth2: ['urn:vendor:service:peers.read'] }],
        querystring: Type.Object({ is_local: Type.Optional(Type.Boolean()) }),
        response: { 200: Type.Array(Peer), ...errorResponses(400, 401, 403) },
      },
    },
    async (request) => {
      const { is_local } = request.query as { is_local?: boolean };
      const localPeerId = deps.store.agentState()?.localPeerId;
      const peers = deps.store.peers().map((p) => peerView(p, localPeerId));
      return is_local === undefined ? peers : peers.filter((p) => p.is_local === is_local);
    },
  );

  app.get(
    '/v1/peers/:id',
    {
      schema: {
        tags: ['peers'],
        summary: 'One peer',
        security: [{ oauth2: ['urn:vendor:service:peers.read'] }],
        params: Type.Object({ id: Type.String({ maxLength: 256 }) }),
        response: { 200: Peer, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const { id } = request.params as { id: string };
      const peer = deps.store.peer(id);
      if (!peer) throw notFound(`no peer with id ${id}`);
      return peerView(peer, deps.store.agentState()?.localPeerId);
    },
  );
}
