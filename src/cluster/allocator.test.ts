import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { serviceRecord } from '../../test/helpers/service-record.js';
import { isoTime, ManualClock } from '../domain/clock.js';
import { ApiError, type ErrorCode } from '../domain/errors.js';
import { ADMIN } from '../domain/scopes.js';
import type { PeerRecord, ServiceRecord } from '../store/records.js';
import { Store } from '../store/store.js';
import {
  type AdmissionAnswer,
  type AdmissionRequest,
  Allocator,
  isAdmissionRequest,
  RESERVATION_TTL_MS,
} from './allocator.js';
import { hashClusterSecret, keyId } from './cluster-credential.js';

const T0 = Date.UTC(2026, 0, 1);

const root = mkdtempSync(join(tmpdir(), 'alloc-'));
let files = 0;
const stores: Store[] = [];
after(() => {
  for (const s of stores) s.close();
  rmSync(root, { recursive: true, force: true });
});
/** A store on a file of its own under `root`, closed and deleted when the file's tests end. */
function openStore(): Store {
  const store = new Store(join(root, `${files++}.db`));
  stores.push(store);
  return store;
}
const LOCAL = 'a0'.repeat(16);
const id = (n: number) => n.toString(16).padStart(2, '0').repeat(16);

function peer(peerId: string, over: Partial<PeerRecord> = {}): PeerRecord {
  return {
    id: peerId,
    name: '',
    publicKey: `${peerId}-key`,
    address: `${peerId}.example:7000`,
    isActive: true,
    version: 1,
    deactivatedAt: null,
    createdAt: isoTime(T0),
    updatedAt: isoTime(T0),
    vkey: '',
    ...over,
  };
}

function service(id: string, sourcePeerId: string, targetPeerId: string): ServiceRecord {
  return serviceRecord({ id, sourcePeerId, targetPeerId });
}

/** A bootstrapped store whose local peer is LOCAL, plus `others` peers, under the given limits. */
function setup(limits: { maxNodes?: number; maxServices?: number } = {}, others: PeerRecord[] = []) {
  const clock = new ManualClock(T0);
  const store = openStore();
  const secretHash = hashClusterSecret('s');
  store.bootstrap({
    state: {
      license: {
        customer_id: 'c',
        license_id: 'l',
        issued_at: isoTime(T0 - 1000),
        expires_at: isoTime(T0 + 365 * 86_400_000),
        max_nodes: limits.maxNodes ?? 10,
        max_services: limits.maxServices ?? 10,
        signature: 'x',
      },
      localPeerId: LOCAL,
      clusterId: 'cluster',
      description: '',
      bootstrappedAt: isoTime(T0),
      clusterCreatedBy: LOCAL,
      clusterVkey: '',
      credentialVkey: '',
    },
    localPeer: peer(LOCAL),
    firstCredential: {
      clientId: 'mc_x',
      secretHash: Buffer.alloc(32),
      scopes: [ADMIN],
      licenseId: 'l',
      createdAt: isoTime(T0),
      lastUsedAt: null,
    },
    clusterSecret: {
      kid: keyId(secretHash),
      version: 1,
      clientId: 'mcc_x',
      secretHash,
      rotatedBy: LOCAL,
      rotatedAt: isoTime(T0),
      validUntil: null,
      replicated: true,
    },
  });
  // Younger than the local peer, so the local agent is the allocator.
  for (const p of others) store.insertPeer(p);
  return { clock, store, allocator: new Allocator(store, LOCAL, clock) };
}

/** The gossip engine's answer to "has this peer's root matched ours since": yes. */
const inSync = () => true;

const later = (ms: number) => ({ createdAt: isoTime(T0 + ms) });
const P1 = id(1);
const P2 = id(2);
const P3 = id(3);

const svc = (serviceId: string, source: string, target: string): AdmissionRequest => ({
  kind: 'service',
  id: serviceId,
  source_peer_id: source,
  target_peer_id: target,
});

function throwsCode(fn: () => unknown, code: ErrorCode): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(err instanceof ApiError, String(err));
    assert.equal(err.code, code, err.message);
    return true;
  });
}

async function rejectsCode(p: Promise<unknown>, code: ErrorCode, status: number): Promise<ApiError> {
  let caught: unknown;
  await p.catch((err: unknown) => {
    caught = err;
  });
  assert.ok(caught instanceof ApiError, `expected an ApiError, got ${String(caught)}`);
  assert.equal(caught.code, code, caught.message);
  assert.equal(caught.status, status);
  return caught;
}

describe('Allocator.decide: services', { timeout: 30_000 }, () => {
  const peers = [peer(P1, later(1)), peer(P2, later(2)), peer(P3, later(3))];

  it('grants up to max_services counting stored services and reservations, then refuses', () => {
    const { store, allocator } = setup({ maxServices: 3 }, peers);
    store.insertService(service('s0', LOCAL, P1));
    allocator.decide(svc('s1', LOCAL, P2));
    allocator.decide(svc('s2', LOCAL, P3));
    throwsCode(() => allocator.decide(svc('s3', P1, P2)), 'SERVICE_LIMIT_EXCEEDED');
    // Still refused later, while the reservations live.
    throwsCode(() => allocator.decide(svc('s4', P2, P1)), 'SERVICE_LIMIT_EXCEEDED');
  });

  it('asking again for a granted id is not counted twice', () => {
    const { allocator } = setup({ maxServices: 1 }, peers);
    allocator.decide(svc('s1', LOCAL, P1));
    allocator.decide(svc('s1', LOCAL, P1));
    throwsCode(() => allocator.decide(svc('s2', LOCAL, P2)), 'SERVICE_LIMIT_EXCEEDED');
  });

  it('refuses a pair that is reserved or stored: ALREADY_EXISTS', () => {
    const { store, allocator } = setup({ maxServices: 10 }, peers);
    allocator.decide(svc('s1', LOCAL, P1));
    // Asked by another agent (P2) for the same pair.
    throwsCode(() => allocator.decide(svc('s2', LOCAL, P1), P2), 'ALREADY_EXISTS');
    // The reverse direction is another pair.
    allocator.decide(svc('s3', P1, LOCAL));
    store.insertService(service('s9', P2, P3));
    throwsCode(() => allocator.decide(svc('s4', P2, P3)), 'ALREADY_EXISTS');
  });

  it("a requester's new request for a pair replaces its own abandoned reservation on it", () => {
    // P2 was granted s1 on (LOCAL, P1), then was killed before it committed: the restarted P2
    // asks again for the pair with a new id and must not wait for the 30 s reservation.
    const { allocator } = setup({ maxServices: 1 }, peers);
    allocator.decide(svc('s1', LOCAL, P1), P2);
    allocator.decide(svc('s2', LOCAL, P1), P2);
    // The replaced reservation no longer counts: the only slot is s2's, not s1's and s2's.
    throwsCode(() => allocator.decide(svc('s3', P1, P3), P3), 'SERVICE_LIMIT_EXCEEDED');
    // Another agent still finds the pair taken.
    throwsCode(() => allocator.decide(svc('s4', LOCAL, P1), P3), 'ALREADY_EXISTS');
  });

  it('reservations expire after RESERVATION_TTL_MS', () => {
    const { clock, allocator } = setup({ maxServices: 1 }, peers);
    allocator.decide(svc('s1', LOCAL, P1));
    clock.advance(RESERVATION_TTL_MS - 1);
    throwsCode(() => allocator.decide(svc('s2', LOCAL, P2)), 'SERVICE_LIMIT_EXCEEDED');
    throwsCode(() => allocator.decide(svc('s3', LOCAL, P1), P2), 'ALREADY_EXISTS');
    clock.advance(1);
    allocator.decide(svc('s2', LOCAL, P2));
    // s1's pair is free again too (s2 now holds the only slot, so use the limit elsewhere).
    throwsCode(() => allocator.decide(svc('s3', LOCAL, P1)), 'SERVICE_LIMIT_EXCEEDED');
  });

  it("a remote requester's expired reservation holds until its root is seen in sync after the grant", () => {
    const { clock, allocator } = setup({ maxServices: 1 }, peers);
    const asked: [string, number][] = [];
    let synced = false;
    allocator.connect(
      async () => ({ granted: true }),
      (peerId, since) => {
        asked.push([peerId, since]);
        return synced;
      },
    );
    allocator.decide(svc('s1', P2, P1), P2);
    clock.advance(RESERVATION_TTL_MS);
    // P2 was granted s1 and then not heard from in sync: it may hold s1 (cut off after its
    // commit), so the slot stays taken and a second service cannot pass the limit.
    throwsCode(() => allocator.decide(svc('s2', P3, P1), P3), 'SERVICE_LIMIT_EXCEEDED');
    assert.deepEqual(asked.at(-1), [P2, T0 + RESERVATION_TTL_MS / 2]);
    synced = true;
    allocator.decide(svc('s2', P3, P1), P3);
  });

  it('an expired reservation ends when its requester has left or was removed', () => {
    for (const gone of ['left', 'removed'] as const) {
      const { clock, store, allocator } = setup({ maxServices: 1 }, peers);
      allocator.connect(
        async () => ({ granted: true }),
        () => false,
      );
      allocator.decide(svc('s1', P2, P1), P2);
      clock.advance(RESERVATION_TTL_MS);
      throwsCode(() => allocator.decide(svc('s2', P3, P1), P3), 'SERVICE_LIMIT_EXCEEDED');
      if (gone === 'left') store.updatePeer({ ...store.peer(P2)!, isActive: false });
      else store.deletePeer(P2);
      allocator.decide(svc('s2', P3, P1), P3);
    }
  });

  it('drops a reservation once its service lands: a later local delete frees the slot', () => {
    const { store, allocator } = setup({ maxServices: 1 }, peers);
    allocator.decide(svc('s1', LOCAL, P1));
    store.insertService(service('s1', LOCAL, P1));
    // Counted once (by the store), and the reservation is dropped here.
    throwsCode(() => allocator.decide(svc('s2', LOCAL, P2)), 'SERVICE_LIMIT_EXCEEDED');
    // Deleted without a tombstone (a cascade from a removed peer deletes children that way).
    store.deleteService('s1');
    allocator.decide(svc('s2', LOCAL, P2));
  });

  it('drops a reservation whose service was tombstoned before it landed', () => {
    const { store, allocator } = setup({ maxServices: 1 }, peers);
    allocator.decide(svc('s1', LOCAL, P1));
    throwsCode(() => allocator.decide(svc('s2', LOCAL, P2)), 'SERVICE_LIMIT_EXCEEDED');
    store.putTombstone({ key: 'service/s1', vkey: 'x', arrivedAt: T0 });
    allocator.decide(svc('s2', LOCAL, P2));
  });

  it('refuses when the store alone is full', () => {
    const { store, allocator } = setup({ maxServices: 1 }, peers);
    store.insertService(service('s0', P1, P2));
    throwsCode(() => allocator.decide(svc('s1', LOCAL, P1)), 'SERVICE_LIMIT_EXCEEDED');
  });

  it('refuses on an agent that is not bootstrapped: UNAVAILABLE', () => {
    const clock = new ManualClock(T0);
    const store = openStore();
    throwsCode(() => new Allocator(store, LOCAL, clock).decide(svc('s', LOCAL, P1)), 'UNAVAILABLE');
  });
});

describe('Allocator.decide: peers', { timeout: 30_000 }, () => {
  it('refuses when active + reserved + requested exceed max_nodes: NODE_LIMIT_EXCEEDED', () => {
    const inactive = peer(P2, { ...later(2), isActive: false, deactivatedAt: isoTime(T0) });
    const { allocator } = setup({ maxNodes: 4 }, [peer(P1, later(1)), inactive]);
    // Active: LOCAL and P1 (P2 is inactive and does not count).
    allocator.decide({ kind: 'peers', ids: [id(10)] });
    allocator.decide({ kind: 'peers', ids: [id(11)] });
    throwsCode(() => allocator.decide({ kind: 'peers', ids: [id(12)] }), 'NODE_LIMIT_EXCEEDED');
    // Ids already counted add nothing: active ones, reserved ones, repeats.
    allocator.decide({ kind: 'peers', ids: [LOCAL, P1, id(10), id(11), id(11)] });
  });

  it('counts a whole batch at once', () => {
    const { allocator } = setup({ maxNodes: 3 }, [peer(P1, later(1))]);
    throwsCode(() => allocator.decide({ kind: 'peers', ids: [id(10), id(11)] }), 'NODE_LIMIT_EXCEEDED');
    // Nothing of the refused batch was reserved.
    allocator.decide({ kind: 'peers', ids: [id(11)] });
  });

  it('peer reservations expire after RESERVATION_TTL_MS', () => {
    const { clock, allocator } = setup({ maxNodes: 2 });
    allocator.decide({ kind: 'peers', ids: [id(10)] });
    throwsCode(() => allocator.decide({ kind: 'peers', ids: [id(11)] }), 'NODE_LIMIT_EXCEEDED');
    clock.advance(RESERVATION_TTL_MS - 1);
    throwsCode(() => allocator.decide({ kind: 'peers', ids: [id(11)] }), 'NODE_LIMIT_EXCEEDED');
    clock.advance(1);
    allocator.decide({ kind: 'peers', ids: [id(11)] });
  });

  it('drops a peer reservation once the peer lands or is tombstoned', () => {
    const { store, allocator } = setup({ maxNodes: 3 });
    allocator.decide({ kind: 'peers', ids: [id(10), id(11)] });
    // id(10) lands, then leaves: inactive, it no longer counts, and nor does its reservation.
    store.insertPeer(peer(id(10), { ...later(10), isActive: false, deactivatedAt: isoTime(T0) }));
    // id(11)'s join was undone (removed) before it landed here.
    store.putTombstone({ key: `peer/${id(11)}`, vkey: 'x', arrivedAt: T0 });
    allocator.decide({ kind: 'peers', ids: [id(12), id(13)] });
  });
});

describe('Allocator.allocator', { timeout: 30_000 }, () => {
  it('is the oldest active peer by created_at, then id', () => {
    const { store, allocator } = setup({}, [peer(P1, later(5)), peer(P2, later(5))]);
    assert.equal(allocator.allocator()?.id, LOCAL);
    // Two peers older than LOCAL, created at the same instant: the smaller id wins.
    store.insertPeer(peer(id(9), { createdAt: isoTime(T0 - 10) }));
    store.insertPeer(peer(id(8), { createdAt: isoTime(T0 - 10) }));
    assert.equal(allocator.allocator()?.id, id(8));
    store.insertPeer(peer(id(7), { createdAt: isoTime(T0 - 9) }));
    assert.equal(allocator.allocator()?.id, id(8));
  });

  it('skips inactive peers', () => {
    const old = peer(P1, { createdAt: isoTime(T0 - 100), isActive: false, deactivatedAt: isoTime(T0) });
    const { store, allocator } = setup({}, [old]);
    assert.equal(allocator.allocator()?.id, LOCAL);
    store.updatePeer({ ...store.peer(LOCAL)!, isActive: false, deactivatedAt: isoTime(T0) });
    assert.equal(allocator.allocator(), undefined);
  });
});

describe('Allocator.admit', { timeout: 30_000 }, () => {
  /** P1 is older than LOCAL, so P1 is the allocator and LOCAL must ask it. */
  const remoteSetup = (maxServices = 10) =>
    setup({ maxServices }, [peer(P1, { createdAt: isoTime(T0 - 1) })]);

  it('decides locally when this agent is the allocator', async () => {
    const { allocator } = setup({ maxServices: 1 }, [peer(P1, later(1))]);
    let calls = 0;
    allocator.connect(async () => {
      calls++;
      return { granted: true };
    }, inSync);
    await allocator.admitService(service('s1', LOCAL, P1));
    await rejectsCode(allocator.admitService(service('s2', P1, LOCAL)), 'SERVICE_LIMIT_EXCEEDED', 422);
    assert.equal(calls, 0);
  });

  it('asks the remote allocator and passes on its grant', async () => {
    const { allocator } = remoteSetup();
    const calls: [string, AdmissionRequest][] = [];
    allocator.connect(async (to, request) => {
      calls.push([to.id, request]);
      return { granted: true };
    }, inSync);
    await allocator.admitService(service('s1', LOCAL, P1));
    await allocator.admitPeers([id(10), id(11)]);
    assert.deepEqual(calls, [
      [P1, { kind: 'service', id: 's1', source_peer_id: LOCAL, target_peer_id: P1 }],
      [P1, { kind: 'peers', ids: [id(10), id(11)] }],
    ]);
  });

  it('an unreachable allocator is 503 UNAVAILABLE', async () => {
    const { allocator } = remoteSetup();
    allocator.connect(async () => {
      throw new Error('connect ECONNREFUSED');
    }, inSync);
    const err = await rejectsCode(allocator.admitService(service('s1', LOCAL, P1)), 'UNAVAILABLE', 503);
    assert.match(err.message, new RegExp(P1));
    assert.match(err.message, /ECONNREFUSED/);
    await rejectsCode(allocator.admitPeers([id(10)]), 'UNAVAILABLE', 503);
  });

  it('is UNAVAILABLE before the transport is connected', async () => {
    const { allocator } = remoteSetup();
    await rejectsCode(allocator.admitService(service('s1', LOCAL, P1)), 'UNAVAILABLE', 503);
  });

  it('passes a refusal code through; an unexpected one becomes UNAVAILABLE', async () => {
    const { allocator } = remoteSetup();
    let answer: AdmissionAnswer = { granted: false, code: 'SERVICE_LIMIT_EXCEEDED', error: 'full' };
    allocator.connect(async () => answer, inSync);
    const err = await rejectsCode(
      allocator.admitService(service('s1', LOCAL, P1)),
      'SERVICE_LIMIT_EXCEEDED',
      422,
    );
    assert.equal(err.message, 'full');
    answer = { granted: false, code: 'NODE_LIMIT_EXCEEDED', error: 'too many' };
    await rejectsCode(allocator.admitPeers([id(10)]), 'NODE_LIMIT_EXCEEDED', 422);
    answer = { granted: false, code: 'ALREADY_EXISTS', error: 'pair' };
    await rejectsCode(allocator.admitService(service('s1', LOCAL, P1)), 'ALREADY_EXISTS', 409);
    // A code outside what an allocator decides is not trusted to pass as is.
    answer = { granted: false, code: 'FORBIDDEN', error: 'no' };
    await rejectsCode(allocator.admitService(service('s1', LOCAL, P1)), 'UNAVAILABLE', 503);
    answer = { granted: false, code: 'UNAVAILABLE', error: 'not me' };
    await rejectsCode(allocator.admitService(service('s1', LOCAL, P1)), 'UNAVAILABLE', 503);
  });

  it('two agents: the allocator answers for the other one, and the limit holds across both', async () => {
    // Two stores holding the same peers: P1 (older) allocates for both.
    const peersOf = [peer(P1, { createdAt: isoTime(T0 - 1) })];
    const a = setup({ maxServices: 1 }, peersOf);
    const b = setup({ maxServices: 1 }, peersOf);
    const remote = new Allocator(b.store, P1, b.clock);
    a.allocator.connect(async (to, request) => {
      assert.equal(to.id, P1);
      return remote.answer(request, LOCAL);
    }, inSync);
    await a.allocator.admitService(service('s1', LOCAL, P1));
    await rejectsCode(a.allocator.admitService(service('s2', P1, LOCAL)), 'SERVICE_LIMIT_EXCEEDED', 422);
    // An agent that is not the allocator says so instead of deciding.
    const notMe = a.allocator.answer(svc('s3', P1, LOCAL), P2);
    assert.equal(notMe.granted, false);
    assert.equal(!notMe.granted && notMe.code, 'UNAVAILABLE');
  });
});

describe('Allocator: racing creates at max - 1', { timeout: 30_000 }, () => {
  it('of two agents creating at once through the allocator, exactly one gets through', async () => {
    const peersOf = [peer(P1, { createdAt: isoTime(T0 - 1) }), peer(P2, later(1))];
    const home = setup({ maxServices: 2 }, peersOf);
    home.store.insertService(service('s0', P1, P2));
    const remote = new Allocator(home.store, P1, home.clock);
    const agents = [setup({ maxServices: 2 }, peersOf), setup({ maxServices: 2 }, peersOf)];
    agents.forEach((a, i) => {
      // Each request reaches the allocator after its own network delay.
      a.allocator.connect(async (_to, request) => {
        await new Promise((r) => setImmediate(r));
        return remote.answer(request, id(20 + i));
      }, inSync);
    });
    const results = await Promise.allSettled([
      agents[0]!.allocator.admitService(service('x1', LOCAL, P1)),
      agents[1]!.allocator.admitService(service('x2', LOCAL, P2)),
    ]);
    assert.deepEqual(results.map((r) => r.status).sort(), ['fulfilled', 'rejected']);
    const refused = results.find((r) => r.status === 'rejected') as PromiseRejectedResult;
    assert.equal((refused.reason as ApiError).code, 'SERVICE_LIMIT_EXCEEDED');
  });
});

describe('isAdmissionRequest', { timeout: 30_000 }, () => {
  it('accepts the two request shapes and refuses others', () => {
    assert.equal(isAdmissionRequest(svc('s', 'a', 'b')), true);
    assert.equal(isAdmissionRequest({ kind: 'peers', ids: ['a', 'b'] }), true);
    assert.equal(isAdmissionRequest({ kind: 'peers', ids: [] }), true);
    for (const bad of [
      null,
      'service',
      {},
      { kind: 'service', id: 's', source_peer_id: 'a' },
      { kind: 'service', id: 1, source_peer_id: 'a', target_peer_id: 'b' },
      { kind: 'peers', ids: 'a' },
      { kind: 'peers', ids: [1] },
      { kind: 'peers', ids: Array(10_001).fill('a') },
      { kind: 'other', ids: [] },
    ]) {
      assert.equal(isAdmissionRequest(bad), false, JSON.stringify(bad)?.slice(0, 80));
    }
  });
});
