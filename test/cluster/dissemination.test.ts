/**
 * How a change spreads, taken apart from anti-entropy: agents gossiping at a 60 s interval run no
 * probe and no anti-entropy round during these tests, so a change can reach the others only by
 * the writer's push and its relay by whoever received it (infection style), and POST
 * /v1/cluster/sync must carry a change that every push lost before it answers.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { GossipCut } from '../helpers/gossip-cut.js';
import { eventually, gossipMessages, type Member, startCluster, stopAll } from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';

const vendor = makeVendor();
/** No round during a test: changes move only by push and relay, or by an explicit sync. */
const QUIET_ARGS = ['--gossip-interval-ms', '60000'];

/** Anti-entropy messages (bucket lists and digests) every member has sent so far. */
async function antiEntropySent(members: readonly Member[]): Promise<number> {
  let sum = 0;
  for (const m of members) {
    sum += (await gossipMessages(m, 'buckets', 'sent')) + (await gossipMessages(m, 'digest', 'sent'));
  }
  return sum;
}

async function nameOn(m: Member, peerId: string): Promise<string> {
  const res = await m.agent.client.get(`/v1/peers/${peerId}`, { token: m.token });
  assert.equal(res.status, 200, res.text);
  return res.body.name as string;
}

async function rename(writer: Member, peerId: string, name: string): Promise<void> {
  const res = await writer.agent.client.put(`/v1/peers/${peerId}`, { token: writer.token, json: { name } });
  assert.equal(res.status, 200, res.text);
}

describe('dissemination without anti-entropy rounds', { timeout: 90_000 }, () => {
  let members: Member[] = [];
  let a: Member;
  let b: Member;
  let c: Member;
  let d: Member;
  let cut: GossipCut;

  before(async () => {
    cut = new GossipCut();
    members = await startCluster(
      vendor,
      4,
      { license_id: 'L-push', max_nodes: 4, max_services: 4 },
      QUIET_ARGS,
      { ownAddress: true },
    );
    [a, b, c, d] = members as [Member, Member, Member, Member];
    // Let the joins' own anti-entropy exchanges finish before counting: no new one for 2 s (three
    // equal samples; one slow reply on a loaded machine can hold an exchange's last step back).
    let last = -1;
    let unchanged = 0;
    await eventually(
      'the joins’ anti-entropy exchanges are over',
      async () => {
        const now = await antiEntropySent(members);
        unchanged = now === last ? unchanged + 1 : 0;
        last = now;
        return unchanged >= 2 ? true : undefined;
      },
      20_000,
      1_000,
    );
  });

  after(async () => {
    cut?.close();
    await stopAll(members);
  });

  it('a change reaches an agent the writer cannot reach, relayed by those it pushed to', async () => {
    // With 4 agents and a fanout of 3 the writer pushes to every other; its push to D is cut,
    // so D can only have the change from B or C passing it on.
    cut.isolate(a.agent, [d.agent]);
    try {
      const before = await antiEntropySent(members);
      const dPushesBefore = await gossipMessages(d, 'push', 'received');
      await rename(a, c.peerId, 'relayed-name');
      for (const m of [b, c, d]) {
        await eventually(
          `${m.peerId} has the new name`,
          async () => ((await nameOn(m, c.peerId)) === 'relayed-name' ? true : undefined),
          5_000,
          20,
        );
      }
      assert.ok(
        (await gossipMessages(d, 'push', 'received')) > dPushesBefore,
        'D received pushes (from B or C: A is cut off from it)',
      );
      assert.equal(await antiEntropySent(members), before, 'no anti-entropy message was sent meanwhile');
    } finally {
      cut.heal();
    }
  });

  it('POST /v1/cluster/sync carries a change every push lost, before it answers', async () => {
    // Every request A sends is dropped; it still answers what it is sent.
    cut.drop(a.agent, [b.agent, c.agent, d.agent]);
    try {
      await rename(a, b.peerId, 'synced-name');
      await new Promise((r) => setTimeout(r, 500));
      for (const m of [b, c, d]) {
        assert.notEqual(await nameOn(m, b.peerId), 'synced-name', `${m.peerId}: every push was dropped`);
      }
    } finally {
      cut.heal();
    }
    const synced = await a.agent.client.post('/v1/cluster/sync', { token: a.token });
    assert.equal(synced.status, 200, synced.text);
    assert.deepEqual(synced.body, { triggered: true });
    // No waiting: the sync ran anti-entropy with every peer before it answered.
    for (const m of [b, c, d]) assert.equal(await nameOn(m, b.peerId), 'synced-name', m.peerId);
  });
});
