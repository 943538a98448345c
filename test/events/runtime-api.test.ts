/**
 * Runtime events that API requests cause, on real agents (docs/events.md "Runtime events"):
 * refused authentications aggregated into one `auth.failures` event per window (50 bad token
 * requests: one event, count 50, never the secret tried); a write refused by a license limit
 * records `license.limit_refused` and no config event; `license.expiring` at 30, 7 and 1 days
 * and `license.expired`, each once, across a restart too. Time is moved with libfaketime.
 */
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import type { MeshEvent } from '../../src/events/event-log.js';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import { CLUSTER_ARGS, eventually, startCluster, startNode, stopAll } from '../helpers/cluster.js';
import { eventsOf } from '../helpers/event-reads.js';
import { makeVendor } from '../helpers/licenses.js';
import { bootstrapNode, type Node } from '../helpers/nodes.js';

const vendor = makeVendor();
const DAY = 86_400_000;

/** The client id a token was issued to (its `sub`). */
const clientOf = (token: string): string =>
  (JSON.parse(Buffer.from(token.split('.')[1]!, 'base64url').toString()) as { sub: string }).sub;

/** Moves the agent's clock (libfaketime: test/helpers/faketime.ts). */
const advance = (n: Node, ms: number) => n.agent.advanceClock(ms);

describe('runtime events caused by API requests', { timeout: 120_000 }, () => {
  const agents: AgentProcess[] = [];
  after(async () => {
    await stopAll(agents);
  });

  it('50 refused token requests and 3 refused bearer tokens: one auth.failures event', async () => {
    const node = await startNode(vendor, { license_id: 'L-auth' }, { movableClock: true });
    agents.push(node.agent);
    const credential = await node.agent.client.post('/v1/credentials', {
      token: node.token,
      json: { scopes: ['urn:vendor:service:peers.read'] },
    });
    assert.equal(credential.status, 201, credential.text);
    const clientId = credential.body.client_id as string;
    const wrongSecret = `${'W'.repeat(40)}rng`;
    const statuses: number[] = [];
    for (let i = 0; i < 50; i++)
      statuses.push((await node.agent.client.tokenResponse(clientId, wrongSecret)).status);
    for (let i = 0; i < 3; i++) {
      const res = await node.agent.client.get('/v1/peers', { token: 'not.a.token' });
      assert.equal(res.status, 401);
    }
    // From the 11th failure within a minute the endpoint throttles (docs/decisions.md §4).
    assert.deepEqual(
      [statuses.filter((s) => s === 401).length, statuses.filter((s) => s === 429).length],
      [10, 40],
    );
    assert.deepEqual(await eventsOf(node, { type: 'auth.' }), [], 'nothing before the window ends');

    await advance(node, 61_000);
    const [event, ...more] = await eventually('one auth.failures event', async () => {
      const e = await eventsOf(node, { type: 'auth.' });
      return e.length > 0 ? e : undefined;
    });
    assert.deepEqual(more, []);
    const data = event!.data as {
      total: number;
      failures: { client_id: string | null; reason: string; count: number }[];
    };
    assert.equal(data.total, 53);
    const count = (reason: string) =>
      data.failures.filter((f) => f.reason === reason).reduce((n, f) => n + f.count, 0);
    assert.deepEqual([count('wrong_secret'), count('throttled'), count('invalid_token')], [10, 40, 3]);
    assert.ok(
      data.failures.filter((f) => f.reason !== 'invalid_token').every((f) => f.client_id === clientId),
    );
    assert.deepEqual(event!.actor, { client_id: null, agent: node.peerId });
    assert.ok(!JSON.stringify(event).includes(wrongSecret), 'the secret tried is never in the event');
    // Quiet since: no second event, however long.
    await advance(node, 600_000);
    await new Promise((r) => setTimeout(r, 2500));
    assert.equal((await eventsOf(node, { type: 'auth.' })).length, 1);
  });

  it('a write refused by a license limit: one license.limit_refused, no config event', async () => {
    const [a, b] = await startCluster(vendor, 2, { license_id: 'L-limit', max_nodes: 2, max_services: 1 });
    agents.push(a!.agent, b!.agent);
    const third = await bootstrapNode(await AgentProcess.start({ vendor, extraArgs: CLUSTER_ARGS }), vendor, {
      license_id: 'L-limit',
      max_nodes: 2,
      max_services: 1,
    });
    agents.push(third.agent);
    const created = await a!.agent.client.post('/v1/services', {
      token: a!.token,
      json: { source_peer_id: a!.peerId, target_peer_id: b!.peerId },
    });
    assert.equal(created.status, 201, created.text);
    const since = (await eventsOf(a!)).at(-1)!.seq;

    const refused = await a!.agent.client.post('/v1/services', {
      token: a!.token,
      json: { source_peer_id: b!.peerId, target_peer_id: a!.peerId },
    });
    assert.equal(refused.status, 422, refused.text);
    assert.equal(refused.body.code, 'SERVICE_LIMIT_EXCEEDED');
    const joined = await a!.agent.client.post('/v1/peers', {
      token: a!.token,
      json: { address: `127.0.0.1:${third.agent.port}` },
    });
    assert.equal(joined.status, 422, joined.text);
    assert.equal(joined.body.code, 'NODE_LIMIT_EXCEEDED');

    const after = (await eventsOf(a!, { since })).filter((e) => !e.type.startsWith('license.expiring'));
    assert.deepEqual(
      after.map((e) => [e.type, e.resource.id, e.data.limit, e.data.client_id]),
      [
        ['license.limit_refused', 'L-limit', 'max_services', clientOf(a!.token)],
        ['license.limit_refused', 'L-limit', 'max_nodes', clientOf(a!.token)],
      ],
    );
    assert.equal(after[0]!.data.code, 'SERVICE_LIMIT_EXCEEDED');
    assert.equal(after[0]!.data.route, '/v1/services');
    assert.deepEqual(after[0]!.actor, { client_id: null, agent: a!.peerId });
    // The agents the refusals touched record none: the join's handshake is agent-to-agent.
    for (const n of [b!, third]) assert.deepEqual(await eventsOf(n, { type: 'license.limit' }), []);
  });

  it('license.expiring at 30, 7 and 1 days and license.expired: each once, across a restart', async () => {
    const agent = await AgentProcess.start({ vendor, extraArgs: CLUSTER_ARGS, movableClock: true });
    agents.push(agent);
    const creds = await bootstrap(agent, vendor, {
      license_id: 'L-expiry',
      expires_at: new Date(Date.now() + 20 * DAY).toISOString(),
    });
    const node: Node = {
      agent,
      token: await agent.client.token(creds.clientId, creds.clientSecret),
      peerId: '',
    };
    const license = async () =>
      (await eventsOf(node, { type: 'license.' })).map((e: MeshEvent) => [
        e.type,
        e.data.threshold_days ?? null,
      ]);
    await eventually('the 30-day warning', async () => ((await license()).length === 1 ? true : undefined));
    assert.deepEqual(await license(), [['license.expiring', 30]]);

    await node.agent.stop();
    await node.agent.restart();
    await new Promise((r) => setTimeout(r, 1000));
    assert.deepEqual(await license(), [['license.expiring', 30]], 'not again after a restart');

    const expect: [string, number | null][] = [['license.expiring', 30]];
    for (const [days, next] of [
      [14, ['license.expiring', 7]],
      [5.5, ['license.expiring', 1]],
      [1, ['license.expired', null]],
    ] as const) {
      await advance(node, days * DAY);
      // Tokens expire as the clock moves: a fresh one for each step.
      node.token = await agent.client.token(creds.clientId, creds.clientSecret);
      expect.push([...next]);
      await eventually(
        `${next.join(' ')}`,
        async () => (JSON.stringify(await license()) === JSON.stringify(expect) ? true : undefined),
        10_000,
        license,
      );
    }
    await new Promise((r) => setTimeout(r, 6000));
    assert.deepEqual(await license(), expect);
  });
});
