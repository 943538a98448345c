/**
 * The composition root: builds every part of the agent from its configuration, starts them in
 * order and stops them in reverse. Only the CLI and tests import this file.
 *
 * Start order: data dir and keys first (everything signs or hashes with them), then the store
 * (it must be open before the API can answer), then the API. Stop order is the reverse, and the
 * API is closed first so that in-flight requests finish while the store is still open.
 */
import { createPrivateKey, type KeyObject, randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { FastifyInstance } from 'fastify';
import pino, { type Logger } from 'pino';
import { buildApp, type HealthReport } from './api/app.js';
import { ApiMetrics } from './api/metrics.js';
import { AccessTokens } from './auth/access-tokens.js';
import { Credentials } from './auth/credentials.js';
import { FailureThrottle } from './auth/failure-throttle.js';
import { SecretHasher } from './auth/secret-hash.js';
import { TokenEndpoint } from './auth/token-endpoint.js';
import { Allocator } from './cluster/allocator.js';
import { ClusterCredential } from './cluster/cluster-credential.js';
import { DEFAULT_GOSSIP_CONFIG, Gossip } from './cluster/gossip.js';
import { GossipMetrics } from './cluster/gossip-metrics.js';
import { HttpGossipTransport } from './cluster/gossip-transport.js';
import { HybridClock } from './cluster/hlc.js';
import { Identity } from './cluster/identity.js';
import { HttpPeerCaller } from './cluster/peer-client.js';
import { Peers } from './cluster/peers.js';
import { Replica } from './cluster/replica.js';
import { ServiceConfig } from './cluster/service-config.js';
import { type Clock, OffsetClock, systemClock } from './domain/clock.js';
import { generateLicenseKeyPair } from './license/sign.js';
import { loadOrCreateSecretFile, removeStaleTempFiles } from './store/key-files.js';
import { Store } from './store/store.js';

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
  /** `--test-hooks`: a movable clock and the gossip fault switch behind admin-only endpoints. */
  testHooks?: boolean;
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
  const testClock = config.testHooks ? new OffsetClock() : undefined;
  const clock = testClock ?? config.clock ?? systemClock;
  const logger = createLogger(config.logLevel, config.logDestination);
  const dataDir = resolve(config.dataDir);
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const stale = removeStaleTempFiles(dataDir);
  if (stale > 0) logger.warn({ removed: stale }, 'removed temp files left by an interrupted key write');

  const identity = new Identity(
    loadOrCreateSecretFile(join(dataDir, IDENTITY_KEY_FILE), Identity.generatePem),
  );
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
  let stopping = false;
  let gossip: Gossip | undefined;
  try {
    const replica = new Replica(
      store,
      identity.peerId,
      new HybridClock(identity.peerId, clock),
      clock,
      config.tombstoneHorizonMs,
    );
    replica.init();
    const allocator = new Allocator(store, identity.peerId, clock);
    const clusterCredential = new ClusterCredential(store, clock, replica);
    const metrics = new ApiMetrics();
    const scheme = config.tls ? 'https' : 'http';
    gossip = new Gossip({
      store,
      identity,
      replica,
      credential: clusterCredential,
      allocator,
      transport: new HttpGossipTransport(scheme),
      clock,
      logger: logger.child({ component: 'gossip' }),
      metrics: new GossipMetrics(metrics.registry),
      config: {
        ...DEFAULT_GOSSIP_CONFIG,
        intervalMs: config.gossipIntervalMs ?? DEFAULT_GOSSIP_CONFIG.intervalMs,
      },
    });
    const engine = gossip;
    const tokens = await AccessTokens.create(tokenKey, config.publicUrl, audienceFor(identity.peerId), clock);
    const health = (): HealthReport => {
      const liveReasons: string[] = [];
      try {
        store.db.prepare('SELECT 1').get();
      } catch {
        liveReasons.push('the database cannot be read');
      }
      const readyReasons = stopping ? ['the agent is shutting down'] : [];
      if (replica.removedFromCluster) readyReasons.push('another agent removed this one from the cluster');
      return { liveReasons, readyReasons };
    };
    const app = await buildApp({
      store,
      identity,
      tokens,
      tokenEndpoint: new TokenEndpoint(store, hasher, tokens, new FailureThrottle(clock), clock),
      credentials: new Credentials(store, hasher, clock),
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
      ),
      // The data plane joins this in a later issue.
      sync: () => engine.syncNow(),
      liveness: (peerId) => engine.liveness(peerId),
      gossip: (envelope) => engine.handle(envelope),
      testHooks: testClock && { clock: testClock, faults: engine.faults },
      bootstrap: {
        store,
        identity,
        hasher,
        trustedLicenseKeys: config.licenseKeys,
        clock,
        advertiseAddress: config.advertise,
        replica,
      },
      clock,
      publicUrl: config.publicUrl,
      version: AGENT_VERSION,
      health,
      logger,
      metrics,
      metricsPublic: config.metricsPublic ?? false,
      https: config.tls,
    });
    await app.listen({ host: config.listenHost, port: config.listenPort });
    engine.start();
    if (testClock) logger.warn('test hooks are on: the clock and gossip faults can be changed over the API');
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
      identity,
      logger,
      url,
      async stop() {
        if (stopping) return;
        stopping = true;
        await engine.stop();
        await app.close();
        store.close();
        logger.info('agent stopped');
      },
    };
  } catch (err) {
    await gossip?.stop();
    store.close();
    throw err;
  }
}

/** The `aud` of this agent's tokens: bound to its peer id, so no other agent accepts them. */
export const audienceFor = (peerId: string): string => `urn:mesh-agent:peer:${peerId}`;
