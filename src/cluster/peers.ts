/**
 * Peer membership on this agent: adding a peer by the handshake (both roles), renaming,
 * removing, leaving, and the cluster id (init). Every change is a replicated record with a
 * version key (replica.ts) that gossip carries to the rest of the cluster; a join also merges
 * the two clusters' cluster and credential records (handshake-protocol.ts) and is admitted by
 * the allocator against max_nodes (allocator.ts).
 */
import type { KeyObject } from 'node:crypto';
import { type Clock, isoTime } from '../domain/clock.js';
import { ApiError, type ErrorCode, invalidRequest, notFound } from '../domain/errors.js';
import { newClusterId } from '../domain/ids.js';
import { parsePeerAddress } from '../domain/peer-address.js';
import type { EventActor } from '../events/event-log.js';
import { verifyLicense } from '../license/verify.js';
import type { AgentState, PeerRecord } from '../store/records.js';
import type { Store } from '../store/store.js';
import type { Admission } from './allocator.js';
import {
  type ConfirmRequest,
  type ConfirmResponse,
  confirmSigningInput,
  HANDSHAKE_TTL_MS,
  HANDSHAKE_VERSION,
  type HandshakePeerInfo,
  type HelloRequest,
  type HelloResponse,
  initiatorSigningInput,
  isClusterTransfer,
  mergedClusterRecords,
  newNonce,
  peerIdMatchesKey,
  responderSigningInput,
  survivingCluster,
  verifySignature,
} from './handshake-protocol.js';
import type { Identity } from './identity.js';
import { PeerCallError, type PeerCaller } from './peer-client.js';
import { peerRank, type Replica } from './replica.js';
import { keyOf, PEER_RANK, type WireRecord } from './replicated-records.js';

/** Handshakes a responder keeps open at once; more are refused until some complete or expire. */
const MAX_PENDING_HANDSHAKES = 256;

/** Codes a remote may answer a handshake step with that are passed on to our caller as they are. */
const PASSED_ON: ReadonlySet<ErrorCode> = new Set([
  'LICENSE_MISMATCH',
  'ALREADY_EXISTS',
  'NODE_LIMIT_EXCEEDED',
  'SERVICE_LIMIT_EXCEEDED',
  // The remote's allocator is out of reach or its handshake slots are full: worth a retry.
  'UNAVAILABLE',
]);

interface PendingHandshake {
  initiator: HandshakePeerInfo;
  nonceA: string;
  expiresAt: number;
}

export interface Deactivation {
  peer_id: string;
  version: number;
  is_active: boolean;
  deactivated_at: string | null;
}

export interface ClusterInit {
  cluster_id: string;
  created_by: string;
  oldest_peer_id: string;
  was_created: boolean;
  message: string;
}

export class Peers {
  private readonly pending = new Map<string, PendingHandshake>();
  /** One handshake of our own at a time: the checks and the write must see the same state. */
  private queue: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly store: Store,
    private readonly identity: Identity,
    private readonly caller: PeerCaller,
    private readonly clock: Clock,
    private readonly trustedLicenseKeys: readonly KeyObject[],
    private readonly replica: Replica,
    private readonly admission: Admission,
    /** Told of every peer that joined by a handshake, so gossip can sync with it at once. */
    private readonly onJoined: (peerId: string) => void = () => {},
    /** A remote peer was removed here: the gossip engine tells it (Gossip.removed). */
    private readonly onRemoved: (peer: PeerRecord, tombstone: WireRecord) => void = () => {},
  ) {}

  // --- initiator ---------------------------------------------------------------------------

  /** `actor`: who asked (the config event's actor, docs/events.md). */
  add(addressText: string, actor: EventActor): Promise<PeerRecord> {
    const address = parsePeerAddress(addressText);
    if (!address) {
      throw invalidRequest('address must be host:port with a port from 1 to 65535 (IPv6 hosts in brackets)');
    }
    const run = this.queue.then(() => this.handshake(address.text, actor));
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async handshake(address: string, actor: EventActor): Promise<PeerRecord> {
    const state = this.requireState();
    this.requireActive(state);
    const self = this.store.peer(state.localPeerId);
    if (self?.address === address || this.store.peers().some((p) => p.address === address)) {
      throw new ApiError('ALREADY_EXISTS', `a peer with address ${address} is already in the cluster`);
    }
    const identity = await this.callPeer(address, 'GET', '/v1/cluster/identity');
    const remote = identity as Partial<Record<'peer_id' | 'public_key' | 'license_id', unknown>>;
    if (typeof remote.peer_id !== 'string' || typeof remote.public_key !== 'string') {
      throw handshakeFailed(`${address} did not answer with a cluster identity`);
    }
    if (remote.license_id !== state.license.license_id) {
      throw new ApiError('LICENSE_MISMATCH', `the agent at ${address} runs under another license (or none)`);
    }
    if (remote.peer_id === state.localPeerId || this.store.peer(remote.peer_id)) {
      throw new ApiError('ALREADY_EXISTS', `peer ${remote.peer_id} is already in the cluster`);
    }
    if (!peerIdMatchesKey({ peer_id: remote.peer_id, public_key: remote.public_key })) {
      throw handshakeFailed(`${address} claims a peer id that its public key does not yield`);
    }

    const me = this.localInfo(state);
    const nonceA = newNonce();
    const hello = (await this.callPeer(address, 'POST', '/internal/v1/handshake/hello', {
      version: HANDSHAKE_VERSION,
      initiator: me,
      nonce_a: nonceA,
    } satisfies HelloRequest)) as Partial<HelloResponse>;
    const responder = hello.responder;
    if (
      !responder ||
      typeof hello.nonce_b !== 'string' ||
      typeof hello.signature_b !== 'string' ||
      !isPeerInfo(responder)
    ) {
      throw handshakeFailed(`${address} answered the handshake with a malformed message`);
    }
    // The key that signs must be the key the identity endpoint published.
    const proven =
      responder.peer_id === remote.peer_id &&
      responder.public_key === remote.public_key &&
      verifySignature(
        remote.public_key,
        responderSigningInput(nonceA, hello.nonce_b, me.peer_id, responder),
        hello.signature_b,
      );
    if (!proven)
      throw handshakeFailed(`${address} did not prove possession of the private key of ${remote.peer_id}`);
    this.checkLicense(state, responder, `the agent at ${address}`);
    this.checkNodeLimit(state, responder.active_peer_ids);
    this.checkServiceLimit(state, responder.service_count);
    // Our cluster's allocator admits the newcomers: two joins at max_nodes - 1, one wins.
    await this.admission.admitPeers(responder.active_peer_ids);

    const myRecords = this.clusterRecords();
    const signatureA = this.identity.sign(
      initiatorSigningInput(nonceA, hello.nonce_b, me, responder.peer_id, myRecords),
    );
    const confirmed = (await this.callPeer(address, 'POST', '/internal/v1/handshake/confirm', {
      nonce_b: hello.nonce_b,
      signature_a: signatureA.toString('base64'),
      cluster_records: myRecords,
    } satisfies ConfirmRequest)) as Partial<ConfirmResponse>;
    const theirRecords = confirmed.cluster_records;
    if (
      !isClusterTransfer(theirRecords) ||
      typeof confirmed.signature_c !== 'string' ||
      !verifySignature(
        remote.public_key,
        confirmSigningInput(nonceA, hello.nonce_b, theirRecords),
        confirmed.signature_c,
      )
    ) {
      throw handshakeFailed(`${address} confirmed the handshake without valid signed cluster records`);
    }

    const record = this.store.transaction(() => {
      // Checked again at the write: an incoming handshake may have completed while we waited.
      if (this.store.peer(responder.peer_id) || this.store.peers().some((p) => p.address === address)) {
        throw new ApiError('ALREADY_EXISTS', `peer ${responder.peer_id} is already in the cluster`);
      }
      this.checkNodeLimit(state, responder.active_peer_ids);
      this.checkServiceLimit(state, responder.service_count);
      const record = this.newRemotePeer(responder, address);
      this.replica.change(keyOf('peer', record.id), actor, () => this.store.insertPeer(record));
      this.mergeClusters(me, myRecords, responder, theirRecords);
      return record;
    });
    this.onJoined(record.id);
    return record;
  }

  /** Calls a peer; its documented refusals pass on, anything else is HANDSHAKE_FAILED. */
  private async callPeer(
    address: string,
    method: 'GET' | 'POST',
    path: string,
    body?: unknown,
  ): Promise<unknown> {
    let res: Awaited<ReturnType<PeerCaller['call']>>;
    try {
      res = await this.caller.call(address, method, path, body);
    } catch (err) {
      const why = err instanceof PeerCallError ? err.message : 'connection failed';
      throw handshakeFailed(`the agent at ${address} did not answer ${method} ${path}: ${why}`);
    }
    if (res.status === 200) {
      if (typeof res.body !== 'object' || res.body === null || Array.isArray(res.body)) {
        throw handshakeFailed(
          `the agent at ${address} answered ${method} ${path} with something other than an object`,
        );
      }
      return res.body;
    }
    const remote = res.body as { code?: unknown; error?: unknown };
    const code = typeof remote?.code === 'string' ? (remote.code as ErrorCode) : undefined;
    const text = typeof remote?.error === 'string' ? remote.error.slice(0, 200) : `status ${res.status}`;
    if (code && PASSED_ON.has(code)) throw new ApiError(code, `the agent at ${address} refused: ${text}`);
    throw handshakeFailed(`the agent at ${address} refused the handshake: ${text}`);
  }

  // --- responder ---------------------------------------------------------------------------

  hello(req: HelloRequest): HelloResponse {
    const state = this.store.agentState();
    if (!state) throw new ApiError('LICENSE_MISMATCH', 'this agent is not bootstrapped: it has no license');
    if (req.version !== HANDSHAKE_VERSION)
      throw handshakeFailed(`handshake version ${req.version} is not supported`);
    this.requireActive(state);
    const initiator = req.initiator;
    this.checkLicense(state, initiator, 'the initiator');
    if (!peerIdMatchesKey(initiator)) throw handshakeFailed('the peer id does not match the public key');
    if (
      ![initiator.created_at, initiator.oldest_peer_created_at].every((t) => Number.isFinite(Date.parse(t)))
    ) {
      throw handshakeFailed('the initiator sent a timestamp that does not parse');
    }
    if (!parsePeerAddress(initiator.address)) throw handshakeFailed('the initiator address is not host:port');
    if (initiator.peer_id === state.localPeerId || this.store.peer(initiator.peer_id)) {
      throw new ApiError('ALREADY_EXISTS', `peer ${initiator.peer_id} is already in the cluster`);
    }
    // The same checks in the same order as the initiator's, so a merge that does not fit gets
    // the same answer whichever side starts it.
    this.checkNodeLimit(state, initiator.active_peer_ids);
    this.checkServiceLimit(state, initiator.service_count);
    this.prunePending();
    if (this.pending.size >= MAX_PENDING_HANDSHAKES) {
      throw new ApiError('UNAVAILABLE', 'too many handshakes in progress; try again shortly');
    }
    const me = this.localInfo(state);
    const nonceB = newNonce();
    this.pending.set(nonceB, {
      initiator,
      nonceA: req.nonce_a,
      expiresAt: this.clock.now() + HANDSHAKE_TTL_MS,
    });
    const signature = this.identity.sign(responderSigningInput(req.nonce_a, nonceB, initiator.peer_id, me));
    return {
      version: HANDSHAKE_VERSION,
      responder: me,
      nonce_b: nonceB,
      signature_b: signature.toString('base64'),
    };
  }

  async confirm(req: ConfirmRequest): Promise<ConfirmResponse> {
    const pending = this.pending.get(req.nonce_b);
    this.pending.delete(req.nonce_b);
    if (!pending || pending.expiresAt <= this.clock.now())
      throw handshakeFailed('unknown or expired handshake');
    const state = this.requireState();
    this.requireActive(state);
    const { initiator, nonceA } = pending;
    if (!isClusterTransfer(req.cluster_records)) {
      throw handshakeFailed('the initiator sent no well-formed cluster records');
    }
    const theirRecords = req.cluster_records;
    const input = initiatorSigningInput(nonceA, req.nonce_b, initiator, state.localPeerId, theirRecords);
    if (!verifySignature(initiator.public_key, input, req.signature_a)) {
      throw handshakeFailed(
        `the initiator did not prove possession of the private key of ${initiator.peer_id}`,
      );
    }
    // Our own cluster's allocator admits the initiator's peers too.
    await this.admission.admitPeers(initiator.active_peer_ids);
    const address = parsePeerAddress(initiator.address)!.text;
    const myRecords = this.store.transaction(() => {
      // Our side of the merge as it was before the initiator joined it.
      const me = this.localInfo(state);
      const mine = this.clusterRecords();
      if (this.store.peer(initiator.peer_id) || this.store.peers().some((p) => p.address === address)) {
        throw new ApiError('ALREADY_EXISTS', `peer ${initiator.peer_id} is already in the cluster`);
      }
      this.checkNodeLimit(state, initiator.active_peer_ids);
      // Again at the write: a service created here while the handshake ran counts too.
      this.checkServiceLimit(state, initiator.service_count);
      // The initiating agent asked, on behalf of a client this side does not learn.
      const record = this.newRemotePeer(initiator, address);
      this.replica.change(keyOf('peer', record.id), { client_id: null, agent: initiator.peer_id }, () =>
        this.store.insertPeer(record),
      );
      this.mergeClusters(me, mine, initiator, theirRecords);
      return mine;
    });
    this.onJoined(initiator.peer_id);
    return {
      accepted: true,
      peer_id: state.localPeerId,
      cluster_records: myRecords,
      signature_c: this.identity.sign(confirmSigningInput(nonceA, req.nonce_b, myRecords)).toString('base64'),
    };
  }

  // --- local changes -----------------------------------------------------------------------

  rename(id: string, name: string | undefined, actor: EventActor): PeerRecord {
    return this.store.transaction(() => {
      const peer = this.store.peer(id);
      if (!peer) throw notFound(`no peer with id ${id}`);
      if (name === undefined || name === peer.name) return peer;
      const updated = {
        ...peer,
        name,
        version: peer.version + 1,
        updatedAt: isoTime(this.clock.now()),
        vkey: this.replica.nextVkey(peer.vkey, peerRank(peer)),
      };
      this.replica.change(keyOf('peer', id), actor, () => this.store.updatePeer(updated));
      return updated;
    });
  }

  /** Removes a remote peer and every service that involves it. */
  remove(id: string, actor: EventActor): void {
    const { peer, tombstone } = this.store.transaction(() => {
      const state = this.requireState();
      const peer = this.store.peer(id);
      if (!peer) throw notFound(`no peer with id ${id}`);
      if (id === state.localPeerId) {
        throw new ApiError(
          'CANNOT_DELETE_LOCAL',
          'this is the local peer: leave the cluster with DELETE /v1/peers/self',
        );
      }
      // The tombstone keeps anti-entropy from bringing the peer back (docs/decisions.md §5).
      const tombstone = { key: keyOf('peer', id), vkey: this.replica.nextVkey(peer.vkey, PEER_RANK.removed) };
      this.replica.change(tombstone.key, actor, () => {
        this.replica.deletePeerAndServices(id, tombstone.vkey, this.clock.now(), actor);
        this.store.putTombstone({ ...tombstone, arrivedAt: this.clock.now() });
      });
      return { peer, tombstone: { ...tombstone, body: null } };
    });
    this.onRemoved(peer, tombstone);
  }

  /** DELETE /v1/peers/self: final for this agent; repeated calls answer the same. */
  leave(actor: EventActor): Deactivation {
    return this.store.transaction(() => {
      const state = this.requireState();
      const self = this.store.peer(state.localPeerId)!;
      if (self.isActive) {
        const now = isoTime(this.clock.now());
        const updated = {
          ...self,
          isActive: false,
          deactivatedAt: now,
          version: self.version + 1,
          updatedAt: now,
          vkey: this.replica.nextVkey(self.vkey, PEER_RANK.inactive),
        };
        this.replica.change(keyOf('peer', self.id), actor, () => this.store.updatePeer(updated));
        return deactivation(updated);
      }
      return deactivation(self);
    });
  }

  initCluster(force: boolean, actor: EventActor): ClusterInit {
    return this.store.transaction(() => {
      const state = this.requireState();
      const oldest = this.oldestActivePeer(state);
      if (!force) {
        return {
          cluster_id: state.clusterId,
          created_by: state.clusterCreatedBy,
          oldest_peer_id: oldest.id,
          was_created: false,
          message: 'the cluster exists; nothing changed',
        };
      }
      const clusterId = newClusterId();
      this.replica.change('cluster', actor, () =>
        this.store.setCluster(clusterId, state.localPeerId, this.replica.nextVkey(state.clusterVkey, 0)),
      );
      return {
        cluster_id: clusterId,
        created_by: state.localPeerId,
        oldest_peer_id: oldest.id,
        was_created: true,
        message: 'a new cluster id was generated; gossip carries it to every peer',
      };
    });
  }

  // --- helpers -----------------------------------------------------------------------------

  /**
   * The other side must hold a license signed by a key this agent trusts, with our license_id.
   * The id alone proves nothing: the identity endpoint shows it to anyone.
   */
  private checkLicense(state: AgentState, info: HandshakePeerInfo, who: string): void {
    if (
      info.license_id !== state.license.license_id ||
      info.license?.license_id !== state.license.license_id
    ) {
      throw new ApiError('LICENSE_MISMATCH', `${who} runs under another license`);
    }
    try {
      verifyLicense(info.license, this.trustedLicenseKeys, this.clock.now());
    } catch (err) {
      throw new ApiError(
        'LICENSE_MISMATCH',
        `${who} did not present a valid license: ${(err as Error).message}`,
      );
    }
  }

  /** docs/decisions.md §5: leaving is final, so a departed agent neither joins nor lets others join it. */
  private requireActive(state: AgentState): void {
    if (!this.store.peer(state.localPeerId)?.isActive) {
      throw handshakeFailed('this agent has left the cluster (DELETE /v1/peers/self is final)');
    }
  }

  private requireState(): AgentState {
    const state = this.store.agentState();
    if (!state) throw notFound('this agent is not bootstrapped');
    return state;
  }

  private localInfo(state: AgentState): HandshakePeerInfo {
    const oldest = this.oldestActivePeer(state);
    const self = this.store.peer(state.localPeerId)!;
    return {
      peer_id: state.localPeerId,
      public_key: this.identity.publicKeyBase64,
      address: self.address,
      created_at: self.createdAt,
      license_id: state.license.license_id,
      license: state.license,
      cluster_id: state.clusterId,
      cluster_created_by: state.clusterCreatedBy,
      oldest_peer_id: oldest.id,
      oldest_peer_created_at: oldest.createdAt,
      active_peer_ids: [...this.store.activePeerIds()],
      service_count: this.store.serviceCount(),
      name: self.name,
      version: self.version,
    };
  }

  /** This agent's cluster and credential records, as a handshake exchanges them. */
  private clusterRecords(): WireRecord[] {
    return [this.replica.held('cluster')!, this.replica.held('credential')!];
  }

  /** A merge must fit max_services: both clusters' services together (they never overlap). */
  private checkServiceLimit(state: AgentState, remoteServices: number): void {
    const total = this.store.serviceCount() + remoteServices;
    if (total > state.license.max_services) {
      throw new ApiError(
        'SERVICE_LIMIT_EXCEEDED',
        `joining would make ${total} services; the license allows ${state.license.max_services}`,
      );
    }
  }

  private oldestActivePeer(state: AgentState): PeerRecord {
    const active = this.store.peers().filter((p) => p.isActive);
    const byAge = (a: PeerRecord, b: PeerRecord) =>
      a.createdAt === b.createdAt ? (a.id < b.id ? -1 : 1) : a.createdAt < b.createdAt ? -1 : 1;
    return active.sort(byAge)[0] ?? this.store.peer(state.localPeerId)!;
  }

  private checkNodeLimit(state: AgentState, remoteActive: readonly string[]): void {
    const union = new Set([...this.store.activePeerIds(), ...remoteActive]);
    if (union.size > state.license.max_nodes) {
      throw new ApiError(
        'NODE_LIMIT_EXCEEDED',
        `joining would make ${union.size} active peers; the license allows ${state.license.max_nodes}`,
      );
    }
  }

  /**
   * The other side's peer row as this agent first writes it, with the name and version the other
   * side announced for itself in the signed handshake: this fresh write sorts after the peer's
   * own record, so a row made up here would undo its `--name` and any earlier rename.
   */
  private newRemotePeer(info: HandshakePeerInfo, address: string): PeerRecord {
    const now = isoTime(this.clock.now());
    // A peer removed before and now added again starts an epoch above its tombstone.
    const removed = this.store.tombstone(keyOf('peer', info.peer_id));
    const named =
      typeof info.name === 'string' &&
      info.name.length <= 255 &&
      Number.isSafeInteger(info.version) &&
      info.version! >= 1;
    return {
      id: info.peer_id,
      name: named ? info.name! : '',
      publicKey: info.public_key,
      address,
      isActive: true,
      version: named ? info.version! : 1,
      deactivatedAt: null,
      createdAt: isoTime(Date.parse(info.created_at)),
      updatedAt: now,
      vkey: this.replica.nextVkey(removed?.vkey, PEER_RANK.active, removed ? 1 : 0),
    };
  }

  /**
   * Both sides of a join adopt the surviving cluster's id and credential (docs/decisions.md §5: the
   * cluster whose oldest peer is older; ties by peer id).
   */
  private mergeClusters(
    me: HandshakePeerInfo,
    mine: WireRecord[],
    them: HandshakePeerInfo,
    theirs: WireRecord[],
  ): void {
    const iWin = survivingCluster(me, them) === me;
    const merged = iWin ? mergedClusterRecords(mine, theirs) : mergedClusterRecords(theirs, mine);
    this.replica.apply(merged);
    // A peer removed before and added again: its new record replaces the tombstone.
    this.store.deleteTombstone(keyOf('peer', them.peer_id));
  }

  private prunePending(): void {
    const now = this.clock.now();
    for (const [nonce, p] of this.pending) if (p.expiresAt <= now) this.pending.delete(nonce);
  }
}

const handshakeFailed = (message: string) => new ApiError('HANDSHAKE_FAILED', message);

const deactivation = (p: PeerRecord): Deactivation => ({
  peer_id: p.id,
  version: p.version,
  is_active: p.isActive,
  deactivated_at: p.deactivatedAt,
});

function isPeerInfo(v: unknown): v is HandshakePeerInfo {
  const o = v as Record<string, unknown>;
  return (
    typeof o === 'object' &&
    o !== null &&
    [
      'peer_id',
      'public_key',
      'address',
      'created_at',
      'license_id',
      'cluster_id',
      'cluster_created_by',
      'oldest_peer_id',
      'oldest_peer_created_at',
    ].every((k) => typeof o[k] === 'string') &&
    [o.created_at, o.oldest_peer_created_at].every((t) => Number.isFinite(Date.parse(t as string))) &&
    typeof o.license === 'object' &&
    o.license !== null &&
    Array.isArray(o.active_peer_ids) &&
    o.active_peer_ids.length <= 10_000 &&
    o.active_peer_ids.every((x) => typeof x === 'string') &&
    Number.isSafeInteger(o.service_count) &&
    (o.service_count as number) >= 0
  );
}
