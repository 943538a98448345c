/**
 * Cluster endpoints: the public identity, init and sync, the cluster credential and its
 * rotation.
 */
import type { FastifyInstance } from 'fastify';
import { notFound } from '../../domain/errors.js';
import type { AppDeps } from '../app.js';
import { requestActor } from '../authorize.js';
import {
  ClusterCredentialResponse,
  ClusterIdentity,
  ClusterInitBody,
  ClusterInitResponse,
  errorResponses,
  RotatedClusterCredential,
  SyncResponse,
} from '../schemas.js';

export function registerClusterRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.get(
    '/v1/cluster/identity',
    {
      schema: {
        tags: ['cluster'],
        summary: "This agent's identity, for verifying it before adding it as a peer",
        description: 'license_id and cluster_id are null until the agent is bootstrapped.',
        response: { 200: ClusterIdentity },
      },
    },
    async () => {
      const state = deps.store.agentState();
      return {
        peer_id: deps.identity.peerId,
        public_key: deps.identity.publicKeyBase64,
        license_id: state?.license.license_id ?? null,
        cluster_id: state?.clusterId ?? null,
        version: deps.version,
      };
    },
  );

  app.get(
    '/v1/cluster/credentials',
    {
      schema: {
        tags: ['cluster'],
        summary: 'The cluster credential (no secret)',
        response: { 200: ClusterCredentialResponse, ...errorResponses(401, 403, 404) },
      },
    },
    async () => deps.clusterCredential.current(),
  );

  app.post(
    '/v1/cluster/credentials/rotate',
    {
      schema: {
        tags: ['cluster'],
        summary: 'Rotate the cluster secret; the previous one stays valid for 24 hours',
        response: { 200: RotatedClusterCredential, ...errorResponses(400, 401, 403, 404, 413) },
      },
    },
    async (request) => {
      const state = deps.store.agentState();
      if (!state) throw notFound('this agent is not bootstrapped: it has no cluster credential');
      const rotated = deps.clusterCredential.rotate(state.localPeerId, requestActor(deps.events, request));
      request.log.info({ version: rotated.version }, 'cluster credential rotated');
      return rotated;
    },
  );

  app.post(
    '/v1/cluster/init',
    {
      schema: {
        tags: ['cluster'],
        summary: 'Return the cluster, or with force a new cluster id that gossip carries to every peer',
        body: ClusterInitBody,
        response: { 200: ClusterInitResponse, ...errorResponses(400, 401, 403, 413) },
      },
      // The body is optional (force defaults to false): no body reads as {}.
      preValidation: async (request) => {
        if (request.body === undefined || request.body === null) request.body = {};
      },
    },
    async (request) => {
      const result = deps.peers.initCluster(
        (request.body as { force?: boolean } | undefined)?.force ?? false,
        requestActor(deps.events, request),
      );
      if (result.was_created) request.log.warn({ cluster_id: result.cluster_id }, 'new cluster id generated');
      return result;
    },
  );

  app.post(
    '/v1/cluster/sync',
    {
      schema: {
        tags: ['cluster'],
        summary: 'Trigger gossip heartbeats, configuration regeneration and subsystem processing now',
        response: { 200: SyncResponse, ...errorResponses(400, 401, 403, 413) },
      },
    },
    async (request) => {
      await deps.sync();
      request.log.info('sync done: heartbeats and anti-entropy with every reachable peer');
      return { triggered: true };
    },
  );
}
