/**
 * Rotation of the cluster credential across real agents: a new secret is accepted everywhere at
 * once, the previous one for 24 hours and not a minute longer (clocks moved with libfaketime),
 * concurrent rotations end with one winner, and an agent that was down through a rotation and
 * past the grace period rejoins by its identity.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { GossipCut } from '../helpers/gossip-cut.js';
import {
  advanceClocks,
  assertKeyAccepted,
  assertKeyRefused,
  credentialOf,
  eventually,
  type LiveKey,
  type Member,
  macKeyFromSecret,
  refreshToken,
  rotate,
  startCluster,
  stopAll,
  waitForConvergence,
} from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';

const vendor = makeVendor();
const HOUR = 60 * 60_000;

describe('cluster credential rotation', { timeout: 90_000 }, () => {
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
      { license_id: 'L-rot', max_nodes: 5, max_services: 5 },
      undefined,
      { ownAddress: true, movableClock: true },
    );
    [a, b, c] = members as [Member, Member, Member];
  });

  after(async () => {
    cut?.close();
    await stopAll(members);
  });

  /** Probes are signed by B, or by A when B receives. */
  const senderFor = (receiver: Member) => (receiver === b ? a : b);
  const assertAccepted = (receiver: Member, key: LiveKey, what: string) =>
    assertKeyAccepted(receiver, senderFor(receiver), key, what);
  const assertRefused = (receiver: Member, key: LiveKey, what: string) =>
    assertKeyRefused(receiver, senderFor(receiver), key, what);

  async function waitForVersion(version: number, rotatedBy: string): Promise<void> {
    for (const m of members) {
      await eventually(`${m.peerId} shows credential version ${version}`, async () => {
        const cred = await credentialOf(m);
        return cred.version === version && cred.rotated_by === rotatedBy ? true : undefined;
      });
    }
  }

  it('the new secret works everywhere; the previous one for 24 h, then nowhere', async () => {
    const v0 = (await credentialOf(a)).version;
    for (const m of members) assert.equal((await credentialOf(m)).version, v0, 'same version everywhere');

    const first = await rotate(a);
    assert.equal(first.version, v0 + 1, 'a rotation raises the version by one');
    assert.equal(first.rotated_by, a.peerId);
    await waitForVersion(v0 + 1, a.peerId);
    const second = await rotate(a);
    assert.equal(second.version, v0 + 2, 'a rotation raises the version by one');
    await waitForVersion(v0 + 2, a.peerId);
    const oldKey = macKeyFromSecret(first.client_secret);
    const newKey = macKeyFromSecret(second.client_secret);

    for (const m of members) {
      await assertAccepted(m, newKey, `new secret on ${m.peerId}`);
      await assertAccepted(m, oldKey, `previous secret (in its grace period) on ${m.peerId}`);
    }

    await advanceClocks(members, 24 * HOUR + 60_000);
    for (const m of members) {
      await assertRefused(m, oldKey, `previous secret after 24 h + 1 min on ${m.peerId}`);
      await assertAccepted(m, newKey, `new secret after 24 h + 1 min on ${m.peerId}`);
    }

    // The cluster still converges: a write after the advance reaches everyone.
    const renamed = await b.agent.client.put(`/v1/peers/${c.peerId}`, {
      token: b.token,
      json: { name: 'renamed-after-grace' },
    });
    assert.equal(renamed.status, 200, renamed.text);
    const created = await c.agent.client.post('/v1/services', {
      token: c.token,
      json: { source_peer_id: a.peerId, target_peer_id: b.peerId },
    });
    assert.equal(created.status, 201, created.text);
    const view = (await waitForConvergence(members)) as {
      peers: { id: string; name: string }[];
      services: { id: string }[];
      credential: { version: number };
    };
    assert.equal(view.peers.find((p) => p.id === c.peerId)?.name, 'renamed-after-grace');
    assert.deepEqual(
      view.services.map((s) => s.id),
      [created.body.id],
    );
    assert.equal(view.credential.version, v0 + 2, 'no rotation happened on its own');
  });

  it('two rotations at the same moment on two agents: one winner, one secret valid cluster-wide', async () => {
    const v = (await credentialOf(a)).version;
    // A and B hear nobody while they rotate, so on a loaded machine A's push cannot reach B (or
    // reach it through C) before B has handled its own request: the two are concurrent by
    // construction, not by timing. The heal then lets the two rotations meet.
    cut.isolate(a.agent, [b.agent, c.agent]);
    cut.isolate(b.agent, [c.agent]);
    let ra: Awaited<ReturnType<typeof rotate>>;
    let rb: Awaited<ReturnType<typeof rotate>>;
    try {
      [ra, rb] = await Promise.all([rotate(a), rotate(b)]);
    } finally {
      cut.heal();
    }
    assert.equal(ra.version, v + 1);
    assert.equal(rb.version, v + 1, 'both rotated from the same version: the rotations were concurrent');
    const winner = await eventually('every agent shows the same credential', async () => {
      const creds = await Promise.all(members.map((m) => credentialOf(m)));
      const first = JSON.stringify(creds[0]);
      return creds.every((cr) => JSON.stringify(cr) === first) ? creds[0] : undefined;
    });
    assert.equal(winner.version, v + 1, 'the winner keeps the version: one rotation, not two');
    assert.ok([a.peerId, b.peerId].includes(winner.rotated_by), `rotated_by ${winner.rotated_by}`);
    const [won, lost] = winner.rotated_by === a.peerId ? [ra, rb] : [rb, ra];
    const wonKey = macKeyFromSecret(won.client_secret);
    const lostKey = macKeyFromSecret(lost.client_secret);
    for (const m of members) await assertAccepted(m, wonKey, `winning secret on ${m.peerId}`);
    // The losing secret is valid nowhere once the winner has reached every agent: not on the
    // winner, which never took it, and not on the agent that issued it or one that adopted it
    // first (a key replaced in the same epoch gets no grace: docs/gossip.md).
    for (const m of members) await assertRefused(m, lostKey, `losing secret on ${m.peerId}`);
    const view = (await waitForConvergence(members)) as { credential: { version: number } };
    assert.equal(view.credential.version, v + 1);
  });

  it('an agent down through a rotation and past the grace period rejoins by identity', async () => {
    const v = (await credentialOf(a)).version;
    assert.equal(await c.agent.stop(), 0, 'C stops cleanly');
    const rotated = await rotate(a);
    assert.equal(rotated.version, v + 1);
    await eventually('B shows the new version', async () =>
      (await credentialOf(b)).version === v + 1 ? true : undefined,
    );
    await advanceClocks([a, b], 25 * HOUR);

    await c.agent.restart();
    // C's clock kept its offset through the restart: 25 h behind A's and B's. Bring it level.
    await refreshToken(c);
    await advanceClocks([c], a.agent.clock!.offsetMs - c.agent.clock!.offsetMs);
    assert.equal(c.agent.clock!.offsetMs, a.agent.clock!.offsetMs);

    await eventually(
      'C shows the new credential version',
      async () => ((await credentialOf(c)).version === v + 1 ? true : undefined),
      20_000,
    );
    assert.match(c.agent.logs, /rejoining by identity/, 'C rejoined by identity');

    const fromA = await a.agent.client.put(`/v1/peers/${b.peerId}`, {
      token: a.token,
      json: { name: 'written-on-a-after-restart' },
    });
    assert.equal(fromA.status, 200, fromA.text);
    const fromC = await c.agent.client.put(`/v1/peers/${c.peerId}`, {
      token: c.token,
      json: { name: 'written-on-c-after-restart' },
    });
    assert.equal(fromC.status, 200, fromC.text);
    const view = (await waitForConvergence(members, 20_000)) as {
      peers: { id: string; name: string }[];
      credential: { version: number };
    };
    assert.equal(view.peers.find((p) => p.id === b.peerId)?.name, 'written-on-a-after-restart');
    assert.equal(view.peers.find((p) => p.id === c.peerId)?.name, 'written-on-c-after-restart');
    assert.equal(view.credential.version, v + 1);
    await assertAccepted(c, macKeyFromSecret(rotated.client_secret), 'the new secret on C');
  });
});
