/**
 * The cluster simulator: N real agents (agent.ts) in one process on virtual time and the
 * in-memory network, a seeded workload and seeded faults, and the invariants of docs/gossip.md
 * ("The simulator") checked every simulated second and at quiescence. One seed, one run: the
 * same seed gives the same trace, hashed in `traceHash`.
 *
 * A run: form the cluster by real handshakes; then for 60 % of the duration writes on random
 * agents with faults changing every few seconds (loss up to 30 %, delay and reordering,
 * duplicates, partitions and their healing, crashes and restarts with the store kept, clock
 * skew, a peer removed while perhaps partitioned away, an agent leaving); then the faults end and the cluster
 * must converge within `convergeBoundMs`.
 */
import { createHash, createPublicKey } from 'node:crypto';
import { CLUSTER_SECRET_GRACE_MS, type MacKey } from '../../src/cluster/cluster-credential.js';
import { seal } from '../../src/cluster/gossip-envelope.js';
import { DEFAULT_TOMBSTONE_HORIZON_MS } from '../../src/cluster/replica.js';
import { keyOf } from '../../src/cluster/replicated-records.js';
import type { EventActor } from '../../src/events/event-log.js';
import { loadLicenseSigningKey, signLicense } from '../../src/license/sign.js';
import { type PartFactories, SimAgent } from './agent.js';
import { SimNetwork } from './network.js';
import { Prng } from './prng.js';
import { seededEd25519Pem, withSeededCrypto } from './seeded-crypto.js';
import { VirtualTime } from './virtual-time.js';

export const INVARIANTS = [
  'converges',
  'no-lost-write',
  'deleted-stays-deleted',
  'versions-only-grow',
  'limits-hold',
  'membership-agrees',
  'credential-grace',
] as const;
export type InvariantName = (typeof INVARIANTS)[number];

export interface Violation {
  invariant: InvariantName;
  atMs: number;
  detail: string;
}

export interface SimOptions {
  seed: number;
  agents: number;
  seconds: number;
  /** Gossip interval; default 1000 ms (the product's default). */
  intervalMs?: number;
  /** Faults on (default) or a calm network. */
  faults?: boolean;
  /** Writes per simulated second across the cluster during the fault phase; default 2. */
  writesPerSecond?: number;
  maxServices?: number;
  /** After the faults end, how long convergence may take; default 30 s. */
  convergeBoundMs?: number;
  /** Broken parts to inject (the invariant tests). */
  factories?: PartFactories;
  /** Called once the cluster is formed, before the workload and faults begin. */
  onFormed?: () => void;
  /** Stop at the first violation (default) or collect all. */
  stopAtFirst?: boolean;
}

export interface SimResult {
  seed: number;
  violations: Violation[];
  traceHash: string;
  /** Simulated ms from the end of faults to convergence, or -1. */
  convergedAfterMs: number;
  writesAcked: number;
  writesRefused: number;
  /** Refused writes by error code (SERVICE_LIMIT_EXCEEDED, NODE_LIMIT_EXCEEDED, ...). */
  refusals: Record<string, number>;
  /** Peers removed by another agent, and agents that left, in this run. */
  departures: { removed: number; left: number };
  events: number;
  messages: number;
  replay: string;
}

interface Ack {
  key: string;
  vkey: string;
  deleted: boolean;
  at: number;
  /** For a service: its peers; their removal deletes it without a tombstone of its own. */
  peers?: [string, string];
  /** The agent that acknowledged it. */
  by: number;
  /**
   * Set when its agent was removed before any other agent held the write: the cluster refuses
   * a removed agent's messages, so what it alone held goes with it (seed 1141: a rename made
   * in a partition, its agent removed from the other side six seconds later).
   */
  lostWithRemoval?: boolean;
}

const ACTOR: EventActor = { client_id: null, agent: 'sim' };

/** Whether `agent` holds the acknowledged write, or a later one that superseded it. */
function holdsAck(agent: SimAgent, ack: Ack): boolean {
  const held = agent.replica.vkeyOf(ack.key);
  return held !== undefined && held >= ack.vkey;
}
const START = Date.UTC(2026, 0, 1);

export function replayCommand(o: SimOptions): string {
  return `node dist/test/sim/replay.js --seed ${o.seed} --agents ${o.agents} --seconds ${o.seconds}${o.faults === false ? ' --calm' : ''}`;
}

export async function simulate(o: SimOptions): Promise<SimResult> {
  const root = new Prng(o.seed);
  return withSeededCrypto(root.fork(), () => new Simulation(o, root).run());
}

class Simulation {
  private readonly time = new VirtualTime(START);
  private readonly hash = createHash('sha256');
  private readonly net: SimNetwork;
  private readonly agents: SimAgent[] = [];
  private readonly violations: Violation[] = [];
  private readonly acks: Ack[] = [];
  private readonly deletions = new Map<string, string>();
  private readonly seenVkeys: Map<string, string>[] = [];
  /** Agents removed by another or that left: out of the cluster, no longer checked. */
  private readonly removed = new Set<number>();
  private removals = 0;
  private leaves = 0;
  /** Agents in the cluster: all but the spare one, until it joins. */
  private readonly members = new Set<number>([0]);
  private refused = 0;
  private readonly refusals: Record<string, number> = {};
  /**
   * Each rotation's previous key, by the vkey of the credential record it wrote: of rotations
   * made at once on both sides of a partition only one record wins the merge, and only its
   * previous key is graced everywhere (a losing one's stays usable on the agents that held it).
   */
  private readonly rotations = new Map<string, { previous: MacKey; at: number }>();
  private readonly maxServices: number;
  private readonly maxNodes: number;
  private readonly w: Prng;
  private readonly f: Prng;

  constructor(
    private readonly o: SimOptions,
    private readonly root: Prng,
  ) {
    this.net = new SimNetwork(this.time, root.fork(), (line) => this.trace(line));
    this.w = root.fork();
    this.f = root.fork();
    this.maxServices = o.maxServices ?? Math.max(3, Math.floor(o.agents / 4));
    this.maxNodes = o.agents;
  }

  private trace(line: string): void {
    this.hash.update(`${this.time.now() - START} ${line}\n`);
    // SIM_TRACE=1: the trace itself on stderr, to follow a failing seed.
    if (process.env.SIM_TRACE) process.stderr.write(`${this.time.now() - START} ${line}\n`);
  }

  private violate(invariant: InvariantName, detail: string): void {
    this.violations.push({ invariant, atMs: this.time.now() - START, detail });
    this.trace(`VIOLATION ${invariant} ${detail}`);
  }

  private get stop(): boolean {
    return this.violations.length > 0 && this.o.stopAtFirst !== false;
  }

  async run(): Promise<SimResult> {
    const { o } = this;
    const vendor = this.root.fork();
    const vendorPem = seededEd25519Pem(vendor);
    const licenseKey = loadLicenseSigningKey(vendorPem);
    const license = signLicense(
      {
        customer_id: 'sim',
        license_id: 'license-sim',
        issued_at: new Date(START - 86_400_000).toISOString(),
        expires_at: new Date(START + 365 * 86_400_000).toISOString(),
        max_nodes: this.maxNodes,
        max_services: this.maxServices,
      },
      licenseKey,
    );
    const env = {
      time: this.time,
      net: this.net,
      licenseKeys: [createPublicKey(licenseKey)],
      intervalMs: o.intervalMs ?? 1000,
      tombstoneHorizonMs: DEFAULT_TOMBSTONE_HORIZON_MS,
      factories: o.factories ?? {},
      agentAt: (address: string) => this.agents.find((a) => a.address === address),
    };
    // One more agent than max_nodes allows: it asks to join during the run, and may only get in
    // once a removal has freed a slot.
    for (let i = 0; i <= o.agents; i++) {
      const a = new SimAgent(i, env, this.root.fork());
      a.start();
      a.bootstrap(license);
      this.agents.push(a);
      this.seenVkeys.push(new Map());
    }
    // Formation: the first agent adds each other one by the real handshake.
    const first = this.agents[0]!;
    for (const a of this.agents.slice(1, o.agents)) {
      await this.drive(first.peers.add(a.address, ACTOR));
      this.members.add(a.index);
    }
    await this.time.runUntil(this.time.now() + 5000);
    o.onFormed?.();
    const t0 = this.time.now();
    const faultEnd = t0 + Math.floor(o.seconds * 600);
    const end = t0 + o.seconds * 1000;
    this.trace(`formed ${this.agents.map((a) => a.replica.digest().root).join(',')}`);

    const rate = o.writesPerSecond ?? 2;
    for (let t = t0; t < faultEnd && !this.stop; t += 1000) {
      if (o.faults !== false && this.f.chance(0.3)) this.changeFaults();
      for (let k = 0; k < rate; k++) this.time.at(this.w.int(1000), () => this.write());
      await this.time.runUntil(t + 1000);
      this.checkStep();
    }
    this.endFaults();
    let converged = -1;
    for (let t = this.time.now(); t < end && !this.stop; t += 1000) {
      await this.time.runUntil(t + 1000);
      this.checkStep();
      if (converged < 0 && this.converged()) converged = this.time.now() - faultEnd;
    }
    const bound = o.convergeBoundMs ?? 30_000;
    if (!this.stop && (converged < 0 || converged > bound)) {
      this.violate('converges', `not one state within ${bound} ms of the faults' end (${this.rootsText()})`);
    }
    if (!this.stop) this.checkQuiescent();
    if (!this.stop) await this.checkGrace();
    for (const a of this.agents) if (a.up) a.crash();
    for (const a of this.agents) a.store.close();
    return {
      seed: o.seed,
      violations: this.violations,
      traceHash: this.hash.digest('hex'),
      convergedAfterMs: converged,
      writesAcked: this.acks.length,
      writesRefused: this.refused,
      refusals: this.refusals,
      departures: { removed: this.removals, left: this.leaves },
      events: this.time.events,
      messages: this.net.messages,
      replay: replayCommand(o),
    };
  }

  private async drive<T>(p: Promise<T>): Promise<T> {
    let done = false;
    const settled = p.finally(() => {
      done = true;
    });
    settled.catch(() => undefined);
    while (!done) await this.time.runUntil(this.time.now() + 50);
    return p;
  }

  private live(): SimAgent[] {
    return this.agents.filter((a) => a.up && this.members.has(a.index) && !this.removed.has(a.index));
  }

  // --- workload -----------------------------------------------------------------------------

  private write(): void {
    const live = this.live();
    if (live.length === 0) return;
    const a = this.w.pick(live);
    const roll = this.w.int(100);
    const services = a.store.services();
    const others = a.store.peers().filter((p) => p.isActive && p.id !== a.id);
    const op = (name: string, key: () => string, run: () => unknown, peers?: [string, string]) => {
      const refuse = (err: unknown) => {
        const code = (err as { code?: string }).code ?? 'error';
        this.refused++;
        this.refusals[code] = (this.refusals[code] ?? 0) + 1;
        this.trace(`refused ${a.index} ${name} ${code}`);
      };
      try {
        const done = (result: unknown) => {
          void result;
          if (!a.up) return;
          // Acknowledged by an agent that left or was removed while the write was in flight
          // (a create waits for the allocator): it holds that write alone, and its word no
          // longer counts in the cluster (seed 1045: a service created on an agent just after
          // it left). Whether the agent should refuse such a write instead is open.
          if (this.removed.has(a.index)) {
            this.trace(`ack-after-departure ${a.index} ${name}`);
            return;
          }
          const k = key();
          const vkey = a.replica.vkeyOf(k);
          const held = a.replica.held(k);
          this.trace(`ack ${a.index} ${name} ${k} ${vkey}`);
          if (!vkey) return;
          const deleted = held?.body === null;
          this.acks.push({
            key: k,
            vkey,
            deleted,
            at: this.time.now(),
            by: a.index,
            ...(peers ? { peers } : {}),
          });
          if (deleted) this.deletions.set(k, vkey);
        };
        const r = run();
        if (r instanceof Promise) {
          r.then(done, refuse);
        } else done(r);
      } catch (err) {
        refuse(err);
      }
    };
    if (roll < 15 && others.length > 0) {
      const p = this.w.pick([...others, a.store.peer(a.id)!]);
      op(
        'rename',
        () => keyOf('peer', p.id),
        () => a.peers.rename(p.id, `n${this.w.int(1e6)}`, ACTOR),
      );
    } else if (roll < 45 && others.length > 0) {
      const target = this.w.pick(others);
      let id = '';
      op(
        'create',
        () => keyOf('service', id),
        () =>
          a.services.create({ target_peer_id: target.id }, ACTOR).then((s) => {
            id = s.id;
          }),
        [a.id, target.id],
      );
    } else if (roll < 60 && services.length > 0) {
      const s = this.w.pick(services);
      const bw = 1 + this.w.int(1000);
      op(
        'update',
        () => keyOf('service', s.id),
        () => a.services.update(s.id, { bandwidth_limit_mbps: bw }, ACTOR),
        [s.sourcePeerId, s.targetPeerId],
      );
    } else if (roll < 75 && services.length > 0) {
      const s = this.w.pick(services);
      op(
        'delete',
        () => keyOf('service', s.id),
        () => a.services.delete(s.id, ACTOR),
        [s.sourcePeerId, s.targetPeerId],
      );
    } else if (roll < 85 && services.length > 0) {
      const s = this.w.pick(services);
      const routes = a.services.routes(s.id);
      if (routes.length > 0 && this.w.chance(0.4)) {
        const r = this.w.pick(routes);
        op(
          'route-delete',
          () => keyOf('route', r.id),
          () => a.services.deleteRoute(s.id, r.id, ACTOR),
          [s.sourcePeerId, s.targetPeerId],
        );
      } else {
        let rid = 0;
        op(
          'route-add',
          () => keyOf('route', rid),
          () => {
            rid = a.services.addRoutes(
              s.id,
              [{ priority: 1 + this.w.int(1000), dest_cidr: `10.${this.w.int(256)}.0.0/16` }],
              ACTOR,
            )[0]!;
          },
          [s.sourcePeerId, s.targetPeerId],
        );
      }
    } else if (roll < 90) {
      const previous = a.credential.macKeys()[0]!;
      op(
        'rotate',
        () => 'credential',
        () => {
          a.credential.rotate(a.id, ACTOR);
          const vkey = a.replica.vkeyOf('credential');
          if (vkey) this.rotations.set(vkey, { previous, at: this.time.now() });
        },
      );
    } else if (roll < 94 && !this.members.has(this.o.agents)) {
      // The spare agent asks to join: beyond max_nodes unless a removal freed a slot.
      const spare = this.agents[this.o.agents]!;
      if (!spare.up) return;
      op(
        'join',
        () => keyOf('peer', spare.id),
        () =>
          a.peers.add(spare.address, ACTOR).then(() => {
            this.members.add(spare.index);
          }),
      );
    } else if (
      roll >= 96 &&
      roll < 98 &&
      this.leaves === 0 &&
      a.index !== 0 &&
      others.length > 2 &&
      this.o.faults !== false
    ) {
      // An agent leaves (DELETE /v1/peers/self): its last word is a push to every peer.
      this.leaves++;
      op(
        'leave',
        () => keyOf('peer', a.id),
        () => {
          a.peers.leave(ACTOR);
          this.removed.add(a.index);
        },
      );
    } else if (roll < 96 && this.removals === 0 && others.length > 2 && this.o.faults !== false) {
      // A peer removed, perhaps while partitioned away or down: never the first (the allocator).
      const victim = this.agents.find((x) => x.id === this.w.pick(others).id);
      if (!victim || victim.index === 0) return;
      op(
        'remove',
        () => keyOf('peer', victim.id),
        () => {
          a.peers.remove(victim.id, ACTOR);
          this.removed.add(victim.index);
          this.removals++;
          for (const ack of this.acks) {
            if (ack.by !== victim.index) continue;
            const escaped = this.agents.some(
              (x) => x !== victim && !this.removed.has(x.index) && holdsAck(x, ack),
            );
            if (!escaped) {
              ack.lostWithRemoval = true;
              this.trace(`lost-with-removal ${victim.index} ${ack.key} ${ack.vkey}`);
            }
          }
        },
      );
    }
  }

  // --- faults -------------------------------------------------------------------------------

  private changeFaults(): void {
    const f = this.f;
    const kind = f.int(6);
    const n = this.agents.length;
    if (kind === 0) {
      this.net.faults.loss = f.next() * 0.3;
      this.trace(`fault loss ${this.net.faults.loss.toFixed(3)}`);
    } else if (kind === 1) {
      this.net.faults.delayMs = 1 + f.int(100);
      this.net.faults.jitterMs = f.int(300);
      this.net.faults.duplicate = f.next() * 0.1;
      this.trace(`fault delay ${this.net.faults.delayMs}+${this.net.faults.jitterMs} dup`);
    } else if (kind === 2) {
      const groups: number[][] = [[], []];
      for (let i = 0; i < n; i++) groups[f.chance(0.3) ? 1 : 0]!.push(i);
      this.net.partition(groups);
      this.trace(`fault partition ${groups[1]!.join('.')}`);
    } else if (kind === 3) {
      this.net.heal();
      this.trace('fault heal');
    } else if (kind === 4) {
      const a = f.pick(this.agents);
      if (a.up && this.agents.filter((x) => !x.up).length < Math.max(1, n / 5)) {
        a.crash();
        this.trace(`fault crash ${a.index}`);
      } else if (!a.up) {
        a.restart();
        this.trace(`fault restart ${a.index}`);
      }
    } else {
      const a = f.pick(this.agents);
      a.skewMs = f.int(3001) - 1500;
      this.trace(`fault skew ${a.index} ${a.skewMs}`);
    }
  }

  private endFaults(): void {
    this.net.heal();
    this.net.faults = { loss: 0, delayMs: 5, jitterMs: 5, duplicate: 0 };
    for (const a of this.agents) if (!a.up) a.restart();
    this.trace('faults end');
  }

  // --- invariants ---------------------------------------------------------------------------

  private rootsText(): string {
    return this.live()
      .map((a) => `${a.index}:${a.replica.digest().root.slice(0, 8)}`)
      .join(' ');
  }

  private converged(): boolean {
    const live = this.live();
    const roots = new Set(live.map((a) => a.replica.digest().root));
    return roots.size === 1;
  }

  /** Every simulated second: versions only grow, deleted records never come back. */
  private checkStep(): void {
    const roots: string[] = [];
    for (const a of this.agents) {
      if (!a.up) continue;
      const { entries, root } = a.replica.digest();
      roots.push(root.slice(0, 12));
      const seen = this.seenVkeys[a.index]!;
      // Deletions first, against what this agent held before this step.
      for (const [key, tvkey] of this.deletions) {
        // A removed agent keeps its own row beside its removal's tombstone (docs/gossip.md).
        if (key === keyOf('peer', a.id)) continue;
        const held = a.replica.held(key);
        if (held && held.body !== null && held.vkey < tvkey && (seen.get(key) ?? '') >= tvkey) {
          this.violate(
            'deleted-stays-deleted',
            `agent ${a.index} holds ${key} live again after its deletion`,
          );
        }
      }
      for (const [key, vkey] of entries) {
        const before = seen.get(key);
        if (before !== undefined && vkey < before) {
          this.violate('versions-only-grow', `agent ${a.index} holds ${key} at ${vkey}, after ${before}`);
        }
        if (before === undefined || vkey > before) seen.set(key, vkey);
      }
    }
    this.trace(`roots ${roots.join(',')}`);
  }

  private checkQuiescent(): void {
    const live = this.live();
    for (const a of live) {
      for (const ack of this.acks) {
        if (holdsAck(a, ack) || ack.lostWithRemoval) continue;
        const held = a.replica.vkeyOf(ack.key);
        // A service (or route) goes with a removed peer, without a tombstone of its own.
        if (ack.peers?.some((p) => a.store.tombstone(keyOf('peer', p)))) continue;
        if (ack.key.startsWith('route/') && held === undefined) continue;
        this.violate(
          'no-lost-write',
          `agent ${a.index} holds ${ack.key} at ${held ?? 'nothing'}, acknowledged at ${ack.vkey}`,
        );
        break;
      }
      for (const [key, tvkey] of this.deletions) {
        const h = a.replica.held(key);
        if (h && h.body !== null && h.vkey < tvkey) {
          this.violate('deleted-stays-deleted', `agent ${a.index} holds ${key} live, deleted at ${tvkey}`);
          break;
        }
      }
      const active = a.store.peers().filter((p) => p.isActive).length;
      if (active > this.maxNodes) this.violate('limits-hold', `agent ${a.index}: ${active} active peers`);
      const services = a.store.serviceCount();
      if (services > this.maxServices) {
        this.violate(
          'limits-hold',
          `agent ${a.index}: ${services} services > max_services ${this.maxServices}`,
        );
      }
    }
    const members = (a: SimAgent) =>
      a.store
        .peers()
        .filter((p) => p.isActive)
        .map((p) => p.id)
        .sort()
        .join(',');
    const sets = new Set(live.map(members));
    if (sets.size > 1) {
      this.violate('membership-agrees', `${sets.size} different member lists`);
      return;
    }
    for (const a of live) {
      for (const b of live) {
        if (a !== b && !a.gossip.liveness(b.id).reachable) {
          this.violate('membership-agrees', `agent ${a.index} sees agent ${b.index} as unreachable`);
          return;
        }
      }
    }
  }

  /** The previous cluster key opens gossip during its grace and not after (every agent's view). */
  private async sendWith(from: SimAgent, to: SimAgent, key: MacKey): Promise<number> {
    const { envelope } = seal(
      from.identity,
      { type: 'ping', to: to.id, sent_at: to.clock.now(), body: {} },
      key,
    );
    return (await to.gossip.handle(envelope)).status;
  }

  private async checkGrace(): Promise<void> {
    const live = this.live();
    if (live.length < 2) return;
    const [a, b] = [live[0]!, live[1]!];
    // The rotation whose record the cluster converged on (seed 1045: concurrent rotations).
    const r = this.rotations.get(a.replica.vkeyOf('credential') ?? '');
    if (!r) return;
    const during = await this.sendWith(a, b, r.previous);
    const current = a.credential.macKeys()[0]!;
    const superseded = current.kid !== r.previous.kid;
    if (superseded && during !== 200) {
      this.violate('credential-grace', `the previous key was refused (${during}) inside its grace`);
    }
    for (const x of this.agents) x.skewMs += CLUSTER_SECRET_GRACE_MS + 60_000;
    const after = await this.sendWith(a, b, r.previous);
    const now = await this.sendWith(a, b, a.credential.macKeys()[0]!);
    if (superseded && after === 200)
      this.violate('credential-grace', 'the previous key still works after its grace');
    if (now !== 200) this.violate('credential-grace', `the current key was refused (${now})`);
  }
}
