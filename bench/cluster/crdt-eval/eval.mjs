// One-off evaluation for docs/gossip.md: the same replicated-config workload on
// (a) Yjs, (b) Automerge, (c) the hand-written versioned-record (LWW) store.
// Run: cd bench/cluster/crdt-eval && npm install && node eval.mjs
// Deterministic (seeded PRNG, simulated wall clock); only the timings vary between runs.

import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { gzipSync } from 'node:zlib';
import * as A from '@automerge/automerge';
import * as Y from 'yjs';

const KINDS = ['peers', 'services', 'routes'];
const SERVICES = 200;
const PEER_RECORDS = 20;
const UPDATES = 20_000;
const DELETE_INTERLEAVED_UPDATES = 5;

// ---------- helpers ----------
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const pick = (rnd, n) => Math.floor(rnd() * n);
function shuffle(rnd, xs) {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = pick(rnd, i + 1);
    [xs[i], xs[j]] = [xs[j], xs[i]];
  }
  return xs;
}
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v);
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const jsonBytes = (v) => Buffer.byteLength(JSON.stringify(v));

// Simulated wall clock shared by all replicas (1 ms per operation), with a per-replica skew.
const sim = { now: 1_763_800_000_000 };

// ---------- (c) hand-written versioned-record store: LWW register per (kind, id) ----------
// vkey = epoch.rank.wall.counter.peer, fixed width so string order = version order.
// Rank puts deletion/deactivation above live values: tombstone 9 > removed 3 > inactive 2 > live 1.
const BUCKETS = 16;
function rankOf(body) {
  if (body === null) return 9;
  if (body.status === 'removed') return 3;
  if (body.status === 'inactive') return 2;
  return 1;
}
function bucketOf(key) {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193);
  return (h >>> 0) % BUCKETS;
}
function lwwEngine(mode) {
  const stamp = (r, rank) => {
    const p = sim.now + r.skew; // HLC send
    if (p > r.wall) {
      r.wall = p;
      r.counter = 0;
    } else r.counter++;
    return `0001.${rank}.${String(r.wall).padStart(15, '0')}.${String(r.counter).padStart(6, '0')}.${r.peer}`;
  };
  const recv = (r, vkey) => {
    const [, , w, c] = vkey.split('.');
    const rw = Number(w);
    const rc = Number(c);
    const p = sim.now + r.skew;
    const l = Math.max(r.wall, rw, p);
    if (l === r.wall && l === rw) r.counter = Math.max(r.counter, rc) + 1;
    else if (l === r.wall) r.counter++;
    else if (l === rw) r.counter = rc + 1;
    else r.counter = 0;
    r.wall = l;
  };
  const apply = (r, key, vkey, body) => {
    const cur = r.recs.get(key);
    if (cur && cur.vkey >= vkey) return false;
    r.recs.set(key, { vkey, body });
    const b = bucketOf(key);
    r.keys[b].add(key);
    r.hashes[b] = null;
    return true;
  };
  const bucketHash = (r, b) => {
    if (!r.hashes[b]) {
      const h = createHash('sha256');
      for (const k of [...r.keys[b]].sort()) h.update(`${k}:${r.recs.get(k).vkey}\n`);
      r.hashes[b] = h.digest();
    }
    return r.hashes[b];
  };
  const root = (r) => {
    const h = createHash('sha256');
    for (let b = 0; b < BUCKETS; b++) h.update(bucketHash(r, b));
    return h.digest();
  };
  const write = (r, kind, id, body) => apply(r, `${kind}/${id}`, stamp(r, rankOf(body)), body);
  const mk = (ident) => ({
    peer: `p${String(ident).padStart(3, '0')}`,
    skew: ((ident * 7919) % 41) - 20,
    wall: 0,
    counter: 0,
    recs: new Map(),
    keys: Array.from({ length: BUCKETS }, () => new Set()),
    hashes: new Array(BUCKETS).fill(null),
  });
  return {
    name: mode === 'flat' ? 'lww (flat key:vkey list)' : 'lww (16-bucket digest)',
    create: mk,
    createEmpty: mk,
    put: (r, kind, id, body) => write(r, kind, id, { ...body }),
    update(r, kind, id, fields) {
      const cur = r.recs.get(`${kind}/${id}`);
      if (!cur || cur.body === null) return false;
      return write(r, kind, id, { ...cur.body, ...fields });
    },
    remove: (r, kind, id) => write(r, kind, id, null),
    has: (r, kind, id) => r.recs.get(`${kind}/${id}`)?.body != null,
    // Anti-entropy between a and b: root hash; (bucketed: bucket hashes); a's key:vkey list for the
    // differing part; b answers with its newer records and the keys it wants; a sends those.
    sync(a, b) {
      let bytes = 32;
      let messages = 1;
      if (root(a).equals(root(b))) return { bytes, messages };
      let buckets = [...Array(BUCKETS).keys()];
      if (mode === 'bucketed') {
        bytes += BUCKETS * 32;
        messages++;
        buckets = buckets.filter((x) => !bucketHash(a, x).equals(bucketHash(b, x)));
      }
      const aList = [];
      for (const x of buckets) for (const k of a.keys[x]) aList.push([k, a.recs.get(k).vkey]);
      bytes += jsonBytes({ b: mode === 'bucketed' ? buckets : undefined, e: aList });
      const aMap = new Map(aList);
      const toA = [];
      for (const x of buckets) {
        for (const k of b.keys[x]) {
          const rec = b.recs.get(k);
          const av = aMap.get(k);
          if (!av || rec.vkey > av) toA.push([k, rec.vkey, rec.body]);
        }
      }
      const want = aList.filter(([k, av]) => {
        const bv = b.recs.get(k);
        return !bv || av > bv.vkey;
      });
      bytes += jsonBytes({ r: toA, w: want.map(([k]) => k) });
      const toB = want.map(([k]) => [k, a.recs.get(k).vkey, a.recs.get(k).body]);
      bytes += jsonBytes({ r: toB });
      messages += 3;
      let maxA = '';
      for (const [k, v, body] of toA) {
        apply(a, k, v, body);
        if (v > maxA) maxA = v;
      }
      let maxB = '';
      for (const [k, v, body] of toB) {
        apply(b, k, v, body);
        if (v > maxB) maxB = v;
      }
      if (maxA) recv(a, maxA);
      if (maxB) recv(b, maxB);
      return { bytes, messages };
    },
    clone(r) {
      const c = mk(0);
      Object.assign(c, { peer: r.peer, skew: r.skew, wall: r.wall, counter: r.counter });
      for (const [k, v] of r.recs) apply(c, k, v.vkey, v.body);
      return c;
    },
    state(r) {
      const out = { peers: {}, services: {}, routes: {} };
      for (const [k, v] of r.recs) {
        if (v.body === null) continue;
        const [kind, id] = k.split('/');
        out[kind][id] = v.body;
      }
      return out;
    },
    size: (r) => jsonBytes([...r.recs].map(([k, v]) => [k, v.vkey, v.body])),
    blob: (r) => Buffer.from(JSON.stringify([...r.recs].map(([k, v]) => [k, v.vkey, v.body]))),
    load(blob) {
      const c = mk(999);
      for (const [k, v, body] of JSON.parse(blob.toString())) apply(c, k, v, body);
      return c;
    },
    tombstones: (r) => [...r.recs.values()].filter((v) => v.body === null).length,
    // Tombstones every replica has seen are dropped (here: after a full sync, all of them).
    gcTombstones(reps) {
      for (const r of reps) {
        for (const [k, v] of [...r.recs]) {
          if (v.body !== null) continue;
          r.recs.delete(k);
          const b = bucketOf(k);
          r.keys[b].delete(k);
          r.hashes[b] = null;
        }
      }
    },
    pushBytes: (r, kind, id) =>
      jsonBytes([`${kind}/${id}`, r.recs.get(`${kind}/${id}`).vkey, r.recs.get(`${kind}/${id}`).body]),
    winnerRule: 'higher vkey: rank, then HLC',
  };
}

// ---------- (a) Yjs: one Y.Doc per agent, one Y.Map per kind ----------
function yjsEngine(nested) {
  const mk = (ident) => {
    const doc = new Y.Doc(); // gc: true (default)
    doc.clientID = ident;
    const r = { doc, lastUpdate: 0 };
    doc.on('update', (u) => {
      r.lastUpdate = u.byteLength;
    });
    return r;
  };
  return {
    name: nested ? 'yjs (Y.Map per record)' : 'yjs (plain object per record)',
    create: mk,
    createEmpty: mk,
    put(r, kind, id, body) {
      r.doc.transact(() => {
        const m = r.doc.getMap(kind);
        if (!nested) return m.set(id, { ...body });
        const y = m.set(id, new Y.Map());
        for (const [k, v] of Object.entries(body)) y.set(k, v);
      });
    },
    update(r, kind, id, fields) {
      const m = r.doc.getMap(kind);
      const cur = m.get(id);
      if (cur === undefined) return false;
      r.doc.transact(() => {
        if (!nested) return m.set(id, { ...cur, ...fields });
        for (const [k, v] of Object.entries(fields)) cur.set(k, v);
      });
      return true;
    },
    remove: (r, kind, id) => r.doc.getMap(kind).delete(id),
    has: (r, kind, id) => r.doc.getMap(kind).has(id),
    sync(a, b) {
      const svA = Y.encodeStateVector(a.doc);
      const svB = Y.encodeStateVector(b.doc);
      const uA = Y.encodeStateAsUpdate(a.doc, svB);
      const uB = Y.encodeStateAsUpdate(b.doc, svA);
      Y.applyUpdate(b.doc, uA);
      Y.applyUpdate(a.doc, uB);
      return { bytes: svA.byteLength + svB.byteLength + uA.byteLength + uB.byteLength, messages: 4 };
    },
    clone(r) {
      const c = mk(r.doc.clientID + 1_000_000); // a clone only receives; a new id avoids Yjs's id-clash warning
      Y.applyUpdate(c.doc, Y.encodeStateAsUpdate(r.doc));
      return c;
    },
    state: (r) => Object.fromEntries(KINDS.map((k) => [k, r.doc.getMap(k).toJSON()])),
    size: (r) => Y.encodeStateAsUpdate(r.doc).byteLength,
    blob: (r) => Y.encodeStateAsUpdate(r.doc),
    load(blob) {
      const c = mk(999_999);
      Y.applyUpdate(c.doc, blob);
      return c;
    },
    pushBytes: (r) => r.lastUpdate,
    winnerRule: 'Yjs: higher clientID (random per doc) wins a concurrent map set',
  };
}

// ---------- (b) Automerge: one document per agent; strings as ImmutableString (atomic values) ----------
function automergeEngine(wholeRecord) {
  // Every replica must descend from one genesis document: maps created independently by A.from()
  // on two agents are two different objects, and a merge would hide one of them.
  const genesis = A.from({ peers: {}, services: {}, routes: {} }, { actor: 'ff'.repeat(16) });
  const actor = (ident) => ident.toString(16).padStart(32, '0');
  const am = (v) => (typeof v === 'string' ? new A.ImmutableString(v) : v);
  const amObj = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, am(v)]));
  const plain = (o) => JSON.parse(JSON.stringify(o));
  return {
    name: wholeRecord ? 'automerge (whole record put)' : 'automerge (map per record)',
    create: (ident) => ({ doc: A.clone(genesis, { actor: actor(ident) }), sync: new Map() }),
    createEmpty: (ident) => ({ doc: A.init({ actor: actor(ident) }), sync: new Map() }),
    put(r, kind, id, body) {
      r.doc = A.change(r.doc, (d) => {
        d[kind][id] = amObj(body);
      });
    },
    update(r, kind, id, fields) {
      const cur = r.doc[kind][id];
      if (cur === undefined) return false;
      const next = wholeRecord ? { ...plain(cur), ...fields } : null;
      r.doc = A.change(r.doc, (d) => {
        if (next) d[kind][id] = amObj(next);
        else for (const [k, v] of Object.entries(fields)) d[kind][id][k] = am(v);
      });
      return true;
    },
    remove(r, kind, id) {
      r.doc = A.change(r.doc, (d) => {
        delete d[kind][id];
      });
    },
    has: (r, kind, id) => r.doc[kind]?.[id] !== undefined,
    // Automerge sync protocol with a sync state kept per peer pair (best case: a long-lived link).
    sync(a, b) {
      let sa = a.sync.get(b) ?? A.initSyncState();
      let sb = b.sync.get(a) ?? A.initSyncState();
      let bytes = 0;
      let messages = 0;
      for (;;) {
        let m1;
        let m2;
        [sa, m1] = A.generateSyncMessage(a.doc, sa);
        if (m1) {
          bytes += m1.byteLength;
          messages++;
          [b.doc, sb] = A.receiveSyncMessage(b.doc, sb, m1);
        }
        [sb, m2] = A.generateSyncMessage(b.doc, sb);
        if (m2) {
          bytes += m2.byteLength;
          messages++;
          [a.doc, sa] = A.receiveSyncMessage(a.doc, sa, m2);
        }
        if (!m1 && !m2) break;
      }
      a.sync.set(b, sa);
      b.sync.set(a, sb);
      return { bytes, messages };
    },
    clone: (r) => ({ doc: A.clone(r.doc), sync: new Map() }),
    state: (r) => plain(r.doc),
    size: (r) => A.save(r.doc).byteLength,
    blob: (r) => A.save(r.doc),
    load: (blob) => ({ doc: A.load(blob), sync: new Map() }),
    pushBytes: (r) => A.getLastLocalChange(r.doc).byteLength,
    winnerRule: 'Automerge: higher op id (Lamport counter, then actor id) wins; loser kept as a conflict',
  };
}

// ---------- the workload ----------
const iso = () => new Date(sim.now).toISOString();
const peerBody = (i) => ({
  id: `peer-${i}`,
  name: `site-${i}`,
  address: `198.51.100.${i + 1}:7443`,
  status: 'active',
  licenseId: 'lic-1',
  joinedAt: iso(),
});
function serviceBody(k, src, dst) {
  return {
    id: `svc-${k}`,
    name: `svc-${k}`,
    sourcePeerId: `peer-${src}`,
    targetPeerId: `peer-${dst}`,
    transportType: k % 2 ? 'tcp' : 'kcp',
    requiresInterface: false,
    desiredIpv4Cidr: `10.${k % 250}.0.0/24`,
    desiredIpv6Cidr: null,
    fullyTransparent: false,
    bandwidthLimitMbps: 100,
    createdAt: iso(),
    updatedAt: iso(),
  };
}
const routeBody = (k, j) => ({
  id: `rt-${k}-${j}`,
  serviceId: `svc-${k}`,
  priority: j,
  sourceCidr: null,
  destCidr: `10.${k % 250}.${j}.0/24`,
  createdAt: iso(),
  updatedAt: iso(),
});

function fullSync(E, reps, order) {
  let passes = 0;
  let bytes = 0;
  const t0 = performance.now();
  for (;;) {
    passes++;
    for (const [i, j] of order) bytes += E.sync(reps[i], reps[j]).bytes;
    const s0 = canonical(E.state(reps[0]));
    if (reps.every((r) => canonical(E.state(r)) === s0) || passes >= 6) break;
  }
  const states = reps.map((r) => canonical(E.state(r)));
  return { passes, bytes, ms: performance.now() - t0, converged: states.every((s) => s === states[0]) };
}

function workload(E, N, seed = 42) {
  const rnd = prng(seed);
  const reps = Array.from({ length: N }, (_, i) => E.create(i + 1));
  const pairs = [];
  for (let i = 0; i < N; i++) for (let j = i + 1; j < N; j++) pairs.push([i, j]);
  const out = { engine: E.name, N };
  let syncMs = 0;
  let syncBytes = 0;
  let syncs = 0;
  const randomSync = () => {
    const [i, j] = pairs[pick(rnd, pairs.length)];
    const t0 = performance.now();
    syncBytes += E.sync(reps[i], reps[j]).bytes;
    syncMs += performance.now() - t0;
    syncs++;
  };

  // create: peer records, then 200 services with 2 routes each, spread over the replicas
  for (let i = 0; i < PEER_RECORDS; i++) E.put(reps[i % N], 'peers', `peer-${i}`, peerBody(i));
  const pairsOfPeers = [];
  for (let s = 0; s < PEER_RECORDS; s++)
    for (let d = 0; d < PEER_RECORDS; d++) if (s !== d) pairsOfPeers.push([s, d]);
  shuffle(rnd, pairsOfPeers);
  let t0 = performance.now();
  for (let k = 0; k < SERVICES; k++) {
    sim.now++;
    const r = reps[k % N];
    const [src, dst] = pairsOfPeers[k];
    E.put(r, 'services', `svc-${k}`, serviceBody(k, src, dst));
    for (let j = 0; j < 2; j++) E.put(r, 'routes', `rt-${k}-${j}`, routeBody(k, j));
    if (k % 10 === 9) randomSync();
  }
  const asc = pairs;
  fullSync(E, reps, asc);
  out.bytesAfterCreate = E.size(reps[0]);

  // 20 000 field updates on random services at random replicas, a random pairwise sync every 20
  let localMs = 0;
  for (let u = 0; u < UPDATES; u++) {
    sim.now++;
    const r = reps[pick(rnd, N)];
    const k = pick(rnd, SERVICES);
    const f =
      rnd() < 0.5 ? { bandwidthLimitMbps: pick(rnd, 10_000) } : { name: `svc-${k}-${pick(rnd, 1e6)}` };
    t0 = performance.now();
    E.update(r, 'services', `svc-${k}`, { ...f, updatedAt: iso() });
    localMs += performance.now() - t0;
    if (u % 20 === 19) randomSync();
  }
  out.update20kMs = localMs;
  fullSync(E, reps, asc);
  out.bytesAfterUpdates = E.size(reps[0]);

  // delete half the services (with their routes) while other replicas keep updating them
  const victims = shuffle(rnd, [...Array(SERVICES).keys()]).slice(0, SERVICES / 2);
  for (const [n, k] of victims.entries()) {
    sim.now++;
    const r = reps[pick(rnd, N)];
    E.remove(r, 'services', `svc-${k}`);
    for (let j = 0; j < 2; j++) E.remove(r, 'routes', `rt-${k}-${j}`);
    for (let u = 0; u < DELETE_INTERLEAVED_UPDATES; u++) {
      sim.now++;
      const kk = pick(rnd, SERVICES);
      E.update(reps[pick(rnd, N)], 'services', `svc-${kk}`, {
        bandwidthLimitMbps: pick(rnd, 10_000),
        updatedAt: iso(),
      });
    }
    if (n % 2 === 1) randomSync();
  }
  out.randomSyncs = syncs;
  out.randomSyncMsAvg = syncMs / syncs;
  out.randomSyncBytesAvg = syncBytes / syncs;

  // order independence: the same divergent replicas, fully synced in two different pair orders
  const snapshot = reps.map((r) => E.clone(r));
  const fa = fullSync(E, reps, asc);
  const fb = fullSync(E, snapshot, shuffle(prng(seed + 1), [...pairs].reverse()));
  out.converged = fa.converged && fb.converged;
  out.passes = `${fa.passes}/${fb.passes}`;
  out.orderIndependent = canonical(E.state(reps[0])) === canonical(E.state(snapshot[0]));
  const live = E.state(reps[0]).services;
  out.resurrected = victims.filter((k) => live[`svc-${k}`] !== undefined).length;
  out.bytesAfterDeletes = E.size(reps[0]);
  const blob = E.blob(reps[0]);
  out.gzipAfterDeletes = gzipSync(blob).byteLength;
  t0 = performance.now();
  const loaded = E.load(blob);
  out.loadMs = performance.now() - t0;
  out.loadOk = canonical(E.state(loaded)) === canonical(E.state(reps[0]));
  if (E.gcTombstones) {
    out.tombstones = E.tombstones(reps[0]);
    E.gcTombstones(reps);
    out.bytesAfterTombstoneGc = E.size(reps[0]);
  }

  // one-change delta sync between two replicas that are otherwise in sync
  const ms = [];
  const wire = [];
  const push = [];
  const survivors = Object.keys(live).map((id) => Number(id.slice(4)));
  for (let n = 0; n < 41; n++) {
    sim.now++;
    const k = survivors[n % survivors.length];
    E.update(reps[0], 'services', `svc-${k}`, { bandwidthLimitMbps: 5000 + n, updatedAt: iso() });
    push.push(E.pushBytes(reps[0], 'services', `svc-${k}`));
    const t = performance.now();
    wire.push(E.sync(reps[0], reps[1]).bytes);
    ms.push(performance.now() - t);
  }
  out.deltaSyncMs = median(ms);
  out.deltaSyncBytes = median(wire);
  out.pushBytes = median(push);
  // an already-in-sync pair: what a no-op anti-entropy round costs
  out.inSyncBytes = E.sync(reps[0], reps[1]).bytes;

  // full state transfer to a new, empty replica
  const fresh = E.createEmpty(N + 1);
  t0 = performance.now();
  const full = E.sync(reps[0], fresh);
  out.fullTransferMs = performance.now() - t0;
  out.fullTransferBytes = full.bytes;
  out.fullTransferOk = canonical(E.state(fresh)) === canonical(E.state(reps[0]));
  return out;
}

// ---------- semantic probes: explicit concurrent conflicts on two replicas ----------
function probes(E, lowFirst) {
  // a = replica writing first; b writes 50 ms later (more than the +-20 ms clock skew). lowFirst: a has the lower id.
  const [ia, ib] = lowFirst ? [1, 2] : [2, 1];
  const setup = () => {
    const a = E.create(ia);
    const b = E.create(ib);
    const c = E.create(3);
    E.put(a, 'peers', 'peer-9', { id: 'peer-9', name: 'old', status: 'active' });
    E.put(a, 'services', 'svc-x', { id: 'svc-x', bandwidthLimitMbps: 1 });
    E.sync(a, b);
    E.sync(a, c);
    return [a, b, c];
  };
  const res = {};
  const get = (r, kind, id) => E.state(r)[kind][id];

  // 1. same field, concurrent: same winner in either delivery order?
  const winners = [0, 1].map((order) => {
    const [a, b, c] = setup();
    sim.now += 10;
    E.update(a, 'services', 'svc-x', { bandwidthLimitMbps: 100 });
    sim.now += 50;
    E.update(b, 'services', 'svc-x', { bandwidthLimitMbps: 200 });
    const seq = order ? [a, b] : [b, a];
    for (const r of seq) E.sync(r, c);
    E.sync(a, b);
    E.sync(a, c);
    const w = [a, b, c].map((r) => get(r, 'services', 'svc-x').bandwidthLimitMbps);
    return w.every((x) => x === w[0]) ? w[0] : `diverged ${w}`;
  });
  res.sameFieldWinner =
    winners[0] === winners[1] ? (winners[0] === 200 ? 'later write' : 'earlier write') : 'order-dependent';

  // 2. delete on a, concurrent update of the same record on b
  {
    const [a, b] = setup();
    sim.now += 10;
    E.remove(a, 'services', 'svc-x');
    sim.now += 50;
    E.update(b, 'services', 'svc-x', { bandwidthLimitMbps: 300 });
    E.sync(a, b);
    const sa = get(a, 'services', 'svc-x');
    res.deleteVsUpdate = sa === undefined ? 'stays deleted' : `resurrected ${canonical(sa)}`;
  }
  // 3. deactivation on a, concurrent rename on b
  {
    const [a, b] = setup();
    sim.now += 10;
    E.update(a, 'peers', 'peer-9', { status: 'inactive' });
    sim.now += 50;
    E.update(b, 'peers', 'peer-9', { name: 'renamed' });
    E.sync(a, b);
    const p = get(a, 'peers', 'peer-9');
    res.deactivateVsRename = `${p.status}${p.name === 'renamed' ? '+renamed' : ''}`;
  }
  // 4. removed on a, concurrent inactive on b (rule: removed > inactive)
  {
    const [a, b] = setup();
    sim.now += 10;
    E.update(a, 'peers', 'peer-9', { status: 'removed' });
    sim.now += 50;
    E.update(b, 'peers', 'peer-9', { status: 'inactive' });
    E.sync(a, b);
    res.removedVsInactive = get(a, 'peers', 'peer-9').status;
  }
  return res;
}

// ---------- main ----------
const engines = [
  lwwEngine('flat'),
  lwwEngine('bucketed'),
  yjsEngine(true),
  yjsEngine(false),
  automergeEngine(false),
  automergeEngine(true),
];
const version = (p) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${p}/package.json`, import.meta.url))).version;
console.log(
  `# crdt-eval  node ${process.version}  yjs ${version('yjs')}  @automerge/automerge ${version('@automerge/automerge')}`,
);
console.log(
  `# ${SERVICES} services x 2 routes, ${PEER_RECORDS} peer records, ${UPDATES} updates, delete ${SERVICES / 2}\n`,
);

console.log('## Semantic probes (a writes first, b 50 ms later; "a<b" = a has the lower replica id)\n');
console.log('| engine | ids | same field | delete vs update | deactivate vs rename | removed vs inactive |');
console.log('|---|---|---|---|---|---|');
for (const E of engines) {
  for (const lowFirst of [true, false]) {
    const p = probes(E, lowFirst);
    console.log(
      `| ${E.name} | ${lowFirst ? 'a<b' : 'a>b'} | ${p.sameFieldWinner} | ${p.deleteVsUpdate} | ${p.deactivateVsRename} | ${p.removedVsInactive} |`,
    );
  }
}

const heavy = engines.filter((E) => !E.name.includes('whole record'));
const rows = [];
for (const N of [3, 10]) {
  for (const E of heavy) {
    const t = performance.now();
    const r = workload(E, N);
    r.totalS = (performance.now() - t) / 1000;
    rows.push(r);
    console.error(`done ${E.name} N=${N} in ${r.totalS.toFixed(1)} s`);
  }
}
const f1 = (x) => (x === undefined ? '-' : x.toFixed(1));
const f2 = (x) => x.toFixed(2);
const kb = (x) => (x === undefined ? '-' : (x / 1024).toFixed(1));
console.log('\n## Workload\n');
console.log(
  '| engine | N | converged (passes A/B) | order-indep. | resurrected | KiB create | KiB 20k upd | KiB deletes (gzip) | KiB after tomb. GC | load blob ms | ms 20k local upd | random sync ms / KiB | 1-change sync ms / B | push B | in-sync round B | full transfer ms / KiB | run s |',
);
console.log('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|');
for (const r of rows) {
  console.log(
    `| ${r.engine} | ${r.N} | ${r.converged} (${r.passes}) | ${r.orderIndependent} | ${r.resurrected}/${SERVICES / 2} | ${kb(r.bytesAfterCreate)} | ${kb(r.bytesAfterUpdates)} | ${kb(r.bytesAfterDeletes)} (${kb(r.gzipAfterDeletes)}) | ${kb(r.bytesAfterTombstoneGc)} | ${f1(r.loadMs)}${r.loadOk ? '' : ' (MISMATCH)'} | ${f1(r.update20kMs)} | ${f2(r.randomSyncMsAvg)} / ${kb(r.randomSyncBytesAvg)} | ${f2(r.deltaSyncMs)} / ${r.deltaSyncBytes} | ${r.pushBytes} | ${r.inSyncBytes} | ${f1(r.fullTransferMs)} / ${kb(r.fullTransferBytes)}${r.fullTransferOk ? '' : ' (MISMATCH)'} | ${f1(r.totalS)} |`,
  );
}
