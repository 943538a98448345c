/**
 * Tombstone collection across real agents (tombstones expire only after every peer has seen them:
 * docs/gossip.md "Tombstones"). A deletion's tombstone leaves the digest an hour
 * after its write; it is deleted from the store only once every active peer has shown an equal
 * digest root since. With nobody cut off that happens within a few rounds past the horizon (the
 * control); with an agent cut off through the horizon the others keep the tombstone, so that when
 * the agent comes back still holding the deleted service, the deletion wins over it instead of
 * the service coming back everywhere. Clocks are moved with libfaketime (faketime.ts), partitions
 * made with nftables (gossip-cut.ts); the tombstones table is read from each agent's SQLite file.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { DEFAULT_TOMBSTONE_HORIZON_MS } from '../../src/cluster/replica.js';
import { dumpDatabase } from '../helpers/db-dump.js';
import { GossipCut } from '../helpers/gossip-cut.js';
import {
  advanceClocks,
  eventually,
  gossipMessages,
  type Member,
  startCluster,
  stopAll,
  waitForConvergence,
} from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';

const vendor = makeVendor();
/** Past the horizon by a margin far above any skew between the agents' advanced clocks. */
const PAST_HORIZON_MS = DEFAULT_TOMBSTONE_HORIZON_MS + 5 * 60_000;

/** The rows of the agent's tombstones table (read-only from its SQLite file). */
function tombstoneKeys(m: Member): string[] {
  return (dumpDatabase(m.agent.dataDir).tables.tombstones ?? []).map((row) => String(row.key));
}

/** The route ids the agent has stored, whatever their service. */
function storedRouteIds(m: Member): number[] {
  return (dumpDatabase(m.agent.dataDir).tables.routes ?? []).map((row) => Number(row.id));
}

/** Probes that got through to the agent. */
const pingsReceived = (m: Member) => gossipMessages(m, 'ping', 'received');

async function serviceStatus(m: Member, id: string): Promise<number> {
  return (await m.agent.client.get(`/v1/services/${id}`, { token: m.token })).status;
}

/** A service from `on` to `to`, created on `on`, with one route; waits until every agent holds both. */
async function serviceWithRoute(
  members: readonly Member[],
  on: Member,
  to: Member,
): Promise<{ id: string; routeId: number }> {
  const created = await on.agent.client.post('/v1/services', {
    token: on.token,
    json: { source_peer_id: on.peerId, target_peer_id: to.peerId },
  });
  assert.equal(created.status, 201, created.text);
  const id = created.body.id as string;
  const routes = await on.agent.client.post(`/v1/services/${id}/routes`, {
    token: on.token,
    json: { routes: [{ priority: 10, dest_cidr: '10.9.0.0/16' }] },
  });
  assert.equal(routes.status, 201, routes.text);
  const routeId = (routes.body.route_ids as number[])[0]!;
  for (const m of members) {
    await eventually(`${m.peerId} holds the service and its route`, async () => {
      const res = await m.agent.client.get(`/v1/services/${id}/routes`, { token: m.token });
      return res.status === 200 && (res.body as { id: number }[]).some((r) => r.id === routeId)
        ? true
        : undefined;
    });
  }
  return { id, routeId };
}

/** Waits until each of `members` has received at least `n` more probes than in `before`. */
async function waitForProbes(
  members: readonly Member[],
  before: readonly number[],
  n: number,
): Promise<void> {
  for (const [i, m] of members.entries()) {
    await eventually(
      `${m.peerId} received ${n} probes`,
      async () => ((await pingsReceived(m)) >= before[i]! + n ? true : undefined),
      20_000,
    );
  }
}

describe('tombstone collection', { timeout: 120_000 }, () => {
  let members: Member[] = [];
  let a: Member;
  let b: Member;
  let c: Member;
  let cut: GossipCut;

  before(async () => {
    cut = new GossipCut();
    members = await startCluster(
      vendor,
      3,
      { license_id: 'L-tomb', max_nodes: 5, max_services: 10 },
      undefined,
      { ownAddress: true, movableClock: true },
    );
    [a, b, c] = members as [Member, Member, Member];
  });

  after(async () => {
    cut?.close();
    await stopAll(members);
  });

  it('control: with nobody cut off, every agent deletes the tombstone once past the horizon', async (t) => {
    const s = await serviceWithRoute(members, a, b);
    const key = `service/${s.id}`;
    const del = await a.agent.client.delete(`/v1/services/${s.id}`, { token: a.token });
    assert.equal(del.status, 200, del.text);
    for (const m of members) {
      await eventually(`${m.peerId} holds the tombstone`, async () =>
        tombstoneKeys(m).includes(key) ? true : undefined,
      );
    }
    // Before the horizon nothing is collected, however many rounds pass (each agent probes both
    // others several times, with equal roots).
    await waitForProbes(members, await Promise.all(members.map(pingsReceived)), 6);
    for (const m of members) {
      assert.ok(tombstoneKeys(m).includes(key), `${m.peerId} keeps the tombstone before the horizon`);
      assert.ok(
        !tombstoneKeys(m).includes(`route/${s.routeId}`),
        'the route went with its service, without a tombstone of its own (docs/gossip.md)',
      );
      assert.equal(await serviceStatus(m, s.id), 404);
    }

    await advanceClocks(members, PAST_HORIZON_MS);
    const started = Date.now();
    for (const m of members) {
      await eventually(
        `${m.peerId} deletes the tombstone past the horizon`,
        async () => (tombstoneKeys(m).includes(key) ? undefined : true),
        20_000,
      );
    }
    t.diagnostic(`control: tombstone collected on all three ${Date.now() - started} ms after the advance`);
    const view = (await waitForConvergence(members)) as { services: { id: string }[] };
    assert.ok(!view.services.some((x) => x.id === s.id), 'the service stays deleted');
  });

  it('an agent cut off through the horizon: the others keep the tombstone, the deletion wins when it returns, then everyone collects', async (t) => {
    const s = await serviceWithRoute(members, a, b);
    const key = `service/${s.id}`;

    // Cut C off from A and B, in both directions.
    cut.isolate(c.agent, [a.agent, b.agent]);
    let healed = false;
    try {
      const del = await a.agent.client.delete(`/v1/services/${s.id}`, { token: a.token });
      assert.equal(del.status, 200, del.text);
      await eventually('B holds the tombstone', async () =>
        tombstoneKeys(b).includes(key) ? true : undefined,
      );
      assert.equal(await serviceStatus(b, s.id), 404, 'B applied the deletion');
      assert.equal(await serviceStatus(c, s.id), 200, 'C, cut off, still holds the service');

      await advanceClocks(members, PAST_HORIZON_MS);
      // Several rounds past the horizon: A and B probe each other (with equal roots: neither
      // holds the service, and the tombstone has left both digests). Probes to or from C are
      // dropped and never counted as received.
      await waitForProbes([a, b], await Promise.all([a, b].map(pingsReceived)), 8);
      for (const m of [a, b]) {
        assert.ok(
          tombstoneKeys(m).includes(key),
          `${m.peerId} keeps the tombstone past the horizon while C has not matched its digest`,
        );
        assert.ok(!storedRouteIds(m).includes(s.routeId), `${m.peerId} holds no route of the service`);
      }
      assert.ok(storedRouteIds(c).includes(s.routeId), 'C still holds the route');

      cut.heal();
      healed = true;

      // Until C has dropped the service, neither A nor B may have dropped the tombstone. Each
      // sample reads A's and B's tombstones first, then C's service: if a tombstone is already
      // gone, C must have dropped the service before that.
      const violations: string[] = [];
      const started = Date.now();
      let cCorrectedAfter: number | undefined;
      await eventually(
        'no agent holds the tombstone any more',
        async () => {
          const held = members.map((m) => tombstoneKeys(m).includes(key));
          const cHolds = (await serviceStatus(c, s.id)) === 200;
          if (!cHolds && cCorrectedAfter === undefined) cCorrectedAfter = Date.now() - started;
          if (cHolds && (!held[0] || !held[1])) {
            violations.push(`A holds: ${held[0]}, B holds: ${held[1]}, while C still holds the service`);
          }
          return held.every((h) => !h) ? true : undefined;
        },
        30_000,
        50,
      );
      t.diagnostic(
        `partition: C dropped the service ${cCorrectedAfter} ms after the heal, ` +
          `every tombstone was gone after ${Date.now() - started} ms`,
      );
      assert.deepEqual(violations, [], 'a tombstone was collected before C held the deletion');
      assert.notEqual(cCorrectedAfter, undefined, 'C dropped the service');

      const view = (await waitForConvergence(members, 20_000)) as { services: { id: string }[] };
      assert.ok(
        !view.services.some((x) => x.id === s.id),
        'the deletion won: the service is gone everywhere',
      );
      for (const m of members) {
        assert.equal(await serviceStatus(m, s.id), 404, `${m.peerId} does not hold the service`);
        const routes = await m.agent.client.get(`/v1/services/${s.id}/routes`, { token: m.token });
        assert.equal(routes.status, 404, `${m.peerId}: no routes of a deleted service`);
        assert.ok(!storedRouteIds(m).includes(s.routeId), `${m.peerId} stores no route of the service`);
        assert.ok(!tombstoneKeys(m).includes(key), `${m.peerId} collected the tombstone`);
      }
      // Nothing brings it back a few rounds later (a collected tombstone cannot be resurrected
      // against: every agent has dropped the record itself).
      await waitForProbes(members, await Promise.all(members.map(pingsReceived)), 4);
      for (const m of members) assert.equal(await serviceStatus(m, s.id), 404, `${m.peerId}: still deleted`);
    } finally {
      if (!healed) cut.heal();
    }
  });

  it('an agent back from the horizon that starts no exchange itself is corrected by those that probe it', async () => {
    const s = await serviceWithRoute(members, a, b);
    cut.isolate(c.agent, [a.agent, b.agent]);
    try {
      const del = await a.agent.client.delete(`/v1/services/${s.id}`, { token: a.token });
      assert.equal(del.status, 200, del.text);
      await eventually('B applied the deletion', async () =>
        (await serviceStatus(b, s.id)) === 404 ? true : undefined,
      );
      await advanceClocks(members, PAST_HORIZON_MS);
      // C answers whatever it is sent but every request of its own is dropped: only A's and B's
      // exchanges can reach it, and their digests no longer list the deletion.
      cut.dropOnly(c.agent, [a.agent, b.agent]);
      await eventually(
        'C drops the service deleted while it was away',
        async () => ((await serviceStatus(c, s.id)) === 404 ? true : undefined),
        15_000,
      );
      assert.ok(!storedRouteIds(c).includes(s.routeId), 'and its route');
    } finally {
      cut.heal();
    }
    const view = (await waitForConvergence(members, 20_000)) as { services: { id: string }[] };
    assert.ok(!view.services.some((x) => x.id === s.id), 'the deletion won everywhere');
  });
});
