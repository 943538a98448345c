/**
 * Webhooks (docs/events.md "Webhooks"), on real agent processes with real HTTP receivers whose
 * every signature is checked by the `standardwebhooks` library: create, list, read, delete and
 * the test delivery with their 400s, 403 and 404s, and the 422 past 50 webhooks; the secret
 * only in the create answer (never in a list, a delivery or the agent's log), and no secret of any kind in a delivery over a run
 * that creates, rotates and revokes; a receiver down for 30 s gets every event once it is
 * back, in order; a hanging receiver does not delay another; a kill -9 with undelivered events
 * delivers them after the restart, and one just after deliveries sends again only a tail of
 * them; after the last attempt (24 h, the agent's clock moved with libfaketime) the events are
 * given up, counted and shown, and delivery moves on.
 *
 * Events are made by creating and deleting throw-away webhooks (`webhook.created`,
 * `webhook.deleted`), whose filter matches nothing, so they make no deliveries of their own; the
 * webhooks under test filter on `webhook.` so that other config events do not change the counts.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import { assertError, assertTimestamp, sleep, tokenWith } from '../helpers/api-assertions.js';
import { eventually, seriesValue } from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';
import { WebhookReceiver } from '../helpers/webhook-receiver.js';

/** The list and read form (src/api/routes/webhooks.ts). */
interface WebhookListed {
  id: string;
  url: string;
  types: string[];
  created_at: string;
  delivery: {
    pending: number;
    delivered: number;
    given_up: number;
    failures: number;
    failing_since: string | null;
    last_error: string | null;
    last_delivered_at: string | null;
    next_attempt_at: string | null;
  };
}

const LIST_FIELDS = ['created_at', 'delivery', 'id', 'types', 'url'];

describe('/v1/webhooks', { timeout: 240_000 }, () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  let admin: { clientId: string; clientSecret: string };
  let token: string;
  const receivers: WebhookReceiver[] = [];
  const secrets: string[] = [];

  const create = (json: unknown, t = token) => agent.client.post('/v1/webhooks', { json, token: t });
  const list = async () => {
    const res = await agent.client.get('/v1/webhooks', { token });
    assert.equal(res.status, 200, res.text);
    return res.body as WebhookListed[];
  };
  const webhook = async (id: string) => {
    const res = await agent.client.get(`/v1/webhooks/${id}`, { token });
    assert.equal(res.status, 200, res.text);
    return res.body as WebhookListed;
  };
  const receiver = async () => {
    const r = await WebhookReceiver.open();
    receivers.push(r);
    return r;
  };
  /** A webhook to `r` for `webhook.` events; `r` learns its secret. */
  const hookTo = async (r: WebhookReceiver): Promise<string> => {
    const res = await create({ url: r.url, types: ['webhook.'] });
    assert.equal(res.status, 201, res.text);
    r.secret = res.body.secret;
    secrets.push(res.body.secret);
    return res.body.id;
  };
  /** `n` pairs of events (created, deleted) by a throw-away webhook; returns their ids in order. */
  const makeEvents = async (n: number): Promise<string[]> => {
    const ids: string[] = [];
    for (let i = 0; i < n; i++) {
      const res = await create({ url: 'http://127.0.0.1:9/never', types: ['nothing.matches'] });
      assert.equal(res.status, 201, res.text);
      secrets.push(res.body.secret);
      assert.equal((await agent.client.delete(`/v1/webhooks/${res.body.id}`, { token })).status, 200);
      ids.push(`created ${res.body.id}`, `deleted ${res.body.id}`);
    }
    return ids;
  };
  /** What a receiver got, as `created|deleted <webhook id>`, skipping the hook's own creation. */
  const made = (r: WebhookReceiver, ownId: string) =>
    r.events
      .filter((e) => (e.resource as { id: string }).id !== ownId)
      .map((e) => `${String(e.type).replace('webhook.', '')} ${(e.resource as { id: string }).id}`);
  const assertAllVerified = (r: WebhookReceiver) => {
    for (const d of r.received) assert.equal(d.verifyError, undefined, `signature of ${d.body}`);
  };
  const metrics = async () => (await agent.client.get('/metrics', { token })).text;

  before(async () => {
    // The last test moves the agent's clock past the 24 h of the retries.
    agent = await AgentProcess.start({ vendor, movableClock: true });
    admin = await bootstrap(agent, vendor, { license_id: 'lic-webhooks' });
    token = await agent.client.token(admin.clientId, admin.clientSecret);
  });
  after(async () => {
    for (const r of receivers) await r.close();
    // stop() fails if a secret the client saw (webhook secrets included) is in the log.
    assert.equal(await agent.stop(), 0);
    for (const s of secrets) {
      assert.ok(!agent.logs.includes(s.slice('whsec_'.length)), 'no webhook secret in the log');
    }
  });

  it('creates a webhook: the secret once, whsec_ and base64, never in a list, a read or a delivery', async () => {
    const r = await receiver();
    const res = await create({ url: r.url, types: ['webhook.', 'service.created'] });
    assert.equal(res.status, 201, res.text);
    const created = res.body;
    assert.match(created.secret, /^whsec_[A-Za-z0-9+/]{43}=$/);
    assert.equal(Buffer.from(created.secret.slice(6), 'base64').length, 32);
    assert.match(created.id, /^wh_[A-Za-z0-9_-]{22}$/);
    assert.equal(created.url, r.url);
    assert.deepEqual(created.types, ['webhook.', 'service.created']);
    assertTimestamp(created.created_at, 'created_at', Date.now());
    secrets.push(created.secret);
    r.secret = created.secret;

    const listed = (await list()).find((w) => w.id === created.id);
    assert.ok(listed);
    assert.deepEqual(Object.keys(listed).sort(), LIST_FIELDS);
    const one = await webhook(created.id);
    assert.deepEqual(Object.keys(one).sort(), LIST_FIELDS);
    const listText = (await agent.client.get('/v1/webhooks', { token })).text;
    assert.ok(!listText.includes(created.secret.slice(6)), 'no secret in the list');

    // Its own creation is the first event it gets: signed, with the URL, without the secret.
    await eventually('the webhook.created event arrives', async () =>
      r.events.length >= 1 ? true : undefined,
    );
    assertAllVerified(r);
    const first = r.received[0]!;
    assert.equal(first.event!.type, 'webhook.created');
    assert.equal(first.headers['webhook-id'], first.event!.id, 'webhook-id is the event id');
    assert.equal(first.headers['content-type'], 'application/json');
    assert.ok(!first.body.includes(created.secret.slice(6)), 'no secret in a delivery');
    assert.deepEqual((first.event!.actor as Record<string, unknown>).client_id, admin.clientId);
    await eventually('the list counts the delivery', async () =>
      (await webhook(created.id)).delivery.delivered === 1 ? true : undefined,
    );
    const d = (await webhook(created.id)).delivery;
    assert.equal(d.pending, 0);
    assert.equal(d.failing_since, null);
    assertTimestamp(d.last_delivered_at, 'last_delivered_at', Date.now());
    assert.equal((await agent.client.delete(`/v1/webhooks/${created.id}`, { token })).status, 200);
  });

  it('refuses a URL that is not http(s), a bad type filter, and a token without admin', async () => {
    for (const url of ['ftp://127.0.0.1/x', 'file:///etc/passwd', 'not a url', '', 'http://u:p@127.0.0.1/']) {
      assertError(await create({ url }), 400, 'INVALID_REQUEST', url);
    }
    assertError(await create({}), 400, 'INVALID_REQUEST', 'no url');
    assertError(await create({ url: 'http://127.0.0.1/', types: ['Peer.'] }), 400, 'INVALID_REQUEST');
    assertError(await create({ url: 'http://127.0.0.1/', types: 'peer.' }), 400, 'INVALID_REQUEST');
    const before = await list();
    const reader = await tokenWith(agent, admin, 'peers.read', 'services.write', 'credentials.write');
    assertError(await create({ url: 'http://127.0.0.1/' }, reader), 403, 'FORBIDDEN');
    assertError(await agent.client.get('/v1/webhooks', { token: reader }), 403, 'FORBIDDEN');
    assert.deepEqual(await list(), before, 'nothing refused was kept');
  });

  it('refuses a webhook past 50: 422 WEBHOOK_LIMIT_EXCEEDED, nothing kept or recorded', async () => {
    const made: string[] = [];
    for (let i = (await list()).length; i < 50; i++) {
      const res = await create({ url: `http://127.0.0.1:9/${i}`, types: ['nothing.matches'] });
      assert.equal(res.status, 201, res.text);
      secrets.push(res.body.secret);
      made.push(res.body.id);
    }
    const before = await list();
    // A filter nothing matches answers `next` = the newest seq given.
    const lastSeq = async () => (await agent.client.get('/v1/events?type=no.such', { token })).body.next;
    const seq = await lastSeq();
    const refused = await create({ url: 'http://127.0.0.1:9/51', types: ['peer.'] });
    assertError(refused, 422, 'WEBHOOK_LIMIT_EXCEEDED');
    assert.match(refused.body.error, /50 webhooks/);
    // The §3 order: what is wrong with the request itself is still a 400.
    assertError(await create({ url: 'ftp://127.0.0.1/' }), 400, 'INVALID_REQUEST');
    assert.deepEqual(await list(), before, 'nothing kept');
    assert.equal(await lastSeq(), seq, 'no event recorded');
    // Deleting one makes room for one.
    assert.equal((await agent.client.delete(`/v1/webhooks/${made.pop()}`, { token })).status, 200);
    const again = await create({ url: 'http://127.0.0.1:9/again', types: ['nothing.matches'] });
    assert.equal(again.status, 201, again.text);
    secrets.push(again.body.secret);
    made.push(again.body.id);
    for (const id of made)
      assert.equal((await agent.client.delete(`/v1/webhooks/${id}`, { token })).status, 200);
  });

  it('answers 404 for an unknown id on read, delete and test; deletes once', async () => {
    for (const [method, path] of [
      ['GET', '/v1/webhooks/wh_nope'],
      ['DELETE', '/v1/webhooks/wh_nope'],
      ['POST', '/v1/webhooks/wh_nope/test'],
    ] as const) {
      assertError(await agent.client.request(method, path, { token }), 404, 'NOT_FOUND', path);
    }
    const res = await create({ url: 'http://127.0.0.1:9/', types: ['nothing.matches'] });
    secrets.push(res.body.secret);
    const del = await agent.client.delete(`/v1/webhooks/${res.body.id}`, { token });
    assert.equal(del.status, 200);
    assert.deepEqual(del.body, { deleted: true });
    assertError(await agent.client.delete(`/v1/webhooks/${res.body.id}`, { token }), 404, 'NOT_FOUND');
    assert.ok(!(await list()).some((w) => w.id === res.body.id));
  });

  it('sends a signed test event on request and reports how the receiver answered', async () => {
    const r = await receiver();
    const id = await hookTo(r);
    await eventually('its creation arrives', async () => (r.events.length >= 1 ? true : undefined));
    const ok = await agent.client.post(`/v1/webhooks/${id}/test`, { token });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.body.delivered, true);
    assert.equal(ok.body.status, 204);
    assert.equal(ok.body.error, null);
    const test = r.received.at(-1)!;
    assert.equal(test.verifyError, undefined);
    assert.equal(test.event!.type, 'webhook.test');
    assert.equal(test.event!.seq, 0);

    r.mode = { status: 302 };
    const redirected = await agent.client.post(`/v1/webhooks/${id}/test`, { token });
    assert.equal(redirected.body.delivered, false);
    assert.equal(redirected.body.status, 302);
    assert.match(redirected.body.error, /redirect/);
    r.mode = { status: 204 };
    await r.close();
    const refused = await agent.client.post(`/v1/webhooks/${id}/test`, { token });
    assert.equal(refused.body.delivered, false);
    assert.equal(refused.body.status, null);
    assert.match(refused.body.error, /ECONNREFUSED/);
    // The test event was outside the queue: nothing pending, nothing failing.
    const d = (await webhook(id)).delivery;
    assert.equal(d.pending, 0);
    assert.equal(d.failing_since, null);
    await agent.client.delete(`/v1/webhooks/${id}`, { token });
  });

  it('no webhook body or header holds a secret, over a run that creates, rotates and revokes', async () => {
    const r = await receiver();
    const hook = await create({ url: r.url });
    assert.equal(hook.status, 201, hook.text);
    r.secret = hook.body.secret;
    secrets.push(hook.body.secret);
    const cred = await agent.client.post('/v1/credentials', { json: {}, token });
    assert.equal(cred.status, 201, cred.text);
    const rotated = await agent.client.post('/v1/cluster/credentials/rotate', { token });
    assert.equal(rotated.status, 200, rotated.text);
    const revoked = await agent.client.delete(`/v1/credentials/${cred.body.client_id}`, { token });
    assert.equal(revoked.status, 200, revoked.text);
    await makeEvents(1);
    const types = () => r.events.map((e) => e.type);
    await eventually('the events of the run arrive', async () =>
      types().includes('webhook.deleted') ? true : undefined,
    );
    for (const t of [
      'credential.created',
      'cluster_credential.rotated',
      'credential.revoked',
      'webhook.created',
    ]) {
      assert.ok(types().includes(t), `${t} delivered: ${types().join(' ')}`);
    }
    assertAllVerified(r);
    const everything = r.received.map((d) => JSON.stringify(d.headers) + d.body).join('\n');
    const known = [...agent.client.secretsSeen];
    assert.ok(known.length >= 5, `secrets known: ${known.length}`);
    for (const secret of known) {
      // A webhook secret also in its bare base64 form, the HMAC key's text.
      for (const form of [secret, secret.replace(/^whsec_/, '')]) {
        assert.ok(!everything.includes(form), `a delivery holds a secret (${form.slice(0, 8)}…)`);
      }
    }
    assert.equal((await agent.client.delete(`/v1/webhooks/${hook.body.id}`, { token })).status, 200);
  });

  it('a receiver down for 30 s gets every event once back, in order, each signature verified', async () => {
    const r = await receiver();
    const id = await hookTo(r);
    await eventually('its creation arrives', async () => (r.events.length >= 1 ? true : undefined));
    await r.close();
    const downAt = Date.now();
    const expected = await makeEvents(3);
    await eventually('the first attempt fails', async () =>
      (await webhook(id)).delivery.failures >= 1 ? true : undefined,
    );
    await sleep(12_000);
    expected.push(...(await makeEvents(2)));
    const failing = (await webhook(id)).delivery;
    assert.equal(failing.pending, 10);
    assert.ok(failing.failures >= 2, `retried within seconds: ${JSON.stringify(failing)}`);
    assertTimestamp(failing.failing_since, 'failing_since', downAt);
    assert.match(failing.last_error ?? '', /ECONNREFUSED/);
    assertTimestamp(failing.next_attempt_at, 'next_attempt_at', Date.now());
    const text = await metrics();
    assert.equal(seriesValue(text, `mesh_webhook_pending_events{webhook_id="${id}"}`), 10);
    assert.ok(seriesValue(text, 'mesh_webhook_deliveries_total{outcome="failed"}') >= 2);

    await sleep(Math.max(0, 30_000 - (Date.now() - downAt)));
    await r.reopen();
    // Retries at 5 s and 30 s after the first failure: the one due next comes within ~35 s of it.
    await eventually(
      'every event arrives',
      async () => (made(r, id).length >= 10 ? true : undefined),
      60_000,
    );
    assertAllVerified(r);
    assert.deepEqual(made(r, id), expected, 'every event, once each, in order');
    const seqs = r.events.map((e) => e.seq as number);
    assert.deepEqual(
      seqs,
      [...seqs].sort((x, y) => x - y),
      'in seq order',
    );
    const after = (await webhook(id)).delivery;
    assert.equal(after.pending, 0);
    assert.equal(after.failing_since, null);
    assert.equal(after.failures, 0);
    assert.equal(after.given_up, 0);
    await agent.client.delete(`/v1/webhooks/${id}`, { token });
  });

  it('a hanging receiver does not delay another', async () => {
    const hang = await receiver();
    const fine = await receiver();
    const hangId = await hookTo(hang);
    await eventually('its creation arrives', async () => (hang.events.length >= 1 ? true : undefined));
    hang.mode = 'hang';
    const fineId = await hookTo(fine);
    const expected = await makeEvents(5);
    await eventually('the hanging receiver holds a request', async () =>
      hang.hanging.size === 1 ? true : undefined,
    );
    await eventually('the other gets every event', async () =>
      made(fine, fineId).length >= 10 ? true : undefined,
    );
    assert.deepEqual(made(fine, fineId), expected);
    assertAllVerified(fine);
    // Structural, not timed: the hanging one still holds its first request of these events
    // (an attempt lasts up to 10 s), and the other got all of them meanwhile.
    assert.equal(hang.hanging.size, 1, 'the first attempt to the hanging receiver is still open');
    assert.equal(made(hang, hangId).length, 1);
    assert.ok((await webhook(hangId)).delivery.pending >= 10);
    for (const x of [hangId, fineId]) await agent.client.delete(`/v1/webhooks/${x}`, { token });
  });

  it('delivers after a kill -9 what was not delivered before it', async () => {
    const r = await receiver();
    const id = await hookTo(r);
    await eventually('its creation arrives', async () => (r.events.length >= 1 ? true : undefined));
    await r.close();
    const expected = await makeEvents(4);
    await eventually('an attempt failed', async () =>
      (await webhook(id)).delivery.failures >= 1 ? true : undefined,
    );
    assert.equal((await webhook(id)).delivery.pending, 8);
    await agent.kill9();
    await r.reopen();
    await agent.restart();
    await eventually(
      'every event arrives after the restart',
      async () => (made(r, id).length >= 8 ? true : undefined),
      60_000,
    );
    assertAllVerified(r);
    assert.deepEqual(made(r, id), expected, 'every event, once each, in order');
    assert.equal((await webhook(id)).delivery.pending, 0);
    await agent.client.delete(`/v1/webhooks/${id}`, { token });
  });

  it('a kill -9 just after deliveries sends again at most their unwritten tail, and skips nothing', async () => {
    const r = await receiver();
    const id = await hookTo(r);
    const expected = await makeEvents(10);
    await eventually('all 20 arrive', async () => (made(r, id).length >= 20 ? true : undefined));
    await agent.kill9();
    await agent.restart();
    expected.push(...(await makeEvents(1)));
    await eventually('the events after the restart arrive', async () =>
      new Set(made(r, id)).size >= 22 ? true : undefined,
    );
    assertAllVerified(r);
    const got = made(r, id);
    assert.deepEqual(got.slice(0, 20), expected.slice(0, 20), 'before the kill: each once, in order');
    // After it: a tail of what was delivered (its cursor not yet written), then the new events.
    const resent = got.length - 22;
    assert.ok(resent >= 0 && resent <= 20, `${resent} sent again`);
    assert.deepEqual(got.slice(20), [...expected.slice(20 - resent, 20), ...expected.slice(20)]);
    await agent.client.delete(`/v1/webhooks/${id}`, { token });
  });

  it('gives events up after their last attempt, 24 h on, shows and counts it, and moves on', async () => {
    const r = await receiver();
    const id = await hookTo(r);
    await eventually('its creation arrives', async () => (r.events.length >= 1 ? true : undefined));
    await r.close();
    await makeEvents(2);
    await eventually('an attempt failed', async () =>
      (await webhook(id)).delivery.failures >= 1 ? true : undefined,
    );
    const givenUpBefore = seriesValue(await metrics(), 'mesh_webhook_deliveries_total{outcome="given_up"}');
    await agent.advanceClock(25 * 3600_000);
    token = await agent.client.token(admin.clientId, admin.clientSecret);
    // The retry due 5 s after the first failure is the last: it fails 25 h after the events.
    await eventually(
      'the events are given up',
      async () => ((await webhook(id)).delivery.given_up === 4 ? true : undefined),
      30_000,
    );
    const d = (await webhook(id)).delivery;
    assert.equal(d.pending, 0);
    assert.notEqual(d.failing_since, null, 'still failing: nothing answered yet');
    assert.match(d.last_error ?? '', /ECONNREFUSED/);
    assert.equal(
      seriesValue(await metrics(), 'mesh_webhook_deliveries_total{outcome="given_up"}') - givenUpBefore,
      4,
    );
    assert.match(agent.logs, /webhook events given up after their last attempt/);

    // The receiver keeps time with the agent, as an operator's does.
    r.clockOffsetMs = agent.clock!.offsetMs;
    await r.reopen();
    const expected = await makeEvents(1);
    await eventually(
      'the next events arrive',
      async () => (made(r, id).length >= 2 ? true : undefined),
      60_000,
    );
    assert.deepEqual(made(r, id), expected, 'only the events after the given-up ones');
    assertAllVerified(r);
    const back = (await webhook(id)).delivery;
    assert.equal(back.failing_since, null);
    assert.equal(back.given_up, 4);
  });
});
