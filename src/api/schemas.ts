/**
 * JSON schemas of every request and response, written once: Fastify validates requests and
 * serializes responses with them, and @fastify/swagger turns the same objects into the OpenAPI
 * document, so the document cannot drift from what the agent does.
 */
import { type TSchema, Type } from '@sinclair/typebox';
import {
  HEALTH_CHECK_FAILURES,
  HEALTH_CHECK_INTERVAL_MS,
  HEALTH_CHECK_TARGET_MAX,
  type HealthCheck,
} from '../domain/health-check.js';
import { ALL_SCOPES } from '../domain/scopes.js';

export const Timestamp = Type.String({
  format: 'date-time',
  description: 'ISO 8601, UTC, milliseconds, Z suffix',
});
// Nullable fields as a type list, not anyOf: fast-json-stringify serializes a type list
// directly, but resolves anyOf by running a validator on every value (bench/api profile).
export const NullableTimestamp = Type.Unsafe<string | null>({
  type: ['string', 'null'],
  format: 'date-time',
  description: 'ISO 8601, UTC, milliseconds, Z suffix; null when unset',
});
export const NullableString = Type.Unsafe<string | null>({ type: ['string', 'null'] });

export const ErrorBody = Type.Object({
  error: Type.String({ description: 'human-readable text' }),
  code: Type.String({ description: 'stable machine code, see docs/errors.md' }),
});

export const OAuthErrorBody = Type.Object({
  error: Type.String({ description: 'RFC 6749 §5.2 error code' }),
  error_description: Type.String(),
  code: Type.String(),
});

export const Health = Type.Object({
  status: Type.String({ description: '`ok` when healthy or ready' }),
  timestamp: Timestamp,
  reasons: Type.Optional(Type.Array(Type.String())),
  warnings: Type.Optional(
    Type.Array(Type.String(), {
      description: '/readyz only: conditions to act on that do not make the agent unready (license expiry)',
    }),
  ),
});

export const LicenseObject = Type.Object(
  {
    customer_id: Type.String({ minLength: 1, maxLength: 256 }),
    license_id: Type.String({ minLength: 1, maxLength: 256 }),
    issued_at: Type.String({ format: 'date-time' }),
    expires_at: Type.String({ format: 'date-time' }),
    max_nodes: Type.Integer({ minimum: 1, maximum: 1_000_000 }),
    max_services: Type.Integer({ minimum: 0, maximum: 1_000_000 }),
    signature: Type.String({ minLength: 1, maxLength: 256 }),
  },
  { description: 'Signed license. Every field present is covered by the signature.' },
);

export const BootstrapBody = Type.Object({
  license: LicenseObject,
  name: Type.Optional(Type.String({ maxLength: 255 })),
  description: Type.Optional(Type.String({ maxLength: 1024 })),
});

export const BootstrapResponse = Type.Object({
  peer_id: Type.String(),
  peer_public_key: Type.String({ description: 'base64, Ed25519' }),
  client_id: Type.String(),
  client_secret: Type.String({ description: 'shown only in this response' }),
  license_id: Type.String(),
  cluster_id: Type.String(),
  expires_at: Type.String(),
  max_nodes: Type.Integer(),
  max_services: Type.Integer(),
});

export const TokenForm = Type.Object({
  grant_type: Type.Literal('client_credentials'),
  client_id: Type.Optional(Type.String({ description: 'client_secret_post; or use HTTP Basic' })),
  client_secret: Type.Optional(Type.String()),
  scope: Type.Optional(
    Type.String({ description: 'space-separated scope URNs, a subset of the credential' }),
  ),
});

export const TokenResponse = Type.Object({
  access_token: Type.String(),
  token_type: Type.Literal('Bearer'),
  expires_in: Type.Integer(),
  scope: Type.String(),
});

export const OpenIdConfiguration = Type.Object(
  {
    issuer: Type.String(),
    token_endpoint: Type.String(),
    jwks_uri: Type.String(),
    grant_types_supported: Type.Array(Type.String()),
    token_endpoint_auth_methods_supported: Type.Array(Type.String()),
    scopes_supported: Type.Array(Type.String()),
    response_types_supported: Type.Array(Type.String()),
    id_token_signing_alg_values_supported: Type.Array(Type.String()),
    subject_types_supported: Type.Array(Type.String()),
  },
  { additionalProperties: true },
);

export const Jwks = Type.Object({
  keys: Type.Array(
    Type.Object(
      {
        kty: Type.String(),
        crv: Type.String(),
        x: Type.String(),
        kid: Type.String(),
        alg: Type.String(),
        use: Type.String(),
      },
      { additionalProperties: true },
    ),
  ),
});

export const ClusterIdentity = Type.Object({
  peer_id: Type.String(),
  public_key: Type.String({ description: 'base64 of the 32-byte Ed25519 public key' }),
  license_id: NullableString,
  cluster_id: NullableString,
  version: Type.String({ description: 'agent version' }),
});

const ScopeValue = Type.Unsafe<string>({ type: 'string', enum: [...ALL_SCOPES] });

export const CredentialCreateBody = Type.Object({
  scopes: Type.Optional(Type.Array(ScopeValue, { maxItems: 16, description: 'empty or absent: admin' })),
});

export const CredentialCreated = Type.Object({
  client_id: Type.String(),
  client_secret: Type.String({ description: 'shown only in this response' }),
  scopes: Type.Array(Type.String()),
  created_at: Timestamp,
});

export const CredentialListItem = Type.Object({
  client_id: Type.String(),
  scopes: Type.Array(Type.String()),
  license_id: Type.String(),
  created_at: Timestamp,
  last_used_at: NullableTimestamp,
});

export const ClusterCredentialResponse = Type.Object({
  client_id: Type.String(),
  version: Type.Integer(),
  rotated_by: Type.String(),
  rotated_at: Timestamp,
});

export const RotatedClusterCredential = Type.Object({
  client_id: Type.String(),
  client_secret: Type.String({ description: 'shown only in this response' }),
  version: Type.Integer(),
  rotated_by: Type.String(),
  rotated_at: Timestamp,
});

export const Peer = Type.Object({
  id: Type.String(),
  name: Type.String(),
  public_key: Type.String(),
  is_local: Type.Boolean(),
  address: Type.String(),
  created_at: Timestamp,
  is_active: Type.Boolean(),
  version: Type.Integer(),
  deactivated_at: NullableTimestamp,
  reachable: Type.Boolean({
    description: 'whether this agent hears from the peer (gossip failure detection); a local observation',
  }),
  last_seen_at: Type.Union([Timestamp, Type.Null()], {
    description: 'when this agent last heard from the peer; null if never',
  }),
});

export const Deleted = Type.Object({ deleted: Type.Literal(true) });

/** The error responses a route can give, by status, all in the one documented shape. */
export function errorResponses(...statuses: number[]): Record<number, TSchema> {
  const out: Record<number, TSchema> = {};
  for (const s of statuses) out[s] = ErrorBody;
  return out;
}

const CidrField = (description: string) =>
  Type.Optional(Type.Union([Type.String({ maxLength: 64 }), Type.Null()], { description }));

// health_check (docs/decisions.md §7). The schema bounds types and ranges for the document and
// the first 400; domain/health-check.ts checks the rest (exactly one kind, IP literals).
const HEALTH_CHECK_TEXT =
  "extension: an active probe that the service's exit runs, a TCP connect (tcp) or an ICMP echo (icmp); " +
  'exactly one of tcp and icmp. Addresses are IP literals, no host names (docs/decisions.md §7)';
const healthCheckFields = {
  tcp: Type.String({
    maxLength: HEALTH_CHECK_TARGET_MAX,
    description:
      'IP address and port to connect to: 10.1.2.3:443, [fd00::1]:443 (IPv6 in brackets; port 1-65535)',
  }),
  icmp: Type.String({
    maxLength: HEALTH_CHECK_TARGET_MAX,
    description: 'IP address to send echo requests to: 10.1.2.3, fd00::1',
  }),
  interval_ms: Type.Integer({
    minimum: HEALTH_CHECK_INTERVAL_MS.min,
    maximum: HEALTH_CHECK_INTERVAL_MS.max,
    default: HEALTH_CHECK_INTERVAL_MS.default,
    description: 'milliseconds between probes',
  }),
  failures: Type.Integer({
    minimum: HEALTH_CHECK_FAILURES.min,
    maximum: HEALTH_CHECK_FAILURES.max,
    default: HEALTH_CHECK_FAILURES.default,
    description: 'failed probes in a row that make the check fail',
  }),
};
const HealthCheckBody = Type.Object({
  tcp: Type.Optional(healthCheckFields.tcp),
  icmp: Type.Optional(healthCheckFields.icmp),
  interval_ms: Type.Optional(healthCheckFields.interval_ms),
  failures: Type.Optional(healthCheckFields.failures),
});
// A type list, not anyOf, for the reason NullableTimestamp gives: the list form holds it.
const HealthCheckShown = Type.Unsafe<HealthCheck | null>({
  type: ['object', 'null'],
  properties: healthCheckFields,
  required: ['interval_ms', 'failures'],
  description: `${HEALTH_CHECK_TEXT}; defaults filled in, addresses in canonical form; null: none`,
});

export const ServiceCreateBody = Type.Object({
  target_peer_id: Type.String({ minLength: 1, maxLength: 256 }),
  source_peer_id: Type.Optional(
    Type.String({ minLength: 1, maxLength: 256, description: 'default: the local peer' }),
  ),
  transport_type: Type.Optional(
    Type.Unsafe<string>({ type: 'string', enum: ['tcp', 'kcp'], default: 'tcp' }),
  ),
  requires_interface: Type.Optional(
    Type.Boolean({ default: false, description: 'creates a MACVLAN interface' }),
  ),
  desired_ipv4_cidr: CidrField('IPv4 address/prefix of the interface; needs requires_interface'),
  desired_ipv6_cidr: CidrField('IPv6 address/prefix of the interface; needs requires_interface'),
  fully_transparent: Type.Optional(
    Type.Boolean({ default: false, description: 'needs transport_type tcp and requires_interface true' }),
  ),
  bandwidth_limit_mbps: Type.Optional(
    Type.Integer({ minimum: 0, maximum: 1_000_000, default: 0, description: '0: unlimited' }),
  ),
  health_check: Type.Optional(
    Type.Union([HealthCheckBody, Type.Null()], { description: `${HEALTH_CHECK_TEXT}; absent or null: none` }),
  ),
});

export const ServiceUpdateBody = Type.Object({
  requires_interface: Type.Optional(Type.Boolean()),
  desired_ipv4_cidr: CidrField('IPv4 address/prefix of the interface; null clears it'),
  desired_ipv6_cidr: CidrField('IPv6 address/prefix of the interface; null clears it'),
  bandwidth_limit_mbps: Type.Optional(Type.Integer({ minimum: 0, maximum: 1_000_000 })),
  health_check: Type.Optional(
    Type.Union([HealthCheckBody, Type.Null()], {
      description: `${HEALTH_CHECK_TEXT}; replaces the current check whole; null removes it`,
    }),
  ),
  transport_type: Type.Optional(
    Type.Unsafe<string>({
      type: 'string',
      enum: ['tcp', 'kcp'],
      description: 'fixed at creation: only its current value is accepted',
    }),
  ),
  fully_transparent: Type.Optional(
    Type.Boolean({ description: 'fixed at creation: only its current value is accepted' }),
  ),
  source_peer_id: Type.Optional(Type.String({ description: 'fixed at creation' })),
  target_peer_id: Type.Optional(Type.String({ description: 'fixed at creation' })),
});

const serviceCommon = {
  id: Type.String(),
  source_peer_id: Type.String(),
  target_peer_id: Type.String(),
  transport_type: Type.String(),
  requires_interface: Type.Boolean(),
  interface_ipv4_cidr: NullableString,
  interface_ipv6_cidr: NullableString,
  fully_transparent: Type.Boolean(),
  bandwidth_limit_mbps: Type.Integer(),
  health_check: HealthCheckShown,
  created_at: Timestamp,
  is_active: Type.Boolean({ description: 'false while a peer involved is inactive' }),
  version: Type.Integer(),
};

export const ServiceListItem = Type.Object({ ...serviceCommon, route_count: Type.Integer() });

const StandbyReason = Type.Union(
  ['inactive', 'tunnel_silent', 'exit_no_route', 'probe_failed', 'unknown', 'hold_down'].map((v) =>
    Type.Literal(v),
  ),
);

export const ServiceRouteItem = Type.Object({
  id: Type.Integer(),
  priority: Type.Integer(),
  source_cidr: NullableString,
  dest_cidr: NullableString,
  active: Type.Optional(
    Type.Boolean({
      description:
        "extension, on the service's ingress agent when it runs a data plane: whether the route takes its " +
        'traffic now; false while its service stands aside (failover, docs/dataplane.md)',
    }),
  ),
  standby_reason: Type.Optional(
    Type.Union([StandbyReason, Type.Null()], {
      description:
        "why the route stands aside (its service's health reason, unknown before the tunnel first answered, " +
        'hold_down while it waits out the failback hold-down); null while active',
    }),
  ),
});

/** Extension (docs/dataplane.md, failover): the service's health as its ingress judges it. */
export const ServiceHealth = Type.Object(
  {
    state: Type.Union(['healthy', 'unhealthy', 'unknown'].map((v) => Type.Literal(v))),
    reason: Type.Union(
      [
        ...['inactive', 'tunnel_silent', 'exit_no_route', 'probe_failed'].map((v) => Type.Literal(v)),
        Type.Null(),
      ],
      { description: 'why unhealthy: the first failing check' },
    ),
    since: Type.String({ format: 'date-time', description: 'when the state last changed' }),
    carrying: Type.Boolean({ description: "whether the service's routes take their traffic now" }),
    hold_down_until: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description: 'healthy again and waiting out the hold-down: when it carries again',
    }),
  },
  {
    description:
      "extension, on the service's ingress agent when it runs a data plane: failover's verdict on the service " +
      '(docs/dataplane.md); null on other agents',
  },
);

/** Extra field (docs/decisions.md §7): this agent's own view of the service's traffic; not replicated. */
export const ServiceDataPlane = Type.Object(
  {
    role: Type.Union([Type.Literal('ingress'), Type.Literal('exit'), Type.Literal('none')], {
      description: 'what this agent is for the service: its source (ingress), its target (exit), or neither',
    }),
    state: Type.Union(
      ['up', 'connecting', 'down', 'error', 'inactive'].map((v) => Type.Literal(v)),
      {
        description:
          'up: tunnel connected and kernel state applied; connecting/down: tunnel not up; error: see problem; ' +
          'inactive: this agent does not carry the service',
      },
    ),
    exit_mode: Type.Union(
      [Type.Literal('nat'), Type.Literal('macvlan'), Type.Literal('transparent'), Type.Null()],
      {
        description:
          "at the exit, how traffic leaves: the exit's address (nat), the MACVLAN address (macvlan), or for " +
          "TCP the client's own address and for the rest the MACVLAN address (transparent)",
      },
    ),
    interface: NullableString,
    problem: NullableString,
    bytes_sent: Type.Integer({ description: 'IP bytes this agent sent into the tunnel for the service' }),
    packets_sent: Type.Integer(),
    bytes_received: Type.Integer({
      description: 'IP bytes this agent received from the tunnel for the service',
    }),
    packets_received: Type.Integer(),
    dropped: Type.Integer(),
    streams_open: Type.Integer({ description: 'TCP connections carried as streams now' }),
    streams_opened: Type.Integer({
      description: 'TCP connections carried as streams since the agent started',
    }),
    stream_bytes_up: Type.Integer({ description: 'stream payload bytes from the ingress to the exit' }),
    stream_bytes_down: Type.Integer({ description: 'stream payload bytes from the exit to the ingress' }),
    streams_reset: Type.Integer({
      description: 'streams ended by a reset (either side, or a tunnel that died)',
    }),
    streams_refused: Type.Integer({ description: 'streams whose destination could not be reached' }),
    can_forward: Type.Union([Type.Boolean(), Type.Null()], {
      description:
        "at the exit: whether its kernel has a usable route toward every route's destination (failover, " +
        'docs/dataplane.md), as it tells the ingress; null elsewhere and before its first check',
    }),
    probe_passing: Type.Union([Type.Boolean(), Type.Null()], {
      description:
        'at the exit of a service with a health_check: whether its probe passes (failures in a row make it fail); ' +
        'null elsewhere, without a health_check, and before its first verdict',
    }),
    forward_problem: Type.Union([Type.String(), Type.Null()], {
      description:
        'at the exit, when can_forward or probe_passing is false: which destination has no usable route, or ' +
        "the probe's last error",
    }),
  },
  { description: "this agent's view of the service's data plane (not replicated)" },
);

export const ServiceSingle = Type.Object({
  ...serviceCommon,
  routes: Type.Array(ServiceRouteItem),
  /** Present only on an agent that runs a data plane (`--dataplane`). */
  dataplane: Type.Optional(ServiceDataPlane),
  health: Type.Optional(Type.Union([ServiceHealth, Type.Null()])),
  transparent_ready: Type.Optional(
    Type.Union([Type.Boolean(), Type.Null()], {
      description:
        'fully_transparent services, on an agent that runs a data plane: whether the exit can carry the service ' +
        'transparently (true/false on the exit agent; null elsewhere)',
    }),
  ),
  transparent_reasons: Type.Optional(
    Type.Array(Type.String(), {
      description: 'why transparent_ready is not true (host requirements, a probable asymmetric route)',
    }),
  ),
});

export const ServiceCreated = Type.Object({
  id: Type.String(),
  source_peer_id: Type.String(),
  target_peer_id: Type.String(),
  transport_type: Type.String(),
  requires_interface: Type.Boolean(),
  created_at: Timestamp,
});

export const Route = Type.Object({
  id: Type.Integer(),
  service_id: Type.String(),
  priority: Type.Integer(),
  source_cidr: NullableString,
  dest_cidr: NullableString,
});

const RouteCidr = Type.Optional(Type.Union([Type.String({ maxLength: 64 }), Type.Null()]));

export const RoutesCreateBody = Type.Object({
  routes: Type.Array(
    Type.Object({
      priority: Type.Integer({ minimum: 0, maximum: 65535, description: 'lower wins' }),
      source_cidr: RouteCidr,
      dest_cidr: RouteCidr,
    }),
    { minItems: 1, maxItems: 1000 },
  ),
});

export const RouteUpdateBody = Type.Object({
  priority: Type.Optional(Type.Integer({ minimum: 0, maximum: 65535 })),
  source_cidr: RouteCidr,
  dest_cidr: RouteCidr,
});

export const RoutesCreated = Type.Object({ route_ids: Type.Array(Type.Integer()), count: Type.Integer() });

export const RouteIdParam = Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER });
export const IdParam = Type.String({ minLength: 1, maxLength: 256 });

export const PeerCreateBody = Type.Object({
  address: Type.String({
    minLength: 1,
    maxLength: 300,
    description: 'management API host:port of the new peer',
  }),
});

export const PeerUpdateBody = Type.Object({ name: Type.Optional(Type.String({ maxLength: 255 })) });

export const PeerDeactivated = Type.Object({
  peer_id: Type.String(),
  version: Type.Integer(),
  is_active: Type.Boolean(),
  deactivated_at: NullableTimestamp,
});

export const ClusterInitBody = Type.Object({ force: Type.Optional(Type.Boolean({ default: false })) });

export const ClusterInitResponse = Type.Object({
  cluster_id: Type.String(),
  created_by: Type.String(),
  oldest_peer_id: Type.String(),
  was_created: Type.Boolean(),
  message: Type.String(),
});

export const SyncResponse = Type.Object({ triggered: Type.Boolean() });

const Base64 = Type.String({ minLength: 1, maxLength: 200 });

export const HandshakePeerInfoSchema = Type.Object({
  peer_id: Type.String({ minLength: 1, maxLength: 256 }),
  public_key: Base64,
  address: Type.String({ minLength: 1, maxLength: 300 }),
  created_at: Type.String({ format: 'date-time' }),
  license_id: Type.String({ maxLength: 256 }),
  license: LicenseObject,
  cluster_id: Type.String({ maxLength: 256 }),
  cluster_created_by: Type.String({ maxLength: 256 }),
  oldest_peer_id: Type.String({ maxLength: 256 }),
  oldest_peer_created_at: Type.String({ format: 'date-time' }),
  active_peer_ids: Type.Array(Type.String({ maxLength: 256 }), { maxItems: 10_000 }),
  service_count: Type.Integer({ minimum: 0 }),
  name: Type.Optional(Type.String({ maxLength: 255 })),
  version: Type.Optional(Type.Integer({ minimum: 1 })),
});

export const HelloBody = Type.Object({
  version: Type.Integer(),
  initiator: HandshakePeerInfoSchema,
  nonce_a: Base64,
});

export const HelloReply = Type.Object({
  version: Type.Integer(),
  responder: HandshakePeerInfoSchema,
  nonce_b: Type.String(),
  signature_b: Type.String(),
});

/** A replicated record (cluster/replicated-records.ts); its shape is checked by isWellFormed. */
const WireRecordSchema = Type.Object(
  {
    key: Type.String({ maxLength: 200 }),
    vkey: Type.String({ maxLength: 200 }),
    body: Type.Union([Type.Object({}, { additionalProperties: true }), Type.Null()]),
  },
  { additionalProperties: false },
);

export const ConfirmBody = Type.Object({
  nonce_b: Base64,
  signature_a: Base64,
  cluster_records: Type.Array(WireRecordSchema, { minItems: 2, maxItems: 2 }),
});
export const ConfirmReply = Type.Object({
  accepted: Type.Boolean(),
  peer_id: Type.String(),
  cluster_records: Type.Array(WireRecordSchema),
  signature_c: Type.String(),
});

/** A gossip envelope (cluster/gossip-envelope.ts); everything inside is checked by the engine. */
export const GossipEnvelopeSchema = Type.Object({
  payload: Type.String({ maxLength: 16 * 1024 * 1024 }),
  kid: Type.String({ maxLength: 64 }),
  mac: Type.String({ maxLength: 128 }),
  sig: Type.String({ maxLength: 128 }),
});
