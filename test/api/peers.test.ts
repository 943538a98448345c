/**
 * Peer edits and cluster init/sync over real HTTP (API document, Peers, Cluster, States;
 * docs/decisions.md §3, §5): the is_local filter, rename, removing a remote peer (its services go),
 * the local peer refused, leaving with DELETE /v1/peers/self (its services become inactive),
 * POST /v1/cluster/init with and without force, POST /v1/cluster/sync, and their 401/403 rows.
 * The handshake itself is tested in test/cluster/handshake.test.ts. Four agents joined into one
 * cluster; every call goes to the first, which leaves the cluster in the last test.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentProcess } from '../helpers/agent-process.js';
import { assertError, withoutLiveness } from '../helpers/api-assertions.js';
import { makeVendor } from '../helpers/licenses.js';
import { bootstrapNode, type Node, scopedToken } from '../helpers/nodes.js';

const LEFT_REASON =
  'this agent left the cluster (DELETE /v1/peers/self, final): it carries no traffic; to bring the host back, empty its data directory, bootstrap it and add it again';
const TIMESTAMP = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const PEER_FIELDS = ['address', 'created_at', 'id', 'is_local', 'name', 'public_key'];
const PEER_EXTRA_FIELDS = ['deactivated_at', 'is_active', 'version'];
const INIT_FIELDS = ['cluster_id', 'created_by', 'message', 'oldest_peer_id', 'was_created'];

function assertPeerShape(p: Record<string, unknown>): void {
  const fields = Object.keys(p);
  for (const f of [...PEER_FIELDS, ...PEER_EXTRA_FIELDS]) assert.ok(fields.includes(f), `peer has ${f}`);
  assert.match(p.created_at as string, TIMESTAMP);
  assert.ok(Number.isInteger(p.version));
  assert.equal(typeof p.is_active, 'boolean');
}

describe('peers and cluster API', () => {
  const vendor = makeVendor();
  let a: Node;
  let b: Node;
  let c: Node;
  let d: Node;
  let agents: AgentProcess[] = [];
  let peersRead: string;
  let peersWrite: string;
  /** Every scope except admin. */
  let allButAdmin: string;

  const api = () => a.agent.client;
  const getPeer = async (id: string) => {
    const res = await api().get(`/v1/peers/${id}`, { token: a.token });
    return res.status === 200 ? { ...res, body: withoutLiveness(res.body) } : res;
  };
  const peerIds = async (query = '') => {
    const res = await api().get(`/v1/peers${query}`, { token: a.token });
    assert.equal(res.status, 200, res.text);
    return (res.body as { id: string }[]).map((p) => p.id).sort();
  };
  const services = async () => {
    const res = await api().get('/v1/services', { token: a.token });
    assert.equal(res.status, 200, res.text);
    return res.body as { id: string; source_peer_id: string; target_peer_id: string; is_active: boolean }[];
  };
  const createService = async (source: Node, target: Node): Promise<string> => {
    const res = await api().post('/v1/services', {
      token: a.token,
      json: { source_peer_id: source.peerId, target_peer_id: target.peerId },
    });
    assert.equal(res.status, 201, res.text);
    return res.body.id as string;
  };

  before(async () => {
    agents = await Promise.all([0, 1, 2, 3].map(() => AgentProcess.start({ vendor })));
    const [first, ...others] = agents as [AgentProcess, AgentProcess, AgentProcess, AgentProcess];
    // The remote peers are bootstrapped first, so the local one is the youngest of the cluster.
    [b, c, d] = (await Promise.all(others.map((x) => bootstrapNode(x, vendor)))) as [Node, Node, Node];
    await new Promise((r) => setTimeout(r, 20));
    a = await bootstrapNode(first, vendor);
    for (const other of [b, c, d]) {
      const res = await api().post('/v1/peers', {
        token: a.token,
        json: { address: `127.0.0.1:${other.agent.port}` },
      });
      assert.equal(res.status, 201, res.text);
    }
    [peersRead, peersWrite, allButAdmin] = await Promise.all([
      scopedToken(a, 'peers.read'),
      scopedToken(a, 'peers.write'),
      scopedToken(
        a,
        'peers.read',
        'peers.write',
        'services.read',
        'services.write',
        'credentials.read',
        'credentials.write',
      ),
    ]);
  });

  after(async () => {
    for (const agent of agents) assert.equal(await agent.stop(), 0);
  });

  describe('GET /v1/peers', () => {
    it('filters by is_local: true gives the local peer only, false the remote ones', async () => {
      assert.deepEqual(await peerIds(), [a.peerId, b.peerId, c.peerId, d.peerId].sort());
      assert.deepEqual(await peerIds('?is_local=true'), [a.peerId]);
      assert.deepEqual(await peerIds('?is_local=false'), [b.peerId, c.peerId, d.peerId].sort());
      const all = (await api().get('/v1/peers', { token: a.token })).body as Record<string, unknown>[];
      for (const p of all) {
        assertPeerShape(p);
        assert.equal(p.is_local, p.id === a.peerId);
        assert.equal(p.is_active, true);
        assert.equal(p.deactivated_at, null);
      }
    });

    it('refuses an is_local filter that is not true or false: 400 INVALID_REQUEST', async () => {
      for (const value of ['maybe', 'yes', '2']) {
        assertError(
          await api().get(`/v1/peers?is_local=${value}`, { token: a.token }),
          400,
          'INVALID_REQUEST',
          value,
        );
      }
    });

    it('401 without a token, 403 without peers.read', async () => {
      assertError(await api().get('/v1/peers'), 401, 'UNAUTHORIZED', 'list');
      assertError(await api().get(`/v1/peers/${b.peerId}`), 401, 'UNAUTHORIZED', 'get');
      assertError(
        await api().get('/v1/peers', { token: peersWrite }),
        403,
        'FORBIDDEN',
        'list with peers.write',
      );
      assertError(await api().get(`/v1/peers/${b.peerId}`, { token: peersWrite }), 403, 'FORBIDDEN', 'get');
      assert.equal((await api().get('/v1/peers?is_local=true', { token: peersRead })).status, 200);
    });
  });

  describe('PUT /v1/peers/{id}', () => {
    it('renames a peer: only the name changes and version rises', async () => {
      const before = (await getPeer(b.peerId)).body;
      assert.equal(before.name, 'test', 'the name b was bootstrapped with, kept by the join');
      const res = await api().put(`/v1/peers/${b.peerId}`, {
        token: peersWrite,
        json: { name: 'branch office' },
      });
      assert.equal(res.status, 200, res.text);
      assertPeerShape(res.body);
      assert.deepEqual(withoutLiveness(res.body), {
        ...before,
        name: 'branch office',
        version: before.version + 1,
      });
      assert.deepEqual((await getPeer(b.peerId)).body, withoutLiveness(res.body), 'GET shows the new name');

      // The longest allowed name (255 characters, also as code points beyond ASCII), and back to empty.
      for (const name of ['n'.repeat(255), '€'.repeat(255), '😀'.repeat(255), '']) {
        const prev = (await getPeer(b.peerId)).body;
        const r = await api().put(`/v1/peers/${b.peerId}`, { token: a.token, json: { name } });
        assert.equal(r.status, 200, `${name.length}: ${r.text}`);
        assert.equal(r.body.name, name);
        assert.equal(r.body.version, prev.version + 1);
      }
    });

    it('an empty body or the same name changes nothing', async () => {
      const before = (await getPeer(c.peerId)).body;
      const empty = await api().put(`/v1/peers/${c.peerId}`, { token: a.token, json: {} });
      assert.equal(empty.status, 200, empty.text);
      assert.deepEqual(withoutLiveness(empty.body), before);
      const same = await api().put(`/v1/peers/${c.peerId}`, { token: a.token, json: { name: before.name } });
      assert.equal(same.status, 200, same.text);
      assert.deepEqual(withoutLiveness(same.body), before);
    });

    it('renames the local peer too; it stays local', async () => {
      const res = await api().put(`/v1/peers/${a.peerId}`, { token: a.token, json: { name: 'hq' } });
      assert.equal(res.status, 200, res.text);
      assert.equal(res.body.name, 'hq');
      assert.equal(res.body.is_local, true);
    });

    it('refuses a name over 255 characters or of the wrong type: 400 INVALID_REQUEST, nothing changes', async () => {
      const before = (await getPeer(b.peerId)).body;
      for (const [what, body] of [
        ['256 characters', { name: 'n'.repeat(256) }],
        ['256 code points', { name: '€'.repeat(256) }],
        ['a number', { name: 5 }],
        ['null', { name: null }],
        ['a JSON array', ['x']],
      ] as [string, unknown][]) {
        assertError(
          await api().put(`/v1/peers/${b.peerId}`, { token: a.token, json: body }),
          400,
          'INVALID_REQUEST',
          what,
        );
      }
      assert.deepEqual((await getPeer(b.peerId)).body, before);
    });

    it('an unknown peer: 404 NOT_FOUND (after body validation: a bad body is 400)', async () => {
      assertError(await getPeer('no-such-peer'), 404, 'NOT_FOUND', 'GET');
      assertError(
        await api().put('/v1/peers/no-such-peer', { token: a.token, json: { name: 'x' } }),
        404,
        'NOT_FOUND',
        'PUT',
      );
      assertError(
        await api().put('/v1/peers/no-such-peer', { token: a.token, json: { name: 'n'.repeat(256) } }),
        400,
        'INVALID_REQUEST',
        'PUT with a bad body',
      );
    });

    it('401 without a token, 403 without peers.write', async () => {
      const before = (await getPeer(b.peerId)).body;
      assertError(
        await api().put(`/v1/peers/${b.peerId}`, { json: { name: 'x' } }),
        401,
        'UNAUTHORIZED',
        'no token',
      );
      assertError(
        await api().put(`/v1/peers/${b.peerId}`, { token: peersRead, json: { name: 'x' } }),
        403,
        'FORBIDDEN',
        'peers.read',
      );
      assertError(
        await api().put('/v1/peers/no-such-peer', { token: peersRead, json: { name: 'n'.repeat(256) } }),
        403,
        'FORBIDDEN',
        'peers.read, bad body, unknown peer',
      );
      assert.deepEqual((await getPeer(b.peerId)).body, before);
    });
  });

  describe('POST /v1/cluster/init and /v1/cluster/sync', () => {
    const init = (json?: unknown, token = a.token) =>
      api().post('/v1/cluster/init', json === undefined ? { token } : { token, json });
    const clusterId = async () => (await api().get('/v1/cluster/identity')).body.cluster_id as string;

    it('without force: the existing cluster, was_created false, nothing changes', async () => {
      const current = await clusterId();
      const peers = await peerIds();
      for (const body of [{}, { force: false }]) {
        const res = await init(body);
        assert.equal(res.status, 200, `${JSON.stringify(body)}: ${res.text}`);
        assert.deepEqual(Object.keys(res.body).sort(), INIT_FIELDS);
        assert.equal(res.body.cluster_id, current);
        assert.equal(res.body.was_created, false);
        assert.ok(peers.includes(res.body.created_by), 'created_by is a peer of the cluster');
        assert.ok(peers.includes(res.body.oldest_peer_id), 'oldest_peer_id is a peer of the cluster');
        assert.equal(typeof res.body.message, 'string');
        assert.ok(res.body.message.length > 0);
      }
      assert.equal(await clusterId(), current);
    });

    it("reports the cluster's oldest peer, and each peer's own created_at, the same on every agent", async () => {
      for (const remote of [b, c, d]) {
        const own = await remote.agent.client.get(`/v1/peers/${remote.peerId}`, { token: remote.token });
        const seenByA = await getPeer(remote.peerId);
        assert.equal(seenByA.body.created_at, own.body.created_at, 'created_at of a remote peer');
      }
      const res = await init({});
      assert.notEqual(res.body.oldest_peer_id, a.peerId, 'the local peer was bootstrapped last');
    });

    it('without a body: the same as force false', async () => {
      const current = await clusterId();
      const res = await init(undefined);
      assert.equal(res.status, 200, res.text);
      assert.equal(res.body.cluster_id, current);
      assert.equal(res.body.was_created, false);
    });

    it('with force: a new cluster id created by the local peer, shown by /v1/cluster/identity', async () => {
      const old = await clusterId();
      const res = await init({ force: true });
      assert.equal(res.status, 200, res.text);
      assert.deepEqual(Object.keys(res.body).sort(), INIT_FIELDS);
      assert.equal(res.body.was_created, true);
      assert.notEqual(res.body.cluster_id, old);
      assert.equal(typeof res.body.cluster_id, 'string');
      assert.ok(res.body.cluster_id.length > 0);
      assert.equal(res.body.created_by, a.peerId);
      assert.equal(await clusterId(), res.body.cluster_id);
      // Asked again without force: that new cluster, not created again.
      const again = await init({});
      assert.equal(again.body.cluster_id, res.body.cluster_id);
      assert.equal(again.body.was_created, false);
      assert.equal(again.body.created_by, a.peerId);
      assert.equal(again.body.oldest_peer_id, res.body.oldest_peer_id);
      // Each force makes another id.
      const third = await init({ force: true });
      assert.notEqual(third.body.cluster_id, res.body.cluster_id);
      assert.equal(await clusterId(), third.body.cluster_id);
    });

    it('refuses a force that is not a boolean: 400 INVALID_REQUEST, nothing changes', async () => {
      const current = await clusterId();
      for (const force of ['true', 1, null]) {
        assertError(await init({ force }), 400, 'INVALID_REQUEST', JSON.stringify(force));
      }
      assertError(await init([true]), 400, 'INVALID_REQUEST', 'array body');
      assert.equal(await clusterId(), current);
    });

    it('sync: {triggered: true}', async () => {
      const res = await api().post('/v1/cluster/sync', { token: a.token });
      assert.equal(res.status, 200, res.text);
      assert.deepEqual(res.body, { triggered: true });
      const withBody = await api().post('/v1/cluster/sync', { token: a.token, json: {} });
      assert.equal(withBody.status, 200, withBody.text);
      assert.deepEqual(withBody.body, { triggered: true });
    });

    it('init and sync: 401 without a token, 403 for every scope but admin', async () => {
      const current = await clusterId();
      for (const [what, token] of [
        ['no token', undefined],
        ['bad token', 'garbage'],
      ] as const) {
        const o = token === undefined ? {} : { token };
        assertError(
          await api().post('/v1/cluster/init', { ...o, json: { force: true } }),
          401,
          'UNAUTHORIZED',
          `init ${what}`,
        );
        assertError(
          await api().post('/v1/cluster/init', { ...o, json: { force: 'x' } }),
          401,
          'UNAUTHORIZED',
          `bad init ${what}`,
        );
        assertError(await api().post('/v1/cluster/sync', o), 401, 'UNAUTHORIZED', `sync ${what}`);
      }
      for (const [what, token] of [
        ['peers.write', peersWrite],
        ['all scopes but admin', allButAdmin],
      ] as const) {
        assertError(await init({ force: true }, token), 403, 'FORBIDDEN', `init ${what}`);
        assertError(await init({ force: 'x' }, token), 403, 'FORBIDDEN', `bad init ${what}`);
        assertError(await api().post('/v1/cluster/sync', { token }), 403, 'FORBIDDEN', `sync ${what}`);
      }
      assert.equal(await clusterId(), current);
    });
  });

  describe('DELETE /v1/peers/{id}', () => {
    it('refuses the local peer: 422 CANNOT_DELETE_LOCAL, it stays', async () => {
      const res = await api().delete(`/v1/peers/${a.peerId}`, { token: peersWrite });
      assertError(res, 422, 'CANNOT_DELETE_LOCAL');
      assert.ok((await peerIds()).includes(a.peerId));
      assert.equal((await getPeer(a.peerId)).body.is_active, true);
    });

    it('an unknown peer: 404 NOT_FOUND', async () => {
      assertError(await api().delete('/v1/peers/no-such-peer', { token: a.token }), 404, 'NOT_FOUND');
    });

    it('401 without a token, 403 without peers.write; nothing removed', async () => {
      assertError(await api().delete(`/v1/peers/${b.peerId}`), 401, 'UNAUTHORIZED', 'no token');
      assertError(
        await api().delete(`/v1/peers/${b.peerId}`, { token: peersRead }),
        403,
        'FORBIDDEN',
        'peers.read',
      );
      assertError(
        await api().delete('/v1/peers/no-such-peer', { token: peersRead }),
        403,
        'FORBIDDEN',
        'unknown, peers.read',
      );
      assertError(
        await api().delete(`/v1/peers/${a.peerId}`, { token: peersRead }),
        403,
        'FORBIDDEN',
        'local, peers.read',
      );
      assert.equal((await peerIds()).length, 4);
    });

    it('removes a remote peer: {deleted: true}; the services that involve it are deleted, others stay', async () => {
      const aToB = await createService(a, b);
      const bToC = await createService(b, c);
      const cToB = await createService(c, b);
      const aToC = await createService(a, c);
      const cToD = await createService(c, d);
      const routes = await api().post(`/v1/services/${aToB}/routes`, {
        token: a.token,
        json: { routes: [{ priority: 1, dest_cidr: '10.0.0.0/8' }] },
      });
      assert.equal(routes.status, 201, routes.text);

      const res = await api().delete(`/v1/peers/${b.peerId}`, { token: peersWrite });
      assert.equal(res.status, 200, res.text);
      assert.deepEqual(res.body, { deleted: true });
      assertError(await getPeer(b.peerId), 404, 'NOT_FOUND', 'GET removed peer');
      assert.deepEqual(await peerIds(), [a.peerId, c.peerId, d.peerId].sort());
      const left = (await services()).map((s) => s.id).sort();
      assert.deepEqual(left, [aToC, cToD].sort());
      for (const gone of [aToB, bToC, cToB]) {
        assertError(await api().get(`/v1/services/${gone}`, { token: a.token }), 404, 'NOT_FOUND', 'service');
      }
      assertError(
        await api().get(`/v1/services/${aToB}/routes`, { token: a.token }),
        404,
        'NOT_FOUND',
        'routes',
      );
      // The removed agent is told (one signed push of its tombstone) and says so on /readyz.
      const deadline = Date.now() + 10_000;
      let ready = await b.agent.client.get('/readyz');
      while (ready.status === 200 && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 100));
        ready = await b.agent.client.get('/readyz');
      }
      assert.equal(ready.status, 503, ready.text);
      assert.deepEqual(ready.body.reasons, ['another agent removed this one from the cluster']);
      // Removed once: now unknown.
      assertError(await api().delete(`/v1/peers/${b.peerId}`, { token: a.token }), 404, 'NOT_FOUND', 'again');
      assertError(
        await api().put(`/v1/peers/${b.peerId}`, { token: a.token, json: { name: 'x' } }),
        404,
        'NOT_FOUND',
        'rename removed',
      );
      // A service can no longer name it.
      assertError(
        await api().post('/v1/services', { token: a.token, json: { target_peer_id: b.peerId } }),
        404,
        'NOT_FOUND',
        'service to the removed peer',
      );
    });
  });

  describe('DELETE /v1/peers/self', () => {
    it('401 without a token, 403 for peers.write and every other scope but admin; nothing changes', async () => {
      assertError(await api().delete('/v1/peers/self'), 401, 'UNAUTHORIZED', 'no token');
      assertError(
        await api().delete('/v1/peers/self', { token: 'garbage' }),
        401,
        'UNAUTHORIZED',
        'bad token',
      );
      assertError(
        await api().delete('/v1/peers/self', { token: peersWrite }),
        403,
        'FORBIDDEN',
        'peers.write',
      );
      assertError(
        await api().delete('/v1/peers/self', { token: allButAdmin }),
        403,
        'FORBIDDEN',
        'all but admin',
      );
      const self = (await getPeer(a.peerId)).body;
      assert.equal(self.is_active, true);
      assert.equal(self.deactivated_at, null);
    });

    it('leaves: {peer_id, version raised, is_active false, deactivated_at}; its services become inactive', async () => {
      const before = (await getPeer(a.peerId)).body;
      const involving = await services();
      assert.ok(
        involving.every((s) => s.is_active),
        'all services active before',
      );
      const cToA = await createService(c, a);

      const t0 = Date.now();
      const res = await api().delete('/v1/peers/self', { token: a.token });
      assert.equal(res.status, 200, res.text);
      assert.deepEqual(Object.keys(res.body).sort(), ['deactivated_at', 'is_active', 'peer_id', 'version']);
      assert.equal(res.body.peer_id, a.peerId);
      assert.ok(Number.isInteger(res.body.version), 'version is an integer');
      assert.ok(res.body.version > before.version, 'version raised');
      assert.equal(res.body.is_active, false);
      assert.match(res.body.deactivated_at, TIMESTAMP);
      const at = Date.parse(res.body.deactivated_at);
      assert.ok(at >= t0 - 1000 && at <= Date.now() + 1000, 'deactivated_at is now');

      // The peer record says the same.
      const self = (await getPeer(a.peerId)).body;
      assert.equal(self.is_active, false);
      assert.equal(self.deactivated_at, res.body.deactivated_at);
      assert.equal(self.version, res.body.version);
      assert.equal(self.is_local, true);
      // It keeps serving its API (reads), but is no longer ready: leaving is final.
      const ready = await a.agent.client.get('/readyz');
      assert.equal(ready.status, 503, ready.text);
      assert.deepEqual(ready.body.reasons, [LEFT_REASON]);

      // Services that involve this peer are inactive (list and single form); the others are not.
      const after = await services();
      assert.equal(after.length, 3);
      for (const s of after) {
        const involvesA = s.source_peer_id === a.peerId || s.target_peer_id === a.peerId;
        assert.equal(s.is_active, !involvesA, `${s.source_peer_id} → ${s.target_peer_id}`);
        const single = await api().get(`/v1/services/${s.id}`, { token: a.token });
        assert.equal(single.body.is_active, !involvesA);
      }
      assert.equal(after.find((s) => s.id === cToA)?.is_active, false);
      assert.ok(
        after.some((s) => s.source_peer_id === c.peerId && s.target_peer_id === d.peerId && s.is_active),
      );

      // Final: asking again answers the same and changes nothing.
      const again = await api().delete('/v1/peers/self', { token: a.token });
      assert.equal(again.status, 200, again.text);
      assert.deepEqual(again.body, res.body);
    });
  });
});
