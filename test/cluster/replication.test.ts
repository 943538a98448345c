/**
 * Replication between real agents: every kind of change made on one agent reaches the others,
 * their full API answers end up equal, the cluster id follows a forced init, leaving and
 * removal spread (and anti-entropy never undoes a removal), and a new member receives the whole
 * existing state when it joins.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { isDeepStrictEqual } from 'node:util';
import type { ApiResponse } from '../helpers/api-client.js';
import {
  del,
  eventually,
  expectStatus,
  GOSSIP_INTERVAL_MS,
  get,
  post,
  put,
  startCluster,
  startNode,
  stopAll,
  viewOf,
  waitConverged,
  waitForPeerCount,
} from '../helpers/cluster.js';
import { metricsOf, seriesValue } from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';
import { join, type Node } from '../helpers/nodes.js';

const vendor = makeVendor();
const LICENSE = { license_id: 'license-replication', max_nodes: 5, max_services: 10 };

/** Polls every node until `check` holds on it; the message names the node and the last answer. */
async function onEvery(
  nodes: readonly Node[],
  what: string,
  path: string,
  check: (res: ApiResponse) => boolean,
  ms = 10_000,
): Promise<void> {
  await Promise.all(
    nodes.map(async (n) => {
      let last: ApiResponse | undefined;
      await eventually(
        `${what} on ${n.agent.url}`,
        async () => {
          last = await get(n, path);
          return check(last) ? true : undefined;
        },
        ms,
        () => last && { status: last.status, body: last.body },
      );
    }),
  );
}

/** mesh_gossip_rejected_total{reason="unknown_sender"} summed over the nodes. */
async function unknownSenderRefusals(nodes: readonly Node[]): Promise<number> {
  let sum = 0;
  for (const n of nodes) {
    sum += seriesValue(await metricsOf(n), 'mesh_gossip_rejected_total{reason="unknown_sender"}');
  }
  return sum;
}

describe('replication between three agents', { timeout: 90_000 }, () => {
  let nodes: Node[] = [];
  const extra: Node[] = [];
  let a: Node;
  let b: Node;
  let c: Node;
  /** Kept for the later tests: services and routes made in the first. */
  let s1 = '';
  let s2 = '';
  let keptRoute = 0;

  before(async () => {
    nodes = await startCluster(vendor, 3, LICENSE);
    [a, b, c] = nodes as [Node, Node, Node];
  });
  after(async () => {
    await stopAll([...nodes, ...extra].map((n) => n.agent));
  });

  it('each kind of change made on one agent appears on the others', async () => {
    // Peer rename, on A.
    const renamed = await put(a, `/v1/peers/${b.peerId}`, { name: 'bravo' });
    expectStatus(renamed, 200, 'rename B on A');
    assert.equal(renamed.body.name, 'bravo');
    await onEvery(nodes, 'B renamed', `/v1/peers/${b.peerId}`, (r) => r.body?.name === 'bravo');

    // Service create, on B, between A and C.
    const created = await post(b, '/v1/services', {
      source_peer_id: a.peerId,
      target_peer_id: c.peerId,
      bandwidth_limit_mbps: 5,
      health_check: { tcp: '[FD00::1]:443', interval_ms: 500 },
    });
    expectStatus(created, 201, 'create A→C on B');
    s1 = created.body.id;
    await onEvery(
      nodes,
      'service A→C',
      `/v1/services/${s1}`,
      (r) =>
        r.status === 200 &&
        r.body.source_peer_id === a.peerId &&
        r.body.target_peer_id === c.peerId &&
        r.body.bandwidth_limit_mbps === 5 &&
        isDeepStrictEqual(r.body.health_check, { tcp: '[fd00::1]:443', interval_ms: 500, failures: 3 }),
    );

    // Service update, on C.
    const updated = await put(c, `/v1/services/${s1}`, {
      bandwidth_limit_mbps: 250,
      health_check: { icmp: '10.1.2.3', failures: 5 },
    });
    expectStatus(updated, 200, 'update A→C on C');
    await onEvery(
      nodes,
      'bandwidth 250, icmp check',
      `/v1/services/${s1}`,
      (r) =>
        r.body?.bandwidth_limit_mbps === 250 &&
        isDeepStrictEqual(r.body.health_check, { icmp: '10.1.2.3', interval_ms: 1000, failures: 5 }) &&
        r.body.version === updated.body.version,
    );

    // Health check removed, on A.
    const unchecked = await put(a, `/v1/services/${s1}`, { health_check: null });
    expectStatus(unchecked, 200, 'remove the check on A');
    await onEvery(
      nodes,
      'no health check',
      `/v1/services/${s1}`,
      (r) => r.body?.health_check === null && r.body.version === unchecked.body.version,
    );

    // Routes add, on A.
    const added = await post(a, `/v1/services/${s1}/routes`, {
      routes: [
        { priority: 10, source_cidr: '10.0.0.0/24', dest_cidr: '10.1.0.0/24' },
        { priority: 20, dest_cidr: '192.168.0.0/16' },
      ],
    });
    expectStatus(added, 201, 'add routes on A');
    const [r1, r2] = added.body.route_ids as [number, number];
    await onEvery(nodes, 'two routes', `/v1/services/${s1}/routes`, (r) => {
      if (r.status !== 200) return false;
      const byId = new Map((r.body as { id: number }[]).map((x) => [x.id, x]));
      return (
        r.body.length === 2 &&
        JSON.stringify(byId.get(r1)) ===
          JSON.stringify({
            id: r1,
            service_id: s1,
            priority: 10,
            source_cidr: '10.0.0.0/24',
            dest_cidr: '10.1.0.0/24',
          }) &&
        JSON.stringify(byId.get(r2)) ===
          JSON.stringify({
            id: r2,
            service_id: s1,
            priority: 20,
            source_cidr: null,
            dest_cidr: '192.168.0.0/16',
          })
      );
    });

    // Route update, on B.
    const routeUpdated = await put(b, `/v1/services/${s1}/routes/${r1}`, {
      priority: 5,
      dest_cidr: '10.2.0.0/16',
    });
    expectStatus(routeUpdated, 200, 'update route on B');
    await onEvery(nodes, 'route updated', `/v1/services/${s1}/routes`, (r) =>
      (r.body as { id: number; priority: number; dest_cidr: string }[]).some(
        (x) => x.id === r1 && x.priority === 5 && x.dest_cidr === '10.2.0.0/16',
      ),
    );

    // Route delete, on C.
    expectStatus(await del(c, `/v1/services/${s1}/routes/${r2}`), 200, 'delete route on C');
    await onEvery(
      nodes,
      'route deleted',
      `/v1/services/${s1}/routes`,
      (r) => r.status === 200 && r.body.length === 1 && r.body[0].id === r1,
    );
    await onEvery(nodes, 'route_count 1', '/v1/services', (r) =>
      (r.body as { id: string; route_count: number }[]).some((s) => s.id === s1 && s.route_count === 1),
    );
    keptRoute = r1;

    // A second service (kept) on C, and a third with a route that is deleted again, on B.
    const second = await post(c, '/v1/services', { source_peer_id: b.peerId, target_peer_id: c.peerId });
    expectStatus(second, 201, 'create B→C on C');
    s2 = second.body.id;
    const third = await post(a, '/v1/services', { source_peer_id: c.peerId, target_peer_id: a.peerId });
    expectStatus(third, 201, 'create C→A on A');
    const s3 = third.body.id as string;
    expectStatus(
      await post(a, `/v1/services/${s3}/routes`, { routes: [{ priority: 1, dest_cidr: '172.16.0.0/12' }] }),
      201,
      'route on C→A',
    );
    await onEvery(nodes, 'B→C and C→A', '/v1/services', (r) => {
      const ids = (r.body as { id: string }[]).map((s) => s.id);
      return ids.includes(s2) && ids.includes(s3);
    });
    await onEvery(nodes, 'route of C→A', `/v1/services/${s3}/routes`, (r) => r.body?.length === 1);
    expectStatus(await del(b, `/v1/services/${s3}`), 200, 'delete C→A on B');
    await onEvery(nodes, 'C→A gone', `/v1/services/${s3}`, (r) => r.status === 404);
    await onEvery(nodes, 'routes of C→A gone', `/v1/services/${s3}/routes`, (r) => r.status === 404);
    await onEvery(nodes, 'C→A out of the list', '/v1/services', (r) =>
      (r.body as { id: string }[]).every((s) => s.id !== s3),
    );
  });

  it('after convergence every agent serves the same peers, services and routes', async () => {
    const view = await waitConverged(nodes);
    assert.deepEqual(
      view.peers.map((p) => p.id),
      (await get(a, '/v1/peers')).body.map((p: { id: string }) => p.id),
    );
    assert.equal(view.peers.length, 3);
    assert.equal(view.peers.find((p) => p.id === b.peerId)?.name, 'bravo');
    assert.deepEqual(
      view.services.map((s) => s.id),
      [s1, s2],
    );
    assert.deepEqual(
      (view.routes[s1] as { id: number }[]).map((r) => r.id),
      [keptRoute],
    );
    // Compared once more, field by field, for a readable failure.
    const [va, vb, vc] = await Promise.all(nodes.map(viewOf));
    assert.deepEqual(vb, va);
    assert.deepEqual(vc, va);
    // Each agent marks exactly itself as local.
    for (const n of nodes) {
      const peers = (await get(n, '/v1/peers')).body as { id: string; is_local: boolean }[];
      assert.deepEqual(
        peers.filter((p) => p.is_local).map((p) => p.id),
        [n.peerId],
      );
    }
  });

  it('every agent shows one cluster id; a forced init on B gives a new one everywhere', async () => {
    const ids = async () =>
      Promise.all(nodes.map(async (n) => (await n.agent.client.get('/v1/cluster/identity')).body.cluster_id));
    const initial = await ids();
    assert.equal(new Set(initial).size, 1, JSON.stringify(initial));
    assert.equal(typeof initial[0], 'string');
    const init = await post(b, '/v1/cluster/init', { force: true });
    expectStatus(init, 200, 'init force on B');
    assert.equal(init.body.was_created, true);
    assert.equal(init.body.created_by, b.peerId);
    const fresh = init.body.cluster_id as string;
    assert.notEqual(fresh, initial[0]);
    await eventually(
      'the new cluster id everywhere',
      async () => ((await ids()).every((id) => id === fresh) ? true : undefined),
      10_000,
      ids,
    );
    // And init without force answers the cluster as it is, on any agent.
    const plain = await post(c, '/v1/cluster/init', {});
    expectStatus(plain, 200, 'init on C');
    assert.equal(plain.body.was_created, false);
    assert.equal(plain.body.cluster_id, fresh);
    assert.equal(plain.body.created_by, b.peerId);
  });

  it('POST /v1/cluster/sync answers 200 {triggered: true} on every agent', async () => {
    for (const n of nodes) {
      const res = await post(n, '/v1/cluster/sync');
      expectStatus(res, 200, `sync on ${n.agent.url}`);
      assert.deepEqual(res.body, { triggered: true });
    }
    await waitConverged(nodes);
  });

  it('a fourth agent that joins receives the whole existing state', async () => {
    const earlier = await waitConverged(nodes);
    const d = await startNode(vendor, LICENSE);
    extra.push(d);
    // D had nothing but itself before the join.
    assert.deepEqual((await get(d, '/v1/services')).body, []);
    await join(c, d);
    const all = [...nodes, d];
    await waitForPeerCount(all, 4);
    const joined = await waitConverged(all);
    assert.deepEqual(joined.services, earlier.services);
    assert.deepEqual(joined.single, earlier.single);
    assert.deepEqual(joined.routes, earlier.routes);
    assert.deepEqual(
      joined.peers.filter((p) => p.id !== d.peerId),
      earlier.peers,
    );
    const dPeer = joined.peers.find((p) => p.id === d.peerId);
    assert.equal(dPeer?.is_active, true);
    // The cluster id D now shows is the cluster's.
    const ids = await Promise.all(
      all.map(async (n) => (await n.agent.client.get('/v1/cluster/identity')).body.cluster_id),
    );
    assert.equal(new Set(ids).size, 1, JSON.stringify(ids));
  });

  it('removing a peer removes it and its services everywhere, and anti-entropy never brings it back', async () => {
    const d = extra[0];
    assert.ok(d, 'the previous test joined D');
    const all = [...nodes, d];
    // Services that involve D, made on different agents, one with routes.
    const toD = await post(d, '/v1/services', { source_peer_id: a.peerId, target_peer_id: d.peerId });
    expectStatus(toD, 201, 'create A→D on D');
    const fromD = await post(b, '/v1/services', { source_peer_id: d.peerId, target_peer_id: c.peerId });
    expectStatus(fromD, 201, 'create D→C on B');
    const dServices = [toD.body.id as string, fromD.body.id as string];
    expectStatus(
      await post(c, `/v1/services/${dServices[0]}/routes`, {
        routes: [{ priority: 3, source_cidr: '10.9.0.0/16' }],
      }),
      201,
      'route on A→D',
    );
    const withD = await waitConverged(all);
    assert.equal(withD.services.length, 4);
    assert.equal((withD.routes[dServices[0]!] as unknown[]).length, 1);

    expectStatus(await del(a, `/v1/peers/${d.peerId}`), 200, 'remove D on A');
    await onEvery(nodes, 'D gone', `/v1/peers/${d.peerId}`, (r) => r.status === 404);
    for (const id of dServices) {
      await onEvery(nodes, `service ${id} gone`, `/v1/services/${id}`, (r) => r.status === 404);
    }
    const without = await waitConverged(nodes);
    assert.deepEqual(
      without.peers.map((p) => p.id),
      withD.peers.filter((p) => p.id !== d.peerId).map((p) => p.id),
    );
    assert.deepEqual(
      without.services.map((s) => s.id),
      [s1, s2],
    );

    // Anti-entropy, forced on every agent (D included, which still believes it is a member),
    // then several gossip intervals: D stays removed on A, B and C the whole time.
    const refusedBefore = await unknownSenderRefusals(nodes);
    for (const n of all) expectStatus(await post(n, '/v1/cluster/sync'), 200, `sync on ${n.agent.url}`);
    // D did try: its heartbeats and digests were refused as from an unknown sender.
    assert.ok(
      (await unknownSenderRefusals(nodes)) > refusedBefore,
      'the removed agent gossiped and was refused',
    );
    const until = Date.now() + GOSSIP_INTERVAL_MS * 15;
    while (Date.now() < until) {
      for (const n of nodes) {
        const peers = (await get(n, '/v1/peers')).body as { id: string }[];
        assert.ok(
          peers.every((p) => p.id !== d.peerId),
          `D came back on ${n.agent.url}`,
        );
        const services = (await get(n, '/v1/services')).body as { id: string }[];
        assert.deepEqual(
          services.map((s) => s.id),
          [s1, s2],
          `services on ${n.agent.url}`,
        );
      }
      await new Promise((r) => setTimeout(r, GOSSIP_INTERVAL_MS));
    }
    for (const n of nodes) expectStatus(await post(n, '/v1/cluster/sync'), 200, `sync on ${n.agent.url}`);
    assert.deepEqual(await waitConverged(nodes), without);
  });

  it('a peer that leaves shows inactive everywhere, with its services', async () => {
    const left = await del(c, '/v1/peers/self');
    expectStatus(left, 200, 'leave on C');
    assert.equal(left.body.peer_id, c.peerId);
    assert.equal(left.body.is_active, false);
    assert.equal(typeof left.body.deactivated_at, 'string');
    await onEvery(
      [a, b],
      'C inactive',
      `/v1/peers/${c.peerId}`,
      (r) =>
        r.body?.is_active === false &&
        r.body.deactivated_at === left.body.deactivated_at &&
        r.body.version === left.body.version,
    );
    // s1 is A→C and s2 is B→C: both involve C.
    for (const n of [a, b]) {
      const list = (await get(n, '/v1/services')).body as { id: string; is_active: boolean }[];
      assert.deepEqual(
        list.map((s) => [s.id, s.is_active]),
        [
          [s1, false],
          [s2, false],
        ],
      );
      for (const id of [s1, s2]) assert.equal((await get(n, `/v1/services/${id}`)).body.is_active, false);
      const peers = (await get(n, '/v1/peers')).body as { id: string; is_active: boolean }[];
      assert.deepEqual(
        peers.map((p) => [p.id, p.is_active]).sort(),
        [
          [a.peerId, true],
          [b.peerId, true],
          [c.peerId, false],
        ].sort(),
      );
    }
    // A service between A and B is still active, and A and B still agree on everything.
    const ab = await post(a, '/v1/services', { source_peer_id: a.peerId, target_peer_id: b.peerId });
    expectStatus(ab, 201, 'create A→B on A');
    await onEvery([a, b], 'A→B active', `/v1/services/${ab.body.id}`, (r) => r.body?.is_active === true);
    const view = await waitConverged([a, b]);
    assert.equal(view.peers.find((p) => p.id === c.peerId)?.is_active, false);
    assert.equal(view.services.length, 3);
  });
});
