/**
 * Replication under faults with real agents: a partition (gossip cut by nftables) with
 * writes on both sides, then healed; an agent killed with SIGKILL while another takes writes;
 * an agent stopped through several writes. Every time the agents must end up serving the same
 * state, and no write that was acknowledged (2xx) may be missing from it.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { assertError } from '../helpers/api-assertions.js';
import type { ApiResponse } from '../helpers/api-client.js';
import {
  del,
  eventually,
  expectStatus,
  get,
  post,
  put,
  startCluster,
  stopAll,
  waitConverged,
} from '../helpers/cluster.js';
import { GossipCut } from '../helpers/gossip-cut.js';
import { gossipMessages, reachableOn } from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';
import type { Node } from '../helpers/nodes.js';

const vendor = makeVendor();
const LICENSE = { license_id: 'license-faults', max_nodes: 3, max_services: 10 };

async function waitReachable(observer: Node, peer: Node, want: boolean, ms = 20_000): Promise<void> {
  await eventually(
    `${observer.agent.url} to see ${peer.agent.url} as reachable: ${want}`,
    async () => ((await reachableOn(observer, peer.peerId)) === want ? true : undefined),
    ms,
  );
}

async function createService(n: Node, source: Node, target: Node): Promise<string> {
  const res = await post(n, '/v1/services', { source_peer_id: source.peerId, target_peer_id: target.peerId });
  expectStatus(res, 201, 'create service');
  return res.body.id as string;
}

describe('replication under faults', { timeout: 120_000 }, () => {
  let nodes: Node[] = [];
  let a: Node;
  let b: Node;
  let c: Node;
  /** B→C, A→C, A→B: made by the partition test, written to by the later ones. */
  let sBC = '';
  let sAC = '';
  let sAB = '';
  let cut: GossipCut;

  before(async () => {
    cut = new GossipCut();
    nodes = await startCluster(vendor, 3, LICENSE, { ownAddress: true });
    [a, b, c] = nodes as [Node, Node, Node];
    // A was bootstrapped first: it is the oldest peer, so the allocator of new services.
    const init = await post(b, '/v1/cluster/init', {});
    expectStatus(init, 200, 'init');
    assert.equal(init.body.oldest_peer_id, a.peerId);
  });
  after(async () => {
    cut?.close();
    await stopAll(nodes.map((n) => n.agent));
  });

  it('a partition with writes on both sides heals into one state with both sides’ writes', async () => {
    sBC = await createService(a, b, c);
    sAC = await createService(b, a, c);
    const base = await waitConverged(nodes);
    assert.equal(base.services.length, 2);
    for (const [x, y] of [
      [a, c],
      [c, a],
      [b, c],
    ] as const) {
      // waited for, not read once: a spurious suspicion on a loaded machine can make a peer
      // unreachable for a moment before it refutes
      await waitReachable(x, y, true);
    }

    /** C's last_seen_at on A, read during the cut. */
    let seenDuringCut = '';
    /** Bucket lists answered by all three until the heal (the joins' exchanges used them too). */
    let bucketRepliesBeforeHeal = 0;
    // Cut C off from A and B, in both directions.
    cut.isolate(c.agent, [a.agent, b.agent]);
    try {
      // A's side: a new service (A is the allocator) and an update of A→C.
      sAB = await createService(a, a, b);
      expectStatus(
        await put(a, `/v1/services/${sAC}`, { bandwidth_limit_mbps: 111 }),
        200,
        'update A→C on A',
      );
      await new Promise((r) => setTimeout(r, 50));
      // C's side: a rename, an update of B→C, and a later update of the same A→C.
      expectStatus(await put(c, `/v1/peers/${a.peerId}`, { name: 'alpha-as-c-says' }), 200, 'rename A on C');
      expectStatus(await put(c, `/v1/services/${sBC}`, { bandwidth_limit_mbps: 77 }), 200, 'update B→C on C');
      expectStatus(
        await put(c, `/v1/services/${sAC}`, { bandwidth_limit_mbps: 222 }),
        200,
        'update A→C on C',
      );
      // C cannot reach the allocator: no new service on its side.
      assertError(
        await post(c, '/v1/services', { source_peer_id: c.peerId, target_peer_id: b.peerId }),
        503,
        'UNAVAILABLE',
        'create on the cut-off side',
      );

      // B, on A's side, gets A's writes; C does not, and A's side does not get C's.
      await eventually('A→B on B', async () =>
        (await get(b, `/v1/services/${sAB}`)).status === 200 ? true : undefined,
      );
      // Failure detection: A ends up reporting C unreachable, and C reports A and B.
      await waitReachable(a, c, false);
      await waitReachable(c, a, false);
      await waitReachable(c, b, false);
      // last_seen_at is A's own observation of C: frozen while nothing from C gets through.
      seenDuringCut = (await get(a, `/v1/peers/${c.peerId}`)).body.last_seen_at;
      assert.equal(typeof seenDuringCut, 'string', 'A saw C before the cut');
      // A sync on either side runs, but crosses nothing.
      for (const n of [a, c]) {
        const res = await post(n, '/v1/cluster/sync');
        expectStatus(res, 200, 'sync while cut');
        assert.deepEqual(res.body, { triggered: true });
      }
      // Seconds into the cut, after probes and anti-entropy rounds: still nothing crossed.
      expectStatus(await get(c, `/v1/services/${sAB}`), 404, 'A→B on C while cut');
      assert.equal(
        (await get(a, `/v1/peers/${c.peerId}`)).body.last_seen_at,
        seenDuringCut,
        "C's last_seen_at on A did not move during the cut",
      );
      assert.equal((await get(c, `/v1/services/${sAC}`)).body.bandwidth_limit_mbps, 222);
      for (const n of [a, b]) {
        assert.notEqual((await get(n, `/v1/peers/${a.peerId}`)).body.name, 'alpha-as-c-says');
        assert.equal((await get(n, `/v1/services/${sBC}`)).body.bandwidth_limit_mbps, 0);
        assert.equal((await get(n, `/v1/services/${sAC}`)).body.bandwidth_limit_mbps, 111);
      }
    } finally {
      bucketRepliesBeforeHeal = 0;
      for (const n of nodes) bucketRepliesBeforeHeal += await gossipMessages(n, 'buckets-reply', 'sent');
      // Heal, also when a check failed: the later tests need the whole cluster.
      cut.heal();
    }

    const healed = await waitConverged(nodes, 20_000);
    assert.deepEqual(
      healed.services.map((s) => s.id),
      [sBC, sAC, sAB],
    );
    const bw = (id: string) => healed.services.find((s) => s.id === id)?.bandwidth_limit_mbps;
    assert.equal(bw(sBC), 77, "C's update");
    assert.equal(bw(sAC), 222, 'the later of two concurrent updates wins');
    assert.equal(bw(sAB), 0);
    assert.equal(healed.peers.find((p) => p.id === a.peerId)?.name, 'alpha-as-c-says', "C's rename");
    // The writes were pushed during the cut and lost: anti-entropy carried them after the heal,
    // comparing digest buckets first.
    let bucketReplies = 0;
    for (const n of nodes) bucketReplies += await gossipMessages(n, 'buckets-reply', 'sent');
    assert.ok(bucketReplies > bucketRepliesBeforeHeal, 'anti-entropy after the heal compared digest buckets');
    await waitReachable(a, c, true);
    await waitReachable(c, a, true);
    await waitReachable(c, b, true);
    await eventually("C's last_seen_at on A moves again after the heal", async () => {
      const seen = (await get(a, `/v1/peers/${c.peerId}`)).body.last_seen_at as string;
      return Date.parse(seen) > Date.parse(seenDuringCut) ? true : undefined;
    });
  });

  it('an agent killed with SIGKILL while another takes writes loses nothing acknowledged', async () => {
    // Acknowledged values: the last 2xx write of each field wins, since one writer (A) writes
    // them in order.
    const bandwidth = new Map<string, number>();
    const names = new Map<string, string>();
    const routesAdded: { service: string; id: number }[] = [];
    const servicesCreated: string[] = [];
    const failures: string[] = [];
    let acks = 0;
    let writing = true;
    const targets = [sBC, sAC, sAB];
    const loop = (async () => {
      for (let i = 0; writing; i++) {
        let res: ApiResponse;
        try {
          if (i % 3 === 0) {
            const id = targets[Math.floor(i / 3) % targets.length]!;
            res = await put(a, `/v1/services/${id}`, { bandwidth_limit_mbps: 1000 + i });
            if (res.status === 200) bandwidth.set(id, 1000 + i);
          } else if (i % 3 === 1) {
            const peer = i % 2 === 0 ? a : c;
            res = await put(a, `/v1/peers/${peer.peerId}`, { name: `name-${i}` });
            if (res.status === 200) names.set(peer.peerId, `name-${i}`);
          } else {
            const id = targets[Math.floor(i / 3) % targets.length]!;
            res = await post(a, `/v1/services/${id}/routes`, {
              routes: [{ priority: i % 60_000, dest_cidr: `10.${i % 250}.0.0/16` }],
            });
            if (res.status === 201) routesAdded.push({ service: id, id: res.body.route_ids[0] });
          }
        } catch (err) {
          failures.push(`write ${i}: ${(err as Error).message}`);
          continue;
        }
        if (res.status >= 200 && res.status < 300) acks++;
        else failures.push(`write ${i}: ${res.status} ${res.text}`);
        await new Promise((r) => setTimeout(r, 10));
      }
    })();
    const acksReach = (n: number) =>
      eventually(`${n} acknowledged writes`, async () => (acks >= n ? true : undefined), 20_000);

    try {
      await acksReach(15);
      // A write acknowledged by B itself right before it dies must survive too.
      expectStatus(await put(b, `/v1/peers/${b.peerId}`, { name: 'bravo-before-kill' }), 200, 'rename on B');
      await b.agent.kill9();
      const atKill = acks;
      // Writes while B is down, one of them a new service that involves B.
      servicesCreated.push(await createService(a, b, a));
      await acksReach(atKill + 30);
      await waitReachable(a, b, false);
      await b.agent.restart();
      const atRestart = acks;
      await acksReach(atRestart + 15);
    } finally {
      writing = false;
      await loop;
    }
    assert.deepEqual(failures, [], 'every write through A was acknowledged');

    const view = await waitConverged(nodes, 30_000);
    for (const [id, mbps] of bandwidth) {
      assert.equal(view.services.find((s) => s.id === id)?.bandwidth_limit_mbps, mbps, `bandwidth of ${id}`);
    }
    for (const [id, name] of names) {
      assert.equal(view.peers.find((p) => p.id === id)?.name, name, `name of ${id}`);
    }
    assert.equal(view.peers.find((p) => p.id === b.peerId)?.name, 'bravo-before-kill');
    for (const id of servicesCreated) assert.ok(view.single[id], `service ${id} created while B was down`);
    for (const r of routesAdded) {
      assert.ok(
        (view.routes[r.service] as { id: number }[]).some((x) => x.id === r.id),
        `route ${r.id} of ${r.service}`,
      );
    }
    const routeTotal = Object.values(view.routes).reduce<number>(
      (n, list) => n + (list as unknown[]).length,
      0,
    );
    assert.equal(routeTotal, routesAdded.length, 'no route beyond the acknowledged ones');
    await waitReachable(a, b, true);
  });

  it('an agent stopped through several writes catches up after its restart', async () => {
    expectStatus(await post(c, '/v1/cluster/sync'), 200, 'sync');
    const earlier = await waitConverged(nodes);
    assert.equal(await c.agent.stop(), 0, 'C exits cleanly on SIGTERM');
    // Writes on A and B while C is down, several of them about C.
    expectStatus(await put(a, `/v1/peers/${c.peerId}`, { name: 'charlie-while-down' }), 200, 'rename C');
    expectStatus(await put(b, `/v1/services/${sBC}`, { bandwidth_limit_mbps: 4242 }), 200, 'update B→C');
    const added = await post(a, `/v1/services/${sAC}/routes`, {
      routes: [{ priority: 7, source_cidr: '192.0.2.0/24', dest_cidr: '198.51.100.0/24' }],
    });
    expectStatus(added, 201, 'route on A→C');
    const oldRoute = (earlier.routes[sAB] as { id: number }[])[0];
    assert.ok(oldRoute, 'A→B has routes from the previous test');
    expectStatus(await del(b, `/v1/services/${sAB}/routes/${oldRoute.id}`), 200, 'delete a route of A→B');
    const created = await createService(b, c, a);
    expectStatus(await del(a, `/v1/services/${sAC}`), 200, 'delete A→C');
    const onAB = await waitConverged([a, b]);

    await c.agent.restart();
    const caughtUp = await waitConverged(nodes, 20_000);
    assert.deepEqual(caughtUp, onAB);
    assert.equal(caughtUp.peers.find((p) => p.id === c.peerId)?.name, 'charlie-while-down');
    assert.equal(caughtUp.services.find((s) => s.id === sBC)?.bandwidth_limit_mbps, 4242);
    assert.ok(caughtUp.single[created], 'C→A created while C was down');
    assert.equal(caughtUp.single[sAC], undefined, 'A→C deleted while C was down');
    expectStatus(await get(c, `/v1/services/${sAC}`), 404, 'A→C on C');
    assert.ok(
      (caughtUp.routes[sAB] as { id: number }[]).every((r) => r.id !== oldRoute.id),
      'the deleted route stays deleted on C',
    );
    await waitReachable(a, c, true);
  });
});
