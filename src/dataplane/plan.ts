/**
 * The data plane's pure core: from the replicated services and routes (as this agent sees them)
 * to the kernel state this agent wants (docs/decisions.md §6). No I/O: the reconciler feeds it and
 * applies the difference through the kernel port. docs/dataplane.md draws the result.
 *
 * Per service this agent carries, one slot N (1..4095) names everything: TUN `mesh-tN`, tables
 * tableOf(N) / exitTableOf(N), mark N << 16, MACVLAN `mesh-mN`.
 *
 * Ingress (source peer): each route becomes one policy rule per family, ordered by the route
 * selection order of docs/decisions.md §6 (priority, then longer destination prefix, then longer source
 * prefix, then lower route id), looking up tableOf(N), whose default route is the service's TUN.
 * Exit (target peer): packets read from the tunnel are written to the TUN; they get the
 * connection mark N, are NATed (masquerade, or SNAT to the MACVLAN address) and routed by main
 * (or by exitTableOf(N), out of the MACVLAN). Replies carry the connection mark back into a
 * packet mark, which a rule sends to tableOf(N), into the TUN.
 *
 * For the stream path it also names the service of a TCP connection by the same route order
 * (RouteMatcher: compiled once, asked per connection by dataplane.ts at the ingress and the exit).
 */
import { formatIp, parseCidr, parseIp } from '../domain/cidr.js';
import type { HealthProbe } from '../domain/health-check.js';
import { formatCidr, masked, parseCidrLoose } from './kernel/canonical.js';
import {
  AGENT_MARK,
  exitTableOf,
  exitTunAddress,
  INTERCEPT_MARK,
  INTERCEPT_TABLE,
  MARK_MASK,
  macvlanMac,
  macvlanName,
  markOf,
  PACE_MARK,
  paceMarkOf,
  pacerGateway,
  pacerName,
  pacerPeerAddress,
  pacerTableOf,
  RULE_PREF,
  TRANSPARENT_MARK,
  tableOf,
  transparentSocketMark,
  tunName,
} from './kernel/ownership.js';
import type { Family, KernelState, LinkSpec, RouteSpec, RuleSpec } from './kernel/port.js';

/** A service's transport_type: the tunnel transport that carries it. */
export type TransportKind = 'tcp' | 'kcp';

/** A service as the data plane needs it. */
export interface PlanService {
  id: string;
  sourcePeerId: string;
  targetPeerId: string;
  /** Both peers active: an inactive service carries nothing. */
  isActive: boolean;
  requiresInterface: boolean;
  /** Interface address with prefix, e.g. 10.91.2.50/24. */
  desiredIpv4Cidr: string | null;
  desiredIpv6Cidr: string | null;
  /** bandwidth_limit_mbps: 0 or absent is unlimited (docs/decisions.md §6). */
  bandwidthLimitMbps?: number;
  /** fully_transparent: the exit's TCP leaves from the client's own address (docs/transparent.md). */
  fullyTransparent?: boolean;
  /** transport_type; default tcp. */
  transportType?: TransportKind;
  /** health_check (docs/decisions.md §7): the probe the exit runs; null or absent: none. */
  healthCheck?: HealthProbe | null;
}

export interface PlanRoute {
  id: number;
  serviceId: string;
  priority: number;
  sourceCidr: string | null;
  destCidr: string | null;
}

export interface PlanInput {
  localPeerId: string;
  services: readonly PlanService[];
  routes: readonly PlanRoute[];
  /** IP addresses of every peer of the cluster (this one included): never selected. */
  peerIps: readonly string[];
  /** TCP port of the management API (gossip and the tunnel share it): its replies are never selected. */
  apiPort: number;
  /** Slot of every service this agent carries (see SlotTable). */
  slots: ReadonlyMap<string, number>;
  /** MACVLAN parent and its gateways (the --macvlan-parent interface, or the default route's). */
  uplink: { dev: string; gateway4: string | null; gateway6: string | null } | null;
  /** MTU of the TUN devices (per transport: tcp carries whole packets, so the link's own). */
  tunMtu: number;
  /** Services whose tunnel is not up: their TCP gets a reset and the rest an ICMP error. */
  unreachable: ReadonlySet<string>;
  /**
   * Ingress services standing aside (failover, health.ts): their routes rank after every route
   * of the others, so that the next route selecting the traffic carries it, and they get only
   * what nothing else selects (dropped there as before, never looped). Default: none.
   */
  standby?: ReadonlySet<string>;
  /**
   * Port of the agent's TPROXY listener on 127.0.0.1 and ::1: selected TCP is intercepted and
   * carried as streams. Absent or null: TCP travels as packets like everything else.
   */
  interceptPort?: number | null;
  /**
   * The agent opens stream sockets (SO_MARK AGENT_MARK; it does once the multiplexer runs, even
   * when its listener could not be opened): they get their rules (AGENT pref, MACVLAN sources).
   * Default: whether interceptPort is set.
   */
  agentSockets?: boolean;
  /** The transports this agent has (default: tcp only); a service of another is a problem. */
  transports?: ReadonlySet<TransportKind>;
  /**
   * The families whose paced packets the host lets through (dataplane.ts pacingAllowed: it
   * forwards them, and takes them back in): limited services this agent is the ingress of get a
   * pacer, and their clients' TCP of these families goes through it. Elsewhere the clients' own
   * send buffers hold what the limit keeps back. Default: none.
   */
  pacing?: ReadonlySet<Family>;
}

export type Role = 'ingress' | 'exit';

/** What this agent carries for one service. */
export interface CarriedService {
  serviceId: string;
  slot: number;
  role: Role;
  /** The peer at the other end of the tunnel. */
  peerId: string;
  /** The transport whose tunnel to peerId carries the service. */
  transport: TransportKind;
  tun: string;
  macvlan: string | null;
  /**
   * fully_transparent (at either end: the ingress flags its streams, the exit opens them from the
   * client's address). Only with a MACVLAN at the exit: the validation refuses it otherwise.
   */
  transparent: boolean;
}

export interface Plan {
  kernel: KernelState;
  carried: CarriedService[];
  /** The IP families the carried services' routes select (a route without CIDRs: both). */
  families: ReadonlySet<Family>;
  /** Why a service cannot be carried as asked (e.g. a MACVLAN without a parent), by service id. */
  problems: Map<string, string>;
}

const FAMILIES: readonly Family[] = [4, 6];

/** The services this agent is an end of, with their role; inactive ones are left out. */
export function carriedServices(
  input: Pick<PlanInput, 'localPeerId' | 'services' | 'slots'>,
): CarriedService[] {
  const out: CarriedService[] = [];
  for (const s of input.services) {
    if (!s.isActive) continue;
    const role: Role | null =
      s.sourcePeerId === input.localPeerId ? 'ingress' : s.targetPeerId === input.localPeerId ? 'exit' : null;
    const slot = input.slots.get(s.id);
    if (!role || slot === undefined) continue;
    out.push({
      serviceId: s.id,
      slot,
      role,
      peerId: role === 'ingress' ? s.targetPeerId : s.sourcePeerId,
      tun: tunName(slot),
      macvlan: role === 'exit' && s.requiresInterface ? macvlanName(slot) : null,
      transparent: (s.fullyTransparent ?? false) && s.requiresInterface,
      transport: s.transportType ?? 'tcp',
    });
  }
  return out.sort((a, b) => a.slot - b.slot);
}

/**
 * The selection order with failover: the routes of services standing aside after all the others,
 * each group in the selection order (compareRoutes).
 */
export function routeOrder(
  standby: ReadonlySet<string> = NO_SERVICES,
): (a: PlanRoute, b: PlanRoute) => number {
  if (standby.size === 0) return compareRoutes;
  return (a, b) => rankBetween(a, b, standby);
}

const NO_SERVICES: ReadonlySet<string> = new Set();

/** docs/decisions.md §6 selection order: lower priority, longer destination, longer source, lower id. */
export function compareRoutes(a: PlanRoute, b: PlanRoute): number {
  return rankBetween(a, b, NO_SERVICES);
}

/** The keys of the selection order, in the order they are asked (orderBetween). */
export type OrderKey = 'standby' | 'priority' | 'dest_prefix' | 'source_prefix' | 'id';
const ORDER_KEYS: readonly OrderKey[] = ['standby', 'priority', 'dest_prefix', 'source_prefix', 'id'];

/**
 * Which key of the selection order (with failover) puts `a` before or after `b`, and which way:
 * `difference` -1 when `a` comes first, 1 when `b` does. Null for the same route. routeOrder and
 * compareRoutes are this comparison, and explain (explain.ts) names its key, so a reason can
 * never disagree with the order that ranked the routes.
 */
export function orderBetween(
  a: PlanRoute,
  b: PlanRoute,
  standby: ReadonlySet<string>,
): { key: OrderKey; difference: -1 | 1 } | null {
  const r = rankBetween(a, b, standby);
  return r === 0 ? null : { key: ORDER_KEYS[Math.abs(r) - 1]!, difference: r < 0 ? -1 : 1 };
}

/**
 * The comparison itself, without allocating (it runs inside sorts): negative when `a` comes
 * first, positive when `b` does, 0 for the same route; its magnitude is 1 + the index in
 * ORDER_KEYS of the key that decided.
 */
function rankBetween(a: PlanRoute, b: PlanRoute, standby: ReadonlySet<string>): number {
  if (standby.size > 0) {
    const d = Number(standby.has(a.serviceId)) - Number(standby.has(b.serviceId));
    if (d !== 0) return d;
  }
  let d = a.priority - b.priority;
  if (d !== 0) return d < 0 ? -2 : 2;
  d = prefixLength(b.destCidr) - prefixLength(a.destCidr);
  if (d !== 0) return d < 0 ? -3 : 3;
  d = prefixLength(b.sourceCidr) - prefixLength(a.sourceCidr);
  if (d !== 0) return d < 0 ? -4 : 4;
  d = a.id - b.id;
  return d === 0 ? 0 : d < 0 ? -5 : 5;
}

/** A route CIDR's prefix length; -1 for none (any address), which ranks after /0. */
export function prefixLength(cidr: string | null): number {
  return cidr === null ? -1 : Number(cidr.slice(cidr.indexOf('/') + 1));
}

function familyOf(route: PlanRoute): Family | null {
  const any = route.sourceCidr ?? route.destCidr;
  return any === null ? null : any.includes(':') ? 6 : 4;
}

export function plan(input: PlanInput): Plan {
  const carried = carriedServices(input);
  const problems = new Map<string, string>();
  const links: LinkSpec[] = [];
  const addresses: KernelState['addresses'] = [];
  const routes: RouteSpec[] = [];
  const rules: RuleSpec[] = [];
  const byId = new Map(input.services.map((s) => [s.id, s]));
  const agentSockets = input.agentSockets ?? input.interceptPort != null;

  const transports = input.transports ?? new Set<TransportKind>(['tcp']);
  for (const c of carried) {
    if (!transports.has(c.transport)) {
      problems.set(c.serviceId, `transport_type ${c.transport} is not available on this agent`);
    }
    links.push({ name: c.tun, kind: 'tun', mtu: input.tunMtu });
    // Lets loose reverse-path filtering pass the clients' packets (ownership.ts exitTunAddress).
    if (c.role === 'exit') addresses.push({ dev: c.tun, cidr: exitTunAddress(c.slot) });
    // Into the TUN: the ingress's selected traffic, the exit's replies.
    for (const family of FAMILIES) {
      routes.push({ family, table: tableOf(c.slot), dst: 'default', dev: c.tun });
    }
    let fromTunTable: number | 'main' = 'main';
    if (c.macvlan) {
      const service = byId.get(c.serviceId)!;
      if (!input.uplink) {
        problems.set(
          c.serviceId,
          'requires_interface: no --macvlan-parent and no default route to attach to',
        );
      } else {
        links.push({
          name: c.macvlan,
          kind: 'macvlan',
          parent: input.uplink.dev,
          mac: macvlanMac(c.serviceId),
          mtu: 1500,
        });
        fromTunTable = exitTableOf(c.slot);
        for (const [cidrText, gateway] of [
          [service.desiredIpv4Cidr, input.uplink.gateway4],
          [service.desiredIpv6Cidr, input.uplink.gateway6],
        ] as const) {
          const cidr = cidrText ? parseCidr(cidrText, false) : undefined;
          if (!cidr) continue;
          addresses.push({ dev: c.macvlan, cidr: cidr.text });
          const network = networkOf(cidr.text);
          routes.push({ family: cidr.family, table: fromTunTable, dst: network, dev: c.macvlan });
          if (gateway && cidrHolds(network, gateway)) {
            routes.push({
              family: cidr.family,
              table: fromTunTable,
              dst: 'default',
              dev: c.macvlan,
              via: gateway,
            });
          }
        }
      }
    }
    for (const family of FAMILIES) {
      // Packets the agent writes into a TUN are never selected again (that would loop).
      rules.push({ family, pref: RULE_PREF.FROM_TUN, iif: c.tun, table: fromTunTable });
      if (c.role === 'exit') {
        rules.push({
          family,
          pref: RULE_PREF.REPLY,
          fwmark: { value: markOf(c.slot), mask: MARK_MASK },
          table: tableOf(c.slot),
        });
      }
      if (c.role === 'exit' && c.transparent && fromTunTable !== 'main' && agentSockets) {
        // Sockets bound to a client's address: out of the MACVLAN whatever that address is.
        const mark = transparentSocketMark(c.slot);
        rules.push({
          family,
          pref: RULE_PREF.TRANSPARENT,
          fwmark: { value: mark & (TRANSPARENT_MARK | MARK_MASK), mask: TRANSPARENT_MARK | MARK_MASK },
          table: fromTunTable,
        });
      }
    }
  }

  // Ingress selection: every route of every service this agent is the ingress of, in order.
  const slotOfService = new Map(
    carried.filter((c) => c.role === 'ingress').map((c) => [c.serviceId, c.slot]),
  );
  const selecting = ingressRoutes(carried, input.routes).sort(routeOrder(input.standby));
  const nextPref: Record<Family, number> = { 4: RULE_PREF.ROUTES_FIRST, 6: RULE_PREF.ROUTES_FIRST };
  for (const route of selecting) {
    const only = familyOf(route);
    for (const family of only === null ? FAMILIES : [only]) {
      const pref = nextPref[family]++;
      if (pref > RULE_PREF.LAST) {
        problems.set(
          route.serviceId,
          `too many routes on this ingress (rule range ends at ${RULE_PREF.LAST})`,
        );
        continue;
      }
      const rule: RuleSpec = { family, pref, table: tableOf(slotOfService.get(route.serviceId)!) };
      if (route.sourceCidr !== null) rule.from = route.sourceCidr;
      if (route.destCidr !== null) rule.to = route.destCidr;
      rules.push(rule);
    }
  }

  // The agent's own traffic is excluded first, so that even a catch-all route keeps the cluster
  // (gossip, tunnels: to peer addresses; API replies: from its port) and loopback working.
  if (selecting.length > 0) {
    for (const ip of [...new Set(input.peerIps)].sort()) {
      const family: Family = ip.includes(':') ? 6 : 4;
      rules.push({
        family,
        pref: RULE_PREF.EXCLUDE,
        to: family === 4 ? `${ip}/32` : `${ip}/128`,
        table: 'main',
      });
    }
    for (const family of FAMILIES) {
      rules.push({
        family,
        pref: RULE_PREF.EXCLUDE,
        to: family === 4 ? '127.0.0.0/8' : '::1/128',
        table: 'main',
      });
      rules.push({ family, pref: RULE_PREF.EXCLUDE, ipproto: 'tcp', sport: input.apiPort, table: 'main' });
    }
  }

  const intercepting = input.interceptPort != null && slotOfService.size > 0;
  const pacing = input.pacing ?? new Set<Family>();
  const paced = intercepting && pacing.size > 0 ? pacedServices(carried, byId) : [];
  for (const c of paced) {
    const name = pacerName(c.slot);
    links.push({
      name,
      kind: 'pacer',
      mtu: PACER_MTU,
      rateBps: Math.round(byId.get(c.serviceId)!.bandwidthLimitMbps! * 1e6 * PACER_WIRE_PER_PAYLOAD),
      peerAddress: pacerPeerAddress(c.slot),
    });
    for (const family of FAMILIES) {
      routes.push({
        family,
        table: pacerTableOf(c.slot),
        dst: 'default',
        dev: name,
        via: pacerGateway(c.slot, family),
      });
      rules.push({
        family,
        pref: RULE_PREF.PACE,
        fwmark: { value: paceMarkOf(c.slot), mask: (PACE_MARK | MARK_MASK) >>> 0 },
        table: pacerTableOf(c.slot),
      });
    }
  }
  // Replies to a transparent exit's sockets are addressed to the client: delivered locally by
  // the same mark and table as TPROXY's.
  const transparentExits = agentSockets
    ? carried.filter((c) => c.role === 'exit' && c.transparent && !problems.has(c.serviceId))
    : [];
  for (const family of FAMILIES) {
    if (agentSockets && slotOfService.size > 0) {
      // The agent's own stream sockets (replies to intercepted clients, an exit's connections)
      // are never selected again.
      rules.push({
        family,
        pref: RULE_PREF.AGENT,
        fwmark: { value: AGENT_MARK, mask: AGENT_MARK },
        table: 'main',
      });
    }
    if (intercepting || transparentExits.length > 0) {
      rules.push({
        family,
        pref: RULE_PREF.INTERCEPT,
        fwmark: { value: INTERCEPT_MARK, mask: INTERCEPT_MARK },
        table: INTERCEPT_TABLE,
      });
      routes.push({ family, table: INTERCEPT_TABLE, dst: 'default', dev: 'lo', type: 'local' });
    }
  }
  if (agentSockets) {
    // An exit's stream sockets leave from the MACVLAN address: by the MACVLAN's table.
    for (const a of addresses) {
      const c = carried.find((x) => x.macvlan === a.dev);
      if (!c) continue;
      const family: Family = a.cidr.includes(':') ? 6 : 4;
      const host = `${a.cidr.split('/')[0]}/${family === 4 ? 32 : 128}`;
      rules.push({ family, pref: RULE_PREF.FROM_TUN, from: host, table: exitTableOf(c.slot) });
    }
  }

  const carriedIds = new Set(carried.map((c) => c.serviceId));
  const families = new Set<Family>();
  for (const r of input.routes) {
    if (!carriedIds.has(r.serviceId)) continue;
    const only = familyOf(r);
    for (const f of only === null ? FAMILIES : [only]) families.add(f);
  }
  return {
    families,
    kernel: {
      links,
      addresses,
      rules,
      routes,
      nft:
        carried.length > 0
          ? nftRuleset(
              carried,
              byId,
              input.unreachable,
              intercepting ? input.interceptPort! : null,
              transparentExits.length > 0,
              paced,
              pacing,
            )
          : null,
    },
    carried,
    problems,
  };
}

/**
 * A pacer's MTU: the largest a veth takes, so that no packet a client's interface took (a GRO or
 * TSO burst of up to 64 KiB) is too big for it.
 */
const PACER_MTU = 65_535;

/**
 * The limit counts payload (docs/decisions.md §6); the pacer's queue counts frames. A full-size
 * IPv4 segment with timestamps is 1448 bytes of payload in a 1514-byte frame, so the pacer sends
 * that much more than the limit, and the payload it lets through is the limit's.
 */
const PACER_WIRE_PER_PAYLOAD = 1514 / 1448;

/**
 * The services whose clients' TCP goes through a pacer on its way to the interception (docs/
 * dataplane.md, "Pacing a limited service's clients"): those this agent is the ingress of, with a
 * bandwidth limit. The ingress limits what goes up.
 */
export function pacedServices(
  carried: readonly CarriedService[],
  byId: ReadonlyMap<string, PlanService>,
): CarriedService[] {
  return carried.filter((c) => c.role === 'ingress' && (byId.get(c.serviceId)!.bandwidthLimitMbps ?? 0) > 0);
}

/**
 * The routes that select traffic at this agent: those of the services it carries as their
 * ingress (inactive services are not carried). The policy rules are made from these, the TPROXY
 * interception names connections by them, and explain ranks them.
 */
export function ingressRoutes(carried: readonly CarriedService[], routes: readonly PlanRoute[]): PlanRoute[] {
  const ingress = new Set(carried.filter((c) => c.role === 'ingress').map((c) => c.serviceId));
  return routes.filter((r) => ingress.has(r.serviceId));
}

/**
 * The agent's nftables table. Connection marks tie an exit's connections to their service, so
 * replies find the TUN they came from whatever their destination; NAT makes the exit (or its
 * MACVLAN) the source; forwarded SYNs into a TUN get their MSS clamped to the route's MTU. While
 * a service's tunnel is down, what would enter its TUN is refused (TCP reset, ICMP otherwise), so
 * a client sees an error at once instead of retransmitting into a void for minutes.
 */
function nftRuleset(
  carried: readonly CarriedService[],
  byId: ReadonlyMap<string, PlanService>,
  unreachable: ReadonlySet<string>,
  interceptPort: number | null,
  transparentReplies: boolean,
  paced: readonly CarriedService[],
  pacing: ReadonlySet<Family>,
): string {
  const exits = carried.filter((c) => c.role === 'exit');
  const hex = (n: number) => `0x${n.toString(16).padStart(8, '0')}`;
  const pre: string[] = [];
  const post: string[] = [];
  for (const c of exits) {
    pre.push(`iifname "${c.tun}" ct mark set ${hex(markOf(c.slot))}`);
    const service = byId.get(c.serviceId)!;
    if (c.macvlan) {
      const v4 = service.desiredIpv4Cidr && parseCidr(service.desiredIpv4Cidr, false);
      const v6 = service.desiredIpv6Cidr && parseCidr(service.desiredIpv6Cidr, false);
      const addr4 = v4 ? v4.text.split('/')[0] : null;
      const addr6 = v6 ? v6.text.split('/')[0] : null;
      if (addr4) post.push(`iifname "${c.tun}" oifname "${c.macvlan}" meta nfproto ipv4 snat ip to ${addr4}`);
      if (addr6)
        post.push(`iifname "${c.tun}" oifname "${c.macvlan}" meta nfproto ipv6 snat ip6 to ${addr6}`);
    } else {
      post.push(`iifname "${c.tun}" oifname != "${c.tun}" masquerade`);
    }
  }
  if (exits.length > 0) {
    pre.push(
      `ct direction reply ct mark and ${hex(MARK_MASK)} != 0 meta mark set ct mark and ${hex(MARK_MASK)}`,
    );
  }
  const refused = carried.filter((c) => unreachable.has(c.serviceId)).map((c) => `"${c.tun}"`);
  const refuse =
    refused.length === 0
      ? []
      : [
          `oifname { ${refused.join(', ')} } meta l4proto tcp reject with tcp reset`,
          `oifname { ${refused.join(', ')} } reject`,
        ];
  const intercept: string[] = [];
  const interceptLocal: string[] = [];
  if (transparentReplies) {
    intercept.push(
      // Replies to a transparent exit's connections: addressed to the client, whom this host is
      // not, yet theirs is the agent's socket (IP_TRANSPARENT, TRANSPARENT_MARK): delivered to it.
      `meta l4proto tcp socket transparent 1 socket mark and ${hex(TRANSPARENT_MARK)} == ${hex(TRANSPARENT_MARK)} meta mark set meta mark | ${hex(INTERCEPT_MARK)} accept`,
    );
  }
  const ingressTuns = carried.filter((c) => c.role === 'ingress').map((c) => `"${c.tun}"`);
  if (interceptPort !== null && ingressTuns.length > 0) {
    const tuns = `{ ${ingressTuns.join(', ')} }`;
    const mark = hex(INTERCEPT_MARK);
    const to = { ipv4: `ip to 127.0.0.1:${interceptPort}`, ipv6: `ip6 to [::1]:${interceptPort}` };
    intercept.push(
      // Out of a TUN: already carried (exit side, or replies); never intercepted.
      'iifname "mesh-t*" return',
      ...pacingRules(paced, pacing, hex),
      // Packets of connections the listener already accepted (its sockets carry the agent's
      // mark; other transparent proxies' sockets are not the agent's business).
      `meta l4proto tcp socket transparent 1 socket mark ${hex(AGENT_MARK)} meta mark set meta mark | ${mark} accept`,
      // Locally originated TCP, re-routed here through lo by intercept_local (fib sees lo there).
      ...(['ipv4', 'ipv6'] as const).map(
        (f) =>
          `iifname "lo" meta mark & ${mark} == ${mark} meta nfproto ${f} meta l4proto tcp tproxy ${to[f]} accept`,
      ),
      // Forwarded TCP that the policy rules would send into an ingress TUN: the same decision,
      // taken by the kernel's own lookup (fib), so the stream path selects exactly what the packet
      // path would.
      ...(['ipv4', 'ipv6'] as const).map(
        (f) =>
          `meta nfproto ${f} meta l4proto tcp fib daddr oifname ${tuns} tproxy ${to[f]} meta mark set meta mark | ${mark} accept`,
      ),
    );
    interceptLocal.push(
      `meta mark & ${hex(AGENT_MARK)} == ${hex(AGENT_MARK)} return`,
      `meta l4proto tcp oifname ${tuns} meta mark set meta mark | ${mark}`,
    );
  }
  const chain = (name: string, hook: string, body: string[]) =>
    body.length === 0 ? '' : `  chain ${name} {\n    ${hook}\n${body.map((l) => `    ${l}\n`).join('')}  }\n`;
  return [
    chain('prerouting', 'type filter hook prerouting priority mangle; policy accept;', pre),
    chain('postrouting', 'type nat hook postrouting priority srcnat; policy accept;', post),
    chain('forward', 'type filter hook forward priority mangle; policy accept;', [
      'oifname "mesh-t*" tcp flags syn tcp option maxseg size set rt mtu',
      // Bound for a pacer that is not there (being made again for a new rate): dropped, not let
      // into the TUN as packets, where the destination would reset the connection it never saw.
      ...(paced.length > 0
        ? [`meta mark & ${hex(PACE_MARK)} == ${hex(PACE_MARK)} oifname != "mesh-p*" drop`]
        : []),
    ]),
    chain('intercept', 'type filter hook prerouting priority mangle; policy accept;', intercept),
    chain('intercept_local', 'type route hook output priority mangle; policy accept;', interceptLocal),
    chain('refuse_forward', 'type filter hook forward priority filter; policy accept;', refuse),
    chain('refuse_output', 'type filter hook output priority filter; policy accept;', refuse),
  ].join('');
}

/**
 * The intercept chain's rules for paced services: their clients' TCP first goes out through the
 * service's pacer (marked for rule PACE) and is intercepted where it comes back in, at the pacer's
 * peer, as any other. Locally originated TCP (through lo) is not paced.
 */
function pacingRules(
  paced: readonly CarriedService[],
  families: ReadonlySet<Family>,
  hex: (n: number) => string,
): string[] {
  if (paced.length === 0) return [];
  const keep = hex(~(PACE_MARK | MARK_MASK) >>> 0);
  const nfproto = families.size === 2 ? '' : ` meta nfproto ${families.has(4) ? 'ipv4' : 'ipv6'}`;
  return [
    // Back from a pacer: without its mark, so that rule PACE cannot send it round again.
    `iifname "mesh-q*" meta mark set meta mark and ${keep}`,
    // The slot is written, not added to what the mark held: rule PACE matches the field whole.
    ...paced.map(
      (c) =>
        `iifname != "lo" iifname != "mesh-q*"${nfproto} meta l4proto tcp fib daddr oifname "${c.tun}" meta mark set meta mark and ${keep} or ${hex(paceMarkOf(c.slot))} accept`,
    ),
  ];
}

/**
 * The service an intercepted TCP connection from `src` to `dst` belongs to: that of the first
 * route, in selection order, whose CIDRs hold both addresses (a missing CIDR holds any address of
 * either family). The policy rules follow the same order, and TPROXY acts on their verdict (the
 * fib lookup in nftRuleset), so this names the service whose TUN the connection was bound for.
 * `routes`: the routes of the services this agent is the ingress of. Compiles the routes on every
 * call: where they are asked many times, keep a RouteMatcher instead.
 */
export function serviceOfConnection(
  routes: readonly PlanRoute[],
  src: string,
  dst: string,
  standby?: ReadonlySet<string>,
): string | null {
  return new RouteMatcher(routes, standby).serviceOf(src, dst);
}

/**
 * serviceOfConnection's routes compiled once, for lookups per connection (the data plane's
 * ingress names each intercepted connection with it, its exit checks each stream it is asked to
 * open): sorted into selection order once, every CIDR parsed once into masked 32-bit words, so
 * a lookup parses each address once and compares numbers, making no strings.
 */
export class RouteMatcher {
  private readonly routes: readonly {
    route: PlanRoute;
    serviceId: string;
    source: CompiledCidr;
    dest: CompiledCidr;
  }[];
  /** Whether any route has a source CIDR: if none, the source address need not be parsed. */
  private readonly anySource: boolean;

  /** @param standby services standing aside: their routes are asked last (routeOrder). */
  constructor(routes: readonly PlanRoute[], standby?: ReadonlySet<string>) {
    this.routes = [...routes].sort(routeOrder(standby)).map((r) => ({
      route: r,
      serviceId: r.serviceId,
      source: compileCidr(r.sourceCidr),
      dest: compileCidr(r.destCidr),
    }));
    this.anySource = routes.some((r) => r.sourceCidr !== null);
  }

  /** The service of a connection from `src` to `dst` (address texts), or null. */
  serviceOf(src: string, dst: string): string | null {
    return this.lookup(this.anySource ? wordsOf(parseAddress(src)) : undefined, wordsOf(parseAddress(dst)));
  }

  /** The same for addresses already parsed with parseAddress (undefined: not an address). */
  serviceOfParsed(src: Uint8Array | undefined, dst: Uint8Array | undefined): string | null {
    return this.lookup(wordsOf(src), wordsOf(dst));
  }

  /**
   * Every route whose CIDRs hold both addresses, in selection order: the first is the one
   * serviceOf names (explain shows the rest as the routes it beat). Undefined: not an address.
   */
  selecting(src: Uint8Array | undefined, dst: Uint8Array | undefined): PlanRoute[] {
    const s = wordsOf(src);
    const d = wordsOf(dst);
    return this.routes.filter((r) => holds(r.source, s) && holds(r.dest, d)).map((r) => r.route);
  }

  private lookup(src: Int32Array | undefined, dst: Int32Array | undefined): string | null {
    for (const r of this.routes) {
      if (holds(r.source, src) && holds(r.dest, dst)) return r.serviceId;
    }
    return null;
  }
}

/**
 * A route's CIDR ready to test addresses against: `net` the network's 32-bit words (1 for IPv4,
 * 4 for IPv6) with the host bits cleared, `mask` the prefix's. Kind 'any': a missing CIDR, holds
 * every address; 'none': one that does not parse, holds nothing (as before: such a route never
 * selects).
 */
interface CompiledCidr {
  kind: 'any' | 'none' | 'net';
  net: Int32Array;
  mask: Int32Array;
}

const NO_WORDS = new Int32Array(0);
const ANY_CIDR: CompiledCidr = { kind: 'any', net: NO_WORDS, mask: NO_WORDS };
const NO_CIDR: CompiledCidr = { kind: 'none', net: NO_WORDS, mask: NO_WORDS };

/** Like the kernel's own selectors: `address[/prefix]`, a bare address being a host. */
function compileCidr(text: string | null): CompiledCidr {
  if (text === null) return ANY_CIDR;
  const c = parseCidrLoose(text);
  if (!c) return NO_CIDR;
  const net = wordsOf(c.bytes)!;
  const mask = new Int32Array(net.length);
  for (let i = 0; i < net.length; i++) {
    const bits = Math.min(32, Math.max(0, c.prefix - 32 * i));
    // A shift by 32 is a shift by 0 in JS: a word without prefix bits is spelled out.
    mask[i] = bits === 0 ? 0 : -1 << (32 - bits);
    net[i]! &= mask[i]!;
  }
  return { kind: 'net', net, mask };
}

/** Whether the CIDR holds the address (words of the same family, same bits under the prefix). */
function holds(c: CompiledCidr, address: Int32Array | undefined): boolean {
  if (c.kind === 'any') return true;
  if (c.kind === 'none' || address === undefined || address.length !== c.net.length) return false;
  for (let i = 0; i < address.length; i++) {
    if ((address[i]! & c.mask[i]!) !== c.net[i]) return false;
  }
  return true;
}

/** 4 or 16 address bytes as 1 or 4 big-endian 32-bit words. */
function wordsOf(bytes: Uint8Array | undefined): Int32Array | undefined {
  if (bytes === undefined) return undefined;
  const words = new Int32Array(bytes.length >> 2);
  for (let i = 0; i < words.length; i++) {
    const b = 4 * i;
    words[i] = (bytes[b]! << 24) | (bytes[b + 1]! << 16) | (bytes[b + 2]! << 8) | bytes[b + 3]!;
  }
  return words;
}

/**
 * The bytes (4 or 16) of an address as a connection or stream names it, or undefined when it is
 * not one. A prefix is accepted and ignored (`10.0.0.1/24` is 10.0.0.1), as parseCidrLoose reads
 * it: route matching always took addresses that way.
 */
export function parseAddress(text: string): Uint8Array | undefined {
  if (typeof text !== 'string') return undefined;
  return text.includes('/') ? parseCidrLoose(text)?.bytes : parseIp(text)?.bytes;
}

/**
 * Whether an address (parseAddress's bytes) is never a destination a route leads to: loopback
 * (127/8, ::1), unspecified (0/8, ::), multicast (224/4, ff00::/8), the IPv4 broadcast
 * 255.255.255.255, and IPv6 whose text starts with `::ffff:` (v4-mapped ::ffff:0:0/96 and the
 * other addresses of ::/32 that print so, e.g. ::ffff:1:2:3): what the exit refused by text
 * before, for the canonical text it gets (stream-frames.ts formats the addresses it decodes).
 */
export function isSpecialDestination(bytes: Uint8Array): boolean {
  const b0 = bytes[0]!;
  if (bytes.length === 4) {
    return (
      b0 === 127 ||
      b0 === 0 ||
      (b0 >= 224 && b0 <= 239) ||
      (b0 === 255 && bytes[1] === 255 && bytes[2] === 255 && bytes[3] === 255)
    );
  }
  if (b0 === 0xff) return true;
  // Only ::/32 can print as `::`, `::1` or `::ffff:…` (two leading zero groups at least): the
  // text is made for those alone.
  if ((b0 | bytes[1]! | bytes[2]! | bytes[3]!) !== 0) return false;
  const text = formatIp(bytes);
  return text === '::' || text === '::1' || text.startsWith('::ffff:');
}

/** The network of an interface CIDR: 10.91.2.50/24 -> 10.91.2.0/24. */
export function networkOf(cidrText: string): string {
  return formatCidr(masked(parseCidrLoose(cidrText)!));
}

/** Whether the address lies in the network (same family, same bits under its prefix). */
export function cidrHolds(network: string, ip: string): boolean {
  return holds(compiledCidr(network), wordsOf(parseAddress(ip)));
}

/**
 * cidrHolds for one address against many networks, the address parsed once: explain tests a
 * packet's addresses against every policy rule of 1,000 routes, where parsing was most of it.
 */
export function holdsAddress(ip: string): (network: string) => boolean {
  const words = wordsOf(parseAddress(ip));
  return (network) => holds(compiledCidr(network), words);
}

/** compileCidr, remembered: the same few thousand rule and route networks come back each time. */
const compiledCidrs = new Map<string, CompiledCidr>();
const COMPILED_CIDRS_KEPT = 16_384;

function compiledCidr(text: string): CompiledCidr {
  let compiled = compiledCidrs.get(text);
  if (compiled === undefined) {
    if (compiledCidrs.size >= COMPILED_CIDRS_KEPT) compiledCidrs.clear();
    compiled = compileCidr(text);
    compiledCidrs.set(text, compiled);
  }
  return compiled;
}
