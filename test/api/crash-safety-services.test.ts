/**
 * Crash safety of acknowledged service and route writes, against a real agent process killed
 * with SIGKILL (the credential version of this test is crash-safety.test.ts).
 *
 * Agent A is joined with four other agents, so it knows five peers: twenty (source, target)
 * pairs for services, which are unique per pair. Each round starts a burst of 50 concurrent
 * writes on A: service creations on free pairs with varied fields (half of them followed, once
 * answered, by a route batch on the new service), route batches of 1 to 5 routes (IPv4 and
 * IPv6, non-canonical spellings among them), bandwidth changes (several PUTs in flight on one
 * service), and deletions of services and routes acknowledged in earlier rounds. A is killed
 * with SIGKILL once a random number of the writes have been answered, at that answer or a few
 * ms later, while others are in flight, and restarted on the same data dir and port.
 *
 * After every restart, through the API and in the database file itself: `PRAGMA
 * integrity_check` is ok; every acknowledged creation is there with exactly the fields it was
 * given (canonical CIDRs), every acknowledged deletion is gone (a service's routes with it); a
 * write whose answer the kill cut off either happened whole or not at all (a route batch is all
 * or none); nothing exists that was never requested; a bandwidth changed by concurrent PUTs holds
 * the value of the last one committed (service `version` tells the order), which is the last
 * acknowledged one unless an unanswered PUT committed after it; the admin token issued before
 * the first kill still works and the signing and identity keys are the same.
 *
 * SIGKILL ends the process, not the machine: this covers a crashed agent, not a power cut.
 * Reproduce a run with CRASH_SEED=<seed in the diagnostics>: the kill moments repeat exactly, the
 * writes planned as long as the same unanswered writes commit (which is up to timing).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { ApiResponse, Conformance } from '../helpers/api-client.js';
import { type DumpValue, dumpDatabase, integrityCheck } from '../helpers/db-dump.js';
import { makeVendor } from '../helpers/licenses.js';
import { join, type Node, startNode } from '../helpers/nodes.js';
import { prng, SEED } from '../helpers/seeded-random.js';

// 30 kill/restart rounds, as for credentials: enough different kill moments (after 1 to 49
// answers, at once or a few ms later, among five kinds of write) to catch a lost or torn write,
// while one round (restart and checks included) takes about a second, so the file stays well
// inside its 4-minute budget on 2 cores beside other test files.
const ROUNDS = 30;
/** Writes started at once per round (follow-up route batches of new services come on top). */
const CONCURRENT = 50;
/** Services made before the first round, so that every round has services to change. */
const INITIAL_SERVICES = 12;
/** A, plus this many agents joined to it. */
const OTHER_AGENTS = 4;

/** The fields of a service's single form that its creation fixes (plus the bandwidth). */
interface ServiceFields {
  source_peer_id: string;
  target_peer_id: string;
  transport_type: 'tcp' | 'kcp';
  requires_interface: boolean;
  interface_ipv4_cidr: string | null;
  interface_ipv6_cidr: string | null;
  fully_transparent: boolean;
  bandwidth_limit_mbps: number;
  /** Never set by these writes: an extension whose own tests are in services.test.ts. */
  health_check: null;
}

/** A route as the agent must store it: canonical CIDRs, null for an absent one. */
interface RouteSpec {
  priority: number;
  source_cidr: string | null;
  dest_cidr: string | null;
}

interface RouteModel extends RouteSpec {
  id: number;
  /** Round of the write that created it; -1 before the first round. */
  round: number;
}

interface Batch {
  /** As sent, spellings not always canonical. */
  sent: { priority: number; source_cidr?: string; dest_cidr?: string }[];
  expected: RouteSpec[];
}

/** What the agent must hold for one service. */
interface ServiceModel {
  id: string;
  fields: ServiceFields;
  version: number;
  createdAt: string;
  routes: Map<number, RouteModel>;
  round: number;
  /** False when the creation committed but its answer was cut off by the kill. */
  acknowledged: boolean;
}

type Outcome = 'pending' | 'acknowledged' | 'unknown';

interface OpBase {
  outcome: Outcome;
  // biome-ignore lint/suspicious/noExplicitAny: the JSON answer, checked field by field
  answer?: any;
}
interface CreateOp extends OpBase {
  kind: 'create';
  body: Record<string, unknown>;
  fields: ServiceFields;
  followUp?: RoutesOp;
}
interface RoutesOp extends OpBase {
  kind: 'routes';
  /** Set when sent; a follow-up learns it from its creation's answer. */
  serviceId: string;
  batch: Batch;
}
interface PutOp extends OpBase {
  kind: 'put';
  serviceId: string;
  bandwidth: number;
}
interface DeleteServiceOp extends OpBase {
  kind: 'delete-service';
  serviceId: string;
}
interface DeleteRouteOp extends OpBase {
  kind: 'delete-route';
  serviceId: string;
  routeId: number;
}
type Op = CreateOp | RoutesOp | PutOp | DeleteServiceOp | DeleteRouteOp;

interface RoundStats {
  round: number;
  waitedFor: number;
  killMode: string;
  sent: number;
  acknowledged: number;
  inFlightAtKill: number;
  /** Writes whose answer the kill cut off but which are in the restarted agent's state. */
  committedUnacknowledged: number;
  kinds: string;
}

const routeKey = (r: RouteSpec) => `${r.priority}|${r.source_cidr}|${r.dest_cidr}`;
const pairKey = (source: string, target: string) => `${source}>${target}`;
const byPriorityThenId = (x: RouteModel, y: RouteModel) => x.priority - y.priority || x.id - y.id;

describe('crash safety: services and routes acknowledged before a SIGKILL survive the restart', () => {
  const vendor = makeVendor();
  // Two streams: the kill moments replay exactly; the writes planned replay as far as the state
  // allows (which unanswered writes committed is up to timing, and later plans depend on it).
  const random = prng(SEED);
  const killRandom = prng(SEED ^ 0x9e3779b9);
  const int = (n: number) => Math.floor(random() * n);
  const pick = <T>(items: readonly T[]): T => items[int(items.length)]!;
  function shuffle<T>(items: T[]): T[] {
    for (let i = items.length - 1; i > 0; i--) {
      const j = int(i + 1);
      [items[i], items[j]] = [items[j]!, items[i]!];
    }
    return items;
  }

  let a: Node;
  let others: Node[] = [];
  /** Peer ids in agent order (A first), so that a seed plans the same pairs whatever the ids. */
  let peerIds: string[];
  let kid: string;
  let conformance: Conformance;
  const model = new Map<string, ServiceModel>();
  /** Every service and route id whose deletion was acknowledged or observed; never to return. */
  const goneServices = new Map<string, string>();
  const goneRoutes = new Map<number, string>();
  let routeCounter = 0;

  before(async () => {
    // A high max_services: the 20 pairs, not the license, bound the number of services.
    const license = { max_nodes: 1 + OTHER_AGENTS, max_services: 1000 };
    const nodes = await Promise.all(
      Array.from({ length: 1 + OTHER_AGENTS }, () => startNode(vendor, license)),
    );
    a = nodes[0]!;
    others = nodes.slice(1);
    for (const other of others) await join(a, other);
    const peers = await a.agent.client.get('/v1/peers', { token: a.token });
    assert.equal(peers.status, 200, peers.text);
    peerIds = nodes.map((n) => n.peerId);
    assert.deepEqual(
      (peers.body as { id: string }[]).map((p) => p.id).sort(),
      [...peerIds].sort(),
      'A knows every joined agent',
    );
    kid = (await a.agent.client.get('/.well-known/jwks.json')).body.keys[0].kid;
    conformance = await a.agent.client.conformance();
  });
  after(async () => {
    // Every agent is stopped before any exit code is asserted, so a failure leaves none running.
    const nodes = [...(a ? [a] : []), ...others];
    const codes = await Promise.all(nodes.map((n) => n.agent.stop()));
    const failed = nodes
      .map((n, i) => ({ n, i, code: codes[i] }))
      .filter(({ code }) => code !== 0)
      .map(
        ({ n, i, code }) =>
          `agent ${'ABCDE'[i]} exited with ${code ?? n.agent.exitSignal}; its log ends:\n` +
          n.agent.logs.split('\n').slice(-15).join('\n'),
      );
    assert.deepEqual(failed, [], 'exit codes of A (after its last restart) and B..E');
  });

  /** A route batch of 1 to 5 routes; each carries a CIDR no other route has, so it is recognised. */
  function newBatch(): Batch {
    const batch: Batch = { sent: [], expected: [] };
    for (let i = 1 + int(5); i > 0; i--) {
      const n = ++routeCounter; // below 2^16 over the whole run
      const priority = int(65_536);
      let unique: [string, string];
      let shared: [string, string];
      if (random() < 0.5) {
        unique = [`10.${n >> 8}.${n & 255}.0/24`, `10.${n >> 8}.${n & 255}.0/24`];
        shared = [`172.${16 + (n % 16)}.0.0/16`, `172.${16 + (n % 16)}.0.0/16`];
      } else {
        // Upper case and written-out zero groups, stored as RFC 5952 text.
        const hex = n.toString(16);
        unique = [`2001:DB8:${hex.toUpperCase()}:0:0:0:0:0/48`, `2001:db8:${hex}::/48`];
        shared = ['FD00:0:0:0:0:0:0:0/8', 'fd00::/8'];
      }
      const shape = random();
      const [source, dest] =
        shape < 0.35 ? [undefined, unique] : shape < 0.6 ? [unique, undefined] : [shared, unique];
      batch.sent.push({
        priority,
        ...(source ? { source_cidr: source[0] } : {}),
        ...(dest ? { dest_cidr: dest[0] } : {}),
      });
      batch.expected.push({ priority, source_cidr: source?.[1] ?? null, dest_cidr: dest?.[1] ?? null });
    }
    return batch;
  }

  /** A creation body for the pair with varied fields, and the single form it must give. */
  function newCreate(source: string, target: string): CreateOp {
    const body: Record<string, unknown> = { target_peer_id: target };
    const spellSource = random() < 0.5; // the local peer is the default source
    if (source !== a.peerId || spellSource) body.source_peer_id = source;
    const transport = pick(['tcp', 'kcp', undefined] as const);
    if (transport) body.transport_type = transport;
    const iface = pick([true, true, false, undefined] as const);
    if (iface !== undefined) body.requires_interface = iface;
    let ipv4: string | null = null;
    let ipv6: string | null = null;
    if (iface) {
      if (random() < 0.6) {
        ipv4 = `${pick(['192.0.2', '198.51.100', '203.0.113'])}.${1 + int(254)}/${24 + int(7)}`;
        body.desired_ipv4_cidr = ipv4;
      }
      if (random() < 0.6) {
        const hex = (1 + int(0xffff)).toString(16);
        body.desired_ipv6_cidr = `2001:DB8:0:0:0:0:0:${hex.toUpperCase()}/64`;
        ipv6 = `2001:db8::${hex}/64`;
      }
    }
    const transparent = iface === true && transport !== 'kcp' && random() < 0.3;
    if (transparent || random() < 0.3) body.fully_transparent = transparent;
    const bandwidth = random() < 0.3 ? 0 : int(100_001);
    if (bandwidth !== 0 || random() < 0.5) body.bandwidth_limit_mbps = bandwidth;
    const fields: ServiceFields = {
      source_peer_id: source,
      target_peer_id: target,
      transport_type: transport ?? 'tcp',
      requires_interface: iface ?? false,
      interface_ipv4_cidr: ipv4,
      interface_ipv6_cidr: ipv6,
      fully_transparent: transparent,
      bandwidth_limit_mbps: bandwidth,
      health_check: null,
    };
    return { kind: 'create', outcome: 'pending', body, fields };
  }

  const request = (op: Op): { method: string; path: string; json?: unknown } => {
    switch (op.kind) {
      case 'create':
        return { method: 'POST', path: '/v1/services', json: op.body };
      case 'routes':
        return {
          method: 'POST',
          path: `/v1/services/${op.serviceId}/routes`,
          json: { routes: op.batch.sent },
        };
      case 'put':
        return {
          method: 'PUT',
          path: `/v1/services/${op.serviceId}`,
          json: { bandwidth_limit_mbps: op.bandwidth },
        };
      case 'delete-service':
        return { method: 'DELETE', path: `/v1/services/${op.serviceId}` };
      case 'delete-route':
        return { method: 'DELETE', path: `/v1/services/${op.serviceId}/routes/${op.routeId}` };
    }
  };
  const okStatus = (op: Op) => (op.kind === 'create' || op.kind === 'routes' ? 201 : 200);

  /** The writes of one round: each service and route is touched by compatible writes only. */
  function planRound(): Op[] {
    const services = shuffle([...model.values()]);
    const deleteCount = services.length > 14 ? 2 + int(4) : services.length > 8 ? int(3) : 0;
    const doomed = services.slice(0, deleteCount);
    const live = services.slice(deleteCount);
    const ops: Op[] = doomed.map((s) => ({ kind: 'delete-service', outcome: 'pending', serviceId: s.id }));

    const taken = new Set(services.map((s) => pairKey(s.fields.source_peer_id, s.fields.target_peer_id)));
    const free = shuffle(
      peerIds.flatMap((s) =>
        peerIds.filter((t) => t !== s && !taken.has(pairKey(s, t))).map((t) => [s, t] as const),
      ),
    );
    for (const [source, target] of free.slice(0, 3 + int(6))) {
      const create = newCreate(source, target);
      if (random() < 0.5)
        create.followUp = { kind: 'routes', outcome: 'pending', serviceId: '', batch: newBatch() };
      ops.push(create);
    }

    const routes = shuffle(live.flatMap((s) => [...s.routes.keys()].map((id) => [s.id, id] as const)));
    for (const [serviceId, routeId] of routes.slice(0, int(7))) {
      ops.push({ kind: 'delete-route', outcome: 'pending', serviceId, routeId });
    }

    // Bandwidth changes: 1 to 4 services, each with 1 to 3 concurrent PUTs of different values
    // (none equal to the current one, so each PUT that commits raises the version by one).
    for (const s of shuffle([...live]).slice(0, 1 + int(4))) {
      const values = new Set<number>();
      const count = 1 + int(3);
      while (values.size < count) {
        const v = int(100_001);
        if (v !== s.fields.bandwidth_limit_mbps) values.add(v);
      }
      for (const bandwidth of values)
        ops.push({ kind: 'put', outcome: 'pending', serviceId: s.id, bandwidth });
    }

    while (live.length > 0 && ops.length < CONCURRENT) {
      ops.push({ kind: 'routes', outcome: 'pending', serviceId: pick(live).id, batch: newBatch() });
    }
    return shuffle(ops.slice(0, CONCURRENT));
  }

  /** Sends a write and waits for it and its follow-up; the outcome is recorded on the op. */
  async function send(
    op: Op,
    hooks: { onAnswer: () => void; onSettled: () => void; unexpected: string[]; sent: Op[] },
  ): Promise<void> {
    hooks.sent.push(op);
    const { method, path, json } = request(op);
    let res: ApiResponse;
    try {
      res = await a.agent.client.raw(method, path, {
        ...(json === undefined ? {} : { json }),
        token: a.token,
        timeoutMs: 20_000,
      });
    } catch {
      // The connection died with the agent: outcome unknown, nothing promised.
      op.outcome = 'unknown';
      hooks.onSettled();
      return;
    }
    hooks.onSettled();
    if (res.status !== okStatus(op)) {
      op.outcome = 'unknown';
      hooks.unexpected.push(`${method} ${path} ${JSON.stringify(json)}: ${res.status} ${res.text}`);
      return;
    }
    try {
      conformance.check(method, path, res);
    } catch (e) {
      hooks.unexpected.push(String(e));
    }
    op.outcome = 'acknowledged';
    op.answer = res.body;
    hooks.onAnswer();
    if (op.kind === 'create' && op.followUp) {
      op.followUp.serviceId = res.body.id;
      await send(op.followUp, hooks);
    }
  }

  /** Seeds services with routes before the first round (no kill), so every round has targets. */
  async function seed(): Promise<void> {
    const free = shuffle(peerIds.flatMap((s) => peerIds.filter((t) => t !== s).map((t) => [s, t] as const)));
    for (const [source, target] of free.slice(0, INITIAL_SERVICES)) {
      const create = newCreate(source, target);
      const res = await a.agent.client.post('/v1/services', { token: a.token, json: create.body });
      assert.equal(res.status, 201, res.text);
      const s: ServiceModel = {
        id: res.body.id,
        fields: create.fields,
        version: 1,
        createdAt: res.body.created_at,
        routes: new Map(),
        round: -1,
        acknowledged: true,
      };
      const batch = newBatch();
      const added = await a.agent.client.post(`/v1/services/${s.id}/routes`, {
        token: a.token,
        json: { routes: batch.sent },
      });
      assert.equal(added.status, 201, added.text);
      batch.expected.forEach((r, i) => {
        s.routes.set(added.body.route_ids[i], { ...r, id: added.body.route_ids[i], round: -1 });
      });
      model.set(s.id, s);
    }
  }

  it(`keeps every acknowledged service and route write over ${ROUNDS} kill -9 rounds with ${CONCURRENT} writes in flight`, async (t) => {
    t.diagnostic(`CRASH_SEED=${SEED}`);
    await seed();
    const stats: RoundStats[] = [];
    const committedByKind: Record<Op['kind'], number> = {
      create: 0,
      routes: 0,
      put: 0,
      'delete-service': 0,
      'delete-route': 0,
    };
    const started = Date.now();

    for (let round = 0; round < ROUNDS; round++) {
      const planned = planRound();
      const waitFor = 1 + Math.floor(killRandom() * (CONCURRENT - 1));
      // every other kill lands at an answer, when writes are surely in flight: half the rounds
      // by construction, not by the seed's luck (the in-flight check below counts on them)
      const delayMs = round % 2 === 0 ? 0 : Math.floor(killRandom() * 12);
      const killMode = delayMs === 0 ? 'at the answer' : `${delayMs} ms after it`;
      const where = `round ${round} (CRASH_SEED=${SEED}, kill after ${waitFor} answers, ${killMode})`;

      let answered = 0;
      let settled = 0;
      let inFlightAtKill = -1;
      let killed: Promise<void> | undefined;
      const sent: Op[] = [];
      const unexpected: string[] = [];
      const kill = () => {
        if (killed) return;
        inFlightAtKill = sent.length - settled;
        killed = a.agent.kill9();
      };
      const hooks = {
        sent,
        unexpected,
        onSettled: () => {
          settled++;
        },
        onAnswer: () => {
          answered++;
          if (answered === waitFor) {
            if (delayMs === 0) kill();
            else setTimeout(kill, delayMs);
          }
        },
      };
      await Promise.all(planned.map((op) => send(op, hooks)));
      kill(); // in case every request was answered before the timer fired
      await killed;
      assert.deepEqual(unexpected, [], `${where}: answers other than the documented success before the kill`);
      const acknowledged = sent.filter((op) => op.outcome === 'acknowledged').length;
      assert.ok(acknowledged >= Math.min(waitFor, sent.length), `${where}: only ${acknowledged} answers`);

      await a.agent.restart();

      // The file is sound.
      assert.equal(integrityCheck(a.agent.dataDir), 'ok', `${where}: integrity_check`);
      // The keys were loaded, not made anew: the token issued before the first kill still works.
      const jwks = await a.agent.client.get('/.well-known/jwks.json');
      assert.equal(jwks.body.keys[0].kid, kid, `${where}: the token signing key changed`);
      const identity = await a.agent.client.get('/v1/cluster/identity');
      assert.equal(identity.body.peer_id, a.peerId, `${where}: the identity key changed`);
      const peers = await a.agent.client.get('/v1/peers', { token: a.token });
      assert.equal(
        peers.status,
        200,
        `${where}: the admin token issued before the kills is refused: ${peers.text}`,
      );
      assert.deepEqual(
        (peers.body as { id: string }[]).map((p) => p.id).sort(),
        [...peerIds].sort(),
        `${where}: the joined peers`,
      );

      const committed = await settleAndCheck(round, sent, where);
      for (const kind of Object.keys(committed) as Op['kind'][]) committedByKind[kind] += committed[kind];
      const committedUnacknowledged = Object.values(committed).reduce((n, c) => n + c, 0);
      const count = (kind: Op['kind']) =>
        `${sent.filter((op) => op.kind === kind && op.outcome === 'acknowledged').length}/${sent.filter((op) => op.kind === kind).length}`;
      stats.push({
        round,
        waitedFor: waitFor,
        killMode,
        sent: sent.length,
        acknowledged,
        inFlightAtKill,
        committedUnacknowledged,
        kinds:
          `create ${count('create')}, routes ${count('routes')}, put ${count('put')}, ` +
          `delete service ${count('delete-service')}, delete route ${count('delete-route')}`,
      });
    }

    const withInFlight = stats.filter((s) => s.inFlightAtKill > 0).length;
    const sum = (f: (s: RoundStats) => number) => stats.reduce((n, s) => n + f(s), 0);
    const routes = [...model.values()].reduce((n, s) => n + s.routes.size, 0);
    t.diagnostic(
      `${sum((s) => s.acknowledged)} of ${sum((s) => s.sent)} writes acknowledged and kept; ` +
        `${sum((s) => Math.max(0, s.inFlightAtKill))} unanswered when the kill was sent (answers already ` +
        `written still arrive after it), ${sum((s) => s.sent - s.acknowledged)} never answered; ` +
        `${withInFlight}/${ROUNDS} kills ` +
        `with writes in flight; ${sum((s) => s.committedUnacknowledged)} writes committed whose answer the ` +
        `kill cut off (${JSON.stringify(committedByKind)}); ${model.size} services with ${routes} routes at the end, ${goneServices.size} services ` +
        `and ${goneRoutes.size} routes deleted; ${((Date.now() - started) / 1000).toFixed(1)} s`,
    );
    for (const s of stats) {
      t.diagnostic(
        `round ${s.round}: killed ${s.killMode} #${s.waitedFor}, ${s.acknowledged}/${s.sent} acknowledged ` +
          `(${s.kinds}), ${s.inFlightAtKill} unanswered when the kill was sent, ${s.committedUnacknowledged} committed unacknowledged`,
      );
    }
    // The kill must really land among in-flight writes, or the rounds test nothing.
    assert.ok(withInFlight >= ROUNDS / 2, `only ${withInFlight} of ${ROUNDS} kills had writes in flight`);
  });

  /**
   * Brings the model up to date with the round's writes, resolving each unanswered one by what
   * the restarted agent holds (it happened whole or not at all), then requires the agent's state,
   * through the API and in the file, to be exactly the model. Returns how many unanswered writes
   * of each kind had committed.
   */
  async function settleAndCheck(
    round: number,
    sent: Op[],
    where: string,
  ): Promise<Record<Op['kind'], number>> {
    const listed = await a.agent.client.get('/v1/services', { token: a.token });
    assert.equal(listed.status, 200, `${where}: list: ${listed.text}`);
    // biome-ignore lint/suspicious/noExplicitAny: JSON answers, compared with the model
    const actual = new Map<string, any>();
    for (const item of listed.body) {
      const one = await a.agent.client.get(`/v1/services/${item.id}`, { token: a.token });
      assert.equal(one.status, 200, `${where}: GET service ${item.id}: ${one.text}`);
      const { route_count, ...fromList } = item;
      const { routes, ...fromSingle } = one.body;
      assert.deepEqual(fromSingle, fromList, `${where}: list and single form of ${item.id} differ`);
      assert.equal(route_count, routes.length, `${where}: route_count of ${item.id}`);
      actual.set(item.id, one.body);
    }
    const actualRoutes = (serviceId: string): RouteModel[] => actual.get(serviceId)?.routes ?? [];
    const committed: Record<Op['kind'], number> = {
      create: 0,
      routes: 0,
      put: 0,
      'delete-service': 0,
      'delete-route': 0,
    };

    // Deletions. A service deleted on an acknowledgement is gone with its routes.
    for (const op of sent) {
      if (op.kind !== 'delete-service') continue;
      const s = model.get(op.serviceId)!;
      if (op.outcome === 'acknowledged') {
        assert.deepEqual(op.answer, { deleted: true }, `${where}: answer to DELETE ${op.serviceId}`);
        assert.ok(
          !actual.has(op.serviceId),
          `${where}: service ${op.serviceId} deleted on acknowledgement is back`,
        );
      } else if (actual.has(op.serviceId)) {
        continue; // not committed: it must still be exactly as it was (checked below)
      } else {
        committed['delete-service']++;
      }
      model.delete(op.serviceId);
      goneServices.set(op.serviceId, `deleted in round ${round}`);
      for (const id of s.routes.keys())
        goneRoutes.set(id, `its service ${op.serviceId} was deleted in round ${round}`);
    }
    for (const op of sent) {
      if (op.kind !== 'delete-route') continue;
      const s = model.get(op.serviceId)!;
      const present = actualRoutes(op.serviceId).some((r) => r.id === op.routeId);
      if (op.outcome === 'acknowledged') {
        assert.deepEqual(op.answer, { deleted: true }, `${where}: answer to DELETE route ${op.routeId}`);
        assert.ok(!present, `${where}: route ${op.routeId} deleted on acknowledgement is back`);
      } else if (present) {
        continue;
      } else {
        committed['delete-route']++;
      }
      s.routes.delete(op.routeId);
      goneRoutes.set(op.routeId, `deleted in round ${round}`);
    }

    // Creations: an acknowledged one with its answer's id; an unanswered one is found by its
    // pair, which no other service holds, and must then have exactly the fields requested.
    for (const op of sent) {
      if (op.kind !== 'create') continue;
      const pair = `${op.fields.source_peer_id} → ${op.fields.target_peer_id}`;
      let id: string;
      let createdAt: string;
      if (op.outcome === 'acknowledged') {
        const answer = op.answer;
        assert.deepEqual(
          {
            source_peer_id: answer.source_peer_id,
            target_peer_id: answer.target_peer_id,
            transport_type: answer.transport_type,
            requires_interface: answer.requires_interface,
          },
          {
            source_peer_id: op.fields.source_peer_id,
            target_peer_id: op.fields.target_peer_id,
            transport_type: op.fields.transport_type,
            requires_interface: op.fields.requires_interface,
          },
          `${where}: answer to the creation of ${pair}`,
        );
        id = answer.id;
        createdAt = answer.created_at;
        assert.ok(actual.has(id), `${where}: service ${id} (${pair}) acknowledged in round ${round} is lost`);
      } else {
        const found = [...actual.values()].find(
          (s) =>
            !model.has(s.id) &&
            s.source_peer_id === op.fields.source_peer_id &&
            s.target_peer_id === op.fields.target_peer_id,
        );
        if (!found) continue;
        committed.create++;
        id = found.id;
        createdAt = found.created_at;
      }
      model.set(id, {
        id,
        fields: { ...op.fields },
        version: 1,
        createdAt,
        routes: new Map(),
        round,
        acknowledged: op.outcome === 'acknowledged',
      });
    }

    // Route batches: an acknowledged one with its ids in request order; an unanswered one is
    // recognised by its routes' unique CIDRs and must be there whole or not at all.
    for (const op of sent) {
      if (op.kind !== 'routes') continue;
      const s = model.get(op.serviceId);
      assert.ok(s, `${where}: routes were sent to ${op.serviceId}, which the model does not hold`);
      if (op.outcome === 'acknowledged') {
        assert.equal(op.answer.count, op.batch.expected.length, `${where}: count of routes added to ${s.id}`);
        assert.equal(op.answer.route_ids.length, op.batch.expected.length, `${where}: route_ids of ${s.id}`);
        op.batch.expected.forEach((r, i) => {
          const id = op.answer.route_ids[i] as number;
          s.routes.set(id, { ...r, id, round });
        });
        for (const id of op.answer.route_ids as number[]) {
          assert.ok(
            actualRoutes(s.id).some((r) => r.id === id),
            `${where}: route ${id} of service ${s.id} acknowledged in round ${round} is lost`,
          );
        }
      } else {
        const wanted = new Set(op.batch.expected.map(routeKey));
        const found = actualRoutes(s.id).filter((r) => wanted.has(routeKey(r)));
        if (found.length === 0) continue;
        assert.equal(
          found.length,
          wanted.size,
          `${where}: a batch of ${wanted.size} routes whose answer the kill cut off is there in part: ` +
            `${found.length} routes`,
        );
        committed.routes++;
        for (const r of found) s.routes.set(r.id, { ...r, round });
      }
    }

    // Bandwidth changes. Each PUT that committed raised the version by one, so the version says
    // how many did, and the acknowledged answer with the highest version is the last
    // acknowledged one in commit order.
    const puts = new Map<string, PutOp[]>();
    for (const op of sent)
      if (op.kind === 'put') puts.set(op.serviceId, [...(puts.get(op.serviceId) ?? []), op]);
    for (const [serviceId, ops] of puts) {
      const s = model.get(serviceId)!;
      const now = actual.get(serviceId);
      assert.ok(now, `${where}: service ${serviceId} that only PUTs touched is lost`);
      const acked = ops.filter((op) => op.outcome === 'acknowledged');
      const unanswered = ops.filter((op) => op.outcome !== 'acknowledged');
      for (const op of acked) {
        assert.equal(op.answer.bandwidth_limit_mbps, op.bandwidth, `${where}: answer to PUT ${serviceId}`);
      }
      const versions = acked.map((op) => op.answer.version as number);
      assert.equal(new Set(versions).size, versions.length, `${where}: two PUTs answered the same version`);
      const last = acked.reduce<PutOp | undefined>(
        (best, op) => (best && best.answer.version > op.answer.version ? best : op),
        undefined,
      );
      const lastVersion = last ? (last.answer.version as number) : s.version;
      const lastValue = last ? last.bandwidth : s.fields.bandwidth_limit_mbps;
      const sentValues = ops.map((op) => op.bandwidth);
      const what =
        `${where}: service ${serviceId} after PUTs of ${JSON.stringify(sentValues)} from ` +
        `${s.fields.bandwidth_limit_mbps} (version ${s.version}); acknowledged ` +
        `${JSON.stringify(acked.map((op) => [op.bandwidth, op.answer.version]))}`;
      assert.ok(
        now.version >= lastVersion && now.version <= s.version + ops.length,
        `${what}; stored version ${now.version}`,
      );
      assert.ok(
        now.version - s.version >= acked.length,
        `${what}: an acknowledged PUT is lost (version ${now.version})`,
      );
      if (now.version === lastVersion) {
        assert.equal(now.bandwidth_limit_mbps, lastValue, `${what}: not the last acknowledged value`);
      } else {
        assert.ok(
          unanswered.some((op) => op.bandwidth === now.bandwidth_limit_mbps),
          `${what}: stored ${now.bandwidth_limit_mbps} at version ${now.version}, not a value in flight`,
        );
      }
      committed.put += now.version - s.version - acked.length;
      s.version = now.version;
      s.fields.bandwidth_limit_mbps = now.bandwidth_limit_mbps;
    }

    // Nothing lost, nothing deleted back, nothing never requested: the API shows exactly the model.
    for (const s of model.values()) {
      const how = s.acknowledged ? 'acknowledged' : 'committed unacknowledged';
      assert.ok(actual.has(s.id), `${where}: service ${s.id} (${how} in round ${s.round}) is lost`);
      const present = new Set(actualRoutes(s.id).map((r) => r.id));
      for (const r of s.routes.values()) {
        assert.ok(present.has(r.id), `${where}: route ${r.id} of ${s.id} (round ${r.round}) is lost`);
      }
    }
    for (const id of actual.keys()) {
      assert.ok(!goneServices.has(id), `${where}: service ${id} ${goneServices.get(id)} is back`);
      assert.ok(model.has(id), `${where}: service ${id} exists, but nobody asked for it`);
      for (const r of actualRoutes(id)) {
        assert.ok(!goneRoutes.has(r.id), `${where}: route ${r.id} (${goneRoutes.get(r.id)}) is back`);
      }
    }
    for (const s of model.values()) {
      assert.deepEqual(
        actual.get(s.id),
        {
          id: s.id,
          ...s.fields,
          created_at: s.createdAt,
          is_active: true,
          version: s.version,
          routes: [...s.routes.values()].sort(byPriorityThenId).map((r) => ({
            id: r.id,
            priority: r.priority,
            source_cidr: r.source_cidr,
            dest_cidr: r.dest_cidr,
          })),
        },
        `${where}: service ${s.id} (round ${s.round}) differs from what was requested`,
      );
    }

    // And the file holds the same rows: no route outlives its service.
    const dump = dumpDatabase(a.agent.dataDir);
    assert.equal(dump.integrity, 'ok', `${where}: integrity_check of the dump`);
    const serviceRows = (dump.tables.services ?? []).map((row) =>
      pickColumns(row, [
        'id',
        'source_peer_id',
        'target_peer_id',
        'transport_type',
        'requires_interface',
        'desired_ipv4_cidr',
        'desired_ipv6_cidr',
        'fully_transparent',
        'bandwidth_limit_mbps',
        'version',
        'created_at',
      ]),
    );
    const expectedServiceRows = [...model.values()]
      .map((s) => ({
        id: s.id,
        source_peer_id: s.fields.source_peer_id,
        target_peer_id: s.fields.target_peer_id,
        transport_type: s.fields.transport_type,
        requires_interface: s.fields.requires_interface ? 1 : 0,
        desired_ipv4_cidr: s.fields.interface_ipv4_cidr,
        desired_ipv6_cidr: s.fields.interface_ipv6_cidr,
        fully_transparent: s.fields.fully_transparent ? 1 : 0,
        bandwidth_limit_mbps: s.fields.bandwidth_limit_mbps,
        version: s.version,
        created_at: s.createdAt,
      }))
      .sort((x, y) => (x.id < y.id ? -1 : 1));
    assert.deepEqual(serviceRows, expectedServiceRows, `${where}: services table`);
    const routeRows = (dump.tables.routes ?? []).map((row) =>
      pickColumns(row, ['id', 'service_id', 'priority', 'source_cidr', 'dest_cidr']),
    );
    const expectedRouteRows = [...model.values()]
      .flatMap((s) =>
        [...s.routes.values()].map((r) => ({
          id: r.id,
          service_id: s.id,
          priority: r.priority,
          source_cidr: r.source_cidr,
          dest_cidr: r.dest_cidr,
        })),
      )
      .sort((x, y) => x.id - y.id);
    for (const row of routeRows) {
      assert.ok(
        !goneRoutes.has(row.id as number),
        `${where}: route row ${row.id} (${goneRoutes.get(row.id as number)}) is in the file`,
      );
    }
    assert.deepEqual(routeRows, expectedRouteRows, `${where}: routes table`);
    return committed;
  }
});

function pickColumns(row: Record<string, DumpValue>, columns: string[]): Record<string, DumpValue> {
  return Object.fromEntries(columns.map((c) => [c, row[c] ?? null]));
}
