/**
 * `/v1/explain` (extension, services.read; docs/decisions.md §7, docs/operator-guide.md
 * "Troubleshooting"): which route of which service takes a packet at an ingress agent, and why.
 * GET takes the packet in the query; POST takes it in a JSON body, with `with`, a proposed change
 * explained as if it were applied (nothing is written). `peer` asks another agent, over the
 * authenticated gossip channel.
 */
import { Type } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import { notFound } from '../../domain/errors.js';
import type { AppDeps } from '../app.js';
import { type ExplainRequest, explainRequest } from '../explain-local.js';
import { errorResponses } from '../schemas.js';

const Nullable = (type: string, description?: string) =>
  Type.Unsafe<unknown>({ type: [type, 'null'], ...(description ? { description } : {}) });

const packetFields = {
  source: Type.String({ maxLength: 64, description: 'the source address of the packet (IPv4 or IPv6)' }),
  destination: Type.String({ maxLength: 64, description: 'the destination address, of the same family' }),
  protocol: Type.Optional(
    Type.Unsafe<string>({
      type: 'string',
      enum: ['tcp', 'udp', 'icmp'],
      description:
        'tcp crosses as a stream where the ingress intercepts TCP; routes do not select by protocol',
    }),
  ),
  port: Type.Optional(
    Type.Integer({
      minimum: 1,
      maximum: 65535,
      description: 'destination port (tcp, udp); routes do not select by port',
    }),
  ),
  peer: Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 256,
      description: 'the ingress agent to ask (a peer id); default: this agent',
    }),
  ),
};

const CidrOrNull = Type.Optional(Nullable('string'));
const Proposal = Type.Object(
  {
    service: Type.Optional(
      Type.Object(
        {
          target_peer_id: Type.String(),
          source_peer_id: Type.Optional(Type.String()),
          transport_type: Type.Optional(Type.String()),
          requires_interface: Type.Optional(Type.Boolean()),
          desired_ipv4_cidr: CidrOrNull,
          desired_ipv6_cidr: CidrOrNull,
          fully_transparent: Type.Optional(Type.Boolean()),
          bandwidth_limit_mbps: Type.Optional(Type.Integer()),
        },
        { description: 'a new service, as its create body; shown with service_id `proposed`' },
      ),
    ),
    routes: Type.Optional(
      Type.Array(
        Type.Object({
          service_id: Type.Optional(Type.String({ description: 'default: the proposed service' })),
          route_id: Type.Optional(
            Type.Integer({ description: 'an existing route whose given fields change; absent: a new route' }),
          ),
          priority: Type.Optional(Type.Integer({ description: 'required for a new route' })),
          source_cidr: CidrOrNull,
          dest_cidr: CidrOrNull,
        }),
        { maxItems: 1000 },
      ),
    ),
    remove_routes: Type.Optional(Type.Array(Type.Integer(), { description: 'route ids removed' })),
  },
  {
    description: 'a proposed change, checked as a real write is, explained as if applied; nothing is written',
  },
);

const RankedRoute = Type.Object({
  rank: Type.Integer(),
  route_id: Nullable('integer', 'null for a proposed new route'),
  service_id: Type.String(),
  priority: Type.Integer(),
  source_cidr: Nullable('string'),
  dest_cidr: Nullable('string'),
  proposed: Type.Boolean(),
  outcome: Type.Unsafe<string>({ type: 'string', enum: ['wins', 'loses', 'stands_aside', 'inactive'] }),
  decided_by: Type.Unsafe<string | null>({
    type: ['string', 'null'],
    enum: ['standby', 'priority', 'dest_prefix', 'source_prefix', 'id', 'only', 'inactive', null],
    description: 'the key of the selection order that decided against this route (for the winner: for it)',
  }),
  standby_reason: Nullable('string', "why the route's service stands aside (failover), null when it carries"),
  reason: Type.String(),
});

const Explanation = Type.Object({
  agent: Type.String({ description: 'the peer id of the ingress agent that answered' }),
  packet: Type.Object({
    source: Type.String(),
    destination: Type.String(),
    protocol: Nullable('string'),
    port: Nullable('integer'),
  }),
  proposed: Type.Boolean({ description: 'the answer includes a proposed change (`with`)' }),
  dataplane: Type.Boolean({
    description: 'the agent runs a data plane (health, tunnel, kernel come from it)',
  }),
  selected: Type.Boolean({ description: 'a route takes the packet into a tunnel at this agent' }),
  excluded: Nullable('string', "why the packet is never selected (the agent's own traffic)"),
  ranking: Type.Array(RankedRoute, {
    description: 'every route that selects the packet, in selection order',
  }),
  winner: Type.Union([
    Type.Object({
      service_id: Type.String(),
      route_id: Nullable('integer'),
      target_peer_id: Type.String(),
      transport: Type.String(),
      exit_mode: Type.Unsafe<string>({ type: 'string', enum: ['nat', 'macvlan', 'transparent'] }),
      exit_addresses: Type.Array(Type.String()),
      bandwidth_limit_mbps: Type.Integer(),
      carried_as: Nullable('string', 'stream or packets; null without a protocol or a data plane'),
      interface: Nullable('string'),
      tunnel: Type.Union([Type.Object({ state: Type.String(), rtt_ms: Nullable('number') }), Type.Null()]),
      health: Type.Union([
        Type.Object({
          state: Type.String(),
          reason: Nullable('string'),
          since: Type.String(),
          carrying: Type.Boolean(),
          hold_down_until: Nullable('string'),
        }),
        Type.Null(),
      ]),
    }),
    Type.Null(),
  ]),
  closest: Type.Union([
    Type.Object({
      route_id: Type.Integer(),
      service_id: Type.String(),
      priority: Type.Integer(),
      source_cidr: Nullable('string'),
      dest_cidr: Nullable('string'),
      why: Type.Array(Type.String()),
    }),
    Type.Null(),
  ]),
  kernel: Type.Union(
    [
      Type.Object({
        lookup: Type.String({ description: 'the route lookup asked of the kernel' }),
        iif: Nullable('string', 'the input interface of the lookup (null: a packet of this host itself)'),
        route: Type.Union([
          Type.Object({
            dev: Type.String(),
            gateway: Nullable('string'),
            prefix: Type.String(),
            usable: Type.Boolean(),
          }),
          Type.Null(),
        ]),
        service_id: Nullable(
          'string',
          "the service whose TUN the kernel sends it into; null: none of the agent's",
        ),
        rule: Nullable('string', "the first of the agent's policy rules the packet matches"),
        nft: Type.Array(Type.String(), {
          description: "lines of the agent's nftables table it meets, by chain",
        }),
        repairs: Type.Array(Type.String(), {
          description:
            'owned state differing from the wanted that concerns the packet, as the commands that repair it',
        }),
      }),
      Type.Null(),
    ],
    {
      description: "the kernel's own view, where a data plane runs; null otherwise and for a proposed change",
    },
  ),
  kernel_agrees: Nullable('boolean', 'the kernel sends the packet where the configuration says'),
  kernel_difference: Nullable(
    'string',
    'what differs when it does not (or why the kernel could not be asked)',
  ),
  verdict: Type.String({ description: 'the answer in one line' }),
});

export function registerExplainRoutes(app: FastifyInstance, deps: AppDeps): void {
  const answer = async (request: ExplainRequest) => {
    const local = deps.store.agentState()?.localPeerId;
    if (request.peer === null || request.peer === local) return deps.explain(request);
    if (!deps.store.peer(request.peer)) throw notFound(`no peer with id ${request.peer}`);
    return deps.explainAt(request.peer, request);
  };

  app.get(
    '/v1/explain',
    {
      schema: {
        tags: ['explain'],
        summary: 'Extension: which route takes a packet at an ingress agent, and why',
        querystring: Type.Object(packetFields),
        response: { 200: Explanation, ...errorResponses(400, 401, 403, 404, 503) },
      },
    },
    async (request) => answer(explainRequest(request.query)),
  );

  app.post(
    '/v1/explain',
    {
      schema: {
        tags: ['explain'],
        summary: 'Extension: explain with a proposed change (`with`), as if it were applied; writes nothing',
        body: Type.Object({ ...packetFields, with: Type.Optional(Proposal) }),
        response: { 200: Explanation, ...errorResponses(400, 401, 403, 404, 409, 413, 503) },
      },
    },
    async (request) => answer(explainRequest(request.body)),
  );
}
