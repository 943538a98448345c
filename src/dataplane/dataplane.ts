/**
 * The data plane's shell: keeps the kernel and the tunnels in line with the replicated services
 * and routes, and moves packets between TUN devices and tunnels. The agent (src/agent.ts) feeds
 * it the store's view with update(); it never reads the store itself.
 *
 * Reconciling (one at a time, again when the view changed meanwhile, and on a timer to repair
 * drift): plan (pure) -> open/close TUNs -> observe owned kernel state -> diff (pure) -> apply.
 * At start it first removes every piece of owned state (a crashed predecessor's), at stop all of
 * its own.
 *
 * Packet path: a batch read from a service's TUN becomes one tunnel send to the service's other
 * end; a message from a tunnel is written to the TUN of the service it names, if the sender is
 * that service's other end (anything else is dropped and counted). Batches of messages that
 * arrive in one go are written to each TUN in one call. An ingress follows the TCP connections
 * it carries, to reset their clients when the tunnel dies (tcp-flows.ts).
 */
import { lookup } from 'node:dns/promises';
import { createServer, isIP, isIPv6, type Server, type Socket } from 'node:net';
import type { Logger } from 'pino';
import { isoTime } from '../domain/clock.js';
import type { HealthProbe } from '../domain/health-check.js';
import type { RecordObserved } from '../domain/observed-event.js';
import { parsePeerAddress } from '../domain/peer-address.js';
import { type TunnelMessage, type TunnelState, type TunnelTransport, wholeOf } from '../transports/tunnel.js';
import { diff } from './diff.js';
import { type ExitDestinations, ExitReach, type ExitReachVerdict } from './exit-reach.js';
import type { IngressRuntime, KernelView } from './explain.js';
import { HealthTracker, type HealthVerdict } from './health.js';
import { AGENT_MARK, pacerPeerName, tableOf, transparentSocketMark } from './kernel/ownership.js';
import type {
  KernelChange,
  KernelPort,
  KernelState,
  LinkSpec,
  RouteQuery,
  RuleSpec,
  Tun,
} from './kernel/port.js';
import { commandsOf, renderChange } from './kernel/render.js';
import { decodeMessage, encodePacket, uuidBytes } from './packet-frames.js';
import {
  type CarriedService,
  carriedServices,
  cidrHolds,
  holdsAddress,
  ingressRoutes,
  isSpecialDestination,
  type Plan,
  type PlanRoute,
  type PlanService,
  pacedServices,
  parseAddress,
  plan,
  RouteMatcher,
  type TransportKind,
} from './plan.js';
import { ProbeVerdicts, probeOnce } from './probe.js';
import { forwardingProblems, hasNetAdmin, pacingVerdict } from './requirements.js';
import { FairShaper } from './shaper.js';
import { SlotTable } from './slots.js';
import {
  decodeServiceStatus,
  encodeServiceStatus,
  KIND_SERVICE_STATUS,
  type ServiceStatus,
} from './status-frames.js';
import { isStreamKind } from './stream-frames.js';
import { emptyStats, type StreamEnds, StreamMux, type StreamStats } from './streams.js';
import { TcpFlowTable } from './tcp-flows.js';
import { TransparentChecks } from './transparent.js';

/** How long a peer name's DNS answer is used before it is looked up again. */
const PEER_NAME_TTL_MS = 60_000;

export interface DataPlaneView {
  localPeerId: string;
  services: readonly PlanService[];
  routes: readonly PlanRoute[];
  /** Every peer of the cluster with its `host:port` address. */
  peers: readonly { id: string; address: string }[];
}

export interface DataPlaneOptions {
  kernel: KernelPort;
  /**
   * The tunnel transports by transport_type. A service whose transport this agent lacks is
   * carried nowhere: its status says why.
   */
  transports: { tcp: TunnelTransport; kcp?: TunnelTransport };
  logger: Logger;
  apiPort: number;
  /** --macvlan-parent; null: the interface of the default route. */
  macvlanParent: string | null;
  reconcileIntervalMs?: number;
  tunMtu?: number;
  /**
   * What carrying TCP as streams needs of the native addon (src/native/sockets.ts): a TPROXY
   * listener and marked, optionally bound, outbound connections. Absent: TCP travels as packets.
   */
  sockets?: StreamSockets;
  /** Whether the process holds CAP_NET_ADMIN (transparent exits need it). Default: hasNetAdmin. */
  netAdmin?: () => boolean;
  /** Failover's timing (health.ts); default DEFAULT_FAILOVER. */
  failover?: FailoverOptions;
  /**
   * Runtime events (docs/events.md): tunnels up and down, ingress health changes and failover
   * switches, kernel drift repaired; each reported once, where it is logged.
   */
  observed?: RecordObserved;
}

export interface FailoverOptions {
  /** How often the ingress judges its services' health (ms); the tunnels' keepalives should match. */
  intervalMs: number;
  /** Intervals without a word from the peer before its tunnel counts as silent. */
  misses: number;
  /** How long a service healthy again waits before it takes its traffic back (ms; 0: at once). */
  holdDownMs: number;
}

export const DEFAULT_FAILOVER: FailoverOptions = { intervalMs: 500, misses: 3, holdDownMs: 30_000 };

export interface StreamSockets {
  openTransparentListener(opts: { family: 4 | 6; address?: string; port: number; mark?: number }): number;
  /** SO_RCVBUF of a connected socket; what the kernel took, or null when it has no fd. */
  setReceiveBuffer(socket: Socket, bytes: number): number | null;
  connectNetSocket(opts: {
    family: 4 | 6;
    address: string;
    port: number;
    localAddress?: string;
    /** IP_TRANSPARENT: localAddress may be a client's, not this host's (transparent exits). */
    transparent?: boolean;
    mark?: number;
    timeoutMs?: number;
  }): Promise<Socket>;
}

export type DropReason =
  | 'unauthorized'
  | 'unknown_service'
  | 'malformed'
  | 'tunnel_down'
  | 'tun_write'
  /** Over the service's bandwidth limit: the flow's queue full, or CoDel's late drop (shaper.ts). */
  | 'shaped';

export interface ServiceCounters {
  packetsSent: number;
  bytesSent: number;
  packetsReceived: number;
  bytesReceived: number;
  dropped: number;
}

/** What GET /v1/services/{id} shows of the data plane, as this agent sees it. */
export interface ServiceDataPlaneStatus {
  role: 'ingress' | 'exit' | 'none';
  /** up: tunnel connected and kernel state applied. */
  state: 'up' | 'connecting' | 'down' | 'error' | 'inactive';
  /**
   * The effective exit mode (so that a NAT setting that silently does not take effect shows):
   * transparent = TCP from the client's address, the rest from the MACVLAN's.
   */
  exit_mode: 'nat' | 'macvlan' | 'transparent' | null;
  interface: string | null;
  problem: string | null;
  counters: ServiceCounters;
  /** TCP carried as streams (all zero where TCP travels as packets). */
  streams: StreamStats;
  /**
   * A transparent service's exit: whether it can carry it, and why not (transparent.ts). Null
   * where this agent is not the exit of a transparent service.
   */
  transparent: { ready: boolean; reasons: string[] } | null;
  /** At the ingress: the failover verdict on the service (health.ts), times as wall-clock ms. */
  health: HealthVerdict | null;
  /**
   * At the exit: what it tells the ingress (its route check, exit-reach.ts; its probe,
   * probe.ts); null elsewhere and before either has a verdict.
   */
  exitStatus: Omit<ServiceStatus, 'serviceId'> | null;
}

interface Carried {
  service: CarriedService;
  idBytes: Buffer;
  tun: Tun;
  /** Its TUN failed and could not be opened again yet (reopenTun): the next reconcile retries. */
  tunBroken: boolean;
  counters: ServiceCounters;
  /** Packets from the tunnel waiting for this tick's batched TUN write. */
  pending: Buffer[];
  /** Ingress only: its open TCP connections, reset when the tunnel dies (tcp-flows.ts). */
  flows: TcpFlowTable | null;
  /**
   * The bandwidth limit of what this agent sends for the service (ingress: up, exit: down),
   * over its streams and its packets together.
   */
  shaper: FairShaper;
  mbps: number;
}

/** A reconcile that put back kernel state changed behind the agent (dataplane.drift_repaired). */
export interface DriftRepair {
  at: number;
  changes: number;
  /** The first changes, as the commands that made them. */
  repaired: string[];
}

export interface LastReconcile {
  /** When it started (wall clock, ms). */
  at: number;
  durationMs: number;
  /** Kernel changes it applied (0: the kernel was as wanted). */
  changes: number;
  /** The changes repaired drift: the wanted state was the one already applied. */
  drift: boolean;
  error: string | null;
}

/** GET /v1/dataplane (DataPlane.driftReport). */
export interface DriftReport {
  /** Counts of what the last plan wants in the kernel; null before the first reconcile. */
  wanted: KernelCounts | null;
  /** Counts of what the agent owns in the kernel now. */
  owned: KernelCounts;
  /** What the next reconcile would change, as commands (the first DIFFERENCES_SHOWN). */
  differences: string[];
  differenceCount: number;
  lastReconcile: LastReconcile | null;
  reconciles: number;
  repairs: number;
  recentRepairs: DriftRepair[];
  tunFailures: number;
  problems: string[];
}

export interface KernelCounts {
  links: number;
  addresses: number;
  rules: number;
  routes: number;
  nft: boolean;
}

/** Entries the data plane keeps, by structure (DataPlane.footprint). */
export interface DataPlaneFootprint {
  carried_services: number;
  /** TCP connections the ingress tracks on the packet path (tcp-flows.ts). */
  tcp_flows: number;
  /** Flow records of the services' shapers. */
  shaper_flows: number;
  service_counters: number;
  service_drop_counters: number;
  /** Peer host names resolved and cached. */
  peer_names: number;
  streams: number;
  /** Peers with stream-multiplexer state, summed over the transports. */
  stream_peers: number;
  /** Services with stream counters, summed over the transports. */
  stream_services: number;
}

/** How long an exit waits for a destination to accept a stream's connection. */
const EXIT_CONNECT_TIMEOUT_MS = 10_000;
/** The finest grain at which the ingress judges its services' health (ms). */
const JUDGE_TICK_MS = 100;
/** How often an exit repeats an unchanged status to its ingress (a lost one is made good). */
const STATUS_REPEAT_MS = 2000;
/** How long the ingress takes an exit's word without hearing it again. */
const STATUS_STALE_MS = 3 * STATUS_REPEAT_MS;
/** How long the probe from the MACVLAN address (after a transparent connection got no answer) waits. */
const RETURN_PATH_PROBE_MS = 3000;

/** Packets a flow may have waiting for the bandwidth limit before they are dropped. */
const SHAPED_QUEUE_BYTES = 64 * 1024;
/** Packet flows' ids in a shaper, above the stream mux's (which count up from 1). */
const PACKET_FLOW_BASE = 2 ** 40;

/**
 * Socket options of both ends of a relayed connection: no Nagle delay (the client's own segments
 * were already coalesced as it wanted; waiting again adds latency to every request/response), and
 * keepalives, so that a peer host that vanished without a reset frees its stream in minutes, not
 * hours.
 */
function relaySocket(socket: Socket): Socket {
  socket.setNoDelay(true);
  socket.setKeepAlive(true, 60_000);
  return socket;
}

/** A packet's flow (addresses, protocol, ports) as a 32-bit FNV-1a hash, for fair shaping. */
function packetFlow(p: Buffer): number {
  const v6 = p[0]! >> 4 === 6;
  const [from, to, proto, l4] = v6 ? [8, 40, p[6], 40] : [12, 20, p[9], (p[0]! & 0x0f) * 4];
  let h = 0x811c9dc5;
  const mix = (b: number) => {
    h = Math.imul(h ^ b, 0x01000193) >>> 0;
  };
  for (let i = from; i < to && i < p.length; i++) mix(p[i]!);
  mix(proto ?? 0);
  if (proto === 6 || proto === 17) for (let i = l4; i < l4 + 4 && i < p.length; i++) mix(p[i]!);
  return h;
}

/** A verdict's times (performance.now() ms) as wall-clock ms since the epoch. */
function wallClock(v: HealthVerdict): HealthVerdict {
  const shift = Date.now() - performance.now();
  return {
    ...v,
    since: Math.round(v.since + shift),
    holdDownUntil: v.holdDownUntil === null ? null : Math.round(v.holdDownUntil + shift),
  };
}

const zeroCounters = (): ServiceCounters => ({
  packetsSent: 0,
  bytesSent: 0,
  packetsReceived: 0,
  bytesReceived: 0,
  dropped: 0,
});

export class DataPlane {
  private view: DataPlaneView | null = null;
  private readonly slots = new SlotTable();
  private readonly carried = new Map<string, Carried>();
  /**
   * Per service carried here: they survive a TUN being re-opened and the service leaving this
   * agent while it still exists (its metrics never go down), and go once it is deleted.
   */
  private readonly counters = new Map<string, ServiceCounters>();
  private readonly drops = new Map<DropReason, number>();
  private readonly dropsByService = new Map<string, Map<DropReason, number>>();
  private lastPlan: Plan | null = null;
  private lastPlanUnreachable: ReadonlySet<string> = new Set();
  /** The peer addresses the last plan excluded from selection (names resolved). */
  private lastPeerIps: readonly string[] = [];
  /** Names intercepted connections: the routes the kernel now selects by (set after each apply). */
  private ingressMatcher = new RouteMatcher([]);
  /** routesAllow's matchers, per service, for the view they were compiled from (rebuilt when it changes). */
  private exitMatchers: { view: DataPlaneView | null; byService: Map<string, RouteMatcher> } = {
    view: null,
    byService: new Map(),
  };
  private nft: { applied: string | null; appliedFrom: string | null } = { applied: null, appliedFrom: null };
  private running: Promise<void> | null = null;
  private again = false;
  private readonly failover: FailoverOptions;
  private readonly health: HealthTracker;
  /** Ingress services whose tunnel has been up: silence after that is evidence, before it is not. */
  private readonly everUp = new Set<string>();
  /** The exits' word on their services (status-frames.ts), by service. */
  private readonly exitStatus = new Map<string, { status: ServiceStatus; at: number }>();
  /** At the exit: whether it can forward each service's traffic (exit-reach.ts). */
  private readonly exitReach = new ExitReach(AGENT_MARK);
  /** At the exit: what it last told each service's ingress, and when (status-frames.ts). */
  private readonly exitToldIngress = new Map<string, { status: ServiceStatus; at: number }>();
  private exitCheckRunning = false;
  /** At the exit: the route check's last verdicts, by service. */
  private exitReachVerdicts = new Map<string, ExitReachVerdict>();
  /** At the exit: the services' active probes (health_check). */
  private readonly probes = new ProbeVerdicts();
  /** Ingress services standing aside (health.ts): their routes rank last (plan.ts routeOrder). */
  private standby: ReadonlySet<string> = new Set();
  /** Services that stepped aside since the last reconcile: their streams are looked at after it. */
  private readonly steppedAside = new Set<string>();
  private healthTimer: NodeJS.Timeout | undefined;
  /** Health changes since start, by the state or reason they went to. */
  private readonly healthChanges = new Map<string, number>();
  private startCalled = false;
  /** start() has removed what a predecessor left in the kernel: reconciles may run. */
  private flushed = false;
  private tunFailures = 0;
  /** Reconciles that found the kernel changed behind the agent's back and put it right. */
  private driftRepairs = 0;
  /** The last RECENT_REPAIRS of them, oldest first (GET /v1/dataplane). */
  private readonly recentRepairs: DriftRepair[] = [];
  /** What the reconcile running now changed (set by it, read when it ends). */
  private reconcileChanges = { changes: 0, drift: false };
  /** The last reconcile that ran: when, how long, what it changed or why it failed. */
  private lastReconcile: LastReconcile | null = null;
  private reconciles = 0;
  /** The desired kernel state of the last reconcile that applied: the same again is drift. */
  private appliedKernel: string | null = null;
  /** Tunnels up now, by `transport|peer`: a tunnel.down is said only of one that was up. */
  private readonly tunnelsUp = new Set<string>();
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private lastError: string | null = null;
  private hostProblems: string[] = [];
  /** Why limited services are not paced on this host, or null (pacingAllowed). */
  private pacingProblem: string | null = null;
  /** This agent set net.ipv4.tcp_early_demux to 0 for pacing (restoreEarlyDemux). */
  private earlyDemuxSet = false;
  private readonly flushQueue = new Set<Carried>();
  private flushScheduled = false;
  private readonly peerIpCache = new Map<string, { ips: string[]; at: number }>();
  /** Peers this agent keeps a tunnel with. */
  private tunnelPeers = new Map<TransportKind, Set<string>>();
  /** TUNs opened since the last successful apply: not yet set up (see reconcile). */
  private readonly tunsToSetUp = new Set<string>();
  /** Transparent exits: host requirements and asymmetric return paths. */
  private readonly transparent: TransparentChecks;
  /** Services whose return path is being probed (one probe at a time each). */
  private readonly probing = new Set<string>();

  /** TCP carried as streams (null without options.sockets, until start): listeners and the multiplexer. */
  private streams: {
    /** Per transport: stream ids, windows and flow control are per tunnel. */
    muxes: Map<TransportKind, StreamMux>;
    listeners: Server[];
    /** The listeners' port on 127.0.0.1 and ::1, once listening. */
    port: number | null;
  } | null = null;

  constructor(private readonly options: DataPlaneOptions) {
    this.failover = options.failover ?? DEFAULT_FAILOVER;
    this.health = new HealthTracker(this.failover.holdDownMs);
    this.transparent = new TransparentChecks({
      kernel: options.kernel,
      logger: options.logger,
      netAdmin: options.netAdmin ?? (() => hasNetAdmin()),
      streams: () => this.streams !== null,
    });
    for (const [kind, transport] of this.transportEntries()) {
      transport.on('message', (peerId, message) => this.fromTunnel(kind, peerId, message));
      // A tunnel going up or down changes what is refused (plan.ts, nftRuleset).
      transport.on('state', (peerId, state) => {
        // A dead tunnel resets its streams: their clients see an error, never a hang.
        if (state !== 'up') this.streams?.muxes.get(kind)?.peerDown(peerId);
        this.reportTunnel(kind, peerId, state);
        this.tunnelChanged(kind, peerId, state);
        this.schedule();
      });
      transport.on('drain', (peerId) => {
        for (const c of this.carried.values())
          if (c.service.peerId === peerId && c.service.transport === kind) c.tun.resume();
        this.streams?.muxes.get(kind)?.onDrain(peerId);
      });
    }
  }

  /** The transports this agent has, by kind. */
  private transportEntries(): [TransportKind, TunnelTransport][] {
    const { tcp, kcp } = this.options.transports;
    return kcp
      ? [
          ['tcp', tcp],
          ['kcp', kcp],
        ]
      : [['tcp', tcp]];
  }

  /** The tunnel that carries a service to its other end, if its transport exists here. */
  private tunnelOf(c: Pick<CarriedService, 'peerId' | 'transport'>) {
    return this.options.transports[c.transport]?.tunnel(c.peerId);
  }

  /** One multiplexer per transport: stream ids, windows and flow control are per tunnel. */
  private newMux(
    kind: TransportKind,
    transport: TunnelTransport,
    sockets: StreamSockets,
    localPeerId: string,
  ): StreamMux {
    return new StreamMux({
      localPeerId,
      link: {
        rttMs: (peerId) => transport.tunnel(peerId)?.stats().lastRttMs ?? null,
        // A tunnel that is not up takes nothing; its streams are reset by peerDown.
        send: (peerId, messages) => {
          const t = transport.tunnel(peerId);
          return t?.state === 'up' ? t.send(messages) : true;
        },
      },
      // Each agent limits what it sends of a service (the ingress up, the exit down), streams
      // and packets in one shaper.
      limiter: (serviceId) => this.carried.get(serviceId)?.shaper ?? null,
      boundReceiveBuffer: (socket, bytes) => {
        // A socket closed already has nothing to bound; anything else is the addon's bug.
        if (!socket.destroyed) sockets.setReceiveBuffer(socket, bytes);
      },
      authorize: (peerId, serviceId) => {
        const c = this.carried.get(serviceId);
        return c?.service.role === 'exit' && c.service.peerId === peerId && c.service.transport === kind;
      },
      connect: (serviceId, ends, _fromPeerId, transparent) => {
        const c = this.carried.get(serviceId);
        if (!c)
          return Promise.reject(Object.assign(new Error('service not carried'), { code: 'EHOSTUNREACH' }));
        // The exit goes only where the service's routes lead, never to its own loopback: a peer
        // may open streams of its service, not reach anything the exit can reach.
        if (!this.routesAllow(serviceId, ends)) {
          return Promise.reject(
            Object.assign(new Error(`${ends.dstAddr} is not a destination of the service`), {
              code: 'EACCES',
            }),
          );
        }
        // Transparent only where both ends say so: the ingress flags the stream, and the exit's
        // own view of the service allows it (a peer never picks a source address by itself).
        if (transparent && c.service.transparent && c.service.macvlan) {
          return this.connectTransparent(sockets, c, ends);
        }
        return sockets
          .connectNetSocket({
            family: ends.family,
            address: ends.dstAddr,
            port: ends.dstPort,
            localAddress: this.macvlanAddress(c, ends.family),
            mark: AGENT_MARK,
            timeoutMs: EXIT_CONNECT_TIMEOUT_MS,
          })
          .then(relaySocket);
      },
    });
  }

  /**
   * A transparent stream's connection: from the client's own address (IP_TRANSPARENT), marked
   * so that it leaves by the service's MACVLAN and its replies come back to this socket
   * (plan.ts: rule TRANSPARENT, nftables `socket transparent`). No answer at all: the return
   * path is probed (probeReturnPath).
   */
  private connectTransparent(sockets: StreamSockets, c: Carried, ends: StreamEnds): Promise<Socket> {
    const src = parseAddress(ends.srcAddr);
    // A loopback, multicast or unspecified source is nobody's client.
    if (!src || isSpecialDestination(src)) {
      return Promise.reject(
        Object.assign(new Error(`${ends.srcAddr} cannot be a client address`), { code: 'EACCES' }),
      );
    }
    return sockets
      .connectNetSocket({
        family: ends.family,
        address: ends.dstAddr,
        port: ends.dstPort,
        localAddress: ends.srcAddr,
        transparent: true,
        mark: transparentSocketMark(c.service.slot),
        timeoutMs: EXIT_CONNECT_TIMEOUT_MS,
      })
      .then(
        (socket) => {
          this.transparent.answered(c.service.serviceId);
          return relaySocket(socket);
        },
        (err: NodeJS.ErrnoException) => {
          if (err.code === 'ETIMEDOUT') this.probeReturnPath(sockets, c, ends);
          throw err;
        },
      );
  }

  /**
   * A transparent connection got no SYN-ACK. If the destination answers the MACVLAN's own
   * address (a connection, or a refusal: either is an answer), it is up and reachable, and only
   * its replies to the client's address go astray: reported as a probable asymmetric route.
   */
  private probeReturnPath(sockets: StreamSockets, c: Carried, ends: StreamEnds): void {
    const id = c.service.serviceId;
    const via = this.macvlanAddress(c, ends.family);
    if (!via || this.probing.has(id)) return;
    this.probing.add(id);
    sockets
      .connectNetSocket({
        family: ends.family,
        address: ends.dstAddr,
        port: ends.dstPort,
        localAddress: via,
        mark: AGENT_MARK,
        timeoutMs: RETURN_PATH_PROBE_MS,
      })
      .then(
        (socket) => {
          socket.destroy();
          return true;
        },
        (err: NodeJS.ErrnoException) => err.code === 'ECONNREFUSED',
      )
      .then((answered) => {
        if (!answered) return;
        // The client network as the service's routes name it, else the client alone.
        const route = (this.view?.routes ?? []).find(
          (r) => r.serviceId === id && r.sourceCidr !== null && cidrHolds(r.sourceCidr, ends.srcAddr),
        );
        const host = `${ends.srcAddr}/${ends.family === 4 ? 32 : 128}`;
        this.transparent.unansweredButReachable(id, {
          client: ends.srcAddr,
          destination: ends.dstAddr,
          port: ends.dstPort,
          via,
          clientNetwork: route?.sourceCidr ?? host,
        });
      })
      .finally(() => this.probing.delete(id));
  }

  /** Whether a stream's ends are ones the service's routes select, and not a special address. */
  private routesAllow(serviceId: string, ends: StreamEnds): boolean {
    // Loopback, unspecified, multicast, broadcast, v4-mapped: never a destination of a route; nor
    // is what is not an address.
    const dst = parseAddress(ends.dstAddr);
    if (!dst || isSpecialDestination(dst)) return false;
    // Compiled once per view and service: this runs for every stream a peer opens.
    const view = this.view;
    if (this.exitMatchers.view !== view) this.exitMatchers = { view, byService: new Map() };
    let matcher = this.exitMatchers.byService.get(serviceId);
    if (!matcher) {
      matcher = new RouteMatcher((view?.routes ?? []).filter((r) => r.serviceId === serviceId));
      this.exitMatchers.byService.set(serviceId, matcher);
    }
    return matcher.serviceOfParsed(parseAddress(ends.srcAddr), dst) === serviceId;
  }

  /** The address a MACVLAN exit's streams leave from, in the family asked for. */
  private macvlanAddress(c: Carried, family: 4 | 6): string | undefined {
    if (!c.service.macvlan || !this.lastPlan) return undefined;
    const a = this.lastPlan.kernel.addresses.find(
      (x) => x.dev === c.service.macvlan && (family === 6) === x.cidr.includes(':'),
    );
    return a?.cidr.split('/')[0];
  }

  /** Opens the TPROXY listeners on 127.0.0.1 and ::1, one port for both. */
  private async listen(sockets: StreamSockets): Promise<void> {
    const streams = this.streams!;
    const serve = (fd: number) =>
      new Promise<Server>((resolve, reject) => {
        const server = createServer({ allowHalfOpen: true, pauseOnConnect: true }, (s) =>
          this.intercepted(s),
        );
        server.once('error', reject);
        server.listen({ fd }, () => resolve(server));
      });
    // Both or neither: nftables hands either family to the same port.
    const v4 = await serve(
      sockets.openTransparentListener({ family: 4, address: '127.0.0.1', port: 0, mark: AGENT_MARK }),
    );
    const port = (v4.address() as { port: number }).port;
    try {
      const v6 = await serve(
        sockets.openTransparentListener({ family: 6, address: '::1', port, mark: AGENT_MARK }),
      );
      streams.listeners.push(v4, v6);
    } catch (err) {
      v4.close();
      throw err;
    }
    streams.port = port;
  }

  /** A TCP connection TPROXY handed over: carried to its service's exit as a stream. */
  private intercepted(socket: Socket): void {
    const src = socket.remoteAddress;
    const dst = socket.localAddress;
    // A connection made to the listener itself (its own address) is nobody's traffic.
    if (!src || !dst || dst === '127.0.0.1' || dst === '::1') {
      socket.destroy();
      return;
    }
    const serviceId = this.ingressMatcher.serviceOf(src, dst);
    const c = serviceId ? this.carried.get(serviceId) : undefined;
    const mux = c && this.streams!.muxes.get(c.service.transport);
    if (!c || !mux || this.tunnelOf(c.service)?.state !== 'up') {
      socket.resetAndDestroy();
      return;
    }
    const ends: StreamEnds = {
      family: isIPv6(dst) ? 6 : 4,
      srcAddr: src,
      srcPort: socket.remotePort!,
      dstAddr: dst,
      dstPort: socket.localPort!,
    };
    relaySocket(socket);
    mux.carry(c.service.peerId, c.service.serviceId, socket, ends, c.service.transparent);
  }

  /** Removes a crashed predecessor's state, then reconciles and keeps doing so on a timer. */
  async start(view: DataPlaneView): Promise<void> {
    if (this.startCalled) throw new Error('a data plane is started once');
    this.startCalled = true;
    // A newer view given by update() while the flush runs replaces this one.
    this.view = view;
    try {
      await this.options.kernel.flush();
    } catch (err) {
      // Reported like any reconcile failure (readyz, service status), and retried by the timer.
      this.lastError = `removing stale kernel state failed: ${(err as Error).message}`;
      this.options.logger.error({ err }, 'data plane: removing stale kernel state failed');
    }
    this.flushed = true;
    if (this.stopped) return;
    if (this.options.sockets) {
      const sockets = this.options.sockets;
      const muxes = new Map(
        this.transportEntries().map(
          ([kind, t]) => [kind, this.newMux(kind, t, sockets, view.localPeerId)] as const,
        ),
      );
      this.streams = { muxes, listeners: [], port: null };
      try {
        await this.listen(this.options.sockets);
      } catch (err) {
        // TCP then travels as packets, as without the addon; said once.
        this.options.logger.error({ err }, 'data plane: no TPROXY listener, TCP is carried as packets');
      }
    }
    await this.settle();
    this.timer = setInterval(() => this.schedule(), this.options.reconcileIntervalMs ?? 10_000);
    this.timer.unref();
    // Silence is judged at a finer grain than the keepalive interval, so that a silent tunnel is
    // caught soon after `misses` intervals, not up to one interval later; the exit's route check
    // (an exec) runs once per interval.
    const tick = Math.min(JUDGE_TICK_MS, this.failover.intervalMs);
    const checkEvery = Math.max(1, Math.round(this.failover.intervalMs / tick));
    let ticks = 0;
    // Judged from a setImmediate: after a stall of this process, the keepalives that waited in
    // the sockets are read first (Node runs timers before input), so the stall is not silence.
    this.healthTimer = setInterval(
      () =>
        setImmediate(() => {
          if (this.stopped) return;
          this.judgeHealth();
          this.runProbes(performance.now());
          if (ticks++ % checkEvery === 0)
            this.checkExits().catch((err) =>
              this.options.logger.error({ err }, 'data plane: exit check failed'),
            );
        }),
      tick,
    );
    this.healthTimer.unref();
  }

  /** A new view of services, routes and peers: reconciled soon (changes coalesce). */
  update(view: DataPlaneView): void {
    this.view = view;
    this.schedule();
  }

  /** Waits until the kernel and tunnels match the latest view (POST /v1/cluster/sync, tests). */
  async settle(): Promise<void> {
    this.schedule();
    while (this.running) await this.running;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearInterval(this.timer);
    if (this.healthTimer) clearInterval(this.healthTimer);
    while (this.running) await this.running;
    for (const c of this.carried.values()) c.tun.close();
    this.carried.clear();
    if (this.streams) {
      for (const mux of this.streams.muxes.values()) mux.close();
      for (const l of this.streams.listeners) l.close();
    }
    for (const [kind, peers] of this.tunnelPeers)
      for (const peerId of peers) this.options.transports[kind]?.release(peerId);
    this.tunnelPeers.clear();
    await this.options.kernel.flush();
    await this.restoreEarlyDemux();
  }

  status(serviceId: string): ServiceDataPlaneStatus {
    const c = this.carried.get(serviceId);
    const problem = this.lastPlan?.problems.get(serviceId) ?? null;
    if (!c) {
      return {
        role: 'none',
        state: 'inactive',
        exit_mode: null,
        interface: null,
        problem,
        counters: this.counters.get(serviceId) ?? zeroCounters(),
        streams: this.streamStats(serviceId),
        transparent: null,
        health: null,
        exitStatus: null,
      };
    }
    const tunnel = this.tunnelOf(c.service);
    const hostProblem = this.hostProblems.length > 0 ? this.hostProblems.join('; ') : null;
    const why = problem ?? this.lastError ?? hostProblem;
    // Up only once the kernel carries its traffic: applied (a reconcile that opened the TUN may
    // still be applying) and no longer refused (the reconcile after the tunnel came up).
    const applied = this.lastPlan?.carried.some((x) => x.serviceId === serviceId) ?? false;
    const refused = this.lastPlanUnreachable.has(serviceId);
    const tunnelState = tunnel?.state ?? 'down';
    const state = why ? 'error' : tunnelState === 'up' && (refused || !applied) ? 'connecting' : tunnelState;
    return {
      role: c.service.role,
      state,
      exit_mode:
        c.service.role !== 'exit'
          ? null
          : c.service.transparent
            ? 'transparent'
            : c.service.macvlan
              ? 'macvlan'
              : 'nat',
      interface: c.service.tun,
      problem: why,
      counters: c.counters,
      streams: this.streamStats(serviceId),
      transparent: this.transparent.readiness(serviceId),
      health:
        c.service.role === 'ingress' ? wallClock(this.health.verdict(serviceId, performance.now())) : null,
      exitStatus:
        c.service.role === 'exit'
          ? (() => {
              const told = this.exitToldIngress.get(serviceId)?.status;
              return told
                ? { canForward: told.canForward, probePassing: told.probePassing, detail: told.detail }
                : null;
            })()
          : null,
    };
  }

  /** A service's stream counters (summed over the multiplexers: a service changes transport only by being re-created). */
  private streamStats(serviceId: string): StreamStats {
    const out = emptyStats();
    for (const mux of this.streams?.muxes.values() ?? []) {
      const s = mux.stats(serviceId);
      for (const k of Object.keys(out) as (keyof StreamStats)[]) out[k] += s[k];
    }
    return out;
  }

  /** Per service this agent carried: its streams (open now, opened, bytes, resets, refusals). */
  allStreamStats(): Map<string, StreamStats> {
    const out = new Map<string, StreamStats>();
    if (this.streams) for (const id of this.counters.keys()) out.set(id, this.streamStats(id));
    return out;
  }

  /** Stream frames the multiplexer dropped, by cause. */
  streamDrops(): Readonly<Record<string, number>> {
    const out: Record<string, number> = {};
    for (const mux of this.streams?.muxes.values() ?? [])
      for (const [cause, n] of Object.entries(mux.drops())) out[cause] = (out[cause] ?? 0) + (n as number);
    return out;
  }

  /** Packets dropped per service and cause (drops that name no service are in dropCounts only). */
  serviceDrops(): ReadonlyMap<string, ReadonlyMap<DropReason, number>> {
    return this.dropsByService;
  }

  dropCounts(): ReadonlyMap<DropReason, number> {
    return this.drops;
  }

  /**
   * How many entries the data plane keeps, structure by structure (docs/memory.md says what
   * bounds each): for watching a long-running agent (mesh_dataplane_entries).
   */
  footprint(): DataPlaneFootprint {
    const out: DataPlaneFootprint = {
      carried_services: this.carried.size,
      tcp_flows: 0,
      shaper_flows: 0,
      service_counters: this.counters.size,
      service_drop_counters: this.dropsByService.size,
      peer_names: this.peerIpCache.size,
      streams: 0,
      stream_peers: 0,
      stream_services: 0,
    };
    for (const c of this.carried.values()) {
      out.tcp_flows += c.flows?.size ?? 0;
      out.shaper_flows += c.shaper.flowRecords;
    }
    for (const mux of this.streams?.muxes.values() ?? []) {
      const f = mux.footprint();
      out.streams += f.streams;
      out.stream_peers += f.peers;
      out.stream_services += f.services;
    }
    return out;
  }

  /** Per-service counters of the services this agent carried that still exist. */
  allCounters(): ReadonlyMap<string, ServiceCounters> {
    return this.counters;
  }

  /** Whether each tunnel this agent keeps is up, by peer and transport. */
  tunnelStates(): { peerId: string; transport: TransportKind; up: boolean }[] {
    const out: { peerId: string; transport: TransportKind; up: boolean }[] = [];
    for (const [transport, peers] of this.tunnelPeers)
      for (const peerId of peers)
        out.push({ peerId, transport, up: this.tunnelOf({ peerId, transport })?.state === 'up' });
    return out;
  }

  /** The last round-trip time the kept tunnel to the peer measured, null before its first. */
  tunnelRttMs(peerId: string, transport: TransportKind): number | null {
    return this.tunnelOf({ peerId, transport })?.stats().lastRttMs ?? null;
  }

  /** Each transparent service this agent is the exit of: whether it can carry it now. */
  transparentReadiness(): Map<string, boolean> {
    return this.transparent.readyByService();
  }

  /** What works less well than asked though traffic flows: why limited services are not paced. */
  warnings(): string[] {
    return this.pacingProblem ? [this.pacingProblem] : [];
  }

  /** Why the data plane cannot carry what it should, if so (for /readyz). */
  problems(): string[] {
    return [
      ...(this.lastError ? [this.lastError] : []),
      ...this.hostProblems,
      ...this.transparent.problems(),
    ];
  }

  // --- reconciling -------------------------------------------------------------------------------

  private schedule(): void {
    // Before start has removed a predecessor's state, a reconcile would build what the removal
    // then deletes (TUNs included, under their open fds): views only wait until then.
    if (this.stopped || !this.flushed) return;
    if (this.running) {
      this.again = true;
      return;
    }
    const at = Date.now();
    const started = performance.now();
    this.reconcileChanges = { changes: 0, drift: false };
    this.running = this.reconcile()
      .then(() => {
        this.reconciled({ at, started, error: null });
      })
      .catch((err: unknown) => {
        const message = (err as Error).message;
        if (message !== this.lastError) this.options.logger.error({ err }, 'data plane reconcile failed');
        this.lastError = message;
        this.reconciled({ at, started, error: message });
      })
      .finally(() => {
        this.running = null;
        if (this.again) {
          this.again = false;
          this.schedule();
        }
      });
  }

  private async reconcile(): Promise<void> {
    const view = this.view;
    if (!view || this.stopped) return;
    const { kernel } = this.options;
    const ends = view.services.filter(
      (s) => s.isActive && (s.sourcePeerId === view.localPeerId || s.targetPeerId === view.localPeerId),
    );
    const slots = this.slots.assign(ends.map((s) => s.id));
    const uplink = await this.uplink();
    // carriedServices names each service's other end, whose tunnel decides what is refused.
    const carried = carriedServices({ localPeerId: view.localPeerId, services: view.services, slots });
    const unreachable = new Set(
      carried.filter((c) => this.tunnelOf(c)?.state !== 'up').map((c) => c.serviceId),
    );
    const peerIps = await this.peerIps(view.peers);
    this.lastPeerIps = peerIps;
    const byId = new Map(view.services.map((s) => [s.id, s]));
    const pacing = await this.pacingAllowed(this.streams !== null && pacedServices(carried, byId).length > 0);
    const next = plan({
      localPeerId: view.localPeerId,
      services: view.services,
      routes: view.routes,
      peerIps,
      apiPort: this.options.apiPort,
      slots,
      uplink,
      tunMtu: this.options.tunMtu ?? 1500,
      unreachable,
      standby: this.standby,
      interceptPort: this.streams?.port ?? null,
      agentSockets: this.streams !== null,
      transports: new Set(this.transportEntries().map(([kind]) => kind)),
      pacing,
    });

    // Tunnels: one per peer and transport this agent shares a carried service with; first, so
    // that a kernel failure below does not keep them down too.
    const tunnels = new Map<TransportKind, Set<string>>();
    for (const c of next.carried) {
      if (!this.options.transports[c.transport]) continue; // reported by plan: no such transport here
      const peers = tunnels.get(c.transport) ?? new Set<string>();
      tunnels.set(c.transport, peers.add(c.peerId));
    }
    let newTunnel = false;
    for (const [kind, peers] of tunnels) {
      for (const peerId of peers) {
        if (!this.tunnelPeers.get(kind)?.has(peerId)) newTunnel = true;
        this.options.transports[kind]!.ensure(peerId);
      }
    }
    for (const [kind, peers] of this.tunnelPeers)
      for (const peerId of peers)
        if (!tunnels.get(kind)?.has(peerId)) this.options.transports[kind]?.release(peerId);
    this.tunnelPeers = tunnels;

    // TUNs first: links, routes and rules refer to them.
    const wanted = new Map(next.carried.map((c) => [c.serviceId, c]));
    for (const [id, c] of this.carried) {
      const w = wanted.get(id);
      if (
        !w ||
        w.tun !== c.service.tun ||
        w.peerId !== c.service.peerId ||
        w.role !== c.service.role ||
        w.transport !== c.service.transport
      ) {
        this.closeCarried(c);
      } else {
        c.service = w;
      }
    }
    for (const service of next.carried) if (!this.carried.has(service.serviceId)) this.openCarried(service);
    this.forgetDeleted(new Set(view.services.map((s) => s.id)));
    const limits = new Map(view.services.map((s) => [s.id, s.bandwidthLimitMbps ?? 0]));
    for (const c of this.carried.values()) {
      const mbps = limits.get(c.service.serviceId) ?? 0;
      if (mbps !== c.mbps) {
        c.shaper.setRate(mbps);
        c.mbps = mbps;
      }
    }

    let observed = await kernel.observe();
    // A TUN whose link was deleted behind the agent's back leaves a dead descriptor: open anew.
    const present = new Set(observed.links.map((l) => l.name));
    // So does one whose re-opening after a failure did not succeed (its name was still taken).
    const lost = [...this.carried.values()].filter((c) => !present.has(c.service.tun) || c.tunBroken);
    if (lost.length > 0) {
      this.options.logger.warn(
        { tuns: lost.map((c) => c.service.tun) },
        'data plane: TUN deleted, re-opening',
      );
      for (const c of lost) {
        // A failure already counted by tunFailed is not counted twice.
        if (!c.tunBroken) this.tunFailures++;
        this.reopenTun(c);
      }
      observed = await kernel.observe();
    }
    // Only the names known now are set up by this apply: a TUN made again while it runs
    // (tunFailed) waits for the next one.
    const settingUp = [...this.tunsToSetUp];
    const changes = diff(this.asReconcileSees(observed), next.kernel, this.nft);
    // What was wanted has not changed since the last apply, yet the kernel differs: drift.
    const desired = JSON.stringify(next.kernel);
    const drift = changes.length > 0 && desired === this.appliedKernel;
    if (changes.length > 0) {
      await kernel.apply(changes);
      for (const name of settingUp) this.tunsToSetUp.delete(name);
      if (changes.some((c) => c.op === 'nft')) {
        this.nft = { applied: (await kernel.observe()).nft, appliedFrom: next.kernel.nft };
      }
      this.options.logger.info({ changes: changes.length, drift }, 'data plane kernel state reconciled');
    }
    this.appliedKernel = desired;
    this.reconcileChanges = { changes: changes.length, drift };
    if (drift) this.reportDrift(view.localPeerId, changes);
    this.lastPlan = next;
    this.lastPlanUnreachable = unreachable;
    // What the kernel now selects: intercepted connections are named by these, not by a newer
    // view that the kernel does not follow yet.
    this.ingressMatcher = new RouteMatcher(ingressRoutes(next.carried, view.routes), this.standby);
    // The streams of a service that stepped aside, whose traffic another route now takes, are
    // reset (their clients reconnect through it). Those no other route takes stay: they would
    // only lose what an outage may yet spare.
    for (const id of this.steppedAside) {
      const stillItsOwn = (e: StreamEnds) => this.ingressMatcher.serviceOf(e.srcAddr, e.dstAddr) === id;
      for (const mux of this.streams?.muxes.values() ?? []) mux.closeService(id, stillItsOwn);
    }
    this.steppedAside.clear();
    this.resetConnections(unreachable);
    await this.loosenPacerPeers(next.kernel.links);
    // After the apply: the MACVLANs whose rp_filter a transparent exit may set exist now.
    const services = new Map(view.services.map((s) => [s.id, s]));
    await this.transparent.check(
      next.carried
        .filter((c) => c.role === 'exit' && c.transparent && c.macvlan && !next.problems.has(c.serviceId))
        .map((c) => {
          const s = services.get(c.serviceId)!;
          return {
            serviceId: c.serviceId,
            macvlan: c.macvlan!,
            families: [
              ...(s.desiredIpv4Cidr ? [4 as const] : []),
              ...(s.desiredIpv6Cidr ? [6 as const] : []),
            ],
          };
        }),
    );
    this.lastError = null;
    const exit = next.carried.some((c) => c.role === 'exit');
    const v4 = next.families.has(4);
    const v6 = next.families.has(6);
    const host =
      next.carried.length === 0
        ? []
        : forwardingProblems({
            // Only the families the services' routes select: an IPv4-only mesh needs no IPv6.
            ipv4Forward: v4 ? await kernel.readSysctl('net.ipv4.ip_forward') : null,
            ipv6Forward: v6 ? await kernel.readSysctl('net.ipv6.conf.all.forwarding') : null,
            rpFilterAll: exit && v4 ? await kernel.readSysctl('net.ipv4.conf.all.rp_filter') : null,
            rpFilterDefault: exit && v4 ? await kernel.readSysctl('net.ipv4.conf.default.rp_filter') : null,
          });
    // Said once when it appears, not on every reconcile: one bad host must not flood the log.
    if (host.join() !== this.hostProblems.join() && host.length > 0) {
      this.options.logger.warn({ problems: host }, 'the host does not forward: carried traffic cannot cross');
    }
    this.hostProblems = host;
    // A tunnel that was already up before this agent wanted it sends no state event: look again
    // (after a failure the timer does).
    if (newTunnel) this.again = true;
  }

  /**
   * Once the refuse rules of a dead tunnel are in place, makes every client of a connection the
   * service carried answer, so that the rules reset it (tcp-flows.ts).
   */
  private resetConnections(unreachable: ReadonlySet<string>): void {
    for (const id of unreachable) {
      const c = this.carried.get(id);
      if (!c?.flows || c.flows.size === 0) continue;
      const connections = c.flows.size;
      c.tun.write(c.flows.takeProbes());
      this.options.logger.info(
        { service: id, connections },
        "data plane: resetting the service's connections, its tunnel is down",
      );
    }
  }

  private openCarried(service: CarriedService): void {
    const tun = this.options.kernel.openTun(service.tun);
    this.tunsToSetUp.add(service.tun);
    let counters = this.counters.get(service.serviceId);
    if (!counters) {
      counters = zeroCounters();
      this.counters.set(service.serviceId, counters);
    }
    const carried: Carried = {
      service,
      idBytes: uuidBytes(service.serviceId),
      tun,
      tunBroken: false,
      counters,
      pending: [],
      flows: service.role === 'ingress' ? new TcpFlowTable() : null,
      // 50 ms deep: a loaded event loop that fires the shaper's timer late loses no tokens (the
      // shaper tolerates half its depth), at the cost of bursts of 50 ms of the rate. At 20 ms a
      // kcp exit on two loaded cores sent 85-90 % of the limit (its loop stalls longer than
      // 10 ms), at 50 ms 95 % and more; tcp reached 99 % either way.
      shaper: new FairShaper({ mbps: 0, burstMs: 50, onLateDrop: () => this.drop('shaped', carried, 1) }),
      mbps: 0,
    };
    this.listenTo(carried);
    this.carried.set(service.serviceId, carried);
  }

  private listenTo(c: Carried): void {
    const tun = c.tun;
    tun.onPackets((packets) => this.fromTun(c, packets));
    tun.onError((error) => this.tunFailed(c, tun, error));
  }

  /**
   * Closes a service's TUN and opens it anew under the same name; the next apply sets it up.
   * If opening throws, the service is left `tunBroken` for the next reconcile to try again.
   */
  private reopenTun(c: Carried): void {
    c.tun.close();
    c.tunBroken = true;
    this.tunsToSetUp.add(c.service.tun);
    c.tun = this.options.kernel.openTun(c.service.tun);
    c.tunBroken = false;
    this.listenTo(c);
  }

  /**
   * A TUN failed under the agent (its device deleted behind the fd, by a person or by another
   * process): the service's packets stop, nothing else. Logged once per failure and counted
   * (mesh_dataplane_tun_failures_total); the device is made again at once and the reconcile
   * that follows puts back its address, routes and rules. If opening fails, the reconcile's
   * check for lost TUNs tries again.
   */
  private tunFailed(c: Carried, tun: Tun, error: Error): void {
    if (this.stopped || this.carried.get(c.service.serviceId) !== c || c.tun !== tun) return;
    this.tunFailures++;
    this.options.logger.warn(
      { service: c.service.serviceId, tun: c.service.tun, error: error.message },
      'data plane: TUN failed, making it again',
    );
    try {
      this.reopenTun(c);
    } catch (err) {
      this.options.logger.warn(
        { service: c.service.serviceId, tun: c.service.tun, error: (err as Error).message },
        'data plane: TUN could not be made again yet',
      );
    }
    this.schedule();
  }

  /**
   * Failover, at the ingress (health.ts): each carried ingress service's evidence (its tunnel
   * silent for `misses` intervals, or down after having been up; the exit's word) is judged;
   * when a service stops or starts carrying, the routes are redone with those standing aside
   * ranked last, and the streams of a service that stepped aside are reset at once (their
   * clients see an error, not a hang, and reconnect through the route that carries now).
   */
  private judgeHealth(now = performance.now()): void {
    if (this.stopped || !this.flushed) return;
    const silentAfterMs = this.failover.intervalMs * this.failover.misses;
    const ingress = [...this.carried.values()].filter((c) => c.service.role === 'ingress');
    let redo = false;
    // Asked only of services whose health changed, once each: most judgements change nothing.
    const verdicts = new Map<string, HealthVerdict>();
    const verdictOf = (id: string): HealthVerdict => {
      const known = verdicts.get(id);
      if (known) return known;
      const v = this.health.verdict(id, now);
      verdicts.set(id, v);
      return v;
    };
    for (const c of ingress) {
      const id = c.service.serviceId;
      const silent = this.tunnelOf(c.service)?.silentMs() ?? null;
      if (silent !== null) this.everUp.add(id);
      // The exit's word is about the tunnel it came by: a new tunnel waits for a new word.
      else this.exitStatus.delete(id);
      // An exit repeats its word every STATUS_REPEAT_MS: one not heard again is no word.
      const heard = this.exitStatus.get(id);
      const status = heard && now - heard.at < STATUS_STALE_MS ? heard.status : undefined;
      const change = this.health.observe(
        id,
        {
          active: true, // plan carries active services only
          tunnelAnswering: silent !== null ? silent < silentAfterMs : this.everUp.has(id) ? false : null,
          exitCanForward: status?.canForward ?? null,
          probePassing: status?.probePassing ?? null,
        },
        now,
      );
      if (change.state) {
        const v = verdictOf(id);
        const to = v.reason ?? v.state;
        this.healthChanges.set(to, (this.healthChanges.get(to) ?? 0) + 1);
        this.options.logger.info({ service: id, state: v.state, reason: v.reason }, 'service health changed');
        // `unknown` is a service whose tunnel has not answered yet: nothing observed.
        if (v.state !== 'unknown') {
          this.options.observed?.({
            type: 'service.health_changed',
            resource: { kind: 'service', id },
            data: { state: v.state, reason: v.reason, since: isoTime(Date.now() - (now - v.since)) },
          });
        }
      }
      if (change.carrying) redo = true;
    }
    const ids = new Set(ingress.map((c) => c.service.serviceId));
    this.health.retain(ids);
    for (const id of this.everUp) if (!ids.has(id)) this.everUp.delete(id);
    for (const id of this.exitStatus.keys()) if (!ids.has(id)) this.exitStatus.delete(id);
    if (!redo) return;
    const standby = new Set([...ids].filter((id) => !verdictOf(id).carrying));
    for (const id of standby) {
      if (this.standby.has(id)) continue;
      this.options.logger.warn(
        { service: id, reason: verdictOf(id).standbyReason },
        'service stands aside: its routes yield to the next',
      );
      this.steppedAside.add(id);
    }
    for (const id of this.standby)
      if (!standby.has(id) && ids.has(id))
        this.options.logger.info({ service: id }, 'service carries its routes again');
    this.reportFailovers(this.standby, standby, ids, now);
    this.standby = standby;
    this.schedule();
  }

  /**
   * `service.failover`, once per switch: for each service that stood aside or took its routes
   * back, where each of its routes' traffic went from and to (by the routes this ingress ranks,
   * asked at each route's own network address). A switch that moves no traffic (no other route
   * takes it, or the one it leaves did not carry) is no failover: the health change says it all.
   */
  private reportFailovers(
    before: ReadonlySet<string>,
    after: ReadonlySet<string>,
    ingress: ReadonlySet<string>,
    now: number,
  ): void {
    const observed = this.options.observed;
    if (!observed || !this.view) return;
    const switched = [...ingress].filter((id) => before.has(id) !== after.has(id));
    if (switched.length === 0) return;
    const routes = this.view.routes.filter((r) => ingress.has(r.serviceId));
    const was = new RouteMatcher(routes, before);
    const is = new RouteMatcher(routes, after);
    for (const id of switched) {
      const moves = new Map<string, PlanRoute[]>();
      for (const r of routes) {
        if (r.serviceId !== id) continue;
        const [src, dst] = routePoint(r);
        const from = was.serviceOf(src, dst);
        const to = is.serviceOf(src, dst);
        // Traffic moves only from a service that carried it: at start, services standing aside
        // until their tunnels first answer hand over nothing.
        if (from === null || to === null || from === to || before.has(from)) continue;
        const key = `${from} ${to}`;
        moves.set(key, [...(moves.get(key) ?? []), r]);
      }
      const reason = after.has(id) ? this.health.verdict(id, now).standbyReason : 'healthy';
      for (const [key, moved] of moves) {
        const [from, to] = key.split(' ') as [string, string];
        observed({
          type: 'service.failover',
          resource: { kind: 'service', id },
          data: {
            from_service: from,
            to_service: to,
            reason,
            routes: moved.map((r) => ({ id: r.id, source_cidr: r.sourceCidr, dest_cidr: r.destCidr })),
          },
        });
      }
    }
  }

  /** `tunnel.up` when a tunnel comes up, `tunnel.down` when one that was up is no longer. */
  private reportTunnel(kind: TransportKind, peerId: string, state: TunnelState): void {
    const key = `${kind}|${peerId}`;
    const up = state === 'up';
    if (up === this.tunnelsUp.has(key)) return;
    if (up) this.tunnelsUp.add(key);
    else this.tunnelsUp.delete(key);
    this.options.observed?.({
      type: up ? 'tunnel.up' : 'tunnel.down',
      resource: { kind: 'tunnel', id: peerId },
      data: { peer_id: peerId, transport: kind },
    });
  }

  /** `dataplane.drift_repaired`: one per reconcile that put back what changed behind the agent. */
  private reportDrift(localPeerId: string, changes: readonly KernelChange[]): void {
    this.driftRepairs++;
    this.recentRepairs.push({
      at: Date.now(),
      changes: changes.length,
      repaired: changes.slice(0, DRIFT_CHANGES_SHOWN).map(describeChange),
    });
    if (this.recentRepairs.length > RECENT_REPAIRS) this.recentRepairs.shift();
    this.options.logger.warn({ changes: changes.length }, 'data plane: kernel drift repaired');
    this.options.observed?.({
      type: 'dataplane.drift_repaired',
      resource: { kind: 'agent', id: localPeerId },
      data: {
        changes: changes.length,
        repaired: changes.slice(0, DRIFT_CHANGES_SHOWN).map(describeChange),
      },
    });
  }

  /**
   * A tunnel's state changed. The exits' word came by the tunnel that was: at the ingress it
   * goes with it, and a tunnel that is not up (an exit that died, or one replaced by a new
   * connection) is judged at once, not at the next tick. At the exit, a new tunnel is told at
   * the next check.
   */
  private tunnelChanged(kind: TransportKind, peerId: string, state: TunnelState): void {
    for (const c of this.carried.values()) {
      if (c.service.peerId !== peerId || c.service.transport !== kind) continue;
      const id = c.service.serviceId;
      if (c.service.role === 'ingress' && state !== 'up') this.exitStatus.delete(id);
      const told = this.exitToldIngress.get(id);
      if (c.service.role === 'exit' && state === 'up' && told) told.at = Number.NEGATIVE_INFINITY;
    }
    if (state !== 'up') this.judgeHealth();
  }

  /**
   * At the exit: asks the kernel whether each exit service's traffic can leave toward its routes'
   * destinations (exit-reach.ts), and tells the service's ingress (status-frames.ts) when that
   * changes and every STATUS_REPEAT_MS, so that a new tunnel hears it soon. Logged once per change.
   */
  private async checkExits(): Promise<void> {
    const view = this.view;
    if (this.stopped || !this.flushed || this.exitCheckRunning || !view) return;
    // Only what the kernel carries by now: a service still being set up has no MACVLAN address
    // yet, and a lookup without it would take another table.
    const applied = new Set(this.lastPlan?.carried.map((x) => x.serviceId));
    const exits = [...this.carried.values()].filter(
      (c) => c.service.role === 'exit' && applied.has(c.service.serviceId),
    );
    const services: ExitDestinations[] = exits.map((c) => ({
      serviceId: c.service.serviceId,
      destinations: [
        ...new Set(view.routes.filter((r) => r.serviceId === c.service.serviceId).map((r) => r.destCidr)),
      ]
        // A route without a destination selects everything: there is no one destination to check.
        .filter((cidr): cidr is string => cidr !== null)
        .map((cidr) => {
          const from = this.macvlanAddress(c, cidr.includes(':') ? 6 : 4);
          return from === undefined ? { cidr } : { cidr, from };
        }),
    }));
    this.exitCheckRunning = true;
    let verdicts: Map<string, ExitReachVerdict>;
    try {
      verdicts = this.exitReach.judge(
        services,
        await this.options.kernel.routeGet(this.exitReach.queries(services)),
      );
    } catch (err) {
      this.options.logger.warn({ err }, 'data plane: the exit route check could not ask the kernel');
      return;
    } finally {
      this.exitCheckRunning = false;
    }
    if (this.stopped) return;
    // What the agent itself knows it cannot do for a service (no uplink for its MACVLAN, a host
    // that does not forward, an apply that failed) is no route either.
    const hostProblem = this.hostProblems.length > 0 ? this.hostProblems.join('; ') : null;
    for (const [id, verdict] of verdicts) {
      const problem = this.lastPlan?.problems.get(id) ?? this.lastError ?? hostProblem;
      if (problem && verdict.canForward) verdicts.set(id, { canForward: false, detail: problem });
    }
    for (const [id, verdict] of verdicts) {
      const before = this.exitReachVerdicts.get(id)?.canForward ?? true;
      if (verdict.canForward !== before) {
        if (verdict.canForward)
          this.options.logger.info({ service: id }, 'exit can forward the service again');
        else
          this.options.logger.warn(
            { service: id, detail: verdict.detail },
            'exit cannot forward the service',
          );
      }
    }
    this.exitReachVerdicts = verdicts;
    this.tellIngress();
  }

  /**
   * At the exit: starts the services' probes that are due (probe.ts), each from the address the
   * service's traffic leaves from. A verdict that changes is logged once and told at once.
   */
  private runProbes(now: number): void {
    const view = this.view;
    if (this.stopped || !view) return;
    const probes = new Map<string, HealthProbe>();
    const exits = new Map<string, Carried>();
    for (const s of view.services) {
      const c = this.carried.get(s.id);
      if (c?.service.role !== 'exit' || !s.healthCheck) continue;
      probes.set(s.id, s.healthCheck);
      exits.set(s.id, c);
    }
    for (const id of this.probes.due(probes, now)) {
      const probe = probes.get(id)!;
      const connect = this.options.sockets?.connectNetSocket;
      probeOnce(probe, {
        address: this.macvlanAddress(exits.get(id)!, probe.family),
        mark: AGENT_MARK,
        ...(connect ? { connect: (opts) => connect(opts) } : {}),
      })
        .then(({ ok, detail }) => {
          if (!this.probes.record(id, probe, ok, detail) || this.stopped) return;
          if (ok) this.options.logger.info({ service: id, probe: probe.target }, "exit's probe passes again");
          else this.options.logger.warn({ service: id, detail }, "exit's probe fails");
          this.tellIngress();
        })
        .catch((err) => this.options.logger.error({ err, service: id }, 'data plane: probe failed to run'));
    }
  }

  /**
   * At the exit: tells each service's ingress what its route check and probe say
   * (status-frames.ts), when that changes and every STATUS_REPEAT_MS, so that a new tunnel hears
   * it soon and a lost message is made good.
   */
  private tellIngress(): void {
    const now = performance.now();
    const exitIds = new Set<string>();
    for (const c of this.carried.values()) {
      if (c.service.role !== 'exit') continue;
      const id = c.service.serviceId;
      exitIds.add(id);
      const reach = this.exitReachVerdicts.get(id);
      const probePassing = this.probes.passing(id);
      if (!reach && probePassing === null) continue;
      const status: ServiceStatus = {
        serviceId: id,
        canForward: reach?.canForward ?? null,
        probePassing,
        detail: [reach?.detail ?? '', this.probes.detail(id)].filter((d) => d !== '').join('; '),
      };
      const told = this.exitToldIngress.get(id);
      const changed =
        told?.status.canForward !== status.canForward ||
        told.status.probePassing !== status.probePassing ||
        told.status.detail !== status.detail;
      const tunnel = this.tunnelOf(c.service);
      if (tunnel?.state !== 'up') {
        // Told as soon as a tunnel is up.
        this.exitToldIngress.set(id, { status, at: Number.NEGATIVE_INFINITY });
        continue;
      }
      if (told !== undefined && !changed && now - told.at < STATUS_REPEAT_MS) continue;
      tunnel.send([encodeServiceStatus(status)]);
      this.exitToldIngress.set(id, { status, at: now });
    }
    for (const id of this.exitToldIngress.keys()) if (!exitIds.has(id)) this.exitToldIngress.delete(id);
    for (const id of this.exitReachVerdicts.keys()) if (!exitIds.has(id)) this.exitReachVerdicts.delete(id);
  }

  /** The exit's word on a service this agent is the ingress of; judged at the next interval. */
  private statusFromExit(kind: TransportKind, peerId: string, message: Buffer): void {
    const decoded = decodeServiceStatus(message);
    if (decoded.kind === 'malformed') {
      this.drop('malformed', undefined, 1);
      return;
    }
    const c = this.carried.get(decoded.serviceId);
    if (c?.service.role !== 'ingress' || c.service.peerId !== peerId || c.service.transport !== kind) {
      this.drop(c ? 'unauthorized' : 'unknown_service', c, 1);
      return;
    }
    this.exitStatus.set(decoded.serviceId, { status: decoded, at: performance.now() });
  }

  /** A service's failover verdict at this ingress (null: this agent is not its ingress). */
  healthOf(serviceId: string): HealthVerdict | null {
    const c = this.carried.get(serviceId);
    return c?.service.role === 'ingress' ? this.health.verdict(serviceId, performance.now()) : null;
  }

  /** The failover verdicts of every service this agent is the ingress of. */
  ingressHealth(): [string, HealthVerdict][] {
    const now = performance.now();
    return [...this.carried.values()]
      .filter((c) => c.service.role === 'ingress')
      .map((c) => [c.service.serviceId, this.health.verdict(c.service.serviceId, now)]);
  }

  /** What explain needs of this agent's ingress state now (explain.ts), times as wall-clock ms. */
  ingressRuntime(): IngressRuntime {
    const now = performance.now();
    const health = new Map<string, HealthVerdict>();
    const tunnels = new Map<string, { state: string; rttMs: number | null }>();
    const tuns = new Map<string, string>();
    for (const c of this.carried.values()) {
      const id = c.service.serviceId;
      const tunnel = this.tunnelOf(c.service);
      tuns.set(id, c.service.tun);
      tunnels.set(id, { state: tunnel?.state ?? 'down', rttMs: tunnel?.stats().lastRttMs ?? null });
      if (c.service.role === 'ingress') health.set(id, wallClock(this.health.verdict(id, now)));
    }
    return {
      standby: new Set(this.standby),
      health,
      tunnels,
      tuns,
      streams: this.streams?.port != null,
      peerIps: this.lastPeerIps,
    };
  }

  /**
   * Explain's kernel view of a packet at this ingress (explain.ts KernelView), read from the
   * kernel: the input interface is the one the kernel routes the source by (none for an address
   * of this host: its own packet), the lookup is `ip route get fibmatch DESTINATION from SOURCE
   * [iif DEV]` with the policy rules, unmarked as a client's packet is; the TUN it answers names
   * the service. Beside it, from one reading of the owned state: the first of the agent's rules
   * the packet matches, the nftables lines it meets into that TUN, and what the reconciler would
   * change for it (against the last plan). `expected`: the service the configuration selects.
   */
  async kernelView(
    packet: { source: string; destination: string; protocol: string | null },
    expected: string | null,
  ): Promise<KernelView> {
    const kernel = this.options.kernel;
    const [toSource] = await kernel.routeGet([{ dst: packet.source }]);
    const iif = toSource && !toSource.local ? toSource.dev : null;
    const query: RouteQuery = { dst: packet.destination, from: packet.source, ...(iif ? { iif } : {}) };
    const [[answer], owned] = await Promise.all([kernel.routeGet([query]), kernel.observe()]);
    const ingress = [...this.carried.values()].filter((c) => c.service.role === 'ingress');
    const into = answer ? ingress.find((c) => c.service.tun === answer.dev) : undefined;
    const family = packet.destination.includes(':') ? 6 : 4;
    const at = packetAt(packet);
    const rule = owned.rules
      .filter((r) => r.family === family && ruleHolds(r, at, iif))
      .sort((a, b) => a.pref - b.pref)[0];
    // The slots whose state concerns the packet: the TUN it takes, and the one it should take.
    const slots = [into, expected ? this.carried.get(expected) : undefined]
      .filter((c): c is Carried => c !== undefined)
      .map((c) => c.service);
    const wanted = this.lastPlan?.kernel;
    this.asReconcileSees(owned);
    // Only the state that concerns the packet is compared: the same changes as a whole diff
    // filtered afterwards (whether a change concerns it depends on its key alone), without
    // canonicalising a thousand rules on each side per question.
    const mine = (k: KernelState) => concerning(k, slots, at, family);
    const repairs = wanted ? diff(mine(owned), mine(wanted), this.nft).map(describeChange) : [];
    return {
      lookup: `ip route get fibmatch ${query.dst} from ${query.from}${iif ? ` iif ${iif}` : ''}`,
      iif,
      route: answer
        ? { dev: answer.dev, gateway: answer.gateway, prefix: answer.prefix, usable: answer.usable }
        : null,
      service_id: into?.service.serviceId ?? null,
      rule: rule ? describeChange({ op: 'add', rule }).replace(/^ip -[46] rule add /, '') : null,
      nft: into ? nftMet(owned.nft, into.service.tun, family, packet.protocol) : [],
      repairs,
    };
  }

  /**
   * A TUN is created down with the default MTU, which observe() cannot tell from a configured
   * one: until an apply has set it up, it shows with no MTU, so that diff sets it (and up) again.
   * Changes `observed` in place and returns it.
   */
  private asReconcileSees(observed: KernelState): KernelState {
    observed.links = observed.links.map((l) => (this.tunsToSetUp.has(l.name) ? { ...l, mtu: 0 } : l));
    return observed;
  }

  /** Health changes since start, by the state or reason a service went to. */
  healthChangeCounts(): ReadonlyMap<string, number> {
    return this.healthChanges;
  }

  /** TUN devices that failed under the agent and were made again, since start. */
  tunFailureCount(): number {
    return this.tunFailures;
  }

  /**
   * GET /v1/dataplane: what this agent owns in the kernel now against what it wants (the last
   * plan), what the next reconcile would change, the last reconcile, and the repairs since start.
   * Reads the kernel (one observe: netlink dumps and the nft listing).
   */
  async driftReport(): Promise<DriftReport> {
    const wanted = this.lastPlan?.kernel ?? null;
    const owned = this.asReconcileSees(await this.options.kernel.observe());
    const differences = wanted ? diff(owned, wanted, this.nft) : [];
    const count = (k: KernelState | null) =>
      k && {
        links: k.links.length,
        addresses: k.addresses.length,
        rules: k.rules.length,
        routes: k.routes.length,
        nft: k.nft !== null,
      };
    return {
      wanted: count(wanted),
      owned: count(owned)!,
      differences: differences.slice(0, DIFFERENCES_SHOWN).map(describeChange),
      differenceCount: differences.length,
      lastReconcile: this.lastReconcile,
      reconciles: this.reconciles,
      repairs: this.driftRepairs,
      recentRepairs: [...this.recentRepairs],
      tunFailures: this.tunFailures,
      problems: this.problems(),
    };
  }

  private reconciled(r: { at: number; started: number; error: string | null }): void {
    this.reconciles++;
    this.lastReconcile = {
      at: r.at,
      durationMs: Math.round((performance.now() - r.started) * 10) / 10,
      changes: this.reconcileChanges.changes,
      drift: this.reconcileChanges.drift,
      error: r.error,
    };
  }

  /** Reconciles that repaired kernel drift since start. */
  driftRepairCount(): number {
    return this.driftRepairs;
  }

  /**
   * The counters of a service deleted from the cluster go with it, and so do their series on
   * /metrics: without this the agent would keep every service it ever carried.
   */
  private forgetDeleted(existing: ReadonlySet<string>): void {
    for (const id of [...this.counters.keys()]) {
      if (existing.has(id) || this.carried.has(id)) continue;
      this.counters.delete(id);
      this.dropsByService.delete(id);
      for (const mux of this.streams?.muxes.values() ?? []) mux.forgetService(id);
    }
  }

  private closeCarried(c: Carried): void {
    c.tun.close();
    c.shaper.clear();
    for (const mux of this.streams?.muxes.values() ?? []) mux.closeService(c.service.serviceId);
    this.tunsToSetUp.delete(c.service.tun);
    this.carried.delete(c.service.serviceId);
  }

  /**
   * The families whose limited services are paced (requirements.ts pacingVerdict), asked only
   * while there is something to pace. net.ipv4.tcp_early_demux is set to 0 for it (docs/
   * decisions.md §6; logged with its old value) and set back to 1 when nothing is paced any more,
   * or the data plane stops; after a crash it stays 0. Why nothing is paced is logged once.
   */
  private async pacingAllowed(wanted: boolean): Promise<Set<4 | 6>> {
    if (!wanted) {
      await this.restoreEarlyDemux();
      this.pacingProblem = null;
      return new Set();
    }
    const { kernel, logger } = this.options;
    const verdict = pacingVerdict({
      ipv4Forward: await kernel.readSysctl('net.ipv4.ip_forward'),
      ipv6Forward: await kernel.readSysctl('net.ipv6.conf.all.forwarding'),
      rpFilterAll: await kernel.readSysctl('net.ipv4.conf.all.rp_filter'),
      earlyDemux: await kernel.readSysctl(EARLY_DEMUX),
    });
    let { families, reason } = verdict;
    if (verdict.turnOffEarlyDemux) {
      try {
        await kernel.writeSysctl(EARLY_DEMUX, '0');
        this.earlyDemuxSet = true;
        logger.info({ key: EARLY_DEMUX, was: '1', now: '0' }, 'set for pacing');
      } catch (err) {
        reason = `${EARLY_DEMUX} could not be set to 0 (${(err as Error).message}): limited services are not paced (set ${EARLY_DEMUX} = 0 in /etc/sysctl.d; the agent reads it again within 10 s)`;
        families = new Set();
      }
    }
    // Refused after this agent had turned early demux off (strict rp_filter since): back to 1.
    if (families.size === 0) await this.restoreEarlyDemux();
    if (reason !== null && reason !== this.pacingProblem) logger.warn({ reason }, 'no pacing');
    this.pacingProblem = reason;
    return families;
  }

  /** Sets net.ipv4.tcp_early_demux back to 1 if this agent set it to 0 (pacingAllowed). */
  private async restoreEarlyDemux(): Promise<void> {
    if (!this.earlyDemuxSet) return;
    try {
      await this.options.kernel.writeSysctl(EARLY_DEMUX, '1');
      this.earlyDemuxSet = false;
      this.options.logger.info({ key: EARLY_DEMUX, was: '0', now: '1' }, 'set back: nothing is paced');
    } catch (err) {
      this.options.logger.warn({ err, key: EARLY_DEMUX }, 'could not set back');
    }
  }

  /**
   * A pacer's peer takes its rp_filter from `default` when it is made; strict (1) there would drop
   * every packet the pacer sends (no route to the client leads out of the peer), so it is set to
   * loose (2) on that link alone, which is the agent's own. `all` strict stops pacing in plan.
   * A failure is logged, not thrown: the rest of the reconcile still runs.
   */
  private async loosenPacerPeers(links: readonly LinkSpec[]): Promise<void> {
    const { kernel } = this.options;
    for (const l of links) {
      if (l.kind !== 'pacer') continue;
      const key = `net.ipv4.conf.${pacerPeerName(l.name)}.rp_filter`;
      try {
        if ((await kernel.readSysctl(key))?.trim() === '1') await kernel.writeSysctl(key, '2');
      } catch (err) {
        this.options.logger.warn({ err, key }, 'a pacer cannot pass strict reverse-path filtering');
      }
    }
  }

  private async uplink() {
    const found = await this.options.kernel.uplink();
    const parent = this.options.macvlanParent;
    if (!parent) return found;
    return found && found.dev === parent ? found : { dev: parent, gateway4: null, gateway6: null };
  }

  /**
   * Peer hosts as IP addresses. Names are resolved again once their answer is a minute old (the
   * reconcile timer then puts a changed answer into the exclusion rules); a failed lookup keeps
   * the last answer, so a DNS outage never drops a peer's exclusion and with it the cluster.
   */
  private async peerIps(peers: DataPlaneView['peers']): Promise<string[]> {
    const out: string[] = [];
    const names = new Set<string>();
    for (const p of peers) {
      const host = parsePeerAddress(p.address)?.host;
      if (!host) continue;
      if (isIP(host)) {
        out.push(host);
        continue;
      }
      names.add(host);
      const cached = this.peerIpCache.get(host);
      let ips = cached?.ips ?? [];
      if (!cached || Date.now() - cached.at > PEER_NAME_TTL_MS) {
        try {
          ips = (await lookup(host, { all: true })).map((a) => a.address);
          this.peerIpCache.set(host, { ips, at: Date.now() });
        } catch {
          // Keep what was known (if anything); tried again at the next reconcile.
        }
      }
      out.push(...ips);
    }
    // Names no peer uses any more: their answers go (a renamed or removed peer's stayed for good).
    for (const name of this.peerIpCache.keys()) if (!names.has(name)) this.peerIpCache.delete(name);
    return out;
  }

  // --- packets -----------------------------------------------------------------------------------

  private fromTun(c: Carried, packets: Buffer[]): void {
    const tunnel = this.tunnelOf(c.service);
    if (tunnel?.state !== 'up') {
      this.drop('tunnel_down', c, packets.length);
      return;
    }
    if (c.mbps > 0) {
      this.shapedFromTun(c, packets);
      return;
    }
    const messages = new Array<Buffer>(packets.length);
    let bytes = 0;
    for (let i = 0; i < packets.length; i++) {
      const p = packets[i]!;
      bytes += p.length;
      c.flows?.fromClient(p);
      messages[i] = encodePacket(c.idBytes, p);
    }
    c.counters.packetsSent += packets.length;
    c.counters.bytesSent += bytes;
    // Above the tunnel's high-water mark: stop reading this TUN until the tunnel drains.
    if (!tunnel.send(messages)) c.tun.pause();
  }

  /** fromTun under a bandwidth limit: each packet waits its turn (per flow, fairly) or is dropped. */
  private shapedFromTun(c: Carried, packets: Buffer[]): void {
    const send = (messages: Buffer[], bytes: number) => {
      const tunnel = this.tunnelOf(c.service);
      if (tunnel?.state !== 'up') {
        this.drop('tunnel_down', c, messages.length);
        return;
      }
      c.counters.packetsSent += messages.length;
      c.counters.bytesSent += bytes;
      if (!tunnel.send(messages)) c.tun.pause();
    };
    const now: Buffer[] = [];
    let bytes = 0;
    for (const p of packets) {
      c.flows?.fromClient(p);
      const message = encodePacket(c.idBytes, p);
      const verdict = c.shaper.offer(
        PACKET_FLOW_BASE + packetFlow(p),
        p.length,
        () => send([message], p.length),
        SHAPED_QUEUE_BYTES,
      );
      if (verdict === true) {
        now.push(message);
        bytes += p.length;
      } else if (verdict === 'drop') {
        this.drop('shaped', c, 1);
      }
    }
    if (now.length > 0) send(now, bytes);
  }

  private fromTunnel(kind: TransportKind, peerId: string, message: TunnelMessage): void {
    const first = Buffer.isBuffer(message) ? message : message.parts[0]!;
    const mux = this.streams?.muxes.get(kind);
    if (mux && isStreamKind(first[0])) {
      mux.onMessage(peerId, message);
      return;
    }
    if (first[0] === KIND_SERVICE_STATUS) {
      this.statusFromExit(kind, peerId, wholeOf(message));
      return;
    }
    // Packets come whole but for a long one that arrived across reads: one copy, as a TUN write needs.
    const decoded = decodeMessage(wholeOf(message));
    if (decoded.kind === 'malformed') {
      this.drop('malformed', undefined, 1);
      return;
    }
    const c = this.carried.get(decoded.serviceId);
    if (!c) {
      this.drop('unknown_service', undefined, 1);
      return;
    }
    // Only the service's other end may put packets into its TUN, over the service's transport.
    if (c.service.peerId !== peerId || c.service.transport !== kind) {
      this.drop('unauthorized', c, 1);
      return;
    }
    c.counters.packetsReceived++;
    c.counters.bytesReceived += decoded.packet.length;
    c.flows?.fromServer(decoded.packet);
    c.pending.push(decoded.packet);
    this.flushQueue.add(c);
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      queueMicrotask(() => this.flushTuns());
    }
  }

  private flushTuns(): void {
    this.flushScheduled = false;
    for (const c of this.flushQueue) {
      const batch = c.pending;
      c.pending = [];
      const written = c.tun.write(batch);
      if (written < batch.length) this.drop('tun_write', c, batch.length - written);
    }
    this.flushQueue.clear();
  }

  private drop(reason: DropReason, c: Carried | undefined, count: number): void {
    this.drops.set(reason, (this.drops.get(reason) ?? 0) + count);
    if (c) {
      c.counters.dropped += count;
      let byReason = this.dropsByService.get(c.service.serviceId);
      if (!byReason) {
        byReason = new Map();
        this.dropsByService.set(c.service.serviceId, byReason);
      }
      byReason.set(reason, (byReason.get(reason) ?? 0) + count);
    }
  }
}

/** How many of a drift repair's changes its event lists (the count says how many there were). */
const DRIFT_CHANGES_SHOWN = 20;
/** The sysctl pacing needs off (pacingAllowed). */
const EARLY_DEMUX = 'net.ipv4.tcp_early_demux';

/** Repairs GET /v1/dataplane lists (the count covers all of them). */
const RECENT_REPAIRS = 20;
/** Differences GET /v1/dataplane spells out (the count covers all of them). */
const DIFFERENCES_SHOWN = 50;

/** A change as the commands it ran; the nftables table by name only (its ruleset is long). */
function describeChange(change: KernelChange): string {
  if (change.op === 'nft') return change.ruleset === null ? 'nft: table deleted' : 'nft: table replaced';
  // Its queue is some 270 tc lines: named, not spelled out.
  if ('link' in change && change.link.kind === 'pacer' && change.op === 'add') {
    return `pacer ${change.link.name} made: veth pair, queue at ${change.link.rateBps} bit/s`;
  }
  try {
    return renderChange(change).flatMap(commandsOf).join('; ');
  } catch {
    return `${change.op} ${Object.keys(change).find((k) => k !== 'op')}`;
  }
}

/** A packet's source and destination, each ready to be tested against many networks. */
interface PacketAt {
  inSource: (network: string) => boolean;
  inDestination: (network: string) => boolean;
}

function packetAt(packet: { source: string; destination: string }): PacketAt {
  return { inSource: holdsAddress(packet.source), inDestination: holdsAddress(packet.destination) };
}

/** Whether a policy rule holds an unmarked packet arriving on `iif` (null: this host's own). */
function ruleHolds(r: RuleSpec, packet: PacketAt, iif: string | null): boolean {
  if (r.fwmark && (0 & r.fwmark.mask) !== r.fwmark.value) return false;
  // The packet's source port is not known: a rule on one (the API port's exclusion) is not taken.
  if (r.ipproto !== undefined || r.sport !== undefined) return false;
  if (r.iif !== undefined && r.iif !== (iif ?? 'lo')) return false;
  return (
    (r.from === undefined || packet.inSource(r.from)) && (r.to === undefined || packet.inDestination(r.to))
  );
}

/** Whether a change the reconciler would make concerns a packet: its services' TUN and tables, or a rule holding it. */
function concerns(
  c: KernelChange,
  services: readonly CarriedService[],
  packet: PacketAt,
  family: 4 | 6,
): boolean {
  if (c.op === 'nft') return true;
  const mine = (table: number | 'main', dev?: string) =>
    services.some((s) => table === tableOf(s.slot) || dev === s.tun);
  if ('rule' in c) return mine(c.rule.table) || (c.rule.family === family && ruleHolds(c.rule, packet, null));
  if ('route' in c) return mine(c.route.table, c.route.dev);
  if ('link' in c) return mine('main', c.link.name);
  return mine('main', c.address.dev);
}

/** The part of a kernel state whose changes would concern a packet (concerns()); nft kept whole. */
function concerning(
  k: KernelState,
  services: readonly CarriedService[],
  packet: PacketAt,
  family: 4 | 6,
): KernelState {
  const keep = (c: KernelChange) => concerns(c, services, packet, family);
  return {
    links: k.links.filter((link) => keep({ op: 'add', link })),
    addresses: k.addresses.filter((address) => keep({ op: 'add', address })),
    rules: k.rules.filter((rule) => keep({ op: 'add', rule })),
    routes: k.routes.filter((route) => keep({ op: 'add', route })),
    nft: k.nft,
  };
}

/**
 * The lines of the agent's nftables listing (KernelState.nft: one per line, `chain NAME {` opening
 * each chain) that a packet into `tun` meets: those naming that TUN, or every TUN, as where it
 * goes (`oifname`, `fib daddr oifname`); never those for packets coming out of a TUN (`iifname`).
 * Lines of the other family, and TCP's when the protocol is another, are left out.
 */
function nftMet(listing: string | null, tun: string, family: 4 | 6, protocol: string | null): string[] {
  if (listing === null) return [];
  const out: string[] = [];
  let chain = '';
  for (const line of listing.split('\n').map((l) => l.trim())) {
    const opens = /^chain (\S+) \{$/.exec(line);
    if (opens) {
      chain = opens[1]!;
      continue;
    }
    if (!line.includes(`"${tun}"`) && !line.includes('"mesh-t*"')) continue;
    if (/iifname "mesh-t/.test(line)) continue;
    if (line.includes(family === 4 ? 'ipv6' : 'ipv4')) continue;
    if (protocol !== null && protocol !== 'tcp' && /\btcp\b/.test(line)) continue;
    out.push(`${chain}: ${line}`);
  }
  return out;
}

/** A route's own network address, source and destination: where its traffic is asked about. */
function routePoint(r: PlanRoute): [string, string] {
  const family6 = (r.sourceCidr ?? r.destCidr ?? '').includes(':');
  const any = family6 ? '::' : '0.0.0.0';
  const address = (cidr: string | null) => (cidr === null ? any : cidr.split('/')[0]!);
  return [address(r.sourceCidr), address(r.destCidr)];
}
