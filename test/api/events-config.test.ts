/**
 * Config events (docs/events.md), table-driven over every write route of ROUTE_SCOPES: each
 * successful write gives exactly one event on the agent that took it, with the right type, the
 * caller's client id and this agent as actor, and the changed fields before and after; a refused
 * write gives none. The table fails when a write route is missing from it. The same run checks
 * that no event holds a secret in any form, and that the agent's output holds none either.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ROUTE_SCOPES } from '../../src/api/route-scopes.js';
import { scope } from '../../src/domain/scopes.js';
import { AgentProcess } from '../helpers/agent-process.js';
import type { ApiResponse } from '../helpers/api-client.js';
import { makeVendor } from '../helpers/licenses.js';
import { bootstrapNode, type Node } from '../helpers/nodes.js';

/** Routes that are no API client's write: agent-to-agent. */
const NOT_CLIENT_WRITES = new Set([
  'POST /internal/v1/handshake/hello',
  'POST /internal/v1/handshake/confirm',
  'POST /internal/v1/gossip',
]);

/** An event as the API answers it (arbitrary JSON, as ApiResponse['body']). */
type Ev = ApiResponse['body'];

/** A year to run: no license.expiring event among the config events counted here. */
const LICENSE = {
  license_id: 'lic-events',
  expires_at: new Date(Date.now() + 365 * 86_400_000).toISOString(),
};

interface Ctx {
  a: Node;
  b: Node;
  clientId: string;
  serviceId?: string;
  routeId?: number;
  credentialId?: string;
  webhookId?: string;
}

interface Case {
  /** What the write does; the events it must give. */
  run: (c: Ctx) => Promise<ApiResponse>;
  status: number;
  /** null: changes no configuration, so no event. */
  type: string | null;
  /** Checks on the event's data, resource. */
  check?: (e: Ev, c: Ctx) => void;
  /** A refused form of the same write: no event. */
  refused?: (c: Ctx) => Promise<ApiResponse>;
}

const req = (c: Ctx, method: string, path: string, json?: unknown) =>
  c.a.agent.client.request(method, path, { token: c.a.token, ...(json === undefined ? {} : { json }) });

/** In the order run: each may use what an earlier one made. Bootstrap is checked on its own. */
const TABLE: Record<string, Case | 'bootstrap'> = {
  // Checked by its own test below: it is the first write of an agent.
  'POST /v1/bootstrap': 'bootstrap',
  'POST /v1/oauth/token': {
    run: (c) => c.a.agent.client.tokenResponse(c.clientId, [...c.a.agent.client.secretsSeen][0]!),
    status: 200,
    type: null,
  },
  'POST /v1/peers': {
    run: (c) => req(c, 'POST', '/v1/peers', { address: `127.0.0.1:${c.b.agent.port}` }),
    status: 201,
    type: 'peer.added',
    check: (e, c) => {
      assert.deepEqual(e.resource, { kind: 'peer', id: c.b.peerId });
      assert.equal(e.data.before, null);
      assert.equal(e.data.after.id, c.b.peerId);
      assert.equal(e.data.after.address, `127.0.0.1:${c.b.agent.port}`);
    },
    refused: (c) => req(c, 'POST', '/v1/peers', { address: 'not an address' }),
  },
  'PUT /v1/peers/:id': {
    run: (c) => req(c, 'PUT', `/v1/peers/${c.b.peerId}`, { name: 'bee' }),
    status: 200,
    type: 'peer.renamed',
    check: (e) => assert.deepEqual(e.data, { before: { name: 'test' }, after: { name: 'bee' } }),
    refused: (c) => req(c, 'PUT', '/v1/peers/no-such-peer', { name: 'x' }),
  },
  'POST /v1/services': {
    run: async (c) => {
      const r = await req(c, 'POST', '/v1/services', { target_peer_id: c.b.peerId, bandwidth_limit_mbps: 5 });
      c.serviceId = r.body.id;
      return r;
    },
    status: 201,
    type: 'service.created',
    check: (e, c) => {
      assert.deepEqual(e.resource, { kind: 'service', id: c.serviceId });
      assert.equal(e.data.before, null);
      assert.equal(e.data.after.bandwidth_limit_mbps, 5);
      assert.equal(e.data.after.target_peer_id, c.b.peerId);
    },
    refused: (c) => req(c, 'POST', '/v1/services', { target_peer_id: 'no-such-peer' }),
  },
  'PUT /v1/services/:id': {
    run: (c) => req(c, 'PUT', `/v1/services/${c.serviceId}`, { bandwidth_limit_mbps: 7 }),
    status: 200,
    type: 'service.updated',
    check: (e) =>
      assert.deepEqual(e.data, { before: { bandwidth_limit_mbps: 5 }, after: { bandwidth_limit_mbps: 7 } }),
    refused: (c) => req(c, 'PUT', `/v1/services/${c.serviceId}`, { transport_type: 'kcp' }),
  },
  'POST /v1/services/:service_id/routes': {
    run: async (c) => {
      const r = await req(c, 'POST', `/v1/services/${c.serviceId}/routes`, {
        routes: [{ priority: 10, dest_cidr: '10.1.0.0/16' }],
      });
      c.routeId = r.body.route_ids?.[0];
      return r;
    },
    status: 201,
    type: 'route.created',
    check: (e, c) => {
      assert.deepEqual(e.resource, { kind: 'route', id: String(c.routeId) });
      assert.equal(e.data.after.dest_cidr, '10.1.0.0/16');
      assert.equal(e.data.after.service_id, c.serviceId);
    },
    refused: (c) =>
      req(c, 'POST', `/v1/services/${c.serviceId}/routes`, { routes: [{ priority: 1, dest_cidr: 'nope' }] }),
  },
  'PUT /v1/services/:service_id/routes/:route_id': {
    run: (c) => req(c, 'PUT', `/v1/services/${c.serviceId}/routes/${c.routeId}`, { priority: 20 }),
    status: 200,
    type: 'route.updated',
    check: (e) => assert.deepEqual(e.data, { before: { priority: 10 }, after: { priority: 20 } }),
    refused: (c) => req(c, 'PUT', `/v1/services/${c.serviceId}/routes/12345`, { priority: 20 }),
  },
  'DELETE /v1/services/:service_id/routes/:route_id': {
    run: (c) => req(c, 'DELETE', `/v1/services/${c.serviceId}/routes/${c.routeId}`),
    status: 200,
    type: 'route.deleted',
    check: (e) => {
      assert.equal(e.data.after, null);
      assert.equal(e.data.before.priority, 20);
    },
    refused: (c) => req(c, 'DELETE', `/v1/services/${c.serviceId}/routes/12345`),
  },
  'DELETE /v1/services/:id': {
    run: (c) => req(c, 'DELETE', `/v1/services/${c.serviceId}`),
    status: 200,
    type: 'service.deleted',
    check: (e) => {
      assert.equal(e.data.after, null);
      assert.equal(e.data.before.bandwidth_limit_mbps, 7);
    },
    refused: (c) => req(c, 'DELETE', '/v1/services/no-such-service'),
  },
  'POST /v1/credentials': {
    run: async (c) => {
      const r = await req(c, 'POST', '/v1/credentials', { scopes: [scope('peers.read')] });
      c.credentialId = r.body.client_id;
      return r;
    },
    status: 201,
    type: 'credential.created',
    check: (e, c) => {
      assert.deepEqual(e.resource, { kind: 'credential', id: c.credentialId });
      assert.deepEqual(e.data.after.scopes, [scope('peers.read')]);
    },
    refused: (c) => req(c, 'POST', '/v1/credentials', { scopes: ['urn:vendor:service:nope'] }),
  },
  'DELETE /v1/credentials/:client_id': {
    run: (c) => req(c, 'DELETE', `/v1/credentials/${c.credentialId}`),
    status: 200,
    type: 'credential.revoked',
    check: (e, c) => {
      assert.equal(e.data.after, null);
      assert.equal(e.data.before.client_id, c.credentialId);
    },
    refused: (c) => req(c, 'DELETE', `/v1/credentials/${c.clientId}`),
  },
  'POST /v1/cluster/credentials/rotate': {
    run: (c) => req(c, 'POST', '/v1/cluster/credentials/rotate'),
    status: 200,
    type: 'cluster_credential.rotated',
    check: (e) => {
      assert.equal(e.resource.kind, 'cluster_credential');
      assert.equal(e.data.after.version, e.data.before.version + 1);
    },
  },
  'POST /v1/cluster/init': {
    run: (c) => req(c, 'POST', '/v1/cluster/init', { force: true }),
    status: 200,
    type: 'cluster.initialized',
    check: (e) => {
      assert.notEqual(e.data.after.cluster_id, e.data.before.cluster_id);
      assert.equal(e.resource.id, e.data.after.cluster_id);
    },
  },
  'POST /v1/webhooks': {
    run: async (c) => {
      const r = await req(c, 'POST', '/v1/webhooks', { url: 'http://127.0.0.1:9/hook', types: ['service.'] });
      c.webhookId = r.body.id;
      return r;
    },
    status: 201,
    type: 'webhook.created',
    check: (e, c) => {
      assert.deepEqual(e.resource, { kind: 'webhook', id: c.webhookId });
      assert.equal(e.data.after.url, 'http://127.0.0.1:9/hook');
    },
    refused: (c) => req(c, 'POST', '/v1/webhooks', { url: 'ftp://127.0.0.1/hook' }),
  },
  // A test delivery is sent outside the log.
  'POST /v1/webhooks/:id/test': {
    run: (c) => req(c, 'POST', `/v1/webhooks/${c.webhookId}/test`),
    status: 200,
    type: null,
  },
  'DELETE /v1/webhooks/:id': {
    run: (c) => req(c, 'DELETE', `/v1/webhooks/${c.webhookId}`),
    status: 200,
    type: 'webhook.deleted',
    check: (e) => assert.equal(e.data.after, null),
    refused: (c) => req(c, 'DELETE', '/v1/webhooks/no-such-webhook'),
  },
  // Sign-in codes for the web console, like tokens, change no configuration.
  'POST /v1/console/codes': { run: (c) => req(c, 'POST', '/v1/console/codes'), status: 201, type: null },
  'POST /v1/console/session': {
    run: async (c) => {
      const { code } = (await req(c, 'POST', '/v1/console/codes')).body as { code: string };
      return c.a.agent.client.request('POST', '/v1/console/session', { json: { code } });
    },
    status: 200,
    type: null,
  },
  // Reads only, a proposed change included: any answer records nothing.
  'POST /v1/explain': { run: (c) => req(c, 'POST', '/v1/explain', {}), status: 400, type: null },
  'POST /v1/cluster/sync': { run: (c) => req(c, 'POST', '/v1/cluster/sync'), status: 200, type: null },
  'DELETE /v1/peers/:id': {
    run: (c) => req(c, 'DELETE', `/v1/peers/${c.b.peerId}`),
    status: 200,
    type: 'peer.removed',
    check: (e, c) => {
      assert.equal(e.data.after, null);
      assert.equal(e.data.before.id, c.b.peerId);
      assert.equal(e.data.before.name, 'bee');
    },
    refused: (c) => req(c, 'DELETE', `/v1/peers/${c.a.peerId}`),
  },
  'DELETE /v1/peers/self': {
    run: (c) => req(c, 'DELETE', '/v1/peers/self'),
    status: 200,
    type: 'peer.left',
    check: (e, c) => {
      assert.deepEqual(e.resource, { kind: 'peer', id: c.a.peerId });
      assert.deepEqual(e.data.before.is_active, true);
      assert.deepEqual(e.data.after.is_active, false);
    },
  },
};

describe('config events for every write route', () => {
  const vendor = makeVendor();
  const agents: AgentProcess[] = [];
  let ctx: Ctx;

  const eventsAfter = async (since: number): Promise<Ev[]> => {
    const res = await ctx.a.agent.client.get(`/v1/events?since=${since}&limit=1000`, { token: ctx.a.token });
    assert.equal(res.status, 200, res.text);
    return res.body.events;
  };
  const lastSeq = async () =>
    (await ctx.a.agent.client.get('/v1/events?limit=1000', { token: ctx.a.token })).body.next as number;

  before(async () => {
    agents.push(await AgentProcess.start({ vendor }), await AgentProcess.start({ vendor }));
    const a = await bootstrapNode(agents[0]!, vendor, LICENSE);
    const b = await bootstrapNode(agents[1]!, vendor, LICENSE);
    const me = await a.agent.client.get('/v1/credentials', { token: a.token });
    ctx = { a, b, clientId: me.body[0].client_id };
  });
  after(async () => {
    for (const agent of agents) assert.equal(await agent.stop(), 0);
  });

  it('has a row for every write route of ROUTE_SCOPES, and only for those', () => {
    const writes = Object.keys(ROUTE_SCOPES).filter(
      (k) => !k.startsWith('GET ') && !NOT_CLIENT_WRITES.has(k),
    );
    assert.deepEqual(Object.keys(TABLE).sort(), writes.sort());
  });

  it('bootstrap gives agent.bootstrapped, by the agent, with no secret', async () => {
    const [e, ...rest] = await eventsAfter(0);
    assert.equal(rest.length, 0, JSON.stringify(rest));
    assert.equal(e!.type, 'agent.bootstrapped');
    assert.deepEqual(e!.actor, { client_id: null, agent: ctx.a.peerId });
    assert.equal(e!.data.after.client_id, ctx.clientId);
    assert.equal(e!.seq, 1);
    const again = await ctx.a.agent.client.post('/v1/bootstrap', { json: { license: vendor.sign({}) } });
    assert.equal(again.status, 409);
    assert.deepEqual(await eventsAfter(1), [], 'a refused bootstrap records nothing');
  });

  for (const [route, c] of Object.entries(TABLE)) {
    if (c === 'bootstrap') continue;
    it(`${route}: ${c.type ?? 'no event'}${c.refused ? '; refused: none' : ''}`, async () => {
      if (c.refused) {
        const since = await lastSeq();
        const res = await c.refused(ctx);
        assert.ok(res.status >= 400, `the refused form answered ${res.status}`);
        assert.deepEqual(await eventsAfter(since), [], 'a refused write records nothing');
      }
      const since = await lastSeq();
      const res = await c.run(ctx);
      assert.equal(res.status, c.status, res.text);
      const got = await eventsAfter(since);
      if (c.type === null) {
        assert.deepEqual(got, []);
        return;
      }
      assert.equal(got.length, 1, JSON.stringify(got));
      const e = got[0]!;
      assert.equal(e.type, c.type);
      assert.deepEqual(e.actor, { client_id: ctx.clientId, agent: ctx.a.peerId });
      assert.equal(e.seq, since + 1);
      assert.ok(Math.abs(Date.parse(e.time) - Date.now()) < 60_000, e.time);
      c.check?.(e, ctx);
    });
  }

  it('holds no secret in any event or log line, in any form', async () => {
    const all = JSON.stringify(await eventsAfter(0));
    const secrets = [...ctx.a.agent.client.secretsSeen, ...ctx.b.agent.client.secretsSeen];
    assert.ok(secrets.length >= 3, 'the run saw the bootstrap secret, a credential secret and a rotated one');
    for (const s of secrets) {
      assert.ok(!all.includes(s), 'an event holds a secret or token');
      assert.ok(!ctx.a.agent.logs.includes(s), 'a log line holds a secret or token');
    }
    // Hash forms: nothing that looks like a key or hash field.
    assert.doesNotMatch(all, /secret|"key"|hash/i);
  });
});
