/**
 * Two clusters of real agents merging by one handshake (docs/decisions.md §5): a merge that would not fit
 * the license is refused with neither side changed (nodes, then services, tried from both sides);
 * once it fits, every member of both clusters ends with one state holding both clusters' peers,
 * services and routes, the older cluster's id and credential, and the younger cluster's former
 * secret usable by its own members for the 24-hour grace and by no one after it.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { assertError } from '../helpers/api-assertions.js';
import type { ApiResponse } from '../helpers/api-client.js';
import { viewOf } from '../helpers/cluster.js';
import {
  addPeer,
  advanceClocks,
  assertKeyAccepted,
  assertKeyRefused,
  type LiveKey,
  type Member,
  macKeyFromSecret,
  replicatedView,
  rotate,
  startCluster,
  stopAll,
  waitForConvergence,
  waitForPeers,
} from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';

const vendor = makeVendor();
const HOUR = 60 * 60_000;
/** Two clusters of 2 and 3 agents cannot merge under 4 nodes; 2 + 2 services not under 3. */
const LICENSE = { license_id: 'L-merge', max_nodes: 4, max_services: 3 };

async function created(res: Promise<ApiResponse>, what: string): Promise<Record<string, unknown>> {
  const answer = await res;
  assert.equal(answer.status, 201, `${what}: ${answer.text}`);
  return answer.body;
}

const createService = (m: Member, source: Member, target: Member) =>
  created(
    m.agent.client.post('/v1/services', {
      token: m.token,
      json: { source_peer_id: source.peerId, target_peer_id: target.peerId },
    }),
    `service ${source.peerId} -> ${target.peerId} on ${m.peerId}`,
  );

const createRoute = (m: Member, serviceId: string, cidr: string) =>
  created(
    m.agent.client.post(`/v1/services/${serviceId}/routes`, {
      token: m.token,
      json: { routes: [{ priority: 100, dest_cidr: cidr }] },
    }),
    `route ${cidr} on ${m.peerId}`,
  );

/** Everything each member serves (replicated view plus every route list), member by member. */
async function everything(members: readonly Member[]): Promise<unknown[]> {
  return Promise.all(
    members.map(async (m) => ({ replicated: await replicatedView(m), routes: (await viewOf(m)).routes })),
  );
}

describe('merging two clusters (docs/decisions.md §5)', { timeout: 120_000 }, () => {
  let x: Member[] = [];
  let y: Member[] = [];
  /** Every agent started, stopped at the end whatever happened. */
  let started: Member[] = [];
  let a: Member;
  let b: Member;
  let c: Member;
  let d: Member;
  let e: Member;
  /** The secrets each cluster's last rotation returned, before the merge. */
  let xKey: LiveKey;
  let yKey: LiveKey;
  let xIdentity: { cluster_id: string };
  let xCredential: Record<string, unknown>;
  let yCredential: Record<string, unknown>;
  let abService = '';

  before(async () => {
    // X is created first, so its oldest peer is older: X must survive the merge.
    x = await startCluster(vendor, 2, LICENSE, undefined, { movableClock: true });
    y = await startCluster(vendor, 3, LICENSE, undefined, { movableClock: true });
    [a, b] = x as [Member, Member];
    [c, d, e] = y as [Member, Member, Member];
    started = [...x, ...y];

    abService = (await createService(a, a, b)).id as string;
    const ba = (await createService(b, b, a)).id as string;
    await createRoute(a, abService, '10.60.1.0/24');
    await createRoute(b, ba, '10.60.2.0/24');
    const cd = (await createService(c, c, d)).id as string;
    const dc = (await createService(d, d, c)).id as string;
    await createRoute(c, cd, '10.70.1.0/24');
    await createRoute(d, dc, '10.70.2.0/24');

    xKey = macKeyFromSecret((await rotate(a)).client_secret);
    yKey = macKeyFromSecret((await rotate(c)).client_secret);
    const xView = (await waitForConvergence(x)) as { services: unknown[] };
    const yView = (await waitForConvergence(y)) as { services: unknown[] };
    assert.equal(xView.services.length, 2);
    assert.equal(yView.services.length, 2);
    const xs = await replicatedView(a);
    xIdentity = xs.identity as { cluster_id: string };
    xCredential = xs.credential as Record<string, unknown>;
    yCredential = (await replicatedView(c)).credential as Record<string, unknown>;
    assert.notEqual(
      xIdentity.cluster_id,
      ((await replicatedView(c)).identity as { cluster_id: string }).cluster_id,
    );
  });

  after(async () => {
    await stopAll(started);
  });

  it('a merge over max_nodes is refused from either side with 422 NODE_LIMIT_EXCEEDED; nothing changes', async () => {
    const before = await everything([...x, ...y]);
    assertError(await addPeer(c, a), 422, 'NODE_LIMIT_EXCEEDED', 'younger cluster adds the older');
    assertError(await addPeer(a, c), 422, 'NODE_LIMIT_EXCEEDED', 'older cluster adds the younger');
    // A few gossip rounds, so anything a refused handshake had written would have spread.
    await new Promise((r) => setTimeout(r, 1_000));
    assert.deepEqual(await everything([...x, ...y]), before, 'every member serves what it served before');
  });

  it('a merge over max_services is refused from either side with 422 SERVICE_LIMIT_EXCEEDED; nothing changes', async () => {
    // Y shrinks to 2 active peers: 2 + 2 nodes now fit, 2 + 2 services still do not.
    const removed = await c.agent.client.delete(`/v1/peers/${e.peerId}`, { token: c.token });
    assert.equal(removed.status, 200, removed.text);
    await e.agent.stop();
    y = [c, d];
    await waitForPeers(y, 2);
    // the removal's cascade (E's services) spread to D too before the snapshot
    await waitForConvergence(y);
    const before = await everything([...x, ...y]);
    assertError(await addPeer(c, a), 422, 'SERVICE_LIMIT_EXCEEDED', 'younger cluster adds the older');
    assertError(await addPeer(a, d), 422, 'SERVICE_LIMIT_EXCEEDED', 'older cluster adds the younger');
    await new Promise((r) => setTimeout(r, 1_000));
    assert.deepEqual(await everything([...x, ...y]), before, 'every member serves what it served before');
  });

  it('a merge that fits: all four serve both clusters’ state, with the older cluster’s id and credential', async () => {
    // Room for one more service: X deletes its B -> A service.
    const services = (await a.agent.client.get('/v1/services', { token: a.token })).body as { id: string }[];
    const ba = services.find((s) => s.id !== abService)!;
    const deleted = await a.agent.client.delete(`/v1/services/${ba.id}`, { token: a.token });
    assert.equal(deleted.status, 200, deleted.text);
    await waitForConvergence(x);

    // The younger cluster's member starts the handshake: the responder's cluster must win.
    const joined = await addPeer(c, a);
    assert.equal(joined.status, 201, joined.text);
    const all = [a, b, c, d];
    await waitForPeers(all, 4);
    const view = (await waitForConvergence(all)) as {
      peers: { id: string }[];
      services: { id: string }[];
      credential: Record<string, unknown>;
      cluster_id: string;
    };
    assert.deepEqual(
      view.peers.map((p) => p.id).sort(),
      [a, b, c, d].map((m) => m.peerId).sort(),
      'the four active peers (the removed E is not brought back)',
    );
    assert.equal(view.services.length, 3, 'both clusters’ services');
    assert.equal(view.cluster_id, xIdentity.cluster_id, 'the older cluster keeps its id');
    assert.deepEqual(
      {
        client_id: view.credential.client_id,
        version: view.credential.version,
        by: view.credential.rotated_by,
      },
      { client_id: xCredential.client_id, version: xCredential.version, by: xCredential.rotated_by },
      'the older cluster keeps its credential',
    );
    assert.notDeepEqual(view.credential, yCredential);

    // Routes too: every member serves the same four route lists.
    const routeViews = await Promise.all(all.map(async (m) => (await viewOf(m)).routes));
    for (const r of routeViews) assert.deepEqual(r, routeViews[0]);
    const cidrs = Object.values(routeViews[0]!)
      .flatMap((list) => (list as { dest_cidr: string }[]).map((r) => r.dest_cidr))
      .sort();
    assert.deepEqual(cidrs, ['10.60.1.0/24', '10.70.1.0/24', '10.70.2.0/24']);
  });

  it('the older cluster’s secret works on all four; the younger’s on its own members for 24 h, then nowhere', async () => {
    for (const m of [a, b, c, d])
      await assertKeyAccepted(m, m === a ? b : a, xKey, `X secret on ${m.peerId}`);
    // D never took part in the handshake: it got the credential by gossip.
    for (const m of [c, d])
      await assertKeyAccepted(m, m === c ? d : c, yKey, `former Y secret on ${m.peerId}`);
    for (const m of [a, b]) await assertKeyRefused(m, c, yKey, `Y secret on X member ${m.peerId}`);

    await advanceClocks([a, b, c, d], 24 * HOUR + 60_000);
    for (const m of [a, b, c, d]) {
      await assertKeyRefused(m, m === c ? d : c, yKey, `former Y secret after 24 h on ${m.peerId}`);
      await assertKeyAccepted(m, m === a ? b : a, xKey, `X secret after 24 h on ${m.peerId}`);
    }
    // Still one cluster: a write on a former Y member reaches a former X member.
    const renamed = await d.agent.client.put(`/v1/peers/${b.peerId}`, {
      token: d.token,
      json: { name: 'renamed-after-merge' },
    });
    assert.equal(renamed.status, 200, renamed.text);
    const view = (await waitForConvergence([a, b, c, d])) as { peers: { id: string; name: string }[] };
    assert.equal(view.peers.find((p) => p.id === b.peerId)?.name, 'renamed-after-merge');
  });
});
