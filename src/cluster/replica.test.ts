import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import fc from 'fast-check';
import { isoTime, ManualClock } from '../domain/clock.js';
import { ApiError } from '../domain/errors.js';
import { ADMIN } from '../domain/scopes.js';
import type { PeerRecord, ServiceRecord } from '../store/records.js';
import { Store } from '../store/store.js';
import type { Admission } from './allocator.js';
import { hashClusterSecret, keyId } from './cluster-credential.js';
import { decodeStamp, encodeStamp, HybridClock, MAX_FORWARD_DRIFT_MS } from './hlc.js';
import { Identity } from './identity.js';
import { peerRank, peerRecord, Replica, serviceRecord } from './replica.js';
import {
  DELETED_RANK,
  keyOf,
  LIVE_RANK,
  makeVkey,
  PEER_RANK,
  parseVkey,
  type WireRecord,
} from './replicated-records.js';
import { ServiceConfig } from './service-config.js';

/** The actor of the writes these tests make (docs/events.md). */
const BY = { client_id: null, agent: 'test' };

const T0 = Date.UTC(2026, 0, 1);
const HOUR = 3_600_000;

/** Made once: key generation is the slow part of a node, and stores are new on every run. */
const IDENTITIES = Array.from({ length: 4 }, () => new Identity(Identity.generatePem()));

const root = mkdtempSync(join(tmpdir(), 'replica-'));
let dirs = 0;
const opened = new Set<Store>();
after(() => {
  for (const s of opened) s.close();
  rmSync(root, { recursive: true, force: true });
});

/** Property runs make hundreds of stores: each run closes its own. */
function close(nodes: Node[]): void {
  for (const n of nodes) {
    n.store.close();
    opened.delete(n.store);
  }
}

const admitAll: Admission = { admitService: async () => {}, admitPeers: async () => {} };

interface Node {
  identity: Identity;
  store: Store;
  clock: ManualClock;
  replica: Replica;
  config: ServiceConfig;
}

interface ClusterOptions {
  /** Wall clock of each node relative to T0. */
  offsets?: number[];
  horizonMs?: number;
}

/**
 * `n` agents bootstrapped alike: the same cluster record and credential (same vkeys), each with
 * its own local peer, and every peer record delivered to every other agent by apply().
 */
function cluster(n: number, options: ClusterOptions = {}): Node[] {
  const dir = join(root, String(dirs++));
  mkdirSync(dir);
  const founder = IDENTITIES[0]!.peerId;
  const clusterVkey = makeVkey(0, 0, encodeStamp({ wall: T0, counter: 0, origin: founder }));
  const credentialVkey = makeVkey(0, 1, encodeStamp({ wall: T0, counter: 1, origin: founder }));
  const secretHash = hashClusterSecret('cluster secret');
  const nodes = IDENTITIES.slice(0, n).map((identity, i): Node => {
    const clock = new ManualClock(T0 + (options.offsets?.[i] ?? 0));
    const store = new Store(join(dir, `node${i}.db`));
    // Durability is not under test here, and an fsync per write would make the properties slow.
    store.db.pragma('synchronous = OFF');
    opened.add(store);
    const replica = new Replica(
      store,
      identity.peerId,
      new HybridClock(identity.peerId, clock),
      clock,
      options.horizonMs,
    );
    const now = isoTime(T0 + i);
    store.bootstrap({
      state: {
        license: {
          customer_id: 'c',
          license_id: 'l',
          issued_at: isoTime(T0 - HOUR),
          expires_at: isoTime(T0 + 365 * 24 * HOUR),
          max_nodes: 10,
          max_services: 1000,
          signature: 'x',
        },
        localPeerId: identity.peerId,
        clusterId: 'cluster-1',
        description: '',
        bootstrappedAt: now,
        clusterCreatedBy: founder,
        clusterVkey,
        credentialVkey,
      },
      localPeer: {
        id: identity.peerId,
        name: `node${i}`,
        publicKey: identity.publicKeyBase64,
        address: `127.0.0.1:${7000 + i}`,
        isActive: true,
        version: 1,
        deactivatedAt: null,
        createdAt: now,
        updatedAt: now,
        vkey: replica.nextVkey(undefined, PEER_RANK.active),
      },
      firstCredential: {
        clientId: `mc_${i}`,
        secretHash: Buffer.alloc(32),
        scopes: [ADMIN],
        licenseId: 'l',
        createdAt: now,
        lastUsedAt: null,
      },
      clusterSecret: {
        kid: keyId(secretHash),
        version: 1,
        clientId: 'mcc_cluster',
        secretHash,
        rotatedBy: founder,
        rotatedAt: isoTime(T0),
        validUntil: null,
        replicated: true,
      },
    });
    replica.init();
    return { identity, store, clock, replica, config: new ServiceConfig(store, clock, replica, admitAll) };
  });
  for (const to of nodes) {
    const others = nodes.filter((x) => x !== to).map((x) => peerRecord(x.store.peer(x.identity.peerId)!));
    const result = to.replica.apply(others);
    assert.equal(result.malformed, 0);
    assert.equal(result.applied.length, n - 1);
  }
  return nodes;
}

/** Every key a node holds a vkey for: the digest's entries plus tombstones that left it. */
function held(node: Node): Map<string, string> {
  const all = new Map(node.replica.digest().entries);
  for (const t of node.store.tombstones().values()) all.set(t.key, t.vkey);
  return all;
}

/** Everything a node would offer in a full anti-entropy exchange. */
function allRecords(node: Node): WireRecord[] {
  return [...held(node).keys()].map((k) => node.replica.record(k)!);
}

/** Runs a local write and returns the records it changed, as gossip would push them. */
async function changes(node: Node, write: () => unknown): Promise<WireRecord[]> {
  const before = held(node);
  await write();
  const out: WireRecord[] = [];
  for (const [key, vkey] of held(node)) {
    if (before.get(key) !== vkey) out.push(node.replica.record(key)!);
  }
  return out;
}

/** What an agent stores of the replicated state, local-only details (arrival times) left out. */
function contents(node: Node) {
  const s = node.store;
  const state = s.agentState()!;
  return {
    cluster: [state.clusterId, state.clusterCreatedBy, state.clusterVkey],
    credential: [
      state.credentialVkey,
      s.clusterSecrets().map((k) => [k.kid, k.version, k.clientId, k.validUntil, k.replicated]),
    ],
    peers: s.peers(),
    services: s.services(),
    routes: s.services().flatMap((x) => s.routesOf(x.id)),
    tombstones: [...s.tombstones().values()].map((t) => `${t.key} ${t.vkey}`).sort(),
  };
}

/** Full exchanges between every ordered pair until the digests agree; returns the rounds taken. */
function antiEntropy(nodes: Node[], maxRounds = 4): number {
  for (let round = 1; round <= maxRounds; round++) {
    for (const from of nodes) {
      for (const to of nodes) {
        if (from === to) continue;
        const result = to.replica.apply(allRecords(from));
        assert.equal(result.malformed, 0, 'a record offered by anti-entropy was refused');
      }
    }
    const roots = new Set(nodes.map((n) => n.replica.digest().root));
    if (roots.size === 1) return round;
  }
  return Number.POSITIVE_INFINITY;
}

function assertConverged(nodes: Node[]): void {
  const roots = nodes.map((n) => n.replica.digest().root);
  assert.equal(new Set(roots).size, 1, `digests differ: ${roots.join(' ')}`);
  const first = contents(nodes[0]!);
  for (const n of nodes.slice(1)) assert.deepEqual(contents(n), first);
}

const serviceInput = (from: Node, to: Node) => ({
  source_peer_id: from.identity.peerId,
  target_peer_id: to.identity.peerId,
});

const ids = (node: Node) => node.store.services().map((s) => s.id);

/** DELETE /v1/peers/{id} on `node`, as Peers.remove writes it. */
function removePeer(node: Node, peerId: string): void {
  node.store.transaction(() => {
    const p = node.store.peer(peerId)!;
    const vkey = node.replica.nextVkey(p.vkey, PEER_RANK.removed);
    node.replica.deletePeerAndServices(peerId, vkey, node.clock.now(), BY);
    node.store.putTombstone({ key: keyOf('peer', peerId), vkey, arrivedAt: node.clock.now() });
  });
}

// --- the core property: convergence ----------------------------------------------------------------

type Op =
  | { t: 'create'; at: number; src: number; dst: number; iface: boolean }
  | { t: 'update'; at: number; pick: number; bw: number }
  | { t: 'delete'; at: number; pick: number }
  | { t: 'addRoute'; at: number; pick: number; prio: number }
  | { t: 'updateRoute'; at: number; pick: number; prio: number }
  | { t: 'deleteRoute'; at: number; pick: number }
  | { t: 'rename'; at: number; pick: number; name: string }
  | { t: 'deliver'; pick: number; keep: boolean }
  | { t: 'snapshot'; from: number; to: number }
  | { t: 'tick'; at: number; ms: number };

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      t: fc.constant('create' as const),
      at: fc.nat(),
      src: fc.nat(),
      dst: fc.nat(),
      iface: fc.boolean(),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({ t: fc.constant('update' as const), at: fc.nat(), pick: fc.nat(), bw: fc.nat(3) }),
  },
  { weight: 2, arbitrary: fc.record({ t: fc.constant('delete' as const), at: fc.nat(), pick: fc.nat() }) },
  {
    weight: 3,
    arbitrary: fc.record({
      t: fc.constant('addRoute' as const),
      at: fc.nat(),
      pick: fc.nat(),
      prio: fc.nat(9),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      t: fc.constant('updateRoute' as const),
      at: fc.nat(),
      pick: fc.nat(),
      prio: fc.nat(9),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({ t: fc.constant('deleteRoute' as const), at: fc.nat(), pick: fc.nat() }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      t: fc.constant('rename' as const),
      at: fc.nat(),
      pick: fc.nat(),
      name: fc.constantFrom('a', 'b', 'c'),
    }),
  },
  {
    weight: 8,
    arbitrary: fc.record({ t: fc.constant('deliver' as const), pick: fc.nat(), keep: fc.boolean() }),
  },
  { weight: 1, arbitrary: fc.record({ t: fc.constant('snapshot' as const), from: fc.nat(), to: fc.nat() }) },
  // Clocks move apart by at most 60 ops x 400 ms: inside the drift limit, as on a sane cluster.
  { weight: 2, arbitrary: fc.record({ t: fc.constant('tick' as const), at: fc.nat(), ms: fc.nat(400) }) },
);

interface Message {
  to: number;
  records: WireRecord[];
}

/** Runs `ops` on a fresh cluster, then anti-entropy; asserts that every agent ends alike. */
async function runScenario(n: number, offsets: number[], ops: Op[]): Promise<void> {
  const nodes = cluster(n, { offsets });
  try {
    await play(nodes, ops);
  } finally {
    close(nodes);
  }
}

async function play(nodes: Node[], ops: Op[]): Promise<void> {
  const n = nodes.length;
  const pool: Message[] = [];
  /** Per key, the greatest vkey any local write produced; and each route's service. */
  const produced = new Map<string, string>();
  const routeService = new Map<string, string>();
  /** Service id -> its `source target` pair; services deleted by a user. */
  const servicePair = new Map<string, string>();
  const createdStamp = new Map<string, string>();
  const userDeleted = new Set<string>();
  const send = (from: number, records: WireRecord[]) => {
    for (const r of records) {
      if (!(r.vkey <= (produced.get(r.key) ?? ''))) produced.set(r.key, r.vkey);
      if (r.key.startsWith('route/') && r.body) routeService.set(r.key, String(r.body.service_id));
      if (r.key.startsWith('service/')) {
        if (r.body) {
          servicePair.set(String(r.body.id), `${r.body.source_peer_id} ${r.body.target_peer_id}`);
          createdStamp.set(String(r.body.id), String(r.body.created_stamp));
        } else userDeleted.add(r.key.slice('service/'.length));
      }
    }
    // One message per record: a route can overtake its service, an update its create.
    for (let to = 0; to < n; to++) if (to !== from) for (const r of records) pool.push({ to, records: [r] });
  };
  const local = async (at: number, write: (node: Node) => unknown) => {
    const node = nodes[at % n]!;
    try {
      send(at % n, await changes(node, () => write(node)));
    } catch (err) {
      // Refusals of the API (same pair twice, same peer as source and target) are expected.
      if (!(err instanceof ApiError)) throw err;
    }
  };
  const pickService = (node: Node, pick: number): ServiceRecord | undefined => {
    const all = node.store.services();
    return all.length === 0 ? undefined : all[pick % all.length];
  };
  const pickRoute = (node: Node, pick: number) => {
    const all = node.store.services().flatMap((s) => node.store.routesOf(s.id));
    return all.length === 0 ? undefined : all[pick % all.length];
  };
  for (const op of ops) {
    switch (op.t) {
      case 'create':
        await local(op.at, (node) =>
          node.config.create(
            {
              ...serviceInput(nodes[op.src % n]!, nodes[op.dst % n]!),
              requires_interface: op.iface,
              desired_ipv4_cidr: op.iface ? '10.9.0.1/24' : null,
            },
            BY,
          ),
        );
        break;
      case 'update':
        await local(op.at, (node) => {
          const s = pickService(node, op.pick);
          if (s) node.config.update(s.id, { bandwidth_limit_mbps: op.bw * 10 }, BY);
        });
        break;
      case 'delete':
        await local(op.at, (node) => {
          const s = pickService(node, op.pick);
          if (s) node.config.delete(s.id, BY);
        });
        break;
      case 'addRoute':
        await local(op.at, (node) => {
          const s = pickService(node, op.pick);
          if (s) node.config.addRoutes(s.id, [{ priority: op.prio, dest_cidr: `10.${op.prio}.0.0/16` }], BY);
        });
        break;
      case 'updateRoute':
        await local(op.at, (node) => {
          const r = pickRoute(node, op.pick);
          if (r) node.config.updateRoute(r.serviceId, r.id, { priority: op.prio }, BY);
        });
        break;
      case 'deleteRoute':
        await local(op.at, (node) => {
          const r = pickRoute(node, op.pick);
          if (r) node.config.deleteRoute(r.serviceId, r.id, BY);
        });
        break;
      case 'rename':
        await local(op.at, (node) => {
          const peers = node.store.peers();
          const p = peers[op.pick % peers.length]!;
          if (p.name === op.name) return;
          node.store.updatePeer({
            ...p,
            name: op.name,
            version: p.version + 1,
            updatedAt: isoTime(node.clock.now()),
            vkey: node.replica.nextVkey(p.vkey, peerRank(p)),
          });
        });
        break;
      case 'deliver': {
        if (pool.length === 0) break;
        const i = op.pick % pool.length;
        const msg = pool[i]!;
        if (!op.keep) pool.splice(i, 1);
        const result = nodes[msg.to]!.replica.apply(msg.records);
        assert.equal(result.malformed, 0);
        break;
      }
      case 'snapshot':
        if (op.from % n !== op.to % n) pool.push({ to: op.to % n, records: allRecords(nodes[op.from % n]!) });
        break;
      case 'tick':
        nodes[op.at % n]!.clock.advance(op.ms);
        break;
    }
  }
  // Whatever is still in flight arrives too, oldest last, before anti-entropy settles the rest.
  for (const msg of pool.reverse()) assert.equal(nodes[msg.to]!.replica.apply(msg.records).malformed, 0);
  const rounds = antiEntropy(nodes);
  assert.equal(rounds, 1, `anti-entropy took ${rounds} rounds`);
  assertConverged(nodes);
  // No write was lost: every key holds at least the greatest version written, except a route
  // whose service is gone (deleted or the loser of a pair), which goes without a tombstone.
  const final = held(nodes[0]!);
  for (const [key, vkey] of produced) {
    const now = final.get(key);
    if (now !== undefined && now >= vkey) continue;
    const service = routeService.get(key);
    assert.ok(
      service !== undefined && now === undefined && !nodes[0]!.store.service(service),
      `${key}: the write ${vkey} was lost (held: ${now})`,
    );
  }
  // A service is deleted only by a user, or because a service created later holds its pair.
  for (const key of nodes[0]!.store.tombstones().keys()) {
    if (!key.startsWith('service/')) continue;
    const id = key.slice('service/'.length);
    const pair = servicePair.get(id);
    const later = [...servicePair].some(
      ([other, p]) => p === pair && createdStamp.get(other)! > createdStamp.get(id)!,
    );
    assert.ok(userDeleted.has(id) || later, `${key} was deleted by nobody and lost to nothing`);
  }
  // Invariants every agent keeps: one service per pair, every route under a live service.
  for (const node of nodes) {
    const pairs = node.store.services().map((s) => `${s.sourcePeerId} ${s.targetPeerId}`);
    assert.equal(new Set(pairs).size, pairs.length);
    for (const t of node.store.tombstones().values()) {
      assert.equal(node.replica.record(t.key)?.body, null, `${t.key} is both live and a tombstone`);
    }
  }
}

/** One agent (the author) writes; `a` receives its changes in order, `b` shuffled, in batches, twice. */
async function splitScenario(ops: Op[], cuts: number[]): Promise<void> {
  const nodes = cluster(3);
  try {
    const [author, a, b] = nodes as [Node, Node, Node];
    const history: WireRecord[] = [];
    for (const op of ops) {
      if (op.t === 'create' && op.src % 3 !== op.dst % 3) {
        const [src, dst] = [nodes[op.src % 3]!, nodes[op.dst % 3]!];
        try {
          history.push(...(await changes(author, () => author.config.create(serviceInput(src, dst), BY))));
        } catch (err) {
          if (!(err instanceof ApiError)) throw err;
        }
      } else if (op.t === 'addRoute' || op.t === 'delete' || op.t === 'update') {
        const all = author.store.services();
        const s = all[op.pick % Math.max(1, all.length)];
        if (!s) continue;
        history.push(
          ...(await changes(author, () => {
            if (op.t === 'addRoute')
              author.config.addRoutes(s.id, [{ priority: op.prio, dest_cidr: '::/0' }], BY);
            else if (op.t === 'delete') author.config.delete(s.id, BY);
            else author.config.update(s.id, { bandwidth_limit_mbps: op.bw + 1 }, BY);
          })),
        );
      }
    }
    for (const r of history) assert.equal(a.replica.apply([r]).malformed, 0);
    // In order, once: nothing is missing, no anti-entropy needed.
    assertConverged([author, a]);
    const shuffled = [...history, ...history];
    for (let i = shuffled.length - 1; i > 0; i--) {
      const j = (cuts[i % cuts.length]! + i) % (i + 1);
      [shuffled[i], shuffled[j]] = [shuffled[j]!, shuffled[i]!];
    }
    for (let i = 0; i < shuffled.length; ) {
      const size = 1 + (cuts[i % cuts.length]! % 4);
      assert.equal(b.replica.apply(shuffled.slice(i, i + size)).malformed, 0);
      i += size;
    }
    // A route delivered before its service was dropped; offered again in one batch (which
    // applies parents first), the whole history leaves b as the author.
    assert.equal(b.replica.apply(shuffled).malformed, 0);
    assertConverged(nodes);
    assert.equal(antiEntropy(nodes), 1);
    assertConverged(nodes);
  } finally {
    close(nodes);
  }
}

describe('Replica: convergence', { timeout: 240_000 }, () => {
  it('agents that received the same records hold the same state, whatever the order (3 agents)', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.integer({ min: -2000, max: 2000 }), { minLength: 3, maxLength: 3 }),
        fc.array(opArb, { minLength: 1, maxLength: 60 }),
        (offsets, ops) => runScenario(3, offsets, ops),
      ),
      { numRuns: 60 },
    );
  });

  it('the same with 2 agents and long runs', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.integer({ min: -2000, max: 2000 }), { minLength: 2, maxLength: 2 }),
        fc.array(opArb, { minLength: 20, maxLength: 120 }),
        (offsets, ops) => runScenario(2, offsets, ops),
      ),
      { numRuns: 30 },
    );
  });

  it('merging is idempotent and order-free for any batch split (property)', async () => {
    // One agent makes a history; the others receive its records split and shuffled at random.
    await fc.assert(
      fc.asyncProperty(
        fc.array(opArb, { minLength: 1, maxLength: 40 }),
        fc.array(fc.nat(), { minLength: 1, maxLength: 30 }),
        (ops, cuts) => splitScenario(ops, cuts),
      ),
      { numRuns: 40 },
    );
  });
});

// --- targeted cases --------------------------------------------------------------------------------

describe('Replica: merge rules', { timeout: 60_000 }, () => {
  it('a tombstone beats a later-arriving older live record', async () => {
    const [a, b, c] = cluster(3) as [Node, Node, Node];
    let created!: ServiceRecord;
    const create = await changes(a, async () => {
      created = await a.config.create(serviceInput(a, b), BY);
    });
    a.clock.advance(10);
    const update = await changes(a, () => a.config.update(created.id, { bandwidth_limit_mbps: 5 }, BY));
    a.clock.advance(10);
    const del = await changes(a, () => a.config.delete(created.id, BY));
    assert.equal(del.length, 1);
    assert.equal(del[0]!.body, null);
    // b: the deletion first, then the create and the update arrive late: nothing comes back.
    assert.equal(b.replica.apply(del).applied.length, 1);
    assert.deepEqual(b.replica.apply([...update, ...create]).applied, []);
    assert.equal(b.store.service(created.id), undefined);
    // c: the live record first, then the deletion.
    c.replica.apply(update);
    assert.equal(c.store.service(created.id)?.bandwidthLimitMbps, 5);
    c.replica.apply(del);
    assert.equal(c.store.service(created.id), undefined);
    assert.equal(antiEntropy([a, b, c]), 1);
    assertConverged([a, b, c]);
  });

  it("health_check travels on create, change and removal; an older agent's record reads as none", async () => {
    const [a, b] = cluster(2) as [Node, Node];
    let created!: ServiceRecord;
    const create = await changes(a, async () => {
      created = await a.config.create({ ...serviceInput(a, b), health_check: { tcp: '[FD00::1]:443' } }, BY);
    });
    b.replica.apply(create);
    assert.deepEqual(b.store.service(created.id)?.healthCheck, {
      tcp: '[fd00::1]:443',
      interval_ms: 1000,
      failures: 3,
    });
    const change = await changes(a, () =>
      a.config.update(created.id, { health_check: { icmp: '10.1.2.3', failures: 5 } }, BY),
    );
    assert.equal(b.replica.apply(change).applied.length, 1);
    assert.deepEqual(b.store.service(created.id)?.healthCheck, {
      icmp: '10.1.2.3',
      interval_ms: 1000,
      failures: 5,
    });
    // The same check again changes nothing: no write, nothing to replicate.
    assert.deepEqual(
      await changes(a, () =>
        a.config.update(created.id, { health_check: { icmp: '10.1.2.3', failures: 5 } }, BY),
      ),
      [],
    );
    const removal = await changes(a, () => a.config.update(created.id, { health_check: null }, BY));
    b.replica.apply(removal);
    assert.equal(b.store.service(created.id)?.healthCheck, null);
    assertConverged([a, b]);

    // A record as an agent before the field writes it: no health_check at all.
    a.clock.advance(10);
    const [later] = await changes(a, () => a.config.update(created.id, { bandwidth_limit_mbps: 3 }, BY));
    const { health_check: _none, ...older } = later!.body!;
    assert.deepEqual(b.replica.apply([{ ...later!, body: older }]).malformed, 0);
    assert.equal(b.store.service(created.id)?.bandwidthLimitMbps, 3);
    assert.equal(b.store.service(created.id)?.healthCheck, null);
    // A malformed one is refused whole.
    a.clock.advance(10);
    const [next] = await changes(a, () => a.config.update(created.id, { bandwidth_limit_mbps: 4 }, BY));
    const bad = { ...next!, body: { ...next!.body, health_check: { tcp: 'exit.example:443' } } };
    assert.deepEqual(b.replica.apply([bad]), { applied: [], malformed: 1 });
    assert.equal(b.store.service(created.id)?.bandwidthLimitMbps, 3);
  });

  it('a deletion beats a concurrent update stamped later', async () => {
    // b's clock runs 20 s ahead: its update carries the later stamp, and still loses.
    const [a, b] = cluster(2, { offsets: [0, 20_000] }) as [Node, Node];
    const s = await a.config.create(serviceInput(a, b), BY);
    b.replica.apply(allRecords(a));
    const del = await changes(a, () => a.config.delete(s.id, BY));
    // Setting up the cluster made each clock observe the other's stamps: move b further ahead.
    b.clock.advance(10_000);
    const upd = await changes(b, () => b.config.update(s.id, { bandwidth_limit_mbps: 9 }, BY));
    assert.ok(upd[0]!.vkey.slice(16) > del[0]!.vkey.slice(16), 'the update has the later stamp');
    assert.deepEqual(a.replica.apply(upd).applied, []);
    b.replica.apply(del);
    assert.equal(b.store.service(s.id), undefined);
    assertConverged([a, b]);
  });

  it('a live record with a higher epoch beats a tombstone (a removed peer added again)', async () => {
    const [a, b, c] = cluster(3) as [Node, Node, Node];
    const cId = c.identity.peerId;
    const removal = await changes(a, () =>
      a.store.transaction(() => {
        const p = a.store.peer(cId)!;
        a.store.deletePeer(cId);
        a.store.putTombstone({
          key: keyOf('peer', cId),
          vkey: a.replica.nextVkey(p.vkey, PEER_RANK.removed),
          arrivedAt: a.clock.now(),
        });
      }),
    );
    b.replica.apply(removal);
    assert.equal(b.store.peer(cId), undefined);
    // a adds c again: one epoch above the tombstone, so the live peer wins everywhere.
    a.clock.advance(1000);
    const tomb = a.store.tombstones().get(keyOf('peer', cId))!;
    const readd: PeerRecord = {
      ...c.store.peer(cId)!,
      updatedAt: isoTime(a.clock.now()),
      vkey: a.replica.nextVkey(tomb.vkey, PEER_RANK.active, 1),
    };
    assert.equal(parseVkey(readd.vkey)!.epoch, 1);
    assert.ok(readd.vkey > tomb.vkey);
    const applied = b.replica.apply([peerRecord(readd)]).applied;
    assert.equal(applied.length, 1);
    assert.equal(b.store.peer(cId)?.vkey, readd.vkey);
    assert.equal(b.store.tombstones().has(keyOf('peer', cId)), false, 'the tombstone is gone');
    // The old removal arriving again changes nothing.
    assert.deepEqual(b.replica.apply(removal).applied, []);
    assert.equal(b.store.peer(cId)?.vkey, readd.vkey);
    // A live record of the old epoch, however late its stamp, does not beat the tombstone.
    const sameEpoch = makeVkey(0, PEER_RANK.active, a.replica.hlc.tick());
    const fresh = cluster(2)[0]!;
    fresh.replica.apply(removal);
    assert.equal(fresh.store.peer(cId), undefined);
    assert.deepEqual(fresh.replica.apply([peerRecord({ ...readd, vkey: sameEpoch })]).applied, []);
    assert.equal(fresh.store.peer(cId), undefined);
  });

  it('a route whose service is missing is not stored, and is once the service arrives', async () => {
    const [a, b] = cluster(2) as [Node, Node];
    const createService = await changes(a, () => a.config.create(serviceInput(a, b), BY));
    const s = a.store.services()[0]!;
    const addRoute = await changes(a, () =>
      a.config.addRoutes(s.id, [{ priority: 1, dest_cidr: '10.0.0.0/8' }], BY),
    );
    assert.equal(addRoute.length, 1);
    const routeId = (addRoute[0]!.body as { id: number }).id;
    assert.deepEqual(b.replica.apply(addRoute), { applied: [], malformed: 0 });
    assert.equal(b.store.route(routeId), undefined);
    assert.notEqual(b.replica.digest().root, a.replica.digest().root);
    b.replica.apply(createService);
    b.replica.apply(addRoute);
    assert.equal(b.store.route(routeId)?.serviceId, s.id);
    assertConverged([a, b]);
  });

  it('in one batch, parents are applied before children whatever their order', async () => {
    const [a, b] = cluster(2) as [Node, Node];
    const batch = [
      ...(await changes(a, () => a.config.create(serviceInput(a, b), BY))),
      ...(await changes(a, () =>
        a.config.addRoutes(a.store.services()[0]!.id, [{ priority: 1, source_cidr: '192.0.2.0/24' }], BY),
      )),
    ].reverse();
    assert.equal(b.replica.apply(batch).applied.length, 2);
    assertConverged([a, b]);
  });

  it('two live services for one pair resolve to the later-created one on every agent', async () => {
    const [a, b, c] = cluster(3) as [Node, Node, Node];
    // a and b each create a service from a to b, neither knowing of the other's (two allocators
    // in a split); b's is created later.
    const fromA = await changes(a, () => a.config.create(serviceInput(a, b), BY));
    b.clock.advance(5);
    const fromB = await changes(b, () => b.config.create(serviceInput(a, b), BY));
    const [idA, idB] = [(fromA[0]!.body as { id: string }).id, (fromB[0]!.body as { id: string }).id];
    const [winner, loser] = [idB, idA];
    // The loser also got a route on its creator before it heard of the other service.
    const loserRoute = await changes(a, () =>
      a.config.addRoutes(loser, [{ priority: 3, dest_cidr: '10.3.0.0/16' }], BY),
    );
    a.replica.apply([...fromB, ...loserRoute]);
    b.replica.apply([...fromA, ...loserRoute]);
    // c hears them in the other order from each side.
    c.replica.apply(fromB);
    c.replica.apply(loserRoute);
    c.replica.apply(fromA);
    for (const node of [a, b, c]) {
      assert.deepEqual(ids(node), [winner], node.identity.peerId);
      const tomb = node.store.tombstones().get(keyOf('service', loser));
      assert.ok(tomb, 'the loser is a tombstone');
      assert.equal(parseVkey(tomb.vkey)!.ordinal, DELETED_RANK);
      assert.equal(node.store.routesOf(loser).length, 0);
    }
    assert.equal(antiEntropy([a, b, c]), 1);
    assertConverged([a, b, c]);
  });

  it('a service created after its pair was freed survives a replica that still holds the old one', async () => {
    // The race a CI run hit: a deletes X and creates Y on the same pair at once; b hears of Y
    // before X's deletion, c hears of the live X only after Y. Whatever the ids, Y is the write
    // that was acknowledged last and must be live everywhere in the end.
    for (let round = 0; round < 20; round++) {
      const [a, b, c] = cluster(3) as [Node, Node, Node];
      const createX = await changes(a, () => a.config.create(serviceInput(a, b), BY));
      const x = (createX[0]!.body as { id: string }).id;
      b.replica.apply(createX);
      const deleteX = await changes(a, () => a.config.delete(x, BY));
      const createY = await changes(a, () => a.config.create(serviceInput(a, b), BY));
      const y = (createY[0]!.body as { id: string }).id;
      b.replica.apply(createY); // b still holds X live
      b.replica.apply(deleteX);
      c.replica.apply(createY); // c has never heard of X
      c.replica.apply(createX);
      for (const node of [a, b, c])
        assert.deepEqual(ids(node), [y], `round ${round}, ${node.identity.peerId}`);
      antiEntropy([a, b, c]);
      assertConverged([a, b, c]);
      for (const node of [a, b, c]) assert.deepEqual(ids(node), [y], `round ${round}, after anti-entropy`);
    }
  });

  it('a removed-peer tombstone deletes the peer’s services and their routes', async () => {
    const [a, b, c] = cluster(3) as [Node, Node, Node];
    const cId = c.identity.peerId;
    await a.config.create(serviceInput(a, c), BY);
    await a.config.create(serviceInput(c, b), BY);
    const keep = await a.config.create(serviceInput(a, b), BY);
    for (const s of a.store.services())
      a.config.addRoutes(s.id, [{ priority: 1, dest_cidr: '10.0.0.0/8' }], BY);
    b.replica.apply(allRecords(a));
    assert.equal(b.store.services().length, 3);
    const gone = a.store.services().filter((s) => s.id !== keep.id);
    const removal = await changes(a, () => removePeer(a, cId));
    const expected = [keyOf('peer', cId), ...gone.map((s) => keyOf('service', s.id))].sort();
    assert.deepEqual(removal.map((r) => r.key).sort(), expected, 'the peer and its services, not routes');
    // The peer's tombstone alone is enough for b: it derives the services' tombstones itself.
    const peerOnly = removal.filter((r) => r.key === keyOf('peer', cId));
    assert.equal(b.replica.apply(peerOnly).applied.length, 1);
    assert.equal(b.store.peer(cId), undefined);
    assert.deepEqual(ids(b), [keep.id]);
    assert.equal(b.store.services().flatMap((s) => b.store.routesOf(s.id)).length, 1);
    // Routes go without tombstones of their own: their service's covers them.
    assert.deepEqual([...b.store.tombstones().keys()].sort(), expected);
    assertConverged([a, b]);
    // A service of the removed peer arriving late is not stored.
    const late = serviceRecord({ ...a.store.services()[0]!, id: 'late', targetPeerId: cId });
    assert.deepEqual(b.replica.apply([late]).applied, []);
  });

  it('a tombstone of the local peer is not applied and sets removedFromCluster', async () => {
    const [a, b] = cluster(2) as [Node, Node];
    const bId = b.identity.peerId;
    await a.config.create(serviceInput(a, b), BY);
    b.replica.apply(allRecords(a));
    const removal: WireRecord = {
      key: keyOf('peer', bId),
      vkey: a.replica.nextVkey(a.store.peer(bId)!.vkey, PEER_RANK.removed),
      body: null,
    };
    assert.equal(b.replica.removedFromCluster, false);
    assert.deepEqual(b.replica.apply([removal]), { applied: [], malformed: 0 });
    assert.equal(b.replica.removedFromCluster, true);
    assert.ok(b.store.peer(bId), 'b keeps its own row');
    assert.equal(b.store.services().length, 0, 'but not the services: they are deleted everywhere else');
    // Its own tombstone, beside its row, is how a restart remembers the removal.
    assert.deepEqual([...b.store.tombstones().keys()], [keyOf('peer', bId)]);
    const restarted = new Replica(b.store, bId, new HybridClock(bId, b.clock), b.clock);
    restarted.init();
    assert.equal(restarted.removedFromCluster, true);
  });

  it('a removed agent takes only deletions from a mate that has not heard of it, until it is added again', async () => {
    // test/sim seed 1179: c crashed holding a service, which was deleted and its tombstone
    // collected while b was removed; c came back and pushed its stale copy to b, which took it.
    const [a, b, c] = cluster(3) as [Node, Node, Node];
    const bId = b.identity.peerId;
    const s = await a.config.create(serviceInput(a, c), BY);
    const stale = allRecords(a);
    for (const n of [b, c]) n.replica.apply(stale);
    const removal: WireRecord = {
      key: keyOf('peer', bId),
      vkey: a.replica.nextVkey(a.store.peer(bId)!.vkey, PEER_RANK.removed),
      body: null,
    };
    b.replica.apply([removal]);
    assert.equal(b.store.services().length, 0);
    // A rename of b by a mate unaware of the removal: same epoch, so it does not add b back.
    const rename = await changes(c, () => {
      const p = c.store.peer(bId)!;
      c.store.updatePeer({ ...p, name: 'renamed', vkey: c.replica.nextVkey(p.vkey, peerRank(p)) });
    });
    assert.deepEqual(b.replica.apply([...stale, ...rename]).applied, []);
    assert.equal(b.replica.removedFromCluster, true);
    assert.equal(b.store.services().length, 0, 'the stale service is not taken');
    // A deletion is taken (seed 1027: b, restarted, later met the stale copy again).
    const deletion = await changes(a, () => a.config.delete(s.id, BY));
    b.replica.apply(deletion);
    assert.ok(b.store.tombstone(keyOf('service', s.id)));
    const restarted = new Replica(b.store, bId, new HybridClock(bId, b.clock), b.clock);
    restarted.init();
    assert.deepEqual(restarted.apply(stale).applied, [], 'nor after a restart');
    assert.equal(b.store.services().length, 0);
    b.replica = restarted;
    // a adds b again: its record one epoch above the removal, in the same batch as the state.
    const readd = peerRecord({
      ...a.store.peer(bId)!,
      vkey: a.replica.nextVkey(removal.vkey, PEER_RANK.active, 1),
    });
    const c2 = await a.config.create(serviceInput(a, c), BY);
    const applied = b.replica.apply([...allRecords(a).filter((r) => r.key !== readd.key), readd]).applied;
    assert.equal(b.replica.removedFromCluster, false);
    assert.equal(applied[0]?.key, readd.key, 'its own record first, then the rest');
    assert.deepEqual(ids(b), [c2.id]);
    assert.equal(b.store.tombstone(readd.key), undefined, 'its own tombstone goes');
  });

  it('a peer removed and added again brings none of its old services back, told or not, however old they are', async () => {
    for (const [told, ageMs] of [
      [false, 0],
      [true, 0],
      [false, 2 * HOUR],
    ] as const) {
      const [a, d] = cluster(2, { horizonMs: HOUR }) as [Node, Node];
      const dId = d.identity.peerId;
      const s = await a.config.create(serviceInput(a, d), BY);
      a.config.addRoutes(s.id, [{ priority: 1, dest_cidr: '10.0.0.0/8' }], BY);
      d.replica.apply(allRecords(a));
      assert.deepEqual(ids(d), [s.id]);
      // A service written long before the removal: its tombstone must still last the horizon.
      for (const n of [a, d]) n.clock.advance(ageMs);
      const removal = await changes(a, () => removePeer(a, dId));
      assert.equal(
        a.replica.collectTombstones(() => true),
        0,
        'nothing collectable right after',
      );
      assert.ok(a.replica.digest().entries.has(keyOf('service', s.id)), 'the tombstone is in the digest');
      if (told) {
        d.replica.apply(removal);
        assert.deepEqual(ids(d), [], 'told: d forgets the services');
      }
      // a adds d again, as the handshake does: one epoch above the tombstone, which goes.
      const tombstone = a.store.tombstone(keyOf('peer', dId))!;
      a.store.transaction(() => {
        a.store.upsertPeer({
          ...d.store.peer(dId)!,
          vkey: a.replica.nextVkey(tombstone.vkey, PEER_RANK.active, 1),
        });
        a.store.deleteTombstone(tombstone.key);
      });
      // Anti-entropy both ways: d's old service (if it still has it) does not come back.
      a.replica.apply(allRecords(d));
      assert.deepEqual(ids(a), [], `told: ${told}, age ${ageMs}: the service stays deleted on a`);
      d.replica.apply(allRecords(a));
      assert.deepEqual(ids(d), [], `told: ${told}: and is deleted on d`);
      assert.equal(d.store.routesOf(s.id).length, 0);
      assertConverged([a, d]);
      close([a, d]);
    }
  });

  it('refuses records that are malformed, forged or stamped too far ahead, and counts them', async () => {
    const [a, b] = cluster(2) as [Node, Node];
    const s = await a.config.create(serviceInput(a, b), BY);
    const good = serviceRecord(s);
    const ahead = makeVkey(
      0,
      LIVE_RANK,
      encodeStamp({ wall: b.clock.now() + MAX_FORWARD_DRIFT_MS + 1, counter: 0, origin: 'ab' }),
    );
    // A peer record whose id is not derived from its key.
    const forged = peerRecord({ ...b.store.peer(b.identity.peerId)!, id: 'ab'.repeat(16), vkey: good.vkey });
    const sameSourceTarget = serviceRecord({ ...s, id: 'x', targetPeerId: s.sourcePeerId });
    const result = b.replica.apply([
      { ...good, vkey: ahead },
      forged,
      sameSourceTarget,
      { key: 'service/y', vkey: 'nonsense', body: null },
      'not a record',
    ]);
    assert.deepEqual(result, { applied: [], malformed: 5 });
    assert.equal(b.store.services().length, 0);
    // The refused far-future stamp did not move b's clock.
    const next = decodeStamp(parseVkey(b.replica.nextVkey(undefined, 0))!.stamp)!;
    assert.ok(next.wall <= b.clock.now());
  });

  it('applies nothing before bootstrap', () => {
    const clock = new ManualClock(T0);
    const store = new Store(join(root, `unbootstrapped-${dirs++}.db`));
    opened.add(store);
    const identity = IDENTITIES[0]!;
    const replica = new Replica(store, identity.peerId, new HybridClock(identity.peerId, clock), clock);
    const [a] = cluster(1);
    assert.deepEqual(replica.apply(allRecords(a!)).applied, []);
    assert.equal(replica.record('cluster'), undefined);
  });

  it('init moves the clock past every stored stamp, even when the wall clock went back', () => {
    const [a, b] = cluster(2) as [Node, Node];
    const rename = (replica: Replica, name: string): WireRecord[] => {
      const p = a.store.peer(a.identity.peerId)!;
      a.store.updatePeer({
        ...p,
        name,
        version: p.version + 1,
        vkey: replica.nextVkey(p.vkey, PEER_RANK.active),
      });
      return [peerRecord(a.store.peer(a.identity.peerId)!)];
    };
    for (const n of [a, b]) n.clock.advance(5 * 60_000);
    const first = rename(a.replica, 'first');
    assert.equal(b.replica.apply(first).applied.length, 1);
    // a's wall clock is set back 5 minutes (far beyond the drift limit), and a restarts.
    a.clock.advance(-5 * 60_000);
    const restarted = new Replica(
      a.store,
      a.identity.peerId,
      new HybridClock(a.identity.peerId, a.clock),
      a.clock,
    );
    restarted.init();
    const second = rename(restarted, 'second');
    assert.ok(second[0]!.vkey > first[0]!.vkey, `${second[0]!.vkey} > ${first[0]!.vkey}`);
    // The write made after the restart wins everywhere instead of being undone by anti-entropy.
    assert.equal(b.replica.apply(second).applied.length, 1);
    restarted.apply(allRecords(b));
    assert.equal(a.store.peer(a.identity.peerId)!.name, 'second');
    assert.equal(b.store.peer(a.identity.peerId)!.name, 'second');
  });
});

describe('Replica: tombstone horizon', { timeout: 60_000 }, () => {
  const HORIZON = 10 * 60_000;

  async function deletedService(nodes: Node[]) {
    const [a, b] = nodes as [Node, Node];
    const s = await a.config.create(serviceInput(a, b), BY);
    b.replica.apply(allRecords(a));
    const key = keyOf('service', s.id);
    const del = await changes(a, () => a.config.delete(s.id, BY));
    return { s, key, del };
  }

  it('tombstones leave the digest after the horizon, on every agent at once', async () => {
    const nodes = cluster(2, { horizonMs: HORIZON });
    const [a, b] = nodes as [Node, Node];
    const { key, del } = await deletedService(nodes);
    b.replica.apply(del);
    assert.ok(a.replica.digest().entries.has(key));
    const written = decodeStamp(parseVkey(del[0]!.vkey)!.stamp)!.wall;
    // Still inside at the horizon itself (the cutoff is counted in whole seconds)…
    for (const n of nodes) n.clock.set(written + HORIZON);
    assert.ok(a.replica.digest().entries.has(key));
    // …and out one second later, while the tombstone itself is still kept.
    for (const n of nodes) n.clock.set(written + HORIZON + 1000);
    assert.equal(a.replica.digest().entries.has(key), false);
    assert.equal(b.replica.digest().entries.has(key), false);
    assert.ok(a.store.tombstones().has(key));
    assert.equal(a.replica.record(key)?.body, null);
    assertConverged(nodes);
  });

  it('the digest is rebuilt as time passes only when a tombstone leaves it', async () => {
    const nodes = cluster(2, { horizonMs: HORIZON });
    const [a] = nodes as [Node, Node];
    const { key, del } = await deletedService(nodes);
    const written = decodeStamp(parseVkey(del[0]!.vkey)!.stamp)!.wall;
    const first = a.replica.digest();
    assert.ok(first.entries.has(key));
    for (const n of nodes) n.clock.set(written + HORIZON);
    assert.equal(a.replica.digest(), first, 'the same digest while the tombstone is inside');
    for (const n of nodes) n.clock.set(written + HORIZON + 1000);
    const after = a.replica.digest();
    assert.notEqual(after, first);
    assert.equal(after.entries.has(key), false);
    for (const n of nodes) n.clock.set(written + HORIZON + 60_000);
    assert.equal(a.replica.digest(), after, 'and the same again with no tombstone left to pass');
    close(nodes);
  });

  it('collectTombstones deletes them only once every peer matched after the horizon', async () => {
    const nodes = cluster(2, { horizonMs: HORIZON });
    const [a] = nodes as [Node, Node];
    const { key, del } = await deletedService(nodes);
    const written = decodeStamp(parseVkey(del[0]!.vkey)!.stamp)!.wall;
    const asked: number[] = [];
    const yes = (t: number) => {
      asked.push(t);
      return true;
    };
    const no = (t: number) => {
      asked.push(t);
      return false;
    };
    // Before the horizon nothing goes, whatever the peers say.
    a.clock.set(written + HORIZON - 1);
    assert.equal(a.replica.collectTombstones(yes), 0);
    assert.ok(a.store.tombstones().has(key));
    // After it, only when every peer has matched our digest since the tombstone left it.
    a.clock.set(written + HORIZON + 5000);
    asked.length = 0;
    assert.equal(a.replica.collectTombstones(no), 0);
    assert.deepEqual(asked, [written + HORIZON]);
    assert.ok(a.store.tombstones().has(key));
    const rootBefore = a.replica.digest().root;
    assert.equal(a.replica.collectTombstones(yes), 1);
    assert.equal(a.store.tombstones().has(key), false);
    assert.equal(a.replica.record(key), undefined);
    assert.equal(a.replica.digest().root, rootBefore, 'it had already left the digest');
  });

  it('asks for a match after the tombstone arrived when it arrived after the horizon', async () => {
    const nodes = cluster(3, { horizonMs: HORIZON });
    const c = nodes[2]!;
    const { key, del } = await deletedService(nodes);
    c.replica.apply(allRecords(nodes[1]!));
    const written = decodeStamp(parseVkey(del[0]!.vkey)!.stamp)!.wall;
    // c still holds the live service and hears of the deletion late.
    c.clock.set(written + HORIZON + 60_000);
    assert.equal(c.replica.apply(del).applied.length, 1);
    const asked: number[] = [];
    c.clock.advance(1000);
    c.replica.collectTombstones((t) => {
      asked.push(t);
      return false;
    });
    assert.deepEqual(asked, [written + HORIZON + 60_000]);
    assert.ok(c.store.tombstones().has(key));
  });

  it('a tombstone past the horizon is accepted only where it deletes a live record', async () => {
    const nodes = cluster(3, { horizonMs: HORIZON });
    const [a, b, c] = nodes as [Node, Node, Node];
    const { s, key, del } = await deletedService(nodes);
    const written = decodeStamp(parseVkey(del[0]!.vkey)!.stamp)!.wall;
    for (const n of nodes) n.clock.set(written + HORIZON + 60_000);
    // b still holds the live service: the old deletion still applies there.
    assert.ok(b.store.service(s.id));
    assert.equal(b.replica.apply(del).applied.length, 1);
    assert.equal(b.store.service(s.id), undefined);
    // c never had the service: the old deletion is history, not stored.
    assert.equal(c.store.service(s.id), undefined);
    assert.deepEqual(c.replica.apply(del).applied, []);
    assert.equal(c.store.tombstones().has(key), false);
    // A route tombstone past the horizon for a route nobody has: refused alike.
    const oldRoute: WireRecord = {
      key: 'route/77',
      vkey: makeVkey(0, DELETED_RANK, encodeStamp({ wall: written, counter: 0, origin: 'ab' })),
      body: null,
    };
    assert.deepEqual(a.replica.apply([oldRoute]).applied, []);
    // Within the horizon the same tombstone is kept even where nothing is deleted.
    const fresh: WireRecord = {
      ...oldRoute,
      vkey: makeVkey(0, DELETED_RANK, encodeStamp({ wall: a.clock.now(), counter: 0, origin: 'ab' })),
    };
    assert.equal(a.replica.apply([fresh]).applied.length, 1);
    // Digests agree: the old tombstone left them everywhere.
    const roots = new Set([b, c].map((n) => n.replica.digest().root));
    assert.equal(roots.size, 1);
  });
});
