/**
 * The composition root: builds every part of the agent from its configuration, starts them in
 * order and stops them in reverse. Only the CLI and tests import this file.
 *
 * Start order: the data dir and keys (everything signs or hashes with them); the store (the API
 * answers from it); gossip, built (the API's sync and joins use its peer connections); the API,
 * listening; the data plane's transports (the tcp tunnels ride the API's connections, the kcp
 * socket takes its port number, so a taken port fails before either opens); gossip's rounds; the
 * data plane (kernel state and tunnels). Stopping runs the parts backwards (`StartedParts`), for
 * `stop()` and for a start-up that fails half way alike: kernel state goes while the store still
 * says what it was, the tunnels close before the API waits for its connections, gossip finishes
 * its round in flight, and the store closes last. /readyz says "starting" until all have started.
 * The runtime events' reporters (aggregated auth failures, the license watch) stop after the API
 * and before the store: what they counted is recorded before the log closes.
 */
import { createPrivateKey, type KeyObject, randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { FastifyInstance } from 'fastify';
import pino, { type Logger } from 'pino';
import { buildApp, type HealthReport } from './api/app.js';
import {
  answerPeer,
  type ExplainRequest,
  LocalExplainer,
  peerAnswer,
  requestBody,
} from './api/explain-local.js';
import { registerLicenseMetrics } from './api/license-status.js';
import { ApiMetrics } from './api/metrics.js';
import { dataplaneReportView, noDataPlane } from './api/routes/dataplane.js';
import { AccessTokens } from './auth/access-tokens.js';
import { Credentials } from './auth/credentials.js';
import { AuthFailureReporter } from './auth/failure-report.js';
import { FailureThrottle } from './auth/failure-throttle.js';
import { SecretHasher } from './auth/secret-hash.js';
import { TokenEndpoint } from './auth/token-endpoint.js';
import { Allocator } from './cluster/allocator.js';
import { ClusterCredential } from './cluster/cluster-credential.js';
import { DEFAULT_GOSSIP_CONFIG, Gossip } from './cluster/gossip.js';
import { GossipMetrics } from './cluster/gossip-metrics.js';
import { gossipSourceAddress, HttpGossipTransport } from './cluster/gossip-transport.js';
import { HybridClock } from './cluster/hlc.js';
import { Identity } from './cluster/identity.js';
import { HttpPeerCaller } from './cluster/peer-client.js';
import { Peers } from './cluster/peers.js';
import { Replica } from './cluster/replica.js';
import { ServiceConfig } from './cluster/service-config.js';
import {
  DataPlane,
  type DataPlaneView,
  DEFAULT_FAILOVER,
  type FailoverOptions,
} from './dataplane/dataplane.js';
import { registerDataPlaneMetrics } from './dataplane/dataplane-metrics.js';
import { LinuxKernel } from './dataplane/kernel/linux.js';
import { missingRequirements } from './dataplane/requirements.js';
import { type Clock, systemClock } from './domain/clock.js';
import { ApiError } from './domain/errors.js';
import { healthProbe } from './domain/health-check.js';
import type { RecordObserved } from './domain/observed-event.js';
import { isServiceActive } from './domain/service-rules.js';
import { EventLog } from './events/event-log.js';
import { LicenseWatch } from './events/license-watch.js';
import { EventRetention, type RetentionLimits } from './events/retention.js';
import { RuntimeEvents } from './events/runtime-events.js';
import { generateLicenseKeyPair } from './license/sign.js';
import {
  connectNetSocket,
  openTransparentListener,
  setNotSentLowat,
  setReceiveBuffer,
} from './native/sockets.js';
import { openTun } from './native/tun.js';
import { loadOrCreateSecretFile, removeStaleTempFiles } from './store/key-files.js';
import { Store } from './store/store.js';
import { checkKcpParams, type KcpParams } from './transports/kcp/kcp.js';
import { registerKcpMetrics } from './transports/kcp-metrics.js';
import { KcpTransport } from './transports/kcp-transport.js';
import { TcpTransport } from './transports/tcp.js';
import type { PeerDirectory } from './transports/tunnel.js';
import { WebhookDispatcher } from './webhooks/dispatcher.js';
import { WebhookMetrics } from './webhooks/webhook-metrics.js';
import { Webhooks } from './webhooks/webhooks.js';

export interface AgentConfig {
  listenHost: string;
  listenPort: number;
  /** host:port other agents use; the local peer's address. */
  advertise: string;
  dataDir: string;
  /** Trusted license verification keys, already parsed. */
  licenseKeys: KeyObject[];
  publicUrl: string;
  tls?: { cert: Buffer; key: Buffer } | undefined;
  logLevel: string;
  /** Where log lines go; stdout when absent. */
  logDestination?: NodeJS.WritableStream | undefined;
  /** Serve /metrics without a token. */
  metricsPublic?: boolean;
  clock?: Clock;
  /** Gossip heartbeat interval (default 1000 ms). */
  gossipIntervalMs?: number;
  /** How long tombstones stay in gossip digests (default 1 hour). */
  tombstoneHorizonMs?: number;
  /** --events-max-age-days, --events-max-count (default DEFAULT_RETENTION). */
  eventRetention?: RetentionLimits;
  /** `--dataplane`: auto (on with CAP_NET_ADMIN), on, off. Default off for embedders. */
  dataplane?: 'on' | 'off' | 'auto';
  /** `--macvlan-parent`; default: the interface of the default route. */
  macvlanParent?: string | undefined;
  /**
   * Failover's timing (--health-interval-ms, --health-misses, --failover-hold-down-ms); default
   * DEFAULT_FAILOVER. The tunnels' keepalives run at its interval: silence is measured in them.
   */
  failover?: FailoverOptions;
  /** --kcp: KCP engine parameters of the kcp transport (DEFAULT_KCP_PARAMS where absent). */
  kcp?: Partial<
    Pick<
      KcpParams,
      'mtu' | 'interval' | 'nodelay' | 'resend' | 'noCongestionControl' | 'sndWnd' | 'rcvWnd' | 'minRtoMs'
    >
  >;
}

export const DATABASE_FILE = 'mesh-agent.db';
export const IDENTITY_KEY_FILE = 'identity.key';
export const TOKEN_KEY_FILE = 'token-signing.key';
export const SECRET_HASH_KEY_FILE = 'secret-hash.key';

export const AGENT_VERSION: string = (
  JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }
).version;

export interface RunningAgent {
  app: FastifyInstance;
  store: Store;
  /** This agent's one event log (docs/events.md). */
  events: EventLog;
  identity: Identity;
  logger: Logger;
  /** The bound address, e.g. for port 0 in tests. */
  url: string;
  stop(): Promise<void>;
}

export function createLogger(level: string, destination?: NodeJS.WritableStream): Logger {
  return pino(
    {
      level,
      // Secrets never reach a log line: request lines carry no headers, bodies or query strings,
      // and these paths catch a secret logged by mistake at the top level. Wildcard paths
      // (`*.client_secret`) made every line cost 1.6 times as much (bench/api/hot-path-costs.ts).
      redact: {
        paths: ['req.headers.authorization', 'authorization', 'client_secret', 'access_token'],
        censor: '[redacted]',
      },
    },
    destination ?? process.stdout,
  );
}

export async function startAgent(config: AgentConfig): Promise<RunningAgent> {
  const clock = config.clock ?? systemClock;
  const logger = createLogger(config.logLevel, config.logDestination);
  const dataDir = resolve(config.dataDir);
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const stale = removeStaleTempFiles(dataDir);
  if (stale > 0) logger.warn({ removed: stale }, 'removed temp files left by an interrupted key write');

  const identityPem = loadOrCreateSecretFile(join(dataDir, IDENTITY_KEY_FILE), Identity.generatePem);
  const identity = new Identity(identityPem);
  const tokenKey = createPrivateKey(
    loadOrCreateSecretFile(join(dataDir, TOKEN_KEY_FILE), () => generateLicenseKeyPair().privatePem),
  );
  const hasher = new SecretHasher(
    Buffer.from(
      loadOrCreateSecretFile(join(dataDir, SECRET_HASH_KEY_FILE), () => randomBytes(32).toString('base64')),
      'base64',
    ),
  );

  const store = new Store(join(dataDir, DATABASE_FILE));
  const started = new StartedParts(logger);
  started.add('store', () => store.close());
  // The agent's one event log, on the store's connection: what records into it joins the
  // transaction of the write it describes. Built before any part that records or subscribes.
  const events = new EventLog(store, identity.peerId, clock, (err) =>
    logger.error({ err }, 'an event listener failed'),
  );
  // What the parts observe (docs/events.md "Runtime events"), recorded with this agent as actor.
  const observed = new RuntimeEvents(events, logger.child({ component: 'events' })).record;
  // Registered before the API: stopped after it, so no failure counted is left unreported.
  const authFailures = new AuthFailureReporter(clock, observed, identity.peerId);
  started.add('auth failures', () => authFailures.stop());
  const licenseWatch = new LicenseWatch(() => store.agentState()?.license, events, observed, clock);
  started.add('license watch', () => licenseWatch.stop());
  store.onWrite(() => licenseWatch.poke());
  const retention = new EventRetention(store, clock, config.eventRetention);
  retention.start();
  started.add('event retention', () => retention.stop());
  let stopping = false;
  let starting = true;
  try {
    // A bad --kcp stops the start-up before anything listens (the engine's own check).
    if (config.kcp) checkKcpParams(config.kcp);
    const replica = new Replica(
      store,
      identity.peerId,
      new HybridClock(identity.peerId, clock),
      clock,
      config.tombstoneHorizonMs,
      events,
    );
    replica.init();
    const allocator = new Allocator(store, identity.peerId, clock);
    const clusterCredential = new ClusterCredential(store, clock, replica);
    const metrics = new ApiMetrics();
    const scheme = config.tls ? 'https' : 'http';
    // Built once the API listens (below): until then it is absent, as on a host without one.
    let data: DataPlaneParts | null = null;
    // Explain at this agent (and for a peer that asks over gossip): the store's view, ranked,
    // with the data plane's state where one runs (`data` is set once the API listens).
    const explainer = new LocalExplainer({
      view: () => dataPlaneView(store, identity),
      generation: () => store.generation,
      peers: () => store.peers(),
      runtime: () => data?.dataplane?.ingressRuntime() ?? null,
      kernelView: (packet, expected) => data?.dataplane?.kernelView(packet, expected) ?? null,
    });
    const explainLocal = (request: ExplainRequest) => explainer.explain(request);
    const gossip = new Gossip({
      store,
      identity,
      replica,
      credential: clusterCredential,
      allocator,
      transport: new HttpGossipTransport(scheme, gossipSourceAddress(config.listenHost, config.advertise)),
      clock,
      logger: logger.child({ component: 'gossip' }),
      metrics: new GossipMetrics(metrics.registry),
      observed,
      config: {
        ...DEFAULT_GOSSIP_CONFIG,
        intervalMs: config.gossipIntervalMs ?? DEFAULT_GOSSIP_CONFIG.intervalMs,
      },
      explain: (request) => answerPeer((r) => explainLocal(r), request),
    });
    const engine = gossip;
    // Registered now, started last but one: once the API listens, a sync or a join may open its
    // peer connections before its rounds start. Stopping it before start() is safe.
    started.add('gossip', () => engine.stop());
    registerLicenseMetrics(metrics.registry, store, clock);
    const tokens = await AccessTokens.create(tokenKey, config.publicUrl, audienceFor(identity.peerId), clock);
    const health = (): HealthReport => {
      const liveReasons: string[] = [];
      if (!store.isReadable()) liveReasons.push('the database cannot be read');
      const readyReasons = stopping
        ? ['the agent is shutting down']
        : starting
          ? ['the agent is starting']
          : [];
      if (replica.removedFromCluster) readyReasons.push('another agent removed this one from the cluster');
      const state = store.agentState();
      if (state && store.peer(state.localPeerId)?.isActive === false) {
        readyReasons.push(
          'this agent left the cluster (DELETE /v1/peers/self, final): it carries no traffic; to bring the host back, empty its data directory, bootstrap it and add it again',
        );
      }
      const fromDataPlane = (r: string) => `data plane: ${r}`;
      if (data) readyReasons.push(...data.missing.map(fromDataPlane));
      if (data?.dataplane) readyReasons.push(...data.dataplane.problems().map(fromDataPlane));
      const warnings = (data?.dataplane?.warnings() ?? []).map(fromDataPlane);
      return { liveReasons, readyReasons, warnings };
    };
    // Webhooks deliver the log from the store alone; they start last (below) and stop first.
    const userAgent = `mesh-agent/${AGENT_VERSION}`;
    const dispatcher: WebhookDispatcher = new WebhookDispatcher({
      table: store.webhookTable,
      events,
      clock,
      logger: logger.child({ component: 'webhooks' }),
      metrics: new WebhookMetrics(metrics.registry, () => webhooks.pending()),
      userAgent,
    });
    const webhooks: Webhooks = new Webhooks(store, events, dispatcher, clock, userAgent);
    const app = await buildApp({
      store,
      events,
      webhooks,
      identity,
      tokens,
      tokenEndpoint: new TokenEndpoint(
        store,
        hasher,
        tokens,
        new FailureThrottle(clock),
        clock,
        authFailures.report,
      ),
      credentials: new Credentials(store, hasher, clock, events),
      clusterCredential,
      services: new ServiceConfig(store, clock, replica, allocator),
      peers: new Peers(
        store,
        identity,
        new HttpPeerCaller(scheme),
        clock,
        config.licenseKeys,
        replica,
        allocator,
        (peerId) => engine.joined(peerId),
        (peer, tombstone) => engine.removed(peer, tombstone),
      ),
      sync: async () => {
        await engine.syncNow();
        await data?.dataplane?.settle();
      },
      dataplaneStatus: (id) => data?.dataplane?.status(id),
      dataplaneReport: async () => {
        if (!data)
          return noDataPlane(
            'this agent runs no data plane (--dataplane off, or auto without CAP_NET_ADMIN)',
          );
        if (!data.dataplane) return noDataPlane(`the data plane cannot run: ${data.missing.join('; ')}`);
        return dataplaneReportView(await data.dataplane.driftReport());
      },
      explain: (request) => explainLocal(request),
      explainAt: async (peerId, request) => {
        let reply: unknown;
        try {
          reply = await engine.explainAt(peerId, requestBody(request));
        } catch (err) {
          throw new ApiError('UNAVAILABLE', `peer ${peerId} did not answer: ${(err as Error).message}`);
        }
        return peerAnswer(peerId, reply);
      },
      liveness: (peerId) => engine.liveness(peerId),
      gossip: (envelope) => engine.handle(envelope),
      gossipUnreadable: () => engine.countUnreadable(),
      bootstrap: {
        store,
        identity,
        hasher,
        trustedLicenseKeys: config.licenseKeys,
        clock,
        advertiseAddress: config.advertise,
        replica,
        events,
      },
      clock,
      publicUrl: config.publicUrl,
      version: AGENT_VERSION,
      health,
      logger,
      metrics,
      metricsPublic: config.metricsPublic ?? false,
      https: config.tls,
      observed,
      reportAuthFailure: authFailures.report,
    });
    // The tunnel shares the API's port through an HTTP Upgrade (docs/dataplane.md).
    app.server.on('upgrade', (req, socket, head) => {
      if (!data?.transport?.acceptUpgrade(req, socket, head)) socket.destroy();
    });
    started.add('api', () => app.close());
    await app.listen({ host: config.listenHost, port: config.listenPort });
    // After the API listens: a port already taken stops the start-up before any tunnel socket
    // is bound, and the tcp tunnels ride the API's connections (HTTP Upgrade).
    data = await buildDataPlane(
      config,
      store,
      identity,
      createPrivateKey(identityPem),
      scheme,
      logger,
      observed,
    );
    if (data) {
      const parts = data;
      started.add('tunnels', () => parts.close());
      registerDataPlaneMetricsOf(metrics.registry, parts);
    }
    engine.start();
    if (data) {
      const parts = data;
      // Registered first: a start that fails half way still removes what it put in the kernel.
      started.add('data plane', () => parts.stop());
      await parts.start();
    }
    licenseWatch.start();
    // Last: deliveries start once every part that records events runs, and stop first (their
    // attempts under way are aborted and sent again after a restart).
    started.add('webhooks', () => dispatcher.stop());
    dispatcher.start();
    starting = false;
    const address = app.server.address();
    const port = typeof address === 'object' && address ? address.port : config.listenPort;
    const host = config.listenHost.includes(':') ? `[${config.listenHost}]` : config.listenHost;
    const url = `${config.tls ? 'https' : 'http'}://${host}:${port}`;
    logger.info(
      { url, peer_id: identity.peerId, data_dir: dataDir, version: AGENT_VERSION },
      'agent listening',
    );
    if (config.licenseKeys.length === 0) {
      logger.warn(
        'no license signing key is trusted: bootstrap will be refused (use --license-public-key or --dev)',
      );
    }
    return {
      app,
      store,
      events,
      identity,
      logger,
      url,
      async stop() {
        if (stopping) return;
        stopping = true;
        await started.stopAll();
        logger.info('agent stopped');
      },
    };
  } catch (err) {
    stopping = true;
    await started.stopAll().catch(() => {});
    throw err;
  }
}

/**
 * The parts that have started, in order. Stopping runs them backwards, newest first, both for
 * `stop()` and for a start-up that fails half way, so that nothing opened is left behind.
 */
class StartedParts {
  private readonly parts: { name: string; stop: () => unknown }[] = [];
  constructor(private readonly logger: Logger) {}

  add(name: string, stop: () => unknown): void {
    this.parts.push({ name, stop });
  }

  /** Stops every part; one that fails is logged and the rest still stop. Throws the first failure. */
  async stopAll(): Promise<void> {
    let failure: { err: unknown } | undefined;
    for (let part = this.parts.pop(); part; part = this.parts.pop()) {
      try {
        await part.stop();
      } catch (err) {
        this.logger.error({ err, part: part.name }, 'a part failed to stop');
        failure ??= { err };
      }
    }
    if (failure) throw failure.err;
  }
}

function registerDataPlaneMetricsOf(registry: ApiMetrics['registry'], data: DataPlaneParts): void {
  const dataplane = data.dataplane;
  if (!dataplane) return;
  registerDataPlaneMetrics(registry, dataplane);
  if (data.kcp) {
    registerKcpMetrics(registry, data.kcp, () =>
      dataplane
        .tunnelStates()
        .filter((t) => t.transport === 'kcp')
        .map((t) => t.peerId),
    );
  }
}

/** The `aud` of this agent's tokens: bound to its peer id, so no other agent accepts them. */
export const audienceFor = (peerId: string): string => `urn:mesh-agent:peer:${peerId}`;

/** The store as the data plane (and explain) sees it: services, their routes, the peers. */
function dataPlaneView(store: Store, identity: Identity): DataPlaneView {
  const state = store.agentState();
  const peers = store.peers();
  const active = new Set(peers.filter((p) => p.isActive).map((p) => p.id));
  const services = store.services();
  return {
    localPeerId: state?.localPeerId ?? identity.peerId,
    peers: peers.map((p) => ({ id: p.id, address: p.address })),
    services: services.map((s) => ({
      id: s.id,
      sourcePeerId: s.sourcePeerId,
      targetPeerId: s.targetPeerId,
      isActive: isServiceActive(s, active),
      requiresInterface: s.requiresInterface,
      desiredIpv4Cidr: s.desiredIpv4Cidr,
      desiredIpv6Cidr: s.desiredIpv6Cidr,
      bandwidthLimitMbps: s.bandwidthLimitMbps,
      healthCheck: s.healthCheck && healthProbe(s.healthCheck),
      fullyTransparent: s.fullyTransparent,
      transportType: s.transportType,
    })),
    routes: services.flatMap((s) => store.routesOf(s.id)),
  };
}

/** The data plane's parts, or why it cannot run (`--dataplane on` on a host that lacks something). */
interface DataPlaneParts {
  dataplane: DataPlane | null;
  transport: TcpTransport | null;
  /** Absent when its UDP socket could not be bound (kcp services then show why). */
  kcp?: KcpTransport;
  missing: string[];
  /** Applies the services to the kernel and opens their tunnels. */
  start(): Promise<void>;
  /** Removes what start() put in the kernel and releases the tunnels, while the store still answers. */
  stop(): Promise<void>;
  /** Closes both transports: every tunnel and the kcp UDP socket. */
  close(): Promise<void>;
}

/**
 * Builds the data plane when `--dataplane` asks for it and the host allows it. It is fed from
 * the store: every write (local or replicated) gives it a new view, and peer changes re-check
 * the open tunnels against the active peers.
 */
async function buildDataPlane(
  config: AgentConfig,
  store: Store,
  identity: Identity,
  identityKey: KeyObject,
  scheme: 'http' | 'https',
  logger: Logger,
  observed: RecordObserved,
): Promise<DataPlaneParts | null> {
  const mode = config.dataplane ?? 'off';
  if (mode === 'off') return null;
  const missing = await missingRequirements();
  if (missing.length > 0) {
    if (mode === 'on') {
      logger.error({ reasons: missing }, 'the data plane cannot run (--dataplane on); /readyz lists why');
      const nothing = async () => {};
      return { dataplane: null, transport: null, missing, start: nothing, stop: nothing, close: nothing };
    }
    logger.info({ reasons: missing }, 'data plane off (--dataplane auto)');
    return null;
  }
  const log = logger.child({ component: 'dataplane' });
  const directory: PeerDirectory = {
    peerByKey(raw) {
      const key = raw.toString('base64');
      const p = store.peers().find((x) => x.isActive && x.publicKey === key);
      return p && { id: p.id };
    },
    peer(peerId) {
      const p = store.peer(peerId);
      return p?.isActive ? { publicKey: Buffer.from(p.publicKey, 'base64'), address: p.address } : undefined;
    },
  };
  // Short enough that traffic resumes within seconds of a peer coming back.
  const backoff = { minMs: 250, maxMs: 3000 };
  const failover = config.failover ?? DEFAULT_FAILOVER;
  const transport = new TcpTransport({
    localPeerId: identity.peerId,
    identityKey,
    scheme,
    logger: log,
    backoff,
    directory,
    keepaliveIntervalMs: failover.intervalMs,
    // A socket closed already has nothing to bound. Called from the links' timers, so a failure
    // is logged, not thrown: the tunnel works on, only with the kernel's own queue.
    boundUnsent: (socket, bytes) => {
      if (socket.destroyed) return;
      try {
        setNotSentLowat(socket, bytes);
      } catch (err) {
        log.warn({ err, bytes }, "cannot bound a tunnel socket's unsent bytes");
      }
    },
  });
  const apiPort = Number(config.advertise.slice(config.advertise.lastIndexOf(':') + 1));
  // The kcp transport's UDP socket takes the API's port number (peers know only that address).
  let kcp: KcpTransport | undefined;
  try {
    kcp = await KcpTransport.start({
      localPeerId: identity.peerId,
      identityKey,
      directory,
      bind: { address: config.listenHost, port: config.listenPort || apiPort },
      backoff,
      // UDP hears nothing when a peer dies (no FIN, no RST as a TCP tunnel gets): keepalives at
      // the health interval and 10 s of silence tell it, so its streams' clients get an error
      // well within 15 s (failover sees the silence sooner: health.ts).
      keepaliveIntervalMs: failover.intervalMs,
      deadAfterMs: 10_000,
      ...(config.kcp ? { kcp: config.kcp } : {}),
      logger: log,
    });
  } catch (err) {
    // tcp services still cross; kcp ones show why not (plan.ts: transport not available).
    log.error({ err }, 'kcp transport: cannot bind its UDP socket; kcp services cannot be carried');
  }
  let dataplane: DataPlane;
  try {
    dataplane = new DataPlane({
      kernel: new LinuxKernel({ openTun: (name) => openTun(name) }),
      transports: kcp ? { tcp: transport, kcp } : { tcp: transport },
      logger: log,
      apiPort: config.listenPort || apiPort,
      macvlanParent: config.macvlanParent ?? null,
      failover,
      observed,
      // TCP crosses as streams (TPROXY at the ingress, re-originated at the exit).
      sockets: { openTransparentListener, connectNetSocket, setReceiveBuffer },
    });
  } catch (err) {
    // Not yet the caller's to close: the sockets are.
    await transport.close();
    await kcp?.close();
    throw err;
  }
  const view = () => dataPlaneView(store, identity);
  let started = false;
  store.onWrite(() => {
    if (!started) return;
    transport.revalidate();
    kcp?.revalidate();
    dataplane.update(view());
  });
  return {
    dataplane,
    transport,
    ...(kcp ? { kcp } : {}),
    missing: [],
    async start() {
      started = true;
      await dataplane.start(view());
    },
    async stop() {
      started = false;
      await dataplane.stop();
    },
    async close() {
      await transport.close();
      await kcp?.close();
    },
  };
}
