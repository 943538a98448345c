/**
 * Cluster-wide limits (docs/decisions.md §5): max_nodes and max_services hold even when two agents take
 * writes at the same moment, because every new service and every join is first admitted by one
 * agent, the allocator: the oldest active peer (by created_at, then peer id), which every agent
 * names alike from the replicated peers. The allocator counts what its own store holds plus the
 * admissions it granted that gossip has not brought back yet (reservations, kept 30 s), and
 * decides one request at a time (one event loop), so of two racing creates at max − 1 exactly one
 * gets through.
 *
 * In a partition, the side that cannot reach the allocator gets 503 UNAVAILABLE for new services
 * and joins; everything else (updates, deletes, routes, reads) keeps working on both sides.
 * Safety over availability: a cluster whose oldest peer is dead for good must remove it
 * (DELETE /v1/peers/{id}) to move the allocator to the next oldest.
 *
 * A reservation ends when its record (or that record's tombstone) reaches the allocator, when
 * its requester asks again for the same pair, or RESERVATION_TTL_MS after the grant provided
 * the requester's state has since been seen equal to the allocator's (a digest root match at
 * least half the TTL after the grant: by then a committed record would be in it, so it holds
 * none) or the requester is gone. A requester cut off right after its grant keeps its slot until
 * it is heard from in sync, so the limit holds through a partition.
 *
 * Known window: reservations live in memory. If the allocator is killed between granting an
 * admission and receiving the new record by gossip (milliseconds: the creator pushes it at
 * once), a second creator could be admitted past the limit.
 */
import type { Clock } from '../domain/clock.js';
import { ApiError, type ErrorCode } from '../domain/errors.js';
import type { PeerRecord, ServiceRecord } from '../store/records.js';
import type { Store } from '../store/store.js';

export const RESERVATION_TTL_MS = 30_000;

export interface Admission {
  /** Admits a new service cluster-wide before it is written; throws the API error otherwise. */
  admitService(service: ServiceClaim): Promise<void>;
  /** Admits peers about to join (the other side's active peers) before the handshake ends. */
  admitPeers(peerIds: readonly string[]): Promise<void>;
}

/** What admission looks at of a new service. */
export type ServiceClaim = Pick<ServiceRecord, 'id' | 'sourcePeerId' | 'targetPeerId'>;

/** What travels to the allocator and back (inside an authenticated gossip request). */
export type AdmissionRequest =
  | { kind: 'service'; id: string; source_peer_id: string; target_peer_id: string }
  | { kind: 'peers'; ids: string[] };

export type AdmissionAnswer =
  | { granted: true }
  | {
      granted: false;
      code: ErrorCode;
      error: string;
      /** On ALREADY_EXISTS for a service: the id of the service the allocator holds on the pair. */
      occupant?: string;
    };

/** Sends an admission request to the allocator peer; rejects when it cannot be reached. */
export type AdmissionCall = (allocator: PeerRecord, request: AdmissionRequest) => Promise<AdmissionAnswer>;

interface Reservation {
  kind: 'service' | 'peer';
  pair?: string;
  /** The agent the admission was granted to. */
  requester: string;
  expiresAt: number;
  /** A match of the requester's digest root after this moment shows it holds no such record. */
  settledAfter: number;
}

/** Whether a peer's digest root has matched ours at or after `since` (the gossip engine knows). */
export type InSyncSince = (peerId: string, since: number) => boolean;

const ANSWER_CODES: ReadonlySet<string> = new Set([
  'SERVICE_LIMIT_EXCEEDED',
  'NODE_LIMIT_EXCEEDED',
  'ALREADY_EXISTS',
]);

export class Allocator implements Admission {
  private readonly reservations = new Map<string, Reservation>();
  private call: AdmissionCall | undefined;
  private inSyncSince: InSyncSince = () => true;

  constructor(
    private readonly store: Store,
    private readonly localPeerId: string,
    private readonly clock: Clock,
  ) {}

  /**
   * The gossip engine provides the transport once it exists (it needs the allocator too), and
   * what it saw of each peer's digest root, which ends expired reservations.
   */
  connect(call: AdmissionCall, inSyncSince: InSyncSince): void {
    this.call = call;
    this.inSyncSince = inSyncSince;
  }

  /** The oldest active peer: the same answer on every agent that holds the same peers. */
  allocator(): PeerRecord | undefined {
    let oldest: PeerRecord | undefined;
    for (const p of this.store.peers()) {
      if (!p.isActive) continue;
      if (
        !oldest ||
        p.createdAt < oldest.createdAt ||
        (p.createdAt === oldest.createdAt && p.id < oldest.id)
      ) {
        oldest = p;
      }
    }
    return oldest;
  }

  async admitService(s: ServiceClaim): Promise<void> {
    await this.admit({
      kind: 'service',
      id: s.id,
      source_peer_id: s.sourcePeerId,
      target_peer_id: s.targetPeerId,
    });
  }

  async admitPeers(peerIds: readonly string[]): Promise<void> {
    await this.admit({ kind: 'peers', ids: [...peerIds] });
  }

  private async admit(request: AdmissionRequest): Promise<void> {
    const allocator = this.allocator();
    if (!allocator || allocator.id === this.localPeerId) {
      this.decide(request);
      return;
    }
    if (!this.call) throw new ApiError('UNAVAILABLE', 'the cluster allocator cannot be reached yet');
    let answer: AdmissionAnswer;
    try {
      answer = await this.call(allocator, request);
    } catch (err) {
      throw new ApiError(
        'UNAVAILABLE',
        `the cluster's allocator (peer ${allocator.id} at ${allocator.address}) cannot be reached, so the ` +
          `license limits cannot be checked cluster-wide: ${(err as Error).message}`,
      );
    }
    if (!answer.granted) {
      const code = ANSWER_CODES.has(answer.code) ? answer.code : 'UNAVAILABLE';
      throw new ApiError(code, String(answer.error).slice(0, 300));
    }
  }

  /**
   * The allocator's decision (on this agent): grants and reserves, or throws the API error.
   *
   * A requester's own earlier reservation on the same pair does not block it: the requester
   * commits at most one service per pair (its own store re-checks the pair in the write), so a
   * new request means the earlier one was abandoned (refused locally, or the requester was
   * killed before it committed) and it is replaced, not left to hold the pair for 30 s.
   */
  decide(request: AdmissionRequest, requester: string = this.localPeerId): void {
    const state = this.store.agentState();
    if (!state) throw new ApiError('UNAVAILABLE', 'the allocator is not bootstrapped');
    this.prune();
    if (request.kind === 'service') {
      const pair = `${request.source_peer_id} ${request.target_peer_id}`;
      for (const [id, r] of this.reservations) {
        if (r.pair === pair && r.requester === requester && id !== request.id) this.reservations.delete(id);
      }
      const reserved = [...this.reservations].find(
        ([id, r]) => r.pair === pair && id !== request.id && !this.store.service(id),
      );
      const occupant =
        this.store.serviceIdForPair(request.source_peer_id, request.target_peer_id) ?? reserved?.[0];
      if (occupant) {
        throw new PairTaken(occupant);
      }
      const pending = [...this.reservations].filter(
        ([id, r]) => r.kind === 'service' && id !== request.id && !this.store.service(id),
      ).length;
      const max = state.license.max_services;
      if (this.store.serviceCount() + pending >= max) {
        throw new ApiError(
          'SERVICE_LIMIT_EXCEEDED',
          `the license allows ${max} services and the cluster has that many (counted by its allocator)`,
        );
      }
      this.reservations.set(request.id, {
        kind: 'service',
        pair,
        ...this.terms(requester),
      });
      return;
    }
    const active = new Set(this.store.activePeerIds());
    for (const [id, r] of this.reservations) if (r.kind === 'peer') active.add(id);
    for (const id of request.ids) active.add(id);
    const max = state.license.max_nodes;
    if (active.size > max) {
      throw new ApiError(
        'NODE_LIMIT_EXCEEDED',
        `joining would make ${active.size} active peers; the license allows ${max} (counted by the allocator)`,
      );
    }
    for (const id of request.ids) {
      if (!this.store.peer(id)) {
        this.reservations.set(id, { kind: 'peer', ...this.terms(requester) });
      }
    }
  }

  /** Answers a request from another agent, as the allocator. */
  answer(request: AdmissionRequest, requester: string): AdmissionAnswer {
    try {
      const self = this.allocator();
      if (self && self.id !== this.localPeerId) {
        return {
          granted: false,
          code: 'UNAVAILABLE',
          error: `this agent is not the allocator; ${self.id} is`,
        };
      }
      this.decide(request, requester);
      return { granted: true };
    } catch (err) {
      if (err instanceof PairTaken) {
        return { granted: false, code: err.code, error: err.message, occupant: err.occupant };
      }
      if (err instanceof ApiError) return { granted: false, code: err.code, error: err.message };
      throw err;
    }
  }

  private terms(requester: string): Pick<Reservation, 'requester' | 'expiresAt' | 'settledAfter'> {
    const now = this.clock.now();
    return { requester, expiresAt: now + RESERVATION_TTL_MS, settledAfter: now + RESERVATION_TTL_MS / 2 };
  }

  private prune(): void {
    const now = this.clock.now();
    for (const [id, r] of this.reservations) {
      // Landed (gossip brought the record) or already deleted again: the store counts it now.
      const key = r.kind === 'service' ? `service/${id}` : `peer/${id}`;
      const landed = r.kind === 'service' ? this.store.service(id) : this.store.peer(id);
      if (landed || this.store.tombstone(key)) {
        this.reservations.delete(id);
        continue;
      }
      if (r.expiresAt > now) continue;
      // Expired: ended only if the requester cannot hold the record unseen (docs above).
      const local = r.requester === this.localPeerId;
      const gone = !local && !this.store.peer(r.requester)?.isActive;
      if (local || gone || this.inSyncSince(r.requester, r.settledAfter)) this.reservations.delete(id);
    }
  }
}

/** ALREADY_EXISTS for a service pair, naming the service the allocator holds on it. */
class PairTaken extends ApiError {
  constructor(readonly occupant: string) {
    super('ALREADY_EXISTS', 'a service from this source peer to this target peer already exists');
  }
}

export function isAdmissionRequest(v: unknown): v is AdmissionRequest {
  const o = v as Record<string, unknown>;
  if (typeof o !== 'object' || o === null) return false;
  if (o.kind === 'service') {
    return ['id', 'source_peer_id', 'target_peer_id'].every((k) => typeof o[k] === 'string');
  }
  return (
    o.kind === 'peers' &&
    Array.isArray(o.ids) &&
    o.ids.length <= 10_000 &&
    o.ids.every((x) => typeof x === 'string')
  );
}
