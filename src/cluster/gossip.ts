/**
 * The gossip engine: the I/O shell around the replica (what the state is), the failure detector
 * (who is reachable) and the envelope (who sent what). docs/gossip.md describes the protocol.
 *
 * Every interval it runs one SWIM probe (failure-detector.ts); the ping and its ack carry the
 * digest root of each side's replicated state, so two agents notice they differ at the cost of
 * 43 bytes, and the prober then runs anti-entropy with that peer (digest, records, missing
 * records). Idle traffic is therefore one probe per interval, whatever the number of records.
 * Every change of the local state (a local write or records merged from a peer) is pushed at once
 * to `fanout` random peers, which push on what was new to them (infection-style), so a change
 * reaches everyone in O(log n) rounds, and anti-entropy repairs whatever a lost push missed.
 */
import type { Logger } from 'pino';
import type { Clock, Timers } from '../domain/clock.js';
import { isoTime, systemTimers } from '../domain/clock.js';
import type { RecordObserved } from '../domain/observed-event.js';
import type { PeerRecord } from '../store/records.js';
import type { Store } from '../store/store.js';
import {
  type AdmissionAnswer,
  type AdmissionRequest,
  type Allocator,
  isAdmissionRequest,
} from './allocator.js';
import type { ClusterCredential, MacKey } from './cluster-credential.js';
import { DIGEST_BUCKETS, differingBuckets, scopeOf } from './digest-buckets.js';
import { FailureDetector, type LivenessRumor } from './failure-detector.js';
import {
  type Envelope,
  NO_KEY,
  open,
  type Payload,
  type RejectReason,
  ReplayGuard,
  seal,
} from './gossip-envelope.js';
import type { GossipMetrics } from './gossip-metrics.js';
import type { GossipTransport } from './gossip-transport.js';
import type { Identity } from './identity.js';
import type { Replica } from './replica.js';
import { keyOf, vkeyWall, type WireRecord } from './replicated-records.js';

export interface GossipConfig {
  /** Heartbeat (probe) interval; default 1000 ms. */
  intervalMs: number;
  /** Peers a change is pushed to at once, by its origin and by every agent it was new to. */
  fanout: number;
  /** How old (or how far ahead) a message may be; also how long nonces are remembered. */
  replayWindowMs: number;
}

export const DEFAULT_GOSSIP_CONFIG: GossipConfig = { intervalMs: 1000, fanout: 3, replayWindowMs: 60_000 };

/** Liveness rumors piggybacked per message, and how many times each is sent (memberlist: 4·log10(n+1)). */
const RUMORS_PER_MESSAGE = 8;
const RUMOR_RETRANSMIT_MULT = 4;
/** Records per push or anti-entropy answer are bounded by the license; this bounds a message. */
const MAX_RECORDS_PER_MESSAGE = 50_000;

export interface GossipDeps {
  store: Store;
  identity: Identity;
  replica: Replica;
  credential: ClusterCredential;
  allocator: Allocator;
  transport: GossipTransport;
  clock: Clock;
  /** The interval and the waits between retries; absent: real timers. */
  timers?: Timers;
  /** Picks push targets and the probe order; absent: Math.random. */
  random?: () => number;
  logger: Logger;
  metrics: GossipMetrics;
  config: GossipConfig;
  /**
   * `peer.reachable` / `peer.unreachable` as the failure detector sees them: reported when a
   * peer becomes dead or stops being dead (suspect is still reachable), and once when a peer
   * is first heard from after start; the event log keeps only real changes (events/runtime-events.ts).
   */
  observed?: RecordObserved;
  /**
   * Answers another agent's `explain` request (GET /v1/explain?peer=, src/api/explain-local.ts):
   * the body of the reply. Absent: such a request is refused as malformed, as by an older build.
   */
  explain?: (request: unknown) => Promise<unknown>;
}

/** A reply to the HTTP layer: status and body. 200 bodies are sealed envelopes. */
export interface HandledMessage {
  status: number;
  body: unknown;
}

/** How long a peer that does not know digest buckets gets whole digests before we ask again. */
const BUCKETLESS_RETRY_MS = 10 * 60_000;

class GossipRefused extends Error {
  constructor(readonly reason: string) {
    super(`refused: ${reason}`);
  }
}

/** The peer answered, but its reply did not open (e.g. `unknown_sender`: we removed its key). */
class InvalidReply extends Error {
  constructor(readonly reason: string) {
    super(`invalid reply: ${reason}`);
  }
}

export class Gossip {
  private readonly fd: FailureDetector;
  private readonly replay = new ReplayGuard();
  /** The replay memory is as old as this engine: older messages are refused (gossip-envelope.ts). */
  private readonly startedAt: number;
  private readonly rumors: { rumor: LivenessRumor; left: number }[] = [];
  /** The digest entries as of the last push: what changed since is what to push next. */
  private pushed: ReadonlyMap<string, string> = new Map<string, string>();
  private pushScheduled = false;
  /** Peers that refused a `buckets` message as malformed (an older build), and when. */
  private readonly bucketless = new Map<string, number>();
  /** The anti-entropy exchange running with each peer: one at a time, and callers can wait. */
  private readonly syncing = new Map<string, Promise<void>>();
  /** When each peer last showed a digest root equal to ours (tombstone collection). */
  private readonly matchedAt = new Map<string, number>();
  /** The key each peer last accepted from us: after a merge, not every peer has the newest. */
  private readonly keyFor = new Map<string, string>();
  private stopTimer: (() => void) | undefined;
  private readonly timers: Timers;
  private readonly random: () => number;
  private round: Promise<void> | undefined;
  private running = false;
  private departed = false;
  private removedLogged = false;
  /** Peers whose reachability has been reported since start (heard from, or back from dead). */
  private readonly heardSinceStart = new Set<string>();
  private nextReplayPrune = 0;
  /** otherActiveIds() and the store's list of active ids it was derived from. */
  private members: { from: readonly string[]; ids: readonly string[] } | undefined;
  /** The member list the failure detector was last given. */
  private detectorMembers: readonly string[] | undefined;

  constructor(private readonly deps: GossipDeps) {
    const { identity, clock, config } = deps;
    this.timers = deps.timers ?? systemTimers;
    this.random = deps.random ?? Math.random;
    this.startedAt = clock.now();
    this.fd = new FailureDetector(
      identity.peerId,
      {
        ping: (peerId, timeoutMs, suspected) => this.ping(peerId, timeoutMs, suspected),
        pingReq: (via, target, timeoutMs) => this.pingReq(via, target, timeoutMs),
        disseminate: (rumor) => this.queueRumor(rumor),
      },
      clock,
      { probeIntervalMs: config.intervalMs },
      this.random,
    );
    this.fd.onChange((peerId, from, to) => {
      deps.logger[to === 'dead' ? 'warn' : 'info']({ peer_id: peerId, from, to }, 'peer liveness changed');
      this.updatePeerGauge();
      if (to === 'dead' || from === 'dead') this.reportReachability(peerId);
      // Back from dead is said here: heardFrom() must not say it again as a first contact.
      if (from === 'dead') this.heardSinceStart.add(peerId);
    });
    deps.allocator.connect(
      (allocator, request) => this.allocate(allocator, request),
      (peerId, since) => (this.matchedAt.get(peerId) ?? 0) >= since,
    );
    deps.store.onWrite(() => this.schedulePush());
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    // An agent that left before this start stays silent; one not yet bootstrapped is not gone.
    const self = this.self();
    this.departed = self !== undefined && !self.isActive;
    this.pushed = this.deps.replica.digest().entries;
    this.syncMembers();
    this.stopTimer = this.timers.every(this.deps.config.intervalMs, () => this.tick());
    // A restarted agent catches up at once rather than at its first probe.
    const first = this.randomPeers(1)[0];
    if (first) void this.antiEntropy(first).catch(() => undefined);
  }

  async stop(): Promise<void> {
    this.running = false;
    this.stopTimer?.();
    await this.round;
    this.deps.transport.close();
  }

  /**
   * Liveness of a peer as this agent sees it. The local peer is reachable and has no last-seen
   * time (it would be "now" on every read, and two reads of an unchanged peer should be equal).
   */
  liveness(peerId: string): { reachable: boolean; lastSeenAt: string | null } {
    if (peerId === this.deps.identity.peerId) return { reachable: true, lastSeenAt: null };
    const l = this.fd.liveness(peerId);
    if (!l) return { reachable: false, lastSeenAt: null };
    return {
      reachable: l.state !== 'dead',
      lastSeenAt: l.lastSeenAt === null ? null : isoTime(l.lastSeenAt),
    };
  }

  /** POST /v1/cluster/sync: a heartbeat to every peer and anti-entropy with each, now. */
  async syncNow(): Promise<void> {
    await Promise.all(
      this.otherActivePeers().map(async (p) => {
        // An exchange that began before this call may predate the writes the caller made: let
        // it end, so the one below (started by the probe, or here) covers them.
        await this.syncing.get(p.id)?.catch(() => undefined);
        // A peer that does not answer a probe would not answer the exchange either.
        if (!(await this.ping(p.id, this.deps.config.intervalMs * 2, false))) return;
        await this.antiEntropy(p).catch(() => undefined);
      }),
    );
  }

  /**
   * A peer was just removed here (DELETE /v1/peers/{id}): tell it, since from now on every agent
   * refuses its messages unanswered and it would never learn why. One push of its own tombstone,
   * tried up to three times 5 s apart, to the address it had; it then reports its removal
   * (/readyz, the log). A peer that is down through all three learns nothing (docs/gossip.md).
   */
  removed(peer: PeerRecord, tombstone: WireRecord): void {
    const attempt = async (left: number): Promise<void> => {
      try {
        await this.request(peer, 'push', { records: [tombstone], rumors: [] }, this.slowTimeout());
      } catch (err) {
        // It answered: a reply we cannot open only because its key is gone with its row.
        if (err instanceof InvalidReply && err.reason === 'unknown_sender') return;
        if (left > 1 && this.running) {
          await this.timers.sleep(5000);
          return attempt(left - 1);
        }
      }
    };
    void attempt(3);
  }

  /** A peer just joined by a handshake: exchange whole states with it now. */
  joined(peerId: string): void {
    const peer = this.deps.store.peer(peerId);
    if (peer) void this.antiEntropy(peer).catch(() => undefined);
  }

  // --- the periodic round ----------------------------------------------------------------------

  private tick(): void {
    if (this.round || !this.running) return;
    this.round = this.runRound().finally(() => {
      this.round = undefined;
    });
  }

  private async runRound(): Promise<void> {
    const { replica, clock } = this.deps;
    if (replica.removedFromCluster && !this.removedLogged) {
      this.removedLogged = true;
      this.deps.logger.error('another agent removed this one from the cluster; its gossip is refused');
    }
    if (this.departed) return;
    this.syncMembers();
    await this.fd.probeOnce();
    this.deps.metrics.incarnation.set(this.fd.incarnation);
    const now = clock.now();
    // A quarter of the window apart: a nonce is kept at most that much past its window, and a
    // pass over every sender each round was a tenth of a 200-agent simulation's CPU.
    if (now >= this.nextReplayPrune) {
      this.replay.prune(now);
      this.nextReplayPrune = now + this.deps.config.replayWindowMs / 4;
    }
    const others = this.otherActiveIds();
    replica.collectTombstones((t) => others.every((id) => (this.matchedAt.get(id) ?? 0) >= t));
  }

  // --- probes ------------------------------------------------------------------------------------

  private async ping(peerId: string, timeoutMs: number, suspected: boolean): Promise<boolean> {
    const peer = this.deps.store.peer(peerId);
    if (!peer) return false;
    const root = this.deps.replica.digest().root;
    try {
      const ack = (await this.request(
        peer,
        'ping',
        { root, inc: this.fd.incarnation, suspected, rumors: this.takeRumors() },
        timeoutMs,
      )) as { root?: unknown; inc?: unknown; rumors?: unknown };
      this.heardFrom(peerId, typeof ack.inc === 'number' ? ack.inc : undefined);
      this.receiveRumors(ack.rumors);
      if (ack.root === this.deps.replica.digest().root) this.matchedAt.set(peerId, this.deps.clock.now());
      else if (typeof ack.root === 'string') void this.antiEntropy(peer).catch(() => undefined);
      return true;
    } catch {
      return false;
    }
  }

  private async pingReq(via: string, target: string, timeoutMs: number): Promise<boolean> {
    const peer = this.deps.store.peer(via);
    if (!peer) return false;
    try {
      const answer = (await this.request(
        peer,
        'ping-req',
        { target, timeout_ms: timeoutMs },
        timeoutMs * 2,
      )) as {
        acked?: unknown;
      };
      return answer.acked === true;
    } catch {
      return false;
    }
  }

  // --- dissemination -----------------------------------------------------------------------------

  private queueRumor(rumor: LivenessRumor): void {
    const n = this.otherActiveIds().length + 1;
    const left = Math.max(1, Math.ceil(RUMOR_RETRANSMIT_MULT * Math.log10(n + 1)));
    // A newer rumor about the same peer replaces the older one.
    const i = this.rumors.findIndex((r) => r.rumor.peer === rumor.peer);
    if (i >= 0) this.rumors.splice(i, 1);
    this.rumors.push({ rumor, left });
  }

  private takeRumors(): LivenessRumor[] {
    const out: LivenessRumor[] = [];
    for (const r of this.rumors.slice(0, RUMORS_PER_MESSAGE)) {
      out.push(r.rumor);
      r.left--;
    }
    for (let i = this.rumors.length - 1; i >= 0; i--) if (this.rumors[i]!.left <= 0) this.rumors.splice(i, 1);
    return out;
  }

  private receiveRumors(rumors: unknown): void {
    if (!Array.isArray(rumors)) return;
    for (const r of rumors.slice(0, RUMORS_PER_MESSAGE * 2) as LivenessRumor[]) {
      if (
        typeof r === 'object' &&
        r !== null &&
        (r.kind === 'alive' || r.kind === 'suspect' || r.kind === 'dead') &&
        typeof r.peer === 'string' &&
        typeof r.from === 'string' &&
        Number.isSafeInteger(r.incarnation)
      ) {
        if (this.fd.onRumor(r)) this.queueRumor(r);
      }
    }
  }

  private schedulePush(): void {
    if (this.pushScheduled) return;
    this.pushScheduled = true;
    // After the write's transaction: one push per burst of writes.
    queueMicrotask(() => {
      this.pushScheduled = false;
      this.pushChanges();
    });
  }

  private pushChanges(): void {
    if (!this.running) return;
    const { replica } = this.deps;
    const entries = replica.digest().entries;
    const changed: WireRecord[] = [];
    for (const [key, vkey] of entries) {
      if (this.pushed.get(key) !== vkey) {
        const record = replica.record(key);
        if (record) changed.push(record);
      }
    }
    // A digest's entries are never changed once built: holding them is holding a copy.
    this.pushed = entries;
    // Once gone, this agent's word counts no more: the others refuse its messages.
    if (changed.length === 0 || this.departed) return;
    const self = this.self();
    // Leaving is announced to every peer, not a few: it is this agent's last word.
    const leaving = !this.departed && self !== undefined && !self.isActive;
    const targets = leaving ? this.otherActivePeers() : this.randomPeers(this.deps.config.fanout);
    for (const peer of targets) {
      void this.request(
        peer,
        'push',
        { records: changed, rumors: this.takeRumors() },
        this.slowTimeout(),
      ).catch(() => undefined);
    }
    if (leaving) {
      this.departed = true;
      this.deps.logger.info({ peers: targets.length }, 'deactivation broadcast; this agent gossips no more');
    }
  }

  // --- anti-entropy ------------------------------------------------------------------------------

  /** Runs anti-entropy with a peer, or joins the exchange already running with it. */
  private antiEntropy(peer: PeerRecord): Promise<void> {
    if (this.departed) return Promise.resolve();
    const running = this.syncing.get(peer.id);
    if (running) return running;
    const run = this.exchangeDigests(peer).finally(() => this.syncing.delete(peer.id));
    this.syncing.set(peer.id, run);
    return run;
  }

  private async exchangeDigests(peer: PeerRecord): Promise<void> {
    this.deps.metrics.antiEntropyRounds.inc();
    const { replica } = this.deps;
    const scope = await this.differingBucketsWith(peer);
    // The roots differed at the probe; a change still spreading has often reached both since.
    if (scope?.length === 0) return;
    const digest = replica.digest();
    const entries = replica.digestEntries(scope);
    const answer = (await this.request(
      peer,
      'digest',
      scope ? { root: digest.root, entries, scope } : { root: digest.root, entries },
      this.slowTimeout(),
    )) as { records?: unknown; want?: unknown };
    const received = Array.isArray(answer.records) ? answer.records.slice(0, MAX_RECORDS_PER_MESSAGE) : [];
    this.merge(received);
    const wanted = Array.isArray(answer.want) ? answer.want.slice(0, MAX_RECORDS_PER_MESSAGE) : [];
    // Also what the peer sent that we hold newer: above all a deletion past the horizon, which our
    // digest no longer lists, so the peer would otherwise keep the record until it probes us.
    const outdated = received.flatMap((r) => {
      const key = (r as Partial<WireRecord> | null)?.key;
      const vkey = (r as Partial<WireRecord> | null)?.vkey;
      if (typeof key !== 'string' || typeof vkey !== 'string') return [];
      const held = replica.vkeyOf(key);
      return held !== undefined && held > vkey ? [key] : [];
    });
    const keys = [...new Set([...wanted, ...outdated])];
    if (keys.length > 0) {
      const records = keys
        .map((k) => (typeof k === 'string' ? replica.record(k) : undefined))
        .filter((r): r is WireRecord => r !== undefined);
      await this.request(peer, 'push', { records, rumors: [] }, this.slowTimeout());
    }
  }

  /**
   * The digest buckets in which a peer's state differs from ours (digest-buckets.ts), or
   * undefined for a peer that refuses the message as malformed: an agent from before buckets,
   * with which the whole digest is exchanged, as it always was. That is remembered for
   * BUCKETLESS_RETRY_MS, so an upgrade in progress costs one refused message per peer per
   * period, not one per exchange. Any other failure (timeout, loss) is tried once more, then
   * ends this exchange (the next probe starts another), instead of sending the whole digest to a
   * peer that may not answer: the bench at 20 % loss converged twice as slowly without the retry.
   */
  private async differingBucketsWith(peer: PeerRecord): Promise<number[] | undefined> {
    const refusedAt = this.bucketless.get(peer.id);
    if (refusedAt !== undefined && this.deps.clock.now() - refusedAt < BUCKETLESS_RETRY_MS) return undefined;
    for (let attempt = 1; ; attempt++) {
      try {
        const answer = (await this.request(
          peer,
          'buckets',
          { buckets: this.deps.replica.digestBuckets().hashes },
          this.slowTimeout(),
        )) as { differ?: unknown };
        this.bucketless.delete(peer.id);
        const differ = scopeOf(answer.differ);
        return differ ? [...differ] : undefined;
      } catch (err) {
        if (err instanceof GossipRefused && err.reason === 'malformed') {
          this.bucketless.set(peer.id, this.deps.clock.now());
          return undefined;
        }
        if (attempt === 2 || err instanceof GossipRefused) throw err;
      }
    }
  }

  /** The buckets a peer's list says differ from ours; all of them when its list is malformed. */
  private answerBuckets(buckets: unknown): { differ: number[] } {
    const differ = differingBuckets(this.deps.replica.digestBuckets().hashes, buckets);
    return { differ: differ ?? Array.from({ length: DIGEST_BUCKETS }, (_, i) => i) };
  }

  /**
   * What a peer's digest lacks or holds older, and what it holds newer than we do; with a
   * `scope`, only among keys of those buckets (the peer sent only their entries).
   */
  private answerDigest(entries: unknown, scopeField?: unknown): { records: WireRecord[]; want: string[] } {
    const scope = scopeOf(scopeField);
    const { replica } = this.deps;
    const theirs = new Map<string, string>();
    if (Array.isArray(entries)) {
      for (const e of entries.slice(0, MAX_RECORDS_PER_MESSAGE)) {
        if (Array.isArray(e) && typeof e[0] === 'string' && typeof e[1] === 'string') theirs.set(e[0], e[1]);
      }
    }
    const mine = replica.digest().entries;
    const records: WireRecord[] = [];
    const want: string[] = [];
    for (const [key, vkey] of replica.digestEntries(scope)) {
      const t = theirs.get(key);
      if (t === undefined || vkey > t) {
        const r = replica.record(key);
        if (r) records.push(r);
      }
    }
    for (const [key, t] of theirs) {
      const v = mine.get(key) ?? replica.vkeyOf(key);
      if (v === undefined || t > v) want.push(key);
      else if (v > t && !mine.has(key)) {
        // A deletion older than the horizon still beats a record the peer kept alive.
        const r = replica.record(key);
        if (r) records.push(r);
      }
    }
    return { records, want };
  }

  private merge(records: unknown[]): void {
    const result = this.deps.replica.apply(records);
    this.deps.metrics.recordsApplied.inc(result.applied.length);
    // Convergence: a write's age when it reached this agent, from the stamp its writer gave it.
    // Tombstones keep the stamp of the record they delete, not the deletion's: they are left out.
    const now = this.deps.clock.now();
    for (const r of result.applied) {
      if (r.body === null) continue;
      const wall = vkeyWall(r.vkey);
      if (wall > 0) this.deps.metrics.convergenceSeconds.observe(Math.max(0, now - wall) / 1000);
    }
    if (result.malformed > 0) this.deps.metrics.recordsMalformed.inc(result.malformed);
    this.syncMembers();
  }

  // --- allocation --------------------------------------------------------------------------------

  /**
   * Asks the allocator. When it holds a service on the pair that this agent knows deleted (the
   * tombstone has not reached it yet: this agent was killed between the delete and its push, or
   * the push was lost), the request is sent once more carrying that tombstone, which the
   * allocator merges before it decides, so a pair freed here is free there too.
   */
  private async allocate(allocator: PeerRecord, request: AdmissionRequest): Promise<AdmissionAnswer> {
    const answer = await this.allocateOnce(allocator, request, []);
    if (answer.granted || answer.code !== 'ALREADY_EXISTS' || typeof answer.occupant !== 'string') {
      return answer;
    }
    const known = this.deps.replica.record(keyOf('service', answer.occupant));
    if (!known || known.body !== null) return answer;
    return this.allocateOnce(allocator, request, [known]);
  }

  private async allocateOnce(
    allocator: PeerRecord,
    request: AdmissionRequest,
    records: WireRecord[],
  ): Promise<AdmissionAnswer> {
    const body = records.length > 0 ? { request, records } : { request };
    const reply = (await this.request(allocator, 'allocate', body, this.slowTimeout())) as {
      answer?: AdmissionAnswer;
      stamp?: unknown;
    };
    if (!reply.answer || typeof reply.answer.granted !== 'boolean') throw new Error('malformed answer');
    // The allocator's clock has passed every deletion it decided on; ours must too before we
    // stamp the new service, so that it sorts after the pair's earlier holders (replica.ts).
    if (typeof reply.stamp === 'string') this.deps.replica.hlc.observe(reply.stamp);
    return reply.answer;
  }

  // --- asking -------------------------------------------------------------------------------------

  /**
   * Asks an active peer to explain a packet at its ingress (GET /v1/explain?peer=): a request
   * over the authenticated gossip channel (signed, MACed, bound to the peer, single use), so no
   * endpoint of its own is needed. Returns the body of the peer's reply; throws when the peer is
   * not an active member, cannot be reached, or refuses (an older build that knows no `explain`).
   */
  async explainAt(peerId: string, request: unknown): Promise<unknown> {
    const peer = this.deps.store.peer(peerId);
    if (!peer?.isActive || peerId === this.deps.identity.peerId)
      throw new Error(`peer ${peerId} is not an active remote peer`);
    return this.request(peer, 'explain', request, this.slowTimeout());
  }

  // --- sending -----------------------------------------------------------------------------------

  private slowTimeout(): number {
    return Math.max(2000, this.deps.config.intervalMs * 2);
  }

  /**
   * Sends one request and returns the body of the peer's authenticated reply. Tries the key the
   * peer last accepted, then the others (after a merge or rotation a peer may know only one of
   * ours); if the peer knows none of them, proves our identity alone to get the current
   * credential back (rejoin), then tries once more.
   */
  private async request(peer: PeerRecord, type: string, body: unknown, timeoutMs: number): Promise<unknown> {
    try {
      return await this.requestWithKeys(peer, type, body, timeoutMs);
    } catch (err) {
      if (err instanceof GossipRefused && err.reason === 'unknown_credential' && type !== 'rejoin') {
        await this.rejoin(peer, timeoutMs);
        return this.requestWithKeys(peer, type, body, timeoutMs);
      }
      this.deps.metrics.sendFailures.labels(type).inc();
      throw err;
    }
  }

  private async requestWithKeys(
    peer: PeerRecord,
    type: string,
    body: unknown,
    timeoutMs: number,
  ): Promise<unknown> {
    const keys = this.deps.credential.macKeys();
    const preferred = this.keyFor.get(peer.id);
    keys.sort((a, b) => Number(b.kid === preferred) - Number(a.kid === preferred));
    // Made only when needed: an Error captures a stack, and this runs for every message sent.
    let last: unknown;
    for (const key of keys) {
      try {
        const reply = await this.send(peer, type, body, key, timeoutMs);
        this.keyFor.set(peer.id, key.kid);
        return reply;
      } catch (err) {
        last = err;
        if (!(err instanceof GossipRefused && err.reason === 'unknown_credential')) throw err;
      }
    }
    throw last ?? new GossipRefused('unknown_credential');
  }

  private async rejoin(peer: PeerRecord, timeoutMs: number): Promise<void> {
    this.deps.logger.warn({ peer_id: peer.id }, 'no cluster key of ours is accepted; rejoining by identity');
    const answer = (await this.send(peer, 'rejoin', {}, undefined, timeoutMs)) as { records?: unknown };
    const records = Array.isArray(answer.records) ? answer.records : [];
    // Only what a rejoin is for: the cluster and its credential.
    this.merge(
      records.filter(
        (r) =>
          typeof r === 'object' &&
          r !== null &&
          ((r as WireRecord).key === 'cluster' || (r as WireRecord).key === 'credential'),
      ),
    );
  }

  private async send(
    peer: PeerRecord,
    type: string,
    body: unknown,
    key: MacKey | undefined,
    timeoutMs: number,
  ): Promise<unknown> {
    const { identity, clock, transport, metrics } = this.deps;
    const { envelope, nonce } = seal(identity, { type, to: peer.id, sent_at: clock.now(), body }, key);
    metrics.countMessage(type, 'sent', envelope.payload.length);
    const reply = await transport.post(peer.address, envelope, timeoutMs);
    // Every answered exchange crossed the wire, refused or not.
    if (reply.wireBytes) {
      metrics.httpBytes.labels(type, 'sent').inc(reply.wireBytes.sent);
      metrics.httpBytes.labels(type, 'received').inc(reply.wireBytes.received);
    }
    if (reply.status !== 200) {
      throw new GossipRefused(refusalReason(reply.body) ?? `status ${reply.status}`);
    }
    const opened = this.open(reply.body);
    if (!opened.ok) throw new InvalidReply(opened.reason);
    // Counted as handle() counts a request: the payload and a flat 200 bytes (docs/metrics.md).
    metrics.countBytes('received', (reply.body as Envelope).payload.length);
    const p = opened.payload;
    if (p.from !== peer.id || p.re !== nonce || p.type !== `${type}-reply`) {
      this.deps.metrics.rejected.labels('malformed').inc();
      throw new Error('the reply does not answer our request');
    }
    this.heardFrom(peer.id);
    return p.body;
  }

  // --- receiving ---------------------------------------------------------------------------------

  private open(raw: unknown) {
    const { store, identity, clock, config, credential, metrics } = this.deps;
    const opened = open(raw, {
      localPeerId: identity.peerId,
      now: clock.now(),
      windowMs: config.replayWindowMs,
      sender: (id) => {
        const p = store.peer(id);
        return p && { publicKey: p.publicKey, isActive: p.isActive };
      },
      macKey: (kid) => credential.macKey(kid),
      replay: this.replay,
      notBefore: this.startedAt,
    });
    if (!opened.ok) metrics.rejected.labels(opened.reason).inc();
    return opened;
  }

  /** A request the HTTP layer refused before handle() could read it: counted as malformed. */
  countUnreadable(): void {
    this.deps.metrics.rejected.labels('malformed').inc();
  }

  /** POST /internal/v1/gossip. Anything that fails authentication changes nothing. */
  async handle(raw: unknown): Promise<HandledMessage> {
    const opened = this.open(raw);
    if (!opened.ok) return refusal(opened.reason);
    const p = opened.payload;
    this.deps.metrics.countMessage(p.type, 'received', (raw as Envelope).payload.length);
    this.heardFrom(p.from);
    const body = (p.body ?? {}) as Record<string, unknown>;
    let answer: unknown;
    switch (p.type) {
      case 'ping':
        if (body.suspected === true) this.fd.refuteSuspicion();
        if (typeof body.inc === 'number') this.heardFrom(p.from, body.inc);
        this.receiveRumors(body.rumors);
        answer = {
          root: this.deps.replica.digest().root,
          inc: this.fd.incarnation,
          rumors: this.takeRumors(),
        };
        break;
      case 'ping-req': {
        const timeout = Math.min(Number(body.timeout_ms) || 500, 10_000);
        answer = {
          acked: typeof body.target === 'string' ? await this.ping(body.target, timeout, false) : false,
        };
        break;
      }
      case 'push':
        this.receiveRumors(body.rumors);
        if (Array.isArray(body.records)) this.merge(body.records.slice(0, MAX_RECORDS_PER_MESSAGE));
        answer = {};
        break;
      case 'buckets':
        answer = this.answerBuckets(body.buckets);
        break;
      case 'digest':
        answer = this.answerDigest(body.entries, body.scope);
        break;
      case 'allocate':
        // Records the requester knows and the decision depends on (see allocate()) come first.
        if (Array.isArray(body.records)) this.merge(body.records.slice(0, MAX_RECORDS_PER_MESSAGE));
        answer = {
          answer: isAdmissionRequest(body.request)
            ? this.deps.allocator.answer(body.request, p.from)
            : { granted: false, code: 'UNAVAILABLE', error: 'malformed admission request' },
          stamp: this.deps.replica.hlc.tick(),
        };
        break;
      case 'explain':
        if (!this.deps.explain) {
          this.deps.metrics.rejected.labels('malformed').inc();
          return refusal('malformed');
        }
        answer = await this.deps.explain(p.body);
        break;
      case 'rejoin':
        answer = { records: [this.deps.replica.record('cluster'), this.deps.replica.record('credential')] };
        this.deps.logger.info(
          { peer_id: p.from },
          'a peer rejoined by identity (it held no live cluster key)',
        );
        break;
      default:
        this.deps.metrics.rejected.labels('malformed').inc();
        return refusal('malformed');
    }
    return { status: 200, body: this.reply(p, answer, (raw as Envelope).kid) };
  }

  private reply(request: Payload, body: unknown, kid: string): Envelope {
    const type = `${request.type}-reply`;
    const key = kid === NO_KEY ? undefined : this.deps.credential.macKeys().find((k) => k.kid === kid);
    const { envelope } = seal(
      this.deps.identity,
      { type, to: request.from, sent_at: this.deps.clock.now(), re: request.nonce, body },
      key,
    );
    this.deps.metrics.countMessage(type, 'sent', envelope.payload.length);
    return envelope;
  }

  // --- helpers -----------------------------------------------------------------------------------

  private self(): PeerRecord | undefined {
    return this.deps.store.peer(this.deps.identity.peerId);
  }

  private otherActivePeers(): PeerRecord[] {
    const me = this.deps.identity.peerId;
    return this.deps.store.peers().filter((p) => p.isActive && p.id !== me);
  }

  /**
   * The other active members' ids, derived once per version of the store's active ids (outside
   * a transaction, where every caller is, the store hands out the same list until a peer is
   * written; inside one, a new list each time): every round and every merge ask, and at 1,000
   * members deriving it each time was a measurable share of a round (bench/cluster sim).
   */
  private otherActiveIds(): readonly string[] {
    const active = this.deps.store.activePeerIds();
    if (this.members?.from !== active) {
      const me = this.deps.identity.peerId;
      this.members = { from: active, ids: active.filter((id) => id !== me) };
    }
    return this.members.ids;
  }

  /** Tells the failure detector (and the peers gauge) the members, when they have changed. */
  private syncMembers(): void {
    const ids = this.otherActiveIds();
    if (ids === this.detectorMembers) return;
    this.detectorMembers = ids;
    this.fd.setMembers(ids);
    const members = new Set(ids);
    for (const id of this.heardSinceStart) if (!members.has(id)) this.heardSinceStart.delete(id);
    this.updatePeerGauge();
  }

  private randomPeers(n: number): PeerRecord[] {
    const peers = this.otherActivePeers();
    for (let i = peers.length - 1; i > 0; i--) {
      const j = Math.floor(this.random() * (i + 1));
      [peers[i], peers[j]] = [peers[j]!, peers[i]!];
    }
    return peers.slice(0, n);
  }

  /**
   * Evidence that a peer is alive, for the failure detector. A peer heard from for the first time
   * since start is reachable: said once, so that a log whose last word on it (before a restart)
   * is `peer.unreachable` does not stand while it answers.
   */
  private heardFrom(peerId: string, incarnation?: number): void {
    this.fd.heardFrom(peerId, incarnation);
    // Reported by a running member only, as its rounds would.
    if (!this.running || this.departed || this.heardSinceStart.has(peerId)) return;
    const l = this.fd.liveness(peerId);
    // Not a member (yet): the detector keeps nothing of it, and it is reported once it is one.
    if (!l || l.lastSeenAt === null) return;
    this.heardSinceStart.add(peerId);
    if (l.state !== 'dead') this.reportReachability(peerId);
  }

  private reportReachability(peerId: string): void {
    const l = this.fd.liveness(peerId);
    if (!l || !this.deps.observed) return;
    const reachable = l.state !== 'dead';
    this.deps.observed({
      type: reachable ? 'peer.reachable' : 'peer.unreachable',
      resource: { kind: 'peer', id: peerId },
      data: {
        last_seen_at: l.lastSeenAt === null ? null : isoTime(l.lastSeenAt),
        incarnation: l.incarnation,
      },
    });
  }

  private updatePeerGauge(): void {
    const counts = { alive: 0, suspect: 0, dead: 0 };
    for (const id of this.otherActiveIds()) counts[this.fd.liveness(id)?.state ?? 'alive']++;
    for (const [state, n] of Object.entries(counts)) this.deps.metrics.peers.labels(state).set(n);
    this.deps.metrics.incarnation.set(this.fd.incarnation);
  }
}

/**
 * A refused message gets the documented error shape; the reason after the colon tells the
 * sender whether to try another key. It is no secret: the sender knows what it sent.
 */
function refusal(reason: RejectReason | string): HandledMessage {
  const unauthorized = reason === 'unknown_credential';
  return {
    status: unauthorized ? 401 : 403,
    body: { error: `${REFUSED}${reason}`, code: unauthorized ? 'UNAUTHORIZED' : 'FORBIDDEN' },
  };
}

const REFUSED = 'gossip message refused:';

/** The refusal reason from an error body made by refusal(). */
function refusalReason(body: unknown): string | undefined {
  const error = (body as { error?: unknown })?.error;
  return typeof error === 'string' && error.startsWith(REFUSED) ? error.slice(REFUSED.length) : undefined;
}
