/**
 * License limits hold cluster-wide across real agents: two creates racing for the last service
 * slot on two agents, and two joins racing for the last node slot through two members, end with
 * exactly one winner (the allocator, the oldest active peer, admits one request at a time); an
 * agent cut off from the allocator refuses new services with 503 and creates nothing.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { assertError } from '../helpers/api-assertions.js';
import type { ApiResponse } from '../helpers/api-client.js';
import { GossipCut } from '../helpers/gossip-cut.js';
import {
  activePeerIds,
  addPeer,
  eventually,
  type Member,
  startCluster,
  startMember,
  stopAll,
  waitForPeers,
} from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';

const vendor = makeVendor();

interface Pair {
  source: string;
  target: string;
}

function createService(m: Member, pair: Pair): Promise<ApiResponse> {
  return m.agent.client.post('/v1/services', {
    token: m.token,
    json: { source_peer_id: pair.source, target_peer_id: pair.target },
  });
}

async function serviceIds(m: Member): Promise<string[]> {
  const res = await m.agent.client.get('/v1/services', { token: m.token });
  assert.equal(res.status, 200, res.text);
  return (res.body as { id: string }[]).map((s) => s.id).sort();
}

/** Waits until every member lists the same services, `n` of them; returns their ids. */
async function waitForServices(members: readonly Member[], n: number): Promise<string[]> {
  return eventually(`every member lists the same ${n} services`, async () => {
    const lists = await Promise.all(members.map((m) => serviceIds(m)));
    const first = JSON.stringify(lists[0]);
    return lists.every((l) => l.length === n && JSON.stringify(l) === first) ? lists[0] : undefined;
  });
}

/** POST /v1/cluster/sync on every member: heartbeats and anti-entropy with every peer, now. */
async function syncAll(members: readonly Member[]): Promise<void> {
  for (const m of members) {
    const res = await m.agent.client.post('/v1/cluster/sync', { token: m.token });
    assert.equal(res.status, 200, res.text);
  }
}

/** The allocator: the oldest active peer by created_at, then peer id (allocator.ts). */
async function allocatorOf(m: Member): Promise<string> {
  const res = await m.agent.client.get('/v1/peers', { token: m.token });
  assert.equal(res.status, 200, res.text);
  const active = (res.body as { id: string; created_at: string; is_active: boolean }[]).filter(
    (p) => p.is_active,
  );
  active.sort((x, y) =>
    x.created_at < y.created_at ? -1 : x.created_at > y.created_at ? 1 : x.id < y.id ? -1 : 1,
  );
  return active[0]!.id;
}

/** Of two racing answers: exactly one 201 and one 422 with the code; returns the 201. */
function oneWinner(answers: ApiResponse[], code: string): ApiResponse {
  const statuses = answers.map((r) => r.status).sort();
  assert.deepEqual(statuses, [201, 422], `one 201 and one 422: ${answers.map((r) => r.text).join(' | ')}`);
  const loser = answers.find((r) => r.status === 422)!;
  assertError(loser, 422, code);
  return answers.find((r) => r.status === 201)!;
}

const MAX_SERVICES = 4;

describe('max_services holds cluster-wide', { timeout: 90_000 }, () => {
  let members: Member[] = [];
  let cut: GossipCut;

  before(async () => {
    cut = new GossipCut();
    members = await startCluster(
      vendor,
      3,
      { license_id: 'L-svc', max_nodes: 5, max_services: MAX_SERVICES },
      undefined,
      { ownAddress: true },
    );
  });

  after(async () => {
    cut?.close();
    await stopAll(members);
  });

  /** The six ordered (source, target) pairs of three agents, and which are taken. */
  const taken = new Map<string, string>(); // pair key → service id
  const key = (p: Pair) => `${p.source}>${p.target}`;
  function allPairs(): Pair[] {
    const out: Pair[] = [];
    for (const s of members)
      for (const t of members) if (s !== t) out.push({ source: s.peerId, target: t.peerId });
    return out;
  }
  const freePairs = () => allPairs().filter((p) => !taken.has(key(p)));

  it('two creates for the last slot on two agents: exactly one 201, one 422; several rounds', async () => {
    const pairs = allPairs();
    assert.equal(pairs.length, 6);
    // N − 1 services, made on different agents.
    for (let i = 0; i < MAX_SERVICES - 1; i++) {
      const pair = pairs[i]!;
      const res = await createService(members[i % members.length]!, pair);
      assert.equal(res.status, 201, res.text);
      taken.set(key(pair), res.body.id);
    }
    await waitForServices(members, MAX_SERVICES - 1);

    // Every ordered pair of distinct agents races once (the allocator among them or not).
    const racers: [number, number][] = [
      [0, 1],
      [1, 2],
      [2, 0],
      [1, 0],
      [2, 1],
    ];
    for (const [round, [i, j]] of racers.entries()) {
      const [p1, p2] = freePairs();
      assert.ok(p1 && p2, 'two free pairs');
      const answers = await Promise.all([createService(members[i]!, p1), createService(members[j]!, p2)]);
      const won = oneWinner(answers, 'SERVICE_LIMIT_EXCEEDED');
      const wonPair = answers[0] === won ? p1 : p2;
      taken.set(key(wonPair), won.body.id);
      const ids = await waitForServices(members, MAX_SERVICES);
      assert.ok(ids.includes(won.body.id), `round ${round}: the winner's service is everywhere`);
      // Stays at N once every agent has exchanged its whole state with every other.
      await syncAll(members);
      assert.deepEqual(await waitForServices(members, MAX_SERVICES), ids, `round ${round}: still N`);

      // Free a slot for the next round, deleting on yet another agent.
      const victim = [...taken][round % taken.size]!;
      const del = await members[(round + 2) % 3]!.agent.client.delete(`/v1/services/${victim[1]}`, {
        token: members[(round + 2) % 3]!.token,
      });
      assert.equal(del.status, 200, del.text);
      taken.delete(victim[0]);
      await waitForServices(members, MAX_SERVICES - 1);
    }
  });

  it('an agent cut off from the allocator answers 503 UNAVAILABLE and creates nothing', async () => {
    const allocatorId = await allocatorOf(members[0]!);
    for (const m of members)
      assert.equal(await allocatorOf(m), allocatorId, 'every agent names one allocator');
    const allocator = members.find((m) => m.peerId === allocatorId)!;
    const b = members.find((m) => m !== allocator)!;
    const before = await waitForServices(members, MAX_SERVICES - 1);
    const pair = freePairs()[0]!;

    cut.isolate(b.agent, [allocator.agent]);
    try {
      const res = await createService(b, pair);
      assertError(res, 503, 'UNAVAILABLE', 'create on an agent cut off from the allocator');
      assert.deepEqual(await serviceIds(b), before, 'nothing created on B');
    } finally {
      cut.heal();
    }
    await syncAll(members);
    assert.deepEqual(await waitForServices(members, MAX_SERVICES - 1), before, 'nothing created anywhere');

    const res = await createService(b, pair);
    assert.equal(res.status, 201, `after the heal: ${res.text}`);
    const ids = await waitForServices(members, MAX_SERVICES);
    assert.ok(ids.includes(res.body.id));
  });
});

describe('max_nodes holds cluster-wide', { timeout: 90_000 }, () => {
  const LICENSE = { license_id: 'L-nodes', max_nodes: 3, max_services: 5 };
  const started: Member[] = [];
  let cluster: Member[] = [];

  before(async () => {
    cluster = await startCluster(vendor, 2, LICENSE);
    started.push(...cluster);
  });

  after(async () => {
    await stopAll(started);
  });

  async function lone(): Promise<Member> {
    const m = await startMember(vendor, LICENSE, 'lone');
    started.push(m);
    return m;
  }

  it('two members add two lone agents at once with one slot left: one 201, one 422; three rounds', async () => {
    const [a, b] = cluster as [Member, Member];
    let waiting = await lone();
    for (let round = 0; round < 3; round++) {
      const fresh = await lone();
      // Alternate which member adds the agent that lost before.
      const [first, second] = round % 2 === 0 ? [waiting, fresh] : [fresh, waiting];
      const answers = await Promise.all([addPeer(a, first), addPeer(b, second)]);
      const won = oneWinner(answers, 'NODE_LIMIT_EXCEEDED');
      const winner = answers[0] === won ? first : second;
      const loser = winner === first ? second : first;
      assert.equal(won.body.id, winner.peerId);

      const members = [a, b, winner];
      await waitForPeers(members, LICENSE.max_nodes);
      assert.deepEqual(
        await activePeerIds(a),
        [a.peerId, b.peerId, winner.peerId].sort(),
        `round ${round}: the cluster is its two members and the winner`,
      );
      assert.deepEqual(
        await activePeerIds(loser),
        [loser.peerId],
        `round ${round}: the loser is still alone`,
      );
      await syncAll(members);
      await waitForPeers(members, LICENSE.max_nodes);

      // Free the slot again: remove the winner, and stop it.
      const removed = await a.agent.client.delete(`/v1/peers/${winner.peerId}`, { token: a.token });
      assert.equal(removed.status, 200, removed.text);
      await waitForPeers([a, b], 2);
      await winner.agent.stop();
      waiting = loser;
    }
  });
});
