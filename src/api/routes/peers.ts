/** `/v1/peers`: list, read, add by handshake, rename, remove, and leave (`/v1/peers/self`). */
import { Type } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import { notFound } from '../../domain/errors.js';
import type { AppDeps } from '../app.js';
import { requestActor } from '../authorize.js';
import {
  Deleted,
  errorResponses,
  IdParam,
  Peer,
  PeerCreateBody,
  PeerDeactivated,
  PeerUpdateBody,
} from '../schemas.js';
import { peerView } from '../views.js';

const idParams = Type.Object({ id: IdParam });

export function registerPeerRoutes(app: FastifyInstance, deps: AppDeps): void {
  const localId = () => deps.store.agentState()?.localPeerId;

  app.get(
    '/v1/peers',
    {
      schema: {
        tags: ['peers'],
        summary: 'List peers of the cluster',
        querystring: Type.Object({ is_local: Type.Optional(Type.Boolean()) }),
        response: { 200: Type.Array(Peer), ...errorResponses(400, 401, 403) },
      },
    },
    async (request) => {
      const { is_local } = request.query as { is_local?: boolean };
      const local = localId();
      const peers = deps.store.peers().map((p) => peerView(p, local, deps.liveness(p.id)));
      return is_local === undefined ? peers : peers.filter((p) => p.is_local === is_local);
    },
  );

  app.get(
    '/v1/peers/:id',
    {
      schema: {
        tags: ['peers'],
        summary: 'One peer',
        params: idParams,
        response: { 200: Peer, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const { id } = request.params as { id: string };
      const peer = deps.store.peer(id);
      if (!peer) throw notFound(`no peer with id ${id}`);
      return peerView(peer, localId(), deps.liveness(peer.id));
    },
  );

  app.post(
    '/v1/peers',
    {
      schema: {
        tags: ['peers'],
        summary: 'Add a peer by its address: identity check, license check, mutual Ed25519 proof',
        body: PeerCreateBody,
        response: { 201: Peer, ...errorResponses(400, 401, 403, 409, 413, 422, 503) },
      },
    },
    async (request, reply) => {
      const peer = await deps.peers.add(
        (request.body as { address: string }).address,
        requestActor(deps.events, request),
      );
      request.log.info({ peer_id: peer.id, address: peer.address }, 'peer added');
      return reply.code(201).send(peerView(peer, localId(), deps.liveness(peer.id)));
    },
  );

  app.put(
    '/v1/peers/:id',
    {
      schema: {
        tags: ['peers'],
        summary: 'Rename a peer; only the fields given change',
        params: idParams,
        body: PeerUpdateBody,
        response: { 200: Peer, ...errorResponses(400, 401, 403, 404, 413) },
      },
    },
    async (request) => {
      const { id } = request.params as { id: string };
      return (() => {
        const peer = deps.peers.rename(
          id,
          (request.body as { name?: string }).name,
          requestActor(deps.events, request),
        );
        return peerView(peer, localId(), deps.liveness(peer.id));
      })();
    },
  );

  // Registered before /v1/peers/:id is matched: the router prefers the static segment.
  app.delete(
    '/v1/peers/self',
    {
      schema: {
        tags: ['peers'],
        summary: 'Leave the cluster: final for this agent; its services become inactive',
        response: { 200: PeerDeactivated, ...errorResponses(401, 403) },
      },
    },
    async (request) => {
      const result = deps.peers.leave(requestActor(deps.events, request));
      request.log.warn({ peer_id: result.peer_id }, 'this agent left the cluster');
      return result;
    },
  );

  app.delete(
    '/v1/peers/:id',
    {
      schema: {
        tags: ['peers'],
        summary: 'Remove a remote peer and every service that involves it',
        params: idParams,
        response: { 200: Deleted, ...errorResponses(400, 401, 403, 404, 422) },
      },
    },
    async (request) => {
      const { id } = request.params as { id: string };
      deps.peers.remove(id, requestActor(deps.events, request));
      request.log.info({ peer_id: id }, 'peer removed');
      return { deleted: true as const };
    },
  );
}
