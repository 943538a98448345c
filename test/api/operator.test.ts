/**
 * The extensions of docs/decisions.md §7 an operator reads: /metrics (Prometheus text, any *.read scope
 * or admin, public with --metrics-public), /v1/cluster/license (usage and days to expiry, admin),
 * and /docs (the API reference rendered from the OpenAPI document, assets served locally).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentProcess } from '../helpers/agent-process.js';
import { assertError } from '../helpers/api-assertions.js';
import { makeVendor } from '../helpers/licenses.js';
import { bootstrapNode, type Node, scopedToken } from '../helpers/nodes.js';

/** The value of one sample line of a Prometheus text answer, or undefined. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

describe('operator extensions', () => {
  const vendor = makeVendor();
  let node: Node;
  let creds: { clientId: string; clientSecret: string };
  before(async () => {
    const agent = await AgentProcess.start({ vendor });
    node = await bootstrapNode(agent, vendor, {
      expires_at: new Date(Date.now() + 30.5 * 86_400_000).toISOString(),
    });
    const list = await agent.client.get('/v1/credentials', { token: node.token });
    creds = { clientId: list.body[0].client_id, clientSecret: '' };
  });
  after(async () => {
    assert.equal(await node.agent.stop(), 0);
  });

  it('/metrics needs a token with a read scope: 401 without, 403 with write scopes only', async () => {
    assertError(await node.agent.client.get('/metrics'), 401, 'UNAUTHORIZED');
    const writeOnly = await scopedToken(node, 'services.write', 'credentials.write');
    assertError(await node.agent.client.get('/metrics', { token: writeOnly }), 403, 'FORBIDDEN');
    const read = await scopedToken(node, 'peers.read');
    const res = await node.agent.client.get('/metrics', { token: read });
    assert.equal(res.status, 200);
    assert.match(String(res.headers['content-type']), /^text\/plain/);
  });

  it('/metrics counts requests by route pattern and status, never by raw path', async () => {
    const peerId = node.peerId;
    await node.agent.client.get(`/v1/peers/${peerId}`, { token: node.token });
    await node.agent.client.get('/v1/peers/no-such-peer', { token: node.token });
    const text = (await node.agent.client.get('/metrics', { token: node.token })).text;
    const ok = sample(text, 'mesh_http_requests_total{method="GET",route="/v1/peers/:id",status="200"}');
    const missing = sample(text, 'mesh_http_requests_total{method="GET",route="/v1/peers/:id",status="404"}');
    assert.ok(ok !== undefined && ok >= 1, text.slice(0, 500));
    assert.ok(missing !== undefined && missing >= 1);
    assert.ok(!text.includes(peerId), 'no peer id in any label');
    assert.match(
      text,
      /mesh_http_request_duration_seconds_bucket\{le="0.005",method="GET",route="\/v1\/peers\/:id"\}/,
    );
  });

  it('/metrics counts issued tokens and refused token requests by OAuth error', async () => {
    const before = (await node.agent.client.get('/metrics', { token: node.token })).text;
    const issued0 = sample(before, 'mesh_oauth_tokens_issued_total') ?? 0;
    const failed0 = sample(before, 'mesh_oauth_token_failures_total{error="invalid_client"}') ?? 0;
    await scopedToken(node, 'peers.read');
    const wrong = await node.agent.client
      .withLocalAddress('127.0.0.9')
      .tokenResponse(creds.clientId, 'a-wrong-secret-for-the-metrics-test');
    assert.equal(wrong.status, 401);
    const after = (await node.agent.client.get('/metrics', { token: node.token })).text;
    assert.equal(sample(after, 'mesh_oauth_tokens_issued_total'), issued0 + 1);
    assert.equal(sample(after, 'mesh_oauth_token_failures_total{error="invalid_client"}'), failed0 + 1);
  });

  it('/v1/cluster/license reports the license, usage against the limits and the days to expiry', async () => {
    const res = await node.agent.client.get('/v1/cluster/license', { token: node.token });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.license_id, 'license-test');
    assert.equal(res.body.max_nodes, 5);
    assert.equal(res.body.max_services, 10);
    assert.equal(res.body.nodes_used, 1);
    assert.equal(res.body.services_used, 0);
    assert.equal(res.body.days_to_expiry, 30);
    assert.equal(res.body.expired, false);
    const notAdmin = await scopedToken(node, 'peers.read', 'services.read', 'credentials.read');
    assertError(await node.agent.client.get('/v1/cluster/license', { token: notAdmin }), 403, 'FORBIDDEN');
  });

  it('/docs renders the API reference from local assets, without a token and without a CDN', async () => {
    const html = await node.agent.client.raw('GET', '/docs/');
    assert.equal(html.status, 200, html.text.slice(0, 200));
    assert.match(html.text, /swagger-ui/i);
    assert.doesNotMatch(html.text, /(src|href)="https?:\/\//, 'no asset from another host');
    const assets = [...html.text.matchAll(/(?:src|href)="([^"]+\.(?:js|css))"/g)].map((m) => m[1]!);
    assert.ok(assets.length >= 2, `scripts and styles referenced: ${assets.join(', ')}`);
    for (const asset of assets) {
      const url = new URL(asset, 'http://agent/docs/').pathname;
      const res = await node.agent.client.raw('GET', url);
      assert.equal(res.status, 200, `${url} served`);
    }
  });
});

describe('--metrics-public', () => {
  it('serves /metrics without a token', async () => {
    const vendor = makeVendor();
    const agent = await AgentProcess.start({ vendor, extraArgs: ['--metrics-public'] });
    try {
      const res = await agent.client.get('/metrics');
      assert.equal(res.status, 200);
      assert.match(res.text, /mesh_process_cpu_seconds_total/);
    } finally {
      assert.equal(await agent.stop(), 0);
    }
  });
});
