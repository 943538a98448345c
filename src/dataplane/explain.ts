/**
 * Explain (docs/operator-guide.md, "Troubleshooting"): which route of which service takes a packet
 * from a source to a destination at one ingress agent, and why each other route that selects it
 * lost. Pure: the configuration (as the data plane sees it), the packet and, where a data plane
 * runs, its failover state come in; a plain JSON answer goes out (the API's body, also what a peer
 * sends back over the gossip channel).
 *
 * It ranks with the data plane's own code, never a second algorithm: the routes are those the
 * policy rules are made from (plan.ts ingressRoutes), put in order and matched by RouteMatcher
 * (the TPROXY interception's matcher), and every reason names the key of the selection order
 * (plan.ts orderBetween) that decided it. So explain cannot disagree with the plan.
 *
 * Used by the API (src/api/explain-local.ts) only.
 */
import { formatIp, parseIp } from '../domain/cidr.js';
import type { HealthVerdict, StandbyReason } from './health.js';
import { type ParsedCidr, parseCidrLoose } from './kernel/canonical.js';
import {
  carriedServices,
  ingressRoutes,
  type OrderKey,
  orderBetween,
  type PlanRoute,
  type PlanService,
  RouteMatcher,
  type TransportKind,
} from './plan.js';

export type ExplainProtocol = 'tcp' | 'udp' | 'icmp';

/** The packet asked about: addresses in canonical text, both of one family. */
export interface ExplainPacket {
  source: string;
  destination: string;
  protocol: ExplainProtocol | null;
  /** Destination port (tcp, udp). */
  port: number | null;
}

/** The configuration explain ranks from: the replicated services and routes, as the data plane gets them. */
export interface ExplainConfig {
  /** The agent whose selection is explained (the ingress asked). */
  localPeerId: string;
  services: readonly PlanService[];
  routes: readonly PlanRoute[];
  /** IP addresses of the cluster's peers: traffic to them is the agent's own and never selected. */
  peerIps: readonly string[];
  /** Routes added by a proposed change (`with`), by their stand-in id (negative). */
  proposedRouteIds?: ReadonlySet<number>;
}

/** What a running data plane knows of its ingress services now; null on an agent without one. */
export interface IngressRuntime {
  /** Services standing aside (failover): the plan ranks their routes last. */
  standby: ReadonlySet<string>;
  /** Failover verdicts (wall-clock ms), by service this agent is the ingress of. */
  health: ReadonlyMap<string, HealthVerdict>;
  /** The tunnel of each carried service: its state and last keepalive round trip. */
  tunnels: ReadonlyMap<string, { state: string; rttMs: number | null }>;
  /** The TUN device of each carried service. */
  tuns: ReadonlyMap<string, string>;
  /** TCP is intercepted and carried as streams (the TPROXY listener is open). */
  streams: boolean;
  /** The peer addresses the plan excludes (host names resolved by the data plane). */
  peerIps: readonly string[];
}

export interface RankedRoute {
  rank: number;
  /** Null for a route a proposed change adds (its id is drawn when it is created). */
  route_id: number | null;
  service_id: string;
  priority: number;
  source_cidr: string | null;
  dest_cidr: string | null;
  proposed: boolean;
  outcome: 'wins' | 'loses' | 'stands_aside' | 'inactive';
  /** The key of the selection order that decided against (or, for the winner, for) this route. */
  decided_by: OrderKey | 'only' | 'inactive' | null;
  standby_reason: StandbyReason | null;
  reason: string;
}

export interface ExplainWinner {
  service_id: string;
  route_id: number | null;
  target_peer_id: string;
  transport: TransportKind;
  exit_mode: 'nat' | 'macvlan' | 'transparent';
  /** The MACVLAN's addresses at the exit (macvlan and transparent). */
  exit_addresses: string[];
  bandwidth_limit_mbps: number;
  /** stream: TCP terminated at the ingress and re-originated at the exit; null: depends on the protocol. */
  carried_as: 'stream' | 'packets' | null;
  interface: string | null;
  tunnel: { state: string; rtt_ms: number | null } | null;
  health: {
    state: string;
    reason: string | null;
    since: string;
    carrying: boolean;
    hold_down_until: string | null;
  } | null;
}

export interface ClosestRoute {
  route_id: number;
  service_id: string;
  priority: number;
  source_cidr: string | null;
  dest_cidr: string | null;
  why: string[];
}

/**
 * What the kernel does with the packet, read from the kernel (DataPlane.kernelView): the route
 * lookup as the packet would meet it, the first of the agent's policy rules it matches, the
 * lines of the agent's nftables table it meets, and what the reconciler would change for it.
 */
export interface KernelView {
  /** How the kernel was asked, in words (the `ip route get` line). */
  lookup: string;
  /** The input interface the lookup used (null: a packet of this host itself). */
  iif: string | null;
  /** The route the kernel matched; null: it has none (the packet is dropped, unreachable). */
  route: { dev: string; gateway: string | null; prefix: string; usable: boolean } | null;
  /** The service whose TUN the kernel sends the packet into; null: none of the agent's. */
  service_id: string | null;
  /** The first of the agent's own policy rules (prefs 21000-29999) the packet matches, as `ip rule` shows it. */
  rule: string | null;
  /** Lines of the agent's nftables table the packet meets on its way into that TUN, by chain. */
  nft: string[];
  /** Owned kernel state that differs from what the agent wants and concerns this packet, as the commands that repair it. */
  repairs: string[];
}

export interface Explanation {
  agent: string;
  packet: ExplainPacket;
  proposed: boolean;
  /** Whether the agent runs a data plane (health, tunnel and kernel view come from it). */
  dataplane: boolean;
  /** Some route takes the packet into a tunnel at this agent. */
  selected: boolean;
  /** Why the packet is never selected whatever the routes say (the agent's own traffic). */
  excluded: string | null;
  ranking: RankedRoute[];
  winner: ExplainWinner | null;
  /** Nothing selects it: the route that comes nearest, and why it does not match. */
  closest: ClosestRoute | null;
  /** The kernel's own view; null without a data plane, or for a proposed change. */
  kernel: KernelView | null;
  /** Whether the kernel sends the packet where the configuration says; null when not asked. */
  kernel_agrees: boolean | null;
  /** What differs, when it does not. */
  kernel_difference: string | null;
  verdict: string;
}

/** The ingress's failover reasons in words (health.ts). */
const STANDBY_WORDS: Record<StandbyReason, string> = {
  inactive: 'its service is inactive (a peer left)',
  tunnel_silent: 'its tunnel is silent',
  exit_no_route: 'its exit has no usable route toward the destination',
  probe_failed: "its exit's probe fails",
  unknown: 'its tunnel has not answered yet',
  hold_down: 'it is healthy again and waits out the failback hold-down',
};

/** Ranks the routes that select the packet at `config.localPeerId` and names the winner. */
export function explain(
  config: ExplainConfig,
  packet: ExplainPacket,
  runtime: IngressRuntime | null,
  now: number,
): Explanation {
  return new RouteExplainer(config, runtime?.standby ?? NO_STANDBY).explain(packet, runtime, now);
}

const NO_STANDBY: ReadonlySet<string> = new Set();

/**
 * explain() for one configuration and one set of services standing aside, compiled once (the
 * routes sorted into selection order, every CIDR parsed) and asked per packet: what the API keeps
 * between requests while neither changes.
 */
export class RouteExplainer {
  private readonly services: ReadonlyMap<string, PlanService>;
  private readonly carried: ReadonlySet<string>;
  private readonly matcher: RouteMatcher;
  private readonly inactive: RouteMatcher;
  private readonly proposedIds: ReadonlySet<number>;
  /** Every route with its CIDRs parsed, for the closest route when nothing selects. */
  private readonly parsed: readonly {
    route: PlanRoute;
    dest: ParsedCidr | null;
    source: ParsedCidr | null;
  }[];

  constructor(
    private readonly config: ExplainConfig,
    private readonly standby: ReadonlySet<string>,
  ) {
    this.services = new Map(config.services.map((s) => [s.id, s]));
    // carriedServices decides what this agent carries; slots only name devices, which come from
    // the data plane itself (runtime.tuns).
    const slots = new Map(config.services.map((s) => [s.id, 1]));
    const carried = carriedServices({ localPeerId: config.localPeerId, services: config.services, slots });
    this.carried = new Set(carried.map((c) => c.serviceId));
    this.matcher = new RouteMatcher(ingressRoutes(carried, config.routes), standby);
    // Routes of this agent's inactive services: the plan carries nothing for them.
    this.inactive = new RouteMatcher(
      config.routes.filter((r) => {
        const s = this.services.get(r.serviceId);
        return s?.sourcePeerId === config.localPeerId && !this.carried.has(r.serviceId) && !s.isActive;
      }),
    );
    this.proposedIds = config.proposedRouteIds ?? new Set<number>();
    const parse = (cidr: string | null) => (cidr === null ? null : (parseCidrLoose(cidr) ?? null));
    this.parsed = config.routes.map((route) => ({
      route,
      dest: parse(route.destCidr),
      source: parse(route.sourceCidr),
    }));
  }

  /** The answer for one packet; `runtime` must be the state whose standby set this was made with. */
  explain(packet: ExplainPacket, runtime: IngressRuntime | null, now: number): Explanation {
    const { config, standby, proposedIds } = this;
    const src = parseIp(packet.source)?.bytes;
    const dst = parseIp(packet.destination)?.bytes;
    const selecting = this.matcher.selecting(src, dst);
    const peerIps = runtime ? [...config.peerIps, ...runtime.peerIps] : config.peerIps;
    const excluded = selecting.length > 0 ? exclusion(packet.destination, peerIps) : null;
    const winner = excluded === null ? (selecting[0] ?? null) : null;
    const ranking: RankedRoute[] = selecting.map((r, i) => {
      const verdict = runtime?.health.get(r.serviceId);
      const standing = standby.has(r.serviceId) ? (verdict?.standbyReason ?? 'unknown') : null;
      if (excluded !== null) return ranked(r, i + 1, proposedIds, 'loses', null, standing, excluded);
      if (r === winner) {
        const next = selecting[1];
        const order = next ? orderBetween(r, next, standby) : null;
        let reason = order
          ? `wins: ${againstText(order.key, r, next!, standby, runtime, proposedIds)}`
          : 'the only route that selects it';
        if (standing !== null) {
          reason += `; its service stands aside (${STANDBY_WORDS[standing]}), but no other route selects the packet, so it stays with it (dropped there while it cannot carry)`;
        }
        return ranked(r, i + 1, proposedIds, 'wins', order?.key ?? 'only', standing, reason);
      }
      const order = orderBetween(winner!, r, standby)!;
      const reason = `loses to route ${idText(winner!, proposedIds)}: ${againstText(order.key, winner!, r, standby, runtime, proposedIds)}`;
      return ranked(
        r,
        i + 1,
        proposedIds,
        standing !== null ? 'stands_aside' : 'loses',
        order.key,
        standing,
        reason,
      );
    });
    for (const r of this.inactive.selecting(src, dst)) {
      const reason = `never selects: ${STANDBY_WORDS.inactive}, so the agent carries none of its routes`;
      ranking.push(ranked(r, ranking.length + 1, proposedIds, 'inactive', 'inactive', 'inactive', reason));
    }
    const winnerView = winner
      ? winnerDetails(this.services.get(winner.serviceId)!, winner, packet, runtime, proposedIds)
      : null;
    const closest = winner || excluded ? null : this.closest(packet, src, dst);
    return {
      agent: config.localPeerId,
      packet,
      proposed: proposedIds.size > 0,
      dataplane: runtime !== null,
      selected: winner !== null,
      excluded,
      ranking,
      winner: winnerView,
      closest,
      kernel: null,
      kernel_agrees: null,
      kernel_difference: null,
      verdict: verdictLine(packet, winnerView, excluded, closest, runtime, now),
    };
  }

  /**
   * Nothing selects the packet: the route nearest to selecting it, over every route of the
   * cluster. A route whose addresses hold the packet comes first (it fails for another reason:
   * another agent is its ingress, its service is inactive); then the one with fewest fields that
   * miss, then the fewest prefix bits missing.
   */
  private closest(
    packet: ExplainPacket,
    src: Uint8Array | undefined,
    dst: Uint8Array | undefined,
  ): ClosestRoute | null {
    let best: { route: PlanRoute; misses: number; bits: number; why: string[] } | null = null;
    for (const { route: r, dest, source } of this.parsed) {
      const s = this.services.get(r.serviceId);
      if (!s) continue;
      const why: string[] = [];
      let misses = 0;
      let bits = 0;
      for (const [label, text, cidr, parsed, address] of [
        ['destination', packet.destination, r.destCidr, dest, dst],
        ['source', packet.source, r.sourceCidr, source, src],
      ] as const) {
        const miss = cidrMiss(cidr, parsed, address);
        if (miss === null) continue;
        misses++;
        bits += miss.bits;
        why.push(
          miss.family
            ? `${label} ${text} is IPv${address?.length === 4 ? 4 : 6}, the route's ${cidr} is not`
            : `${label} ${text} is outside ${cidr} (${miss.matching} of its ${miss.prefix} prefix bits match)`,
        );
      }
      if (s.sourcePeerId !== this.config.localPeerId) {
        why.push(
          `its service's ingress is peer ${s.sourcePeerId}, not this agent: ask that agent (peer=${s.sourcePeerId})`,
        );
      } else if (!this.carried.has(s.id)) {
        why.push(STANDBY_WORDS.inactive);
      }
      if (
        best === null ||
        misses < best.misses ||
        (misses === best.misses && (bits < best.bits || (bits === best.bits && r.id < best.route.id)))
      )
        best = { route: r, misses, bits, why };
    }
    if (!best) return null;
    const r = best.route;
    return {
      route_id: r.id,
      service_id: r.serviceId,
      priority: r.priority,
      source_cidr: r.sourceCidr,
      dest_cidr: r.destCidr,
      why: best.why,
    };
  }
}

function ranked(
  r: PlanRoute,
  rank: number,
  proposed: ReadonlySet<number>,
  outcome: RankedRoute['outcome'],
  decidedBy: RankedRoute['decided_by'],
  standing: StandbyReason | null,
  reason: string,
): RankedRoute {
  const isProposed = proposed.has(r.id);
  return {
    rank,
    route_id: isProposed ? null : r.id,
    service_id: r.serviceId,
    priority: r.priority,
    source_cidr: r.sourceCidr,
    dest_cidr: r.destCidr,
    proposed: isProposed,
    outcome,
    decided_by: decidedBy,
    standby_reason: standing,
    reason,
  };
}

const idText = (r: PlanRoute, proposed: ReadonlySet<number>) =>
  proposed.has(r.id) ? '(proposed)' : String(r.id);
const any = (cidr: string | null) => cidr ?? 'any';

/** Why `first` ranks before `second`, by the key that decided it. */
function againstText(
  key: OrderKey,
  first: PlanRoute,
  second: PlanRoute,
  standby: ReadonlySet<string>,
  runtime: IngressRuntime | null,
  proposed: ReadonlySet<number>,
): string {
  switch (key) {
    case 'standby': {
      const aside = standby.has(second.serviceId) ? second : first;
      const reason = runtime?.health.get(aside.serviceId)?.standbyReason ?? 'unknown';
      return `service ${aside.serviceId} stands aside (${STANDBY_WORDS[reason]}): its routes rank after every route of the others`;
    }
    case 'priority':
      return `priority ${first.priority} before ${second.priority} (lower wins)`;
    case 'dest_prefix':
      return `destination ${any(first.destCidr)} is more specific than ${any(second.destCidr)}`;
    case 'source_prefix':
      return `same priority and destination length; source ${any(first.sourceCidr)} is more specific than ${any(second.sourceCidr)}`;
    case 'id':
      // A proposed route's id is drawn when it is created: the tie could go either way.
      return proposed.has(first.id) || proposed.has(second.id)
        ? 'same priority and prefix lengths: the lower route id wins, and a proposed route gets its id when it is created, so this tie may go either way'
        : `same priority and prefix lengths: the lower route id wins (${first.id} < ${second.id})`;
  }
}

/**
 * Traffic the plan's exclusion rules (pref 21000) send to the main table before any route:
 * to a peer's address (gossip, tunnels) or loopback.
 */
function exclusion(destination: string, peerIps: readonly string[]): string | null {
  if (peerIps.includes(destination)) {
    return `excluded: ${destination} is a peer's address; the agent's own traffic (gossip, tunnels) is never selected`;
  }
  const loopback = parseCidrLoose(destination)!;
  if ((loopback.family === 4 && loopback.bytes[0] === 127) || destination === '::1') {
    return `excluded: ${destination} is loopback, never selected`;
  }
  return null;
}

function winnerDetails(
  s: PlanService,
  route: PlanRoute,
  packet: ExplainPacket,
  runtime: IngressRuntime | null,
  proposed: ReadonlySet<number>,
): ExplainWinner {
  const exitMode =
    s.fullyTransparent && s.requiresInterface ? 'transparent' : s.requiresInterface ? 'macvlan' : 'nat';
  const addresses =
    exitMode === 'nat' ? [] : [s.desiredIpv4Cidr, s.desiredIpv6Cidr].filter((c): c is string => !!c);
  const verdict = runtime?.health.get(s.id);
  const tunnel = runtime?.tunnels.get(s.id);
  const iso = (ms: number) => new Date(ms).toISOString();
  return {
    service_id: s.id,
    route_id: proposed.has(route.id) ? null : route.id,
    target_peer_id: s.targetPeerId,
    transport: s.transportType ?? 'tcp',
    exit_mode: exitMode,
    exit_addresses: addresses,
    bandwidth_limit_mbps: s.bandwidthLimitMbps ?? 0,
    carried_as:
      packet.protocol === null || runtime === null
        ? null
        : packet.protocol === 'tcp' && runtime.streams
          ? 'stream'
          : 'packets',
    interface: runtime?.tuns.get(s.id) ?? null,
    tunnel: tunnel ? { state: tunnel.state, rtt_ms: tunnel.rttMs } : null,
    health: verdict
      ? {
          state: verdict.state,
          reason: verdict.reason,
          since: iso(verdict.since),
          carrying: verdict.carrying,
          hold_down_until: verdict.holdDownUntil === null ? null : iso(verdict.holdDownUntil),
        }
      : null,
  };
}

/** Whether a route CIDR misses an address, and by how much (null: it holds it). */
function cidrMiss(
  text: string | null,
  c: ParsedCidr | null,
  address: Uint8Array | undefined,
): { family: boolean; bits: number; matching: number; prefix: number } | null {
  if (text === null || address === undefined) return null;
  if (!c) return { family: false, bits: 128, matching: 0, prefix: 0 };
  if (c.bytes.length !== address.length) return { family: true, bits: 128, matching: 0, prefix: c.prefix };
  let matching = 0;
  while (matching < c.prefix && bit(c.bytes, matching) === bit(address, matching)) matching++;
  return matching === c.prefix
    ? null
    : { family: false, bits: c.prefix - matching, matching, prefix: c.prefix };
}

const bit = (bytes: Uint8Array, i: number) => (bytes[i >> 3]! >> (7 - (i & 7))) & 1;

function verdictLine(
  packet: ExplainPacket,
  winner: ExplainWinner | null,
  excluded: string | null,
  closest: ClosestRoute | null,
  runtime: IngressRuntime | null,
  now: number,
): string {
  const what = `${packet.source} -> ${packet.destination}${packet.protocol ? ` ${packet.protocol}` : ''}${packet.port !== null ? `/${packet.port}` : ''}`;
  if (excluded) return `${what}: not selected (${excluded}); it follows the host's own routing`;
  if (!winner) {
    const near = closest ? `; closest: route ${closest.route_id} (${closest.why.join('; ')})` : '';
    return `${what}: no route selects it at this agent; it follows the host's own routing${near}`;
  }
  const parts = [
    `service ${winner.service_id} by route ${winner.route_id ?? '(proposed)'}`,
    `to peer ${winner.target_peer_id} over ${winner.transport}`,
    `exit ${winner.exit_mode}`,
  ];
  if (winner.carried_as) parts.push(`as ${winner.carried_as === 'stream' ? 'a stream' : 'packets'}`);
  if (winner.health) {
    const h = winner.health;
    const hold = h.hold_down_until
      ? `, hold-down for ${Math.max(0, Math.ceil((Date.parse(h.hold_down_until) - now) / 1000))} s`
      : '';
    parts.push(`${h.state}${h.reason ? ` (${h.reason})` : ''}${h.carrying ? '' : `, standing aside${hold}`}`);
  }
  if (winner.tunnel)
    parts.push(
      `tunnel ${winner.tunnel.state}${winner.tunnel.rtt_ms !== null ? ` rtt ${winner.tunnel.rtt_ms} ms` : ''}`,
    );
  if (!runtime) parts.push('no data plane on this agent: from the configuration only');
  return `${what}: ${parts.join(', ')}`;
}

/** An address of the query in canonical text, or undefined when it is not an IP literal. */
export function canonicalAddress(text: string): { family: 4 | 6; text: string } | undefined {
  const ip = parseIp(text);
  return ip && { family: ip.family, text: formatIp(ip.bytes) };
}

/**
 * The explanation with the kernel's view: whether the kernel sends the packet into the TUN of the
 * service the configuration selects (or into none, when none is selected), and if not, what differs.
 */
export function withKernel(e: Explanation, kernel: KernelView): Explanation {
  const expected = e.winner?.service_id ?? null;
  const agrees = kernel.service_id === expected;
  const goes = kernel.route
    ? kernel.service_id
      ? `into service ${kernel.service_id}'s tunnel (${kernel.route.dev})`
      : `out of ${kernel.route.dev}${kernel.route.gateway ? ` via ${kernel.route.gateway}` : ''} (route ${kernel.route.prefix}), not into a tunnel`
    : 'nowhere (no route)';
  let difference: string | null = null;
  if (!agrees) {
    const wanted = expected
      ? `service ${expected} (route ${e.winner?.route_id ?? '(proposed)'})`
      : 'no service';
    difference = `the configuration selects ${wanted}, but the kernel sends it ${goes}`;
    if (kernel.repairs.length > 0) difference += `; the reconciler will repair: ${kernel.repairs.join('; ')}`;
  }
  return {
    ...e,
    kernel,
    kernel_agrees: agrees,
    kernel_difference: difference,
    verdict: `${e.verdict}; ${agrees ? `the kernel agrees (${goes})` : `the kernel disagrees: ${difference}`}`,
  };
}
