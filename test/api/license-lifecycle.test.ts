/**
 * License lifecycle (docs/metrics.md, docs/decisions.md §7): with the agent's clock moved forward
 * (libfaketime: test/helpers/faketime.ts), /readyz stays 200 and adds a warning 30 days before
 * expiry and after it, the license gauges on /metrics follow the clock,
 * and an expired license stops nothing: the agent stays live and ready and keeps serving its API,
 * and in a two-agent cluster the peers, the services and replication carry on past expiry.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import {
  advanceClocks,
  agentNow,
  eventually,
  type Member,
  startCluster,
  stopAll,
  waitForConvergence,
} from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';

const DAY_MS = 86_400_000;

/** The value of one unlabelled sample of a Prometheus text answer, or undefined. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

describe('license lifecycle', { timeout: 60_000 }, () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  let creds: { clientId: string; clientSecret: string };
  /** Access tokens expire with the moved clock too: a fresh one is taken after each move. */
  let token: string;
  let expiresAt: number;
  const metrics = async () => {
    const res = await agent.client.get('/metrics', { token });
    assert.equal(res.status, 200, res.text);
    return res.text;
  };
  const advance = async (ms: number) => {
    await agent.advanceClock(ms);
    token = await agent.client.token(creds.clientId, creds.clientSecret);
  };

  before(async () => {
    agent = await AgentProcess.start({ vendor, movableClock: true });
    expiresAt = Date.now() + 40 * DAY_MS;
    creds = await bootstrap(agent, vendor, { expires_at: new Date(expiresAt).toISOString() });
    token = await agent.client.token(creds.clientId, creds.clientSecret);
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('before the 30-day window: /readyz 200 without warnings, gauges with the limits and usage', async () => {
    const ready = await agent.client.get('/readyz');
    assert.equal(ready.status, 200);
    assert.equal(ready.body.status, 'ok');
    assert.equal(ready.body.warnings, undefined);
    const text = await metrics();
    const left = sample(text, 'mesh_license_expiry_seconds');
    assert.ok(left !== undefined && Math.abs(left - (expiresAt - Date.now()) / 1000) < 60, String(left));
    assert.equal(sample(text, 'mesh_license_nodes_limit'), 5);
    assert.equal(sample(text, 'mesh_license_nodes_used'), 1);
    assert.equal(sample(text, 'mesh_license_services_limit'), 10);
    assert.equal(sample(text, 'mesh_license_services_used'), 0);
    assert.match(text, /# TYPE mesh_license_expiry_seconds gauge/);
  });

  it('inside the window: /readyz stays 200 and warns with the days left; the gauge follows the clock', async () => {
    await advance(15 * DAY_MS);
    const ready = await agent.client.get('/readyz');
    assert.equal(ready.status, 200, ready.text);
    assert.equal(ready.body.status, 'ok');
    assert.equal(ready.body.warnings.length, 1);
    assert.match(ready.body.warnings[0], /^license license-test expires at .* \(24 days left\)$/);
    const live = await agent.client.get('/livez');
    assert.equal(live.status, 200);
    assert.equal(live.body.warnings, undefined, '/livez carries no warnings');
    const left = sample(await metrics(), 'mesh_license_expiry_seconds');
    assert.ok(
      left !== undefined && Math.abs(left - (expiresAt - Date.now() - 15 * DAY_MS) / 1000) < 60,
      String(left),
    );
  });

  it('past expiry: still live and ready, warns expired, negative gauge, the API keeps serving', async () => {
    await advance(26 * DAY_MS);
    const ready = await agent.client.get('/readyz');
    assert.equal(ready.status, 200, ready.text);
    assert.equal(ready.body.status, 'ok');
    assert.deepEqual(ready.body.warnings, [
      `license license-test expired at ${new Date(expiresAt).toISOString()}: renew it`,
    ]);
    assert.equal((await agent.client.get('/livez')).status, 200);
    const text = await metrics();
    const left = sample(text, 'mesh_license_expiry_seconds');
    assert.ok(left !== undefined && left < 0 && left > (-2 * DAY_MS) / 1000, String(left));
    assert.equal(sample(text, 'mesh_license_nodes_used'), 1);
    const license = await agent.client.get('/v1/cluster/license', { token });
    assert.equal(license.status, 200, license.text);
    assert.equal(license.body.expired, true);
    assert.ok(license.body.days_to_expiry < 0);
    // Tokens are still issued after expiry (advance() took this one) and the API still answers.
    const peers = await agent.client.get('/v1/peers', { token });
    assert.equal(peers.status, 200, peers.text);
    assert.equal(peers.body.length, 1);
  });
});

describe('license expiry in a cluster', { timeout: 60_000 }, () => {
  const vendor = makeVendor();
  let members: Member[] = [];
  let expiresAt: number;

  before(async () => {
    // Expires two minutes from now; the clocks move three minutes, well inside the failure
    // detector's grace, so only the license changes state, not the peers' liveness.
    expiresAt = Date.now() + 120_000;
    members = await startCluster(vendor, 2, { expires_at: new Date(expiresAt).toISOString() }, undefined, {
      movableClock: true,
    });
  });
  after(async () => {
    await stopAll(members);
  });

  it('past expiry the peers stay active, the services stay as they were and gossip still replicates', async () => {
    const [a, b] = members as [Member, Member];
    const created = await a.agent.client.post('/v1/services', {
      token: a.token,
      json: { source_peer_id: a.peerId, target_peer_id: b.peerId },
    });
    assert.equal(created.status, 201, created.text);
    const before = await waitForConvergence(members);
    await advanceClocks(members, 180_000);
    for (const m of members) {
      assert.ok(agentNow(m) > expiresAt, 'the agent clock is past expiry');
      const ready = await m.agent.client.get('/readyz');
      assert.equal(ready.status, 200, ready.text);
      assert.match(ready.body.warnings[0], /expired at/);
      const text = (await m.agent.client.get('/metrics', { token: m.token })).text;
      assert.ok((sample(text, 'mesh_license_expiry_seconds') ?? 0) < 0);
      assert.equal(sample(text, 'mesh_license_nodes_used'), 2);
      assert.equal(sample(text, 'mesh_license_services_used'), 1);
    }
    // Same peers (all active), same services, same credential on both sides.
    assert.deepEqual(await waitForConvergence(members), before);
    // A write made after expiry still reaches the other agent.
    const updated = await b.agent.client.put(`/v1/services/${created.body.id}`, {
      token: b.token,
      json: { bandwidth_limit_mbps: 7 },
    });
    assert.equal(updated.status, 200, updated.text);
    await eventually('the update made after expiry replicated to A', async () => {
      const res = await a.agent.client.get(`/v1/services/${created.body.id}`, { token: a.token });
      return res.status === 200 && res.body.bandwidth_limit_mbps === 7 ? true : undefined;
    });
  });
});
