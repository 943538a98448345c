/**
 * Gossip authentication against real agents: a message built exactly as an agent builds it
 * (signed by B's identity, MACed with a live cluster key) changes C's state; the same message
 * replayed, sent to the wrong agent, altered, unsigned, stale, MACed with an unknown key, sent by
 * a stranger or by a peer that has left changes nothing and is counted by reason in
 * mesh_gossip_rejected_total on the receiver.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import type { Envelope } from '../../src/cluster/gossip-envelope.js';
import { Identity } from '../../src/cluster/identity.js';
import { assertError } from '../helpers/api-assertions.js';
import {
  agentNow,
  credentialOf,
  eventually,
  identityOf,
  impostor,
  type LiveKey,
  type Member,
  macKeyFromSecret,
  peerRenameRecord,
  rejectedCounts,
  replicatedView,
  replyPayload,
  rotate,
  sealMessage,
  sendGossip,
  startCluster,
  stopAll,
} from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';

const vendor = makeVendor();

/** POST /internal/v1/gossip announcing one byte over 16 MiB and sending none; the answer. */
function oversizedGossip(to: Member): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: '127.0.0.1',
      port: to.agent.port,
      method: 'POST',
      path: '/internal/v1/gossip',
      headers: { 'content-type': 'application/json', 'content-length': String(16 * 1024 * 1024 + 1) },
    });
    req.on('response', (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        text += chunk;
      });
      res.on('end', () => {
        resolve({ status: res.statusCode ?? 0, text });
        req.destroy();
      });
    });
    req.on('error', reject);
    req.flushHeaders();
  });
}

describe('gossip security: forged, replayed and misdirected messages change nothing', {
  timeout: 90_000,
}, () => {
  let members: Member[] = [];
  let a: Member;
  let b: Member;
  let c: Member;
  let key: LiveKey;
  let bIdentity: Identity;
  let forged = 0;

  before(async () => {
    members = await startCluster(vendor, 3, { license_id: 'L-sec', max_nodes: 5, max_services: 5 });
    [a, b, c] = members as [Member, Member, Member];
    bIdentity = identityOf(b);
    assert.equal(bIdentity.peerId, b.peerId, "identity.key is B's identity");
    // A live cluster key the test knows: rotate, and wait until every agent has it.
    const rotated = await rotate(a);
    key = macKeyFromSecret(rotated.client_secret);
    for (const m of [b, c]) {
      await eventually(`${m.peerId} has credential version ${rotated.version}`, async () =>
        (await credentialOf(m)).version === rotated.version ? true : undefined,
      );
    }
  });

  after(async () => {
    await stopAll(members);
  });

  /** B as the receiver shows it now. */
  async function peerOn(receiver: Member, peerId: string): Promise<Record<string, unknown>> {
    const res = await receiver.agent.client.get(`/v1/peers/${peerId}`, { token: receiver.token });
    assert.equal(res.status, 200, res.text);
    return res.body;
  }

  /** A push that renames B on `receiver`, as B would send it; each call a new name and stamp. */
  async function renamePush(
    receiver: Member,
    opts: { signer?: Identity; key?: LiveKey; sentAt?: number; to?: string } = {},
  ): Promise<{ envelope: Envelope; nonce: string; name: string }> {
    const name = `forged-${++forged}`;
    const peer = await peerOn(receiver, b.peerId);
    const now = agentNow(receiver);
    const record = peerRenameRecord(peer, name, now, b.peerId);
    const sealed = sealMessage(
      opts.signer ?? bIdentity,
      opts.to ?? receiver.peerId,
      'push',
      { records: [record], rumors: [] },
      'key' in opts ? opts.key : key,
      opts.sentAt ?? now,
    );
    return { ...sealed, name };
  }

  /**
   * Sends the envelope to the receiver and checks the refusal: status and reason in the answer,
   * nothing changed in what the receiver shows, the reason's counter up by one.
   */
  async function assertRefused(
    receiver: Member,
    envelope: Envelope,
    reason: string,
    forgedName?: string,
  ): Promise<void> {
    const viewBefore = await replicatedView(receiver);
    const countsBefore = await rejectedCounts(receiver);
    const res = await sendGossip(receiver, envelope);
    const unauthorized = reason === 'unknown_credential';
    assertError(res, unauthorized ? 401 : 403, unauthorized ? 'UNAUTHORIZED' : 'FORBIDDEN', reason);
    assert.equal(res.body.error, `gossip message refused:${reason}`);
    const viewAfter = await replicatedView(receiver);
    assert.deepEqual(viewAfter, viewBefore, `a message refused for ${reason} changed nothing`);
    if (forgedName) {
      assert.notEqual((await peerOn(receiver, b.peerId)).name, forgedName, 'the forged name is not shown');
    }
    const countsAfter = await rejectedCounts(receiver);
    assert.equal(
      (countsAfter.get(reason) ?? 0) - (countsBefore.get(reason) ?? 0),
      1,
      `mesh_gossip_rejected_total{reason="${reason}"} rose by one: ${JSON.stringify([...countsAfter])}`,
    );
  }

  let accepted: { envelope: Envelope; nonce: string; name: string };

  it('a push signed by B and MACed with a live key renames B on C (the message is otherwise valid)', async () => {
    accepted = await renamePush(c);
    const before = await peerOn(c, b.peerId);
    const res = await sendGossip(c, accepted.envelope);
    assert.equal(res.status, 200, res.text);
    const reply = replyPayload(res);
    assert.equal(reply.type, 'push-reply');
    assert.equal(reply.from, c.peerId);
    assert.equal(reply.to, b.peerId);
    assert.equal(reply.re, accepted.nonce);
    assert.equal((res.body as Envelope).kid, key.kid, 'C answers under the key B used');
    const afterPeer = await peerOn(c, b.peerId);
    assert.equal(afterPeer.name, accepted.name, 'C shows the new name at once');
    assert.equal(afterPeer.version, (before.version as number) + 1);
    // C relays it: A learns the new name by gossip.
    await eventually('A shows the rename', async () =>
      (await peerOn(a, b.peerId)).name === accepted.name ? true : undefined,
    );
  });

  it('the same envelope replayed to C: replay', async () => {
    await assertRefused(c, accepted.envelope, 'replay');
  });

  it('the same envelope replayed after C restarts (its replay memory empty): replay', async () => {
    await c.agent.stop();
    await c.agent.restart();
    await eventually('C answers after its restart', async () =>
      (await c.agent.client.get('/readyz')).status === 200 ? true : undefined,
    );
    await assertRefused(c, accepted.envelope, 'replay');
  });

  it('the same envelope sent to A (addressed to C): wrong_recipient', async () => {
    await assertRefused(a, accepted.envelope, 'wrong_recipient');
    // Also a fresh message addressed to C, with a new name, delivered to A.
    const fresh = await renamePush(a, { to: c.peerId });
    await assertRefused(a, fresh.envelope, 'wrong_recipient', fresh.name);
  });

  it('payload altered after signing (another name): bad_mac', async () => {
    const m = await renamePush(c);
    const altered = m.envelope.payload.replace(`"name":"${m.name}"`, '"name":"altered-name"');
    assert.notEqual(altered, m.envelope.payload);
    await assertRefused(c, { ...m.envelope, payload: altered }, 'bad_mac', 'altered-name');
  });

  it("signed by a fresh Ed25519 key claiming B's peer id (MAC valid): bad_signature", async () => {
    const m = await renamePush(c, { signer: impostor(b.peerId) });
    await assertRefused(c, m.envelope, 'bad_signature', m.name);
  });

  it('unsigned (sig empty): bad_signature', async () => {
    const m = await renamePush(c);
    await assertRefused(c, { ...m.envelope, sig: '' }, 'bad_signature', m.name);
  });

  it('sent 10 minutes ago, correctly signed and MACed: stale', async () => {
    const m = await renamePush(c, { sentAt: agentNow(c) - 10 * 60_000 });
    await assertRefused(c, m.envelope, 'stale', m.name);
  });

  it('MACed under a made-up key id: unknown_credential', async () => {
    const madeUp = { kid: 'deadbeefdeadbeef', key: Buffer.alloc(32, 7) };
    assert.notEqual(madeUp.kid, key.kid);
    const m = await renamePush(c, { key: madeUp });
    await assertRefused(c, m.envelope, 'unknown_credential', m.name);
    // Unkeyed ("none") is only for rejoin: a push without a MAC is refused the same way.
    const unkeyed = await renamePush(c, { key: undefined });
    assert.equal(unkeyed.envelope.kid, 'none');
    await assertRefused(c, unkeyed.envelope, 'unknown_credential', unkeyed.name);
  });

  it('sent by a stranger (a fresh identity, its own peer id): unknown_sender', async () => {
    const stranger = new Identity(Identity.generatePem());
    const m = await renamePush(c, { signer: stranger });
    await assertRefused(c, m.envelope, 'unknown_sender', m.name);
  });

  it('bodies refused before they are read as envelopes are counted as malformed too, and change nothing', async () => {
    const junk: { what: string; body: string | Buffer; type?: string; status: number }[] = [
      { what: 'an envelope without sig', body: '{"payload":"{}","kid":"x","mac":"x"}', status: 400 },
      { what: 'a JSON array', body: '[]', status: 400 },
      { what: 'not JSON', body: '{"payload":', status: 400 },
      { what: 'text, not JSON', body: 'payload=x', type: 'text/plain', status: 400 },
      { what: 'a content type no parser takes', body: '<x/>', type: 'application/xml', status: 400 },
    ];
    const viewBefore = await replicatedView(c);
    const before = (await rejectedCounts(c)).get('malformed') ?? 0;
    for (const j of junk) {
      const res = await c.agent.client.post('/internal/v1/gossip', {
        body: j.body,
        headers: { 'content-type': j.type ?? 'application/json' },
      });
      assert.equal(res.status, j.status, `${j.what}: ${res.text}`);
      assert.equal(typeof res.body.code, 'string', `${j.what}: the API's error shape`);
    }
    // Over the 16 MiB limit: announced by content-length, refused before the body is read (a
    // client still writing 16 MiB would race the answer and the closed socket).
    const tooLarge = await oversizedGossip(c);
    assert.equal(tooLarge.status, 413, tooLarge.text);
    assert.equal(JSON.parse(tooLarge.text).code, 'PAYLOAD_TOO_LARGE');
    const after = (await rejectedCounts(c)).get('malformed') ?? 0;
    assert.equal(after - before, junk.length + 1, 'each refused body counted once as malformed');
    assert.deepEqual(await replicatedView(c), viewBefore, 'nothing changed');
  });

  it('well signed by B after B left the cluster: inactive_sender', async () => {
    const left = await b.agent.client.delete('/v1/peers/self', { token: b.token });
    assert.equal(left.status, 200, left.text);
    await eventually('C shows B inactive', async () =>
      (await peerOn(c, b.peerId)).is_active === false ? true : undefined,
    );
    const m = await renamePush(c);
    const viewBefore = await replicatedView(c);
    const countsBefore = await rejectedCounts(c);
    const res = await sendGossip(c, m.envelope);
    assertError(res, 403, 'FORBIDDEN', 'inactive_sender');
    assert.equal(res.body.error, 'gossip message refused:inactive_sender');
    assert.deepEqual(await replicatedView(c), viewBefore, 'nothing changed');
    assert.notEqual((await peerOn(c, b.peerId)).name, m.name);
    const countsAfter = await rejectedCounts(c);
    // B itself may still have had a message in flight when it left: at least ours is counted.
    assert.ok(
      (countsAfter.get('inactive_sender') ?? 0) - (countsBefore.get('inactive_sender') ?? 0) >= 1,
      `inactive_sender counted: ${JSON.stringify([...countsAfter])}`,
    );
  });
});
