/**
 * One simulated agent: the real cluster layer (store on an in-memory SQLite database, replica,
 * hybrid clock, allocator, cluster credential, peers, service config, gossip engine with its
 * failure detector) wired as src/agent.ts wires it, but on virtual time, a seeded random source
 * and the in-memory network. A crash drops every part but the store; a restart builds them anew.
 */
import type { KeyObject } from 'node:crypto';
import pino from 'pino';
import { Registry } from 'prom-client';
import { SecretHasher } from '../../src/auth/secret-hash.js';
import { type Admission, Allocator } from '../../src/cluster/allocator.js';
import { bootstrapAgent } from '../../src/cluster/bootstrap.js';
import { ClusterCredential } from '../../src/cluster/cluster-credential.js';
import { DEFAULT_GOSSIP_CONFIG, Gossip } from '../../src/cluster/gossip.js';
import type { Envelope } from '../../src/cluster/gossip-envelope.js';
import { GossipMetrics } from '../../src/cluster/gossip-metrics.js';
import type { ConfirmRequest, HelloRequest } from '../../src/cluster/handshake-protocol.js';
import { HybridClock } from '../../src/cluster/hlc.js';
import { Identity } from '../../src/cluster/identity.js';
import type { PeerCaller, PeerResponse } from '../../src/cluster/peer-client.js';
import { Peers } from '../../src/cluster/peers.js';
import { Replica } from '../../src/cluster/replica.js';
import { ServiceConfig } from '../../src/cluster/service-config.js';
import type { Clock } from '../../src/domain/clock.js';
import { ApiError } from '../../src/domain/errors.js';
import type { License } from '../../src/domain/license.js';
import { EventLog } from '../../src/events/event-log.js';
import { Store } from '../../src/store/store.js';
import type { NetNode, SimNetwork } from './network.js';
import type { Prng } from './prng.js';
import { seededEd25519Pem } from './seeded-crypto.js';
import type { VirtualTime } from './virtual-time.js';

const silent = pino({ level: 'silent' });

/**
 * Parts the simulator may swap for broken ones, to show that an invariant catches the break.
 * Each builder gets what the real constructor gets.
 */
export interface PartFactories {
  replica?: (
    store: Store,
    peerId: string,
    hlc: HybridClock,
    clock: Clock,
    horizonMs: number,
    events: EventLog,
  ) => Replica;
  credential?: (store: Store, clock: Clock, replica: Replica) => ClusterCredential;
  /** What service creation asks for admission (the allocator, normally). */
  serviceAdmission?: (allocator: Allocator) => Admission;
}

export interface AgentEnv {
  time: VirtualTime;
  net: SimNetwork;
  licenseKeys: readonly KeyObject[];
  intervalMs: number;
  tombstoneHorizonMs: number;
  factories: PartFactories;
  /** Other agents by address, for the handshake's calls. */
  agentAt(address: string): SimAgent | undefined;
}

export class SimAgent implements NetNode {
  readonly store = new Store(':memory:');
  readonly identity: Identity;
  readonly address: string;
  /** This agent's clock: virtual time plus its skew. */
  readonly clock: Clock;
  skewMs = 0;
  up = false;
  life = 0;
  replica!: Replica;
  allocator!: Allocator;
  credential!: ClusterCredential;
  gossip!: Gossip;
  peers!: Peers;
  services!: ServiceConfig;
  events!: EventLog;

  constructor(
    readonly index: number,
    private readonly env: AgentEnv,
    private readonly random: Prng,
  ) {
    this.identity = new Identity(seededEd25519Pem(random));
    this.address = `agent-${index}.sim:7443`;
    this.clock = { now: () => env.time.now() + this.skewMs };
    env.net.attach(this.address, this);
  }

  get id(): string {
    return this.identity.peerId;
  }

  /**
   * Builds the cluster layer on the kept store and starts gossip (or leaves that to the caller:
   * the bench forms a large cluster with only the first agent's rounds running, which is
   * O(N) messages per join instead of a cascade through every member).
   */
  start(startGossip = true): void {
    const { env, store, identity, clock } = this;
    const f = env.factories;
    this.events = new EventLog(store, identity.peerId, clock);
    const hlc = new HybridClock(identity.peerId, clock);
    this.replica = f.replica
      ? f.replica(store, identity.peerId, hlc, clock, env.tombstoneHorizonMs, this.events)
      : new Replica(store, identity.peerId, hlc, clock, env.tombstoneHorizonMs, this.events);
    this.replica.init();
    this.allocator = new Allocator(store, identity.peerId, clock);
    this.credential = f.credential
      ? f.credential(store, clock, this.replica)
      : new ClusterCredential(store, clock, this.replica);
    const gossip = new Gossip({
      store,
      identity,
      replica: this.replica,
      credential: this.credential,
      allocator: this.allocator,
      transport: env.net.transport(this),
      clock,
      timers: env.time,
      random: () => this.random.next(),
      logger: silent,
      metrics: new GossipMetrics(new Registry()),
      config: { ...DEFAULT_GOSSIP_CONFIG, intervalMs: env.intervalMs },
    });
    this.gossip = gossip;
    this.peers = new Peers(
      store,
      identity,
      this.caller(),
      clock,
      env.licenseKeys,
      this.replica,
      this.allocator,
      (peerId) => gossip.joined(peerId),
      (peer, tombstone) => gossip.removed(peer, tombstone),
    );
    this.services = new ServiceConfig(
      store,
      clock,
      this.replica,
      f.serviceAdmission ? f.serviceAdmission(this.allocator) : this.allocator,
    );
    this.up = true;
    if (startGossip) gossip.start();
  }

  bootstrap(license: License): void {
    bootstrapAgent(
      {
        store: this.store,
        identity: this.identity,
        hasher: new SecretHasher(this.random.bytes(32)),
        trustedLicenseKeys: this.env.licenseKeys,
        clock: this.clock,
        advertiseAddress: this.address,
        replica: this.replica,
        events: this.events,
      },
      { license, name: `agent-${this.index}` },
    );
  }

  /** kill -9: the parts go, with everything in flight; the store stays. */
  crash(): void {
    this.up = false;
    this.life++;
    void this.gossip.stop();
  }

  restart(): void {
    this.start();
  }

  handle(envelope: Envelope): Promise<{ status: number; body: unknown }> {
    return this.gossip.handle(envelope);
  }

  /** The handshake's HTTP calls, answered in process by the addressed agent's routes' code. */
  private caller(): PeerCaller {
    return {
      call: async (address, method, path, body): Promise<PeerResponse> => {
        const to = this.env.agentAt(address);
        if (!to?.up || !this.env.net.reachable(this.index, to.index)) throw new Error('unreachable');
        try {
          if (method === 'GET' && path === '/v1/cluster/identity') {
            const state = to.store.agentState();
            return {
              status: 200,
              body: {
                peer_id: to.identity.peerId,
                public_key: to.identity.publicKeyBase64,
                license_id: state?.license.license_id ?? null,
                cluster_id: state?.clusterId ?? null,
                version: 'sim',
              },
            };
          }
          if (path === '/internal/v1/handshake/hello') {
            return { status: 200, body: to.peers.hello(body as HelloRequest) };
          }
          if (path === '/internal/v1/handshake/confirm') {
            return { status: 200, body: await to.peers.confirm(body as ConfirmRequest) };
          }
          return { status: 404, body: { error: 'not found', code: 'NOT_FOUND' } };
        } catch (err) {
          if (err instanceof ApiError)
            return { status: err.status, body: { error: err.message, code: err.code } };
          throw err;
        }
      },
    };
  }
}
