/**
 * Store records as the API shows them: the documented field names and forms. Pure.
 */
import type { ServiceDataPlaneStatus } from '../dataplane/dataplane.js';
import type { PeerRecord, RouteRecord, ServiceRecord } from '../store/records.js';

/** Liveness is what this agent observes, not replicated state (docs/gossip.md). */
export interface PeerLivenessView {
  reachable: boolean;
  lastSeenAt: string | null;
}

export function peerView(p: PeerRecord, localPeerId: string | undefined, liveness: PeerLivenessView) {
  return {
    id: p.id,
    name: p.name,
    public_key: p.publicKey,
    is_local: p.id === localPeerId,
    address: p.address,
    created_at: p.createdAt,
    is_active: p.isActive,
    version: p.version,
    deactivated_at: p.deactivatedAt,
    reachable: liveness.reachable,
    last_seen_at: liveness.lastSeenAt,
  };
}

/**
 * The list form. Written out field by field rather than spread from a shared helper: a list of
 * a hundred services is built on every GET, and object spread was a visible cost there.
 */
export const serviceListView = (s: ServiceRecord, routeCount: number, isActive: boolean) => ({
  id: s.id,
  source_peer_id: s.sourcePeerId,
  target_peer_id: s.targetPeerId,
  transport_type: s.transportType,
  requires_interface: s.requiresInterface,
  interface_ipv4_cidr: s.requiresInterface ? s.desiredIpv4Cidr : null,
  interface_ipv6_cidr: s.requiresInterface ? s.desiredIpv6Cidr : null,
  fully_transparent: s.fullyTransparent,
  bandwidth_limit_mbps: s.bandwidthLimitMbps,
  health_check: s.healthCheck,
  route_count: routeCount,
  created_at: s.createdAt,
  is_active: isActive,
  version: s.version,
});

/** The single form: the list form with `routes` in place of `route_count`. */
export function serviceSingleView(s: ServiceRecord, routes: readonly RouteRecord[], isActive: boolean) {
  const { route_count: _replaced, ...common } = serviceListView(s, routes.length, isActive);
  return {
    ...common,
    routes: routes.map((r) => ({
      id: r.id,
      priority: r.priority,
      source_cidr: r.sourceCidr,
      dest_cidr: r.destCidr,
    })),
  };
}

export const serviceCreatedView = (s: ServiceRecord) => ({
  id: s.id,
  source_peer_id: s.sourcePeerId,
  target_peer_id: s.targetPeerId,
  transport_type: s.transportType,
  requires_interface: s.requiresInterface,
  created_at: s.createdAt,
});

export const routeView = (r: RouteRecord) => ({
  id: r.id,
  service_id: r.serviceId,
  priority: r.priority,
  source_cidr: r.sourceCidr,
  dest_cidr: r.destCidr,
});

/**
 * The `transparent_ready` and `transparent_reasons` extra fields of a fully_transparent service
 * (none on other services): what its exit agent found (docs/transparent.md). Another agent does
 * not know: null, and the reason says where to ask.
 */
export function transparentReadinessView(s: ServiceRecord, status: ServiceDataPlaneStatus) {
  if (!s.fullyTransparent) return {};
  if (status.transparent) {
    return { transparent_ready: status.transparent.ready, transparent_reasons: status.transparent.reasons };
  }
  return {
    transparent_ready: null,
    transparent_reasons:
      status.role === 'exit'
        ? ['the exit does not carry the service transparently yet']
        : [`checked by the service's exit: ask the agent of peer ${s.targetPeerId}`],
  };
}

/** The `dataplane` extra field of a service, on an agent that runs a data plane. */
export function dataplaneView(status: ServiceDataPlaneStatus) {
  const c = status.counters;
  return {
    role: status.role,
    state: status.state,
    exit_mode: status.exit_mode,
    interface: status.interface,
    problem: status.problem,
    bytes_sent: c.bytesSent,
    packets_sent: c.packetsSent,
    bytes_received: c.bytesReceived,
    packets_received: c.packetsReceived,
    dropped: c.dropped,
    streams_open: status.streams.open,
    streams_opened: status.streams.opened,
    stream_bytes_up: status.streams.bytesUp,
    stream_bytes_down: status.streams.bytesDown,
    streams_reset: status.streams.resets,
    streams_refused: status.streams.refused,
    can_forward: status.exitStatus?.canForward ?? null,
    probe_passing: status.exitStatus?.probePassing ?? null,
    forward_problem:
      status.exitStatus &&
      (status.exitStatus.canForward === false || status.exitStatus.probePassing === false)
        ? status.exitStatus.detail
        : null,
  };
}

/**
 * The failover fields of a service on an agent that runs a data plane: `health` (null where
 * this agent is not its ingress) and, at the ingress, each route's `active` and `standby_reason`.
 */
export function failoverView<R extends object>(status: ServiceDataPlaneStatus, routes: readonly R[]) {
  const h = status.health;
  if (!h) return { health: null, routes };
  const iso = (ms: number) => new Date(ms).toISOString();
  return {
    health: {
      state: h.state,
      reason: h.reason,
      since: iso(h.since),
      carrying: h.carrying,
      hold_down_until: h.holdDownUntil === null ? null : iso(h.holdDownUntil),
    },
    routes: routes.map((r) => ({ ...r, active: h.carrying, standby_reason: h.standbyReason })),
  };
}
