/**
 * This agent's copy of the replicated state, over the store: the records gossip carries, their
 * digest, and the merge of records received from peers (replicated-records.ts gives the rules).
 *
 * Merge rules beyond "greater vkey wins", each deterministic so every agent decides alike:
 * - A child whose parent is missing or deleted (a service without its peers, a route without its
 *   service) is not stored; if it is real, anti-entropy offers it again after its parent.
 *   Deleting a parent deletes its children locally without tombstones of their own.
 * - Two live services for one (source, target) pair: the one created later (greater creation
 *   stamp) stays; the other becomes a tombstone at its own stamp. Later, not earlier: the pair
 *   is also "held twice" where a deleted service's tombstone has not arrived yet but its
 *   successor on the pair has, and the successor is always the later one (its creator or the
 *   allocator had seen the deletion, and the hybrid clock orders causally). A real conflict
 *   (two allocators in a split) has no such order; the later creation wins there too.
 * - A tombstone of this agent's own peer (another agent removed us) is not applied: this agent
 *   keeps its row, and the others refuse its messages from then on.
 * - Tombstones leave the digest `tombstoneHorizonMs` after their write, everywhere at once, and
 *   are deleted when every active peer has matched our digest since (so all of them hold the
 *   deletion). A tombstone past the horizon is accepted only where it deletes a live record.
 */
import { createHash } from 'node:crypto';
import { type Clock, isoTime } from '../domain/clock.js';
import { parseHealthCheck } from '../domain/health-check.js';
import { checkRoute, checkService } from '../domain/service-rules.js';
import type { EventActor, EventLog } from '../events/event-log.js';
import type { ClusterSecretRecord, PeerRecord, RouteRecord, ServiceRecord } from '../store/records.js';
import type { Store } from '../store/store.js';
import { CLUSTER_SECRET_GRACE_MS, keyId } from './cluster-credential.js';
import { bucketize, type DigestBuckets } from './digest-buckets.js';
import { peerIdMatchesKey } from './handshake-protocol.js';
import type { HybridClock } from './hlc.js';
import { actorOf, changeEventId, recordEvent } from './record-events.js';
import {
  APPLY_ORDER,
  type ClusterBody,
  type CredentialBody,
  type CredentialKeyBody,
  DELETED_RANK,
  epochOf,
  isWellFormed,
  keyOf,
  LIVE_RANK,
  makeVkey,
  PEER_RANK,
  type PeerBody,
  parseVkey,
  type RouteBody,
  type ServiceBody,
  splitKey,
  vkeyWall,
  type WireRecord,
} from './replicated-records.js';

export const DEFAULT_TOMBSTONE_HORIZON_MS = 60 * 60 * 1000;

export interface Digest {
  /** SHA-256 over the sorted `key vkey` lines, base64url: equal roots, equal states. */
  root: string;
  entries: ReadonlyMap<string, string>;
}

export interface ApplyResult {
  /** Records that changed this agent's state, as stored (relayed onward by gossip). */
  applied: WireRecord[];
  /** Records that were not well formed or carried a stamp too far in the future. */
  malformed: number;
}

export class Replica {
  private cachedDigest:
    | {
        generation: number;
        cutoff: number;
        /** The oldest tombstone wall time in the digest: it leaves once the cutoff passes it. */
        firstTombstoneWall: number;
        digest: Digest;
      }
    | undefined;
  private cachedBuckets: { digest: Digest; buckets: DigestBuckets } | undefined;
  /**
   * The vkey of the tombstone another agent wrote for this agent's own peer, until it is added
   * again: while it is set, /readyz reports the removal, gossip logs it once, and merges take
   * only deletions. Stored as a tombstone beside the agent's own row, so a restart keeps it.
   */
  private ownRemoval: string | undefined;
  /** The key of this agent's own peer record. */
  private readonly ownKey: string;

  constructor(
    private readonly store: Store,
    private readonly localPeerId: string,
    readonly hlc: HybridClock,
    private readonly clock: Clock,
    readonly tombstoneHorizonMs: number = DEFAULT_TOMBSTONE_HORIZON_MS,
    /** Where each change's config event goes (docs/events.md); without it, none is recorded. */
    private readonly events?: EventLog,
  ) {
    this.ownKey = keyOf('peer', localPeerId);
  }

  /**
   * Runs a local write of the record at `key` (which `write` gives a new vkey, or a tombstone)
   * in one transaction with its config event, made by `actor`: an acknowledged write always has
   * its event, and a refused one (it throws) has none.
   */
  change<T>(key: string, actor: EventActor, write: () => T): T {
    const run = () => {
      const before = this.events && this.held(key);
      const result = write();
      this.noteChange(key, before, actor);
      return result;
    };
    // Inside a transaction already (every caller but one), it is atomic with it: a savepoint
    // of its own would cost a write a fifth more (bench/events/write-cost.ts).
    return this.store.db.inTransaction ? run() : this.store.transaction(run);
  }

  /** Records the event of the change from `before` to what is held at `key` now, if it changed. */
  private noteChange(key: string, before: WireRecord | undefined, actor: EventActor): void {
    if (!this.events) return;
    const after = this.held(key);
    if (!after || after.vkey === before?.vkey) return;
    const event = recordEvent(before, after, actor);
    if (event) this.events.record(event);
  }

  /**
   * A vkey for a local write of a record whose previous vkey is `previous` (if any), in the same
   * epoch, or `epochBump` epochs above it (a removed peer added again).
   */
  nextVkey(previous: string | undefined, ordinal: number, epochBump = 0): string {
    return makeVkey((previous ? epochOf(previous) : 0) + epochBump, ordinal, this.hlc.tick());
  }

  /**
   * Runs once at start: moves the clock past every stamp stored (a restart never issues a stamp
   * older than one it issued before) and stamps rows written before replication existed.
   */
  init(): void {
    const state = this.store.agentState();
    if (!state) return;
    this.ownRemoval = this.store.tombstone(this.ownKey)?.vkey;
    const all = [
      ...this.store.peers().map((p) => p.vkey),
      ...this.store.services().map((s) => s.vkey),
      ...[...this.store.tombstones().values()].map((t) => t.vkey),
      state.clusterVkey,
      state.credentialVkey,
    ];
    for (const v of all) {
      const parsed = parseVkey(v);
      if (parsed) this.hlc.observe(parsed.stamp, true);
    }
    this.store.transaction(() => {
      for (const p of this.store.peers()) {
        if (!p.vkey) this.store.updatePeer({ ...p, vkey: this.nextVkey(undefined, peerRank(p)) });
      }
      for (const s of this.store.services()) {
        if (!s.vkey) {
          const vkey = this.nextVkey(undefined, LIVE_RANK);
          this.store.updateService({ ...s, vkey, createdStamp: parseVkey(vkey)!.stamp });
        }
        for (const r of this.store.routesOf(s.id)) {
          if (!r.vkey) this.store.updateRoute({ ...r, vkey: this.nextVkey(undefined, LIVE_RANK) });
        }
      }
      if (!state.clusterVkey) {
        this.store.setCluster(state.clusterId, state.clusterCreatedBy, this.nextVkey(undefined, 0));
      }
      if (!state.credentialVkey) {
        const current = this.store.clusterSecrets()[0];
        if (current) this.store.setCredentialVkey(this.nextVkey(undefined, current.version));
      }
    });
  }

  /** Whether another agent removed this one from the cluster (and it was not added again). */
  get removedFromCluster(): boolean {
    return this.ownRemoval !== undefined;
  }

  /**
   * Out of the cluster, an agent takes only deletions from its former mates: those that have not
   * yet heard of its removal still push to it, and a live record it took now (it holds no
   * tombstones for the services it forgot) it would spread again if it were ever added back,
   * bringing deleted services back (test/sim seeds 1179 and 1027). Only its own peer record
   * from a later epoch, written when another agent adds it again, lets it back in.
   */
  private admits(r: WireRecord): boolean {
    if (this.ownRemoval === undefined || r.body === null) return true;
    return r.key === this.ownKey && epochOf(r.vkey) > epochOf(this.ownRemoval);
  }

  // --- reading ---------------------------------------------------------------------------------

  /** The vkey this agent holds for a key, tombstones past the horizon included. */
  vkeyOf(key: string): string | undefined {
    const parts = splitKey(key);
    if (!parts) return undefined;
    const tomb = this.store.tombstone(key)?.vkey;
    switch (parts.kind) {
      case 'cluster':
        return this.store.agentState()?.clusterVkey || undefined;
      case 'credential':
        return this.store.agentState()?.credentialVkey || undefined;
      case 'peer':
        return this.store.peer(parts.id)?.vkey ?? tomb;
      case 'service':
        return this.store.service(parts.id)?.vkey ?? tomb;
      case 'route':
        return this.store.route(Number(parts.id))?.vkey ?? tomb;
    }
  }

  /**
   * The record this agent holds for a key, or undefined, with the actor of its change when this
   * agent's event log still holds that change's event.
   */
  record(key: string): WireRecord | undefined {
    const r = this.held(key);
    if (!r || !this.events) return r;
    const actor = this.store.eventTable.actorOf(changeEventId(r.key, r.vkey));
    return actor ? { ...r, actor } : r;
  }

  /**
   * The record as stored, without its actor: for the handshake, whose schema (on agents of every
   * version) takes exactly key, vkey and body.
   */
  held(key: string): WireRecord | undefined {
    const parts = splitKey(key);
    if (!parts) return undefined;
    if (parts.kind === 'cluster' || parts.kind === 'credential') {
      const state = this.store.agentState();
      if (!state) return undefined;
      return parts.kind === 'cluster'
        ? clusterRecord(state.clusterId, state.clusterCreatedBy, state.clusterVkey)
        : credentialRecord(this.store.clusterSecrets(), state.credentialVkey);
    }
    const live =
      parts.kind === 'peer'
        ? mapDefined(this.store.peer(parts.id), peerRecord)
        : parts.kind === 'service'
          ? mapDefined(this.store.service(parts.id), serviceRecord)
          : mapDefined(this.store.route(Number(parts.id)), routeRecord);
    if (live) return live;
    const tomb = this.store.tombstone(key);
    return tomb && { key, vkey: tomb.vkey, body: null };
  }

  /** Wall time before which tombstones have left the digest. */
  private horizonCutoff(): number {
    // Rounded to whole seconds so that the cached digest is not rebuilt on every call.
    return Math.floor((this.clock.now() - this.tombstoneHorizonMs) / 1000) * 1000;
  }

  /**
   * The digest's `[key, vkey]` entries, or with a `scope` only those of its buckets: what an
   * exchange sends, and what the answering side compares with what it was sent.
   */
  digestEntries(scope?: Iterable<number>): [string, string][] {
    if (!scope) return [...this.digest().entries];
    const { entries } = this.digestBuckets();
    return [...scope].flatMap((b) => entries[b]!);
  }

  /** The current digest split into buckets (digest-buckets.ts), computed once per digest. */
  digestBuckets(): DigestBuckets {
    const digest = this.digest();
    if (this.cachedBuckets?.digest !== digest) {
      const previous = this.cachedBuckets && {
        entries: this.cachedBuckets.digest.entries,
        buckets: this.cachedBuckets.buckets,
      };
      this.cachedBuckets = { digest, buckets: bucketize(digest.entries, previous) };
    }
    return this.cachedBuckets.buckets;
  }

  digest(): Digest {
    const cutoff = this.horizonCutoff();
    const cached = this.cachedDigest;
    // The cutoff moves every second, but the digest changes only when it passes a tombstone the
    // digest holds: rebuilding it each second cost an idle agent with 650 records a few ms a second.
    if (
      cached &&
      cached.generation === this.store.generation &&
      cutoff >= cached.cutoff &&
      cutoff <= cached.firstTombstoneWall
    ) {
      return cached.digest;
    }
    let firstTombstoneWall = Number.POSITIVE_INFINITY;
    const entries = new Map<string, string>();
    const state = this.store.agentState();
    if (state) {
      entries.set('cluster', state.clusterVkey);
      entries.set('credential', state.credentialVkey);
      for (const p of this.store.peers()) entries.set(keyOf('peer', p.id), p.vkey);
      for (const s of this.store.services()) {
        entries.set(keyOf('service', s.id), s.vkey);
        for (const r of this.store.routesOf(s.id)) entries.set(keyOf('route', r.id), r.vkey);
      }
      for (const t of this.store.tombstones().values()) {
        const wall = vkeyWall(t.vkey);
        if (wall < cutoff) continue;
        entries.set(t.key, t.vkey);
        firstTombstoneWall = Math.min(firstTombstoneWall, wall);
      }
    }
    const lines = [...entries].map(([k, v]) => `${k} ${v}\n`).sort();
    const digest = { root: createHash('sha256').update(lines.join('')).digest('base64url'), entries };
    this.cachedDigest = { generation: this.store.generation, cutoff, firstTombstoneWall, digest };
    return digest;
  }

  // --- merging ---------------------------------------------------------------------------------

  /** Merges received records in one transaction; parents before children. */
  apply(received: readonly unknown[]): ApplyResult {
    const applied: WireRecord[] = [];
    let malformed = 0;
    const wellFormed: WireRecord[] = [];
    for (const r of received) {
      if (isWellFormed(r) && this.hlc.observe(parseVkey(r.vkey)!.stamp)) wellFormed.push(r);
      else malformed++;
    }
    // What we already hold at this vkey or a newer one changes nothing (applyOne's first test):
    // most records arrive fanout times, and a transaction that finds them all held cost a merge
    // most of its time (test/sim: 64 % of merges, 11 % of a run's CPU). Outside a transaction
    // this reads the store's snapshot, which is what SQLite holds.
    const fresh = wellFormed.filter((r) => {
      const held = this.vkeyOf(r.key);
      return held === undefined || r.vkey > held;
    });
    if (fresh.length === 0) return { applied, malformed };
    // This agent's own peer record first: when it is added back, the rest of the batch counts.
    const order = (r: WireRecord) => (r.key === this.ownKey ? -1 : APPLY_ORDER[splitKey(r.key)!.kind]);
    fresh.sort((a, b) => order(a) - order(b));
    this.store.transaction(() => {
      if (!this.store.agentState()) return;
      for (const r of fresh) {
        if (!this.admits(r)) continue;
        const before = this.events && this.held(r.key);
        const outcome = this.applyOne(r);
        if (outcome === 'malformed') malformed++;
        else if (outcome) {
          applied.push(outcome);
          this.noteChange(r.key, before, actorOf(r, this.localPeerId));
        }
      }
    });
    return { applied, malformed };
  }

  /** The stored record if `r` changed the state, undefined if not, 'malformed' if refused. */
  private applyOne(r: WireRecord): WireRecord | undefined | 'malformed' {
    const held = this.vkeyOf(r.key);
    if (held !== undefined && r.vkey <= held) return undefined;
    const { kind, id } = splitKey(r.key)!;
    const nowMs = this.clock.now();
    if (r.body === null) {
      const live = held !== undefined && !this.store.tombstone(r.key);
      // An old deletion is history everywhere else: take it only where it still deletes something.
      if (vkeyWall(r.vkey) < nowMs - this.tombstoneHorizonMs && !live) return undefined;
      if (kind === 'peer' && id === this.localPeerId) {
        // Out of the cluster: its services are deleted everywhere else, so here too, or they
        // would come back from this agent if it is ever added again.
        if (this.ownRemoval === undefined) this.forgetServices();
        if (this.ownRemoval === undefined || r.vkey > this.ownRemoval) {
          this.ownRemoval = r.vkey;
          this.store.putTombstone({ key: r.key, vkey: r.vkey, arrivedAt: nowMs });
        }
        return undefined;
      }
      if (kind === 'peer') this.deletePeerAndServices(id, r.vkey, nowMs, actorOf(r, this.localPeerId));
      else if (kind === 'service') this.store.deleteService(id);
      else if (kind === 'route') this.store.deleteRoute(Number(id));
      this.store.putTombstone({ key: r.key, vkey: r.vkey, arrivedAt: nowMs });
      return r;
    }
    switch (kind) {
      case 'cluster': {
        const body = r.body as unknown as ClusterBody;
        this.store.setCluster(body.cluster_id, body.created_by, r.vkey);
        return r;
      }
      case 'credential': {
        const body = r.body as unknown as CredentialBody;
        const keys = [body.current, ...body.previous].map(toClusterSecret);
        // Keys the new record lacks: after a merge (a higher epoch), our former cluster mates
        // still use them, so they stay usable here for the grace period. In the same epoch they
        // can only be the loser of a concurrent rotation, which must not stay valid anywhere.
        const merged = held !== undefined && epochOf(r.vkey) > epochOf(held);
        this.store.adoptClusterSecrets(
          keys,
          r.vkey,
          isoTime(merged ? nowMs + CLUSTER_SECRET_GRACE_MS : nowMs),
        );
        return r;
      }
      case 'peer': {
        const body = r.body as unknown as PeerBody;
        if (!peerIdMatchesKey({ peer_id: body.id, public_key: body.public_key })) return 'malformed';
        this.store.upsertPeer(fromPeerBody(body, r.vkey));
        this.store.deleteTombstone(r.key);
        // Only a record from a later epoch than its removal gets here (admits): added again.
        if (id === this.localPeerId) this.ownRemoval = undefined;
        return r;
      }
      case 'service': {
        const body = r.body as unknown as ServiceBody;
        let service: ServiceRecord;
        try {
          service = fromServiceBody(body, r.vkey);
          checkService(service);
        } catch {
          return 'malformed';
        }
        if (!this.store.peer(service.sourcePeerId) || !this.store.peer(service.targetPeerId))
          return undefined;
        const rivalId = this.store.serviceIdForPair(service.sourcePeerId, service.targetPeerId);
        const rival =
          rivalId === undefined || rivalId === service.id ? undefined : this.store.service(rivalId);
        if (rival) {
          if (createdLater(rival, service)) return this.applyOne(asTombstone(r));
          const rivalKey = keyOf('service', rival.id);
          const held = this.events && this.held(rivalKey);
          this.store.deleteService(rival.id);
          const vkey = tombstoneVkey(rival.vkey);
          this.store.putTombstone({ key: rivalKey, vkey, arrivedAt: nowMs });
          // Every agent resolves the conflict alike: no client asked, the rival's writer made it.
          this.noteChange(rivalKey, held, actorOf({ key: rivalKey, vkey, body: null }, this.localPeerId));
        }
        this.store.upsertService(service);
        this.store.deleteTombstone(r.key);
        return r;
      }
      case 'route': {
        const body = r.body as unknown as RouteBody;
        const route = fromRouteBody(body, r.vkey);
        try {
          checkRoute(route);
        } catch {
          return 'malformed';
        }
        if (!this.store.service(route.serviceId)) return undefined;
        const existing = this.store.route(route.id);
        if (existing && existing.serviceId !== route.serviceId) return 'malformed';
        this.store.upsertRoute(route);
        this.store.deleteTombstone(r.key);
        return r;
      }
    }
  }

  /**
   * Removes a peer, with a tombstone for each of its services. The peer's own tombstone is
   * replaced when the peer is added again, so a service deleted only by the cascade would come
   * back then from any agent that still held it. Each service's tombstone takes the service's
   * epoch, the deletion rank (it beats every live version of that epoch) and the stamp of the
   * peer's removal `removalVkey`: every agent derives the same ones, and they stay in digests for
   * the whole horizon after the removal (the service's own stamp may be older than the horizon,
   * and its tombstone would leave at once). Routes need none: a route whose service is missing
   * is never stored. For DELETE /v1/peers/{id} and a removed-peer tombstone from gossip; inside
   * a store transaction.
   */
  deletePeerAndServices(peerId: string, removalVkey: string, nowMs: number, actor: EventActor): void {
    const removal = parseVkey(removalVkey)!;
    const services = this.store
      .services()
      .filter((s) => s.sourcePeerId === peerId || s.targetPeerId === peerId);
    for (const s of services) {
      const vkey = makeVkey(epochOf(s.vkey), DELETED_RANK, removal.stamp);
      this.store.putTombstone({ key: keyOf('service', s.id), vkey, arrivedAt: nowMs });
    }
    this.store.deletePeer(peerId);
    // Each service's deletion is an event of its own, by whoever removed the peer.
    for (const s of services) this.noteChange(keyOf('service', s.id), serviceRecord(s), actor);
  }

  /** Deletes every service (and so every route) held here, without tombstones. */
  private forgetServices(): void {
    for (const s of this.store.services()) this.store.deleteService(s.id);
  }

  /**
   * Deletes tombstones that have left the digest and that every active peer has seen:
   * `matchedSince(t)` says whether every active peer matched our digest at or after time t.
   */
  collectTombstones(matchedSince: (t: number) => boolean): number {
    const nowMs = this.clock.now();
    const expired = [...this.store.tombstones().values()].filter((t) => {
      const leftDigestAt = vkeyWall(t.vkey) + this.tombstoneHorizonMs;
      return leftDigestAt <= nowMs && matchedSince(Math.max(leftDigestAt, t.arrivedAt));
    });
    if (expired.length === 0) return 0;
    this.store.transaction(() => {
      for (const t of expired) this.store.deleteTombstone(t.key);
    });
    return expired.length;
  }
}

// --- conversions ---------------------------------------------------------------------------------

const mapDefined = <A, B>(a: A | undefined, f: (a: A) => B): B | undefined =>
  a === undefined ? undefined : f(a);

export const peerRank = (p: { isActive: boolean }): number =>
  p.isActive ? PEER_RANK.active : PEER_RANK.inactive;

/** The tombstone that replaces a record: same epoch and stamp, deletion's rank. */
function tombstoneVkey(vkey: string): string {
  const v = parseVkey(vkey)!;
  return makeVkey(v.epoch, DELETED_RANK, v.stamp);
}

function asTombstone(r: WireRecord): WireRecord {
  return { key: r.key, vkey: tombstoneVkey(r.vkey), body: null };
}

export function peerRecord(p: PeerRecord): WireRecord {
  const body: PeerBody = {
    id: p.id,
    name: p.name,
    public_key: p.publicKey,
    address: p.address,
    is_active: p.isActive,
    version: p.version,
    deactivated_at: p.deactivatedAt,
    created_at: p.createdAt,
    updated_at: p.updatedAt,
  };
  return { key: keyOf('peer', p.id), vkey: p.vkey, body: { ...body } };
}

function fromPeerBody(b: PeerBody, vkey: string): PeerRecord {
  return {
    id: b.id,
    name: b.name,
    publicKey: b.public_key,
    address: b.address,
    isActive: b.is_active,
    version: b.version,
    deactivatedAt: b.deactivated_at,
    createdAt: b.created_at,
    updatedAt: b.updated_at,
    vkey,
  };
}

export function serviceRecord(s: ServiceRecord): WireRecord {
  const body: ServiceBody = {
    id: s.id,
    source_peer_id: s.sourcePeerId,
    target_peer_id: s.targetPeerId,
    transport_type: s.transportType,
    requires_interface: s.requiresInterface,
    desired_ipv4_cidr: s.desiredIpv4Cidr,
    desired_ipv6_cidr: s.desiredIpv6Cidr,
    fully_transparent: s.fullyTransparent,
    bandwidth_limit_mbps: s.bandwidthLimitMbps,
    health_check: s.healthCheck,
    version: s.version,
    created_at: s.createdAt,
    updated_at: s.updatedAt,
    created_stamp: s.createdStamp,
  };
  return { key: keyOf('service', s.id), vkey: s.vkey, body: { ...body } };
}

function fromServiceBody(b: ServiceBody, vkey: string): ServiceRecord {
  return {
    id: b.id,
    sourcePeerId: b.source_peer_id,
    targetPeerId: b.target_peer_id,
    transportType: b.transport_type,
    requiresInterface: b.requires_interface,
    desiredIpv4Cidr: b.desired_ipv4_cidr,
    desiredIpv6Cidr: b.desired_ipv6_cidr,
    fullyTransparent: b.fully_transparent,
    bandwidthLimitMbps: b.bandwidth_limit_mbps,
    // Canonical again, whatever form the sender wrote; throws on a malformed one.
    healthCheck: b.health_check == null ? null : parseHealthCheck(b.health_check),
    version: b.version,
    createdAt: b.created_at,
    updatedAt: b.updated_at,
    vkey,
    createdStamp: b.created_stamp,
  };
}

/** Whether `a` was created after `b` (stamps are unique per write; ids settle the impossible tie). */
function createdLater(a: ServiceRecord, b: ServiceRecord): boolean {
  if (a.createdStamp !== b.createdStamp) return a.createdStamp > b.createdStamp;
  return a.id > b.id;
}

export function routeRecord(r: RouteRecord): WireRecord {
  const body: RouteBody = {
    id: r.id,
    service_id: r.serviceId,
    priority: r.priority,
    source_cidr: r.sourceCidr,
    dest_cidr: r.destCidr,
    version: r.version,
    created_at: r.createdAt,
    updated_at: r.updatedAt,
  };
  return { key: keyOf('route', r.id), vkey: r.vkey, body: { ...body } };
}

function fromRouteBody(b: RouteBody, vkey: string): RouteRecord {
  return {
    id: b.id,
    serviceId: b.service_id,
    priority: b.priority,
    sourceCidr: b.source_cidr,
    destCidr: b.dest_cidr,
    version: b.version,
    createdAt: b.created_at,
    updatedAt: b.updated_at,
    vkey,
  };
}

export function clusterRecord(clusterId: string, createdBy: string, vkey: string): WireRecord {
  const body: ClusterBody = { cluster_id: clusterId, created_by: createdBy };
  return { key: 'cluster', vkey, body: { ...body } };
}

/** The replicated credential: the current key and the previous keys in the record. */
export function credentialRecord(keys: readonly ClusterSecretRecord[], vkey: string): WireRecord {
  const replicated = keys.filter((k) => k.replicated);
  const current = replicated.find((k) => k.validUntil === null) ?? replicated[0];
  const body: CredentialBody = {
    current: current ? toKeyBody(current) : (undefined as unknown as CredentialKeyBody),
    previous: replicated.filter((k) => k !== current).map(toKeyBody),
  };
  return { key: 'credential', vkey, body: { ...body } };
}

const toKeyBody = (k: ClusterSecretRecord): CredentialKeyBody => ({
  client_id: k.clientId,
  version: k.version,
  key: k.secretHash.toString('base64'),
  rotated_by: k.rotatedBy,
  rotated_at: k.rotatedAt,
  valid_until: k.validUntil,
});

function toClusterSecret(b: CredentialKeyBody): ClusterSecretRecord {
  const secretHash = Buffer.from(b.key, 'base64');
  return {
    kid: keyId(secretHash),
    clientId: b.client_id,
    version: b.version,
    secretHash,
    rotatedBy: b.rotated_by,
    rotatedAt: b.rotated_at,
    validUntil: b.valid_until,
    replicated: true,
  };
}
