/**
 * GET and POST /v1/explain over real HTTP between three real agents (docs/decisions.md §7,
 * docs/operator-guide.md "Troubleshooting"): the ranking with its reasons, the winner, nothing
 * selecting with the closest route, a proposed change (`with`) that writes nothing, another
 * agent asked over the gossip channel (its answer, not ours), 404 for an unknown peer, 400 for
 * invalid addresses and the rest, the scopes, and `mesh-agent explain` printing the table and the
 * verdict. The agents run without a data plane: explain ranks from the configuration alone.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { assertError } from '../helpers/api-assertions.js';
import { runCli } from '../helpers/cli.js';
import { startCluster, stopAll } from '../helpers/cluster.js';
import { makeVendor } from '../helpers/licenses.js';
import { type Node, scopedToken } from '../helpers/nodes.js';

const LICENSE = { license_id: 'license-explain', max_nodes: 5, max_services: 10 };

describe('explain API', { timeout: 120_000 }, () => {
  const vendor = makeVendor();
  let nodes: Node[] = [];
  let a: Node;
  let b: Node;
  let c: Node;
  let s1 = ''; // A -> B
  let s2 = ''; // A -> C
  let s3 = ''; // B -> C
  const routeIds: Record<string, number> = {};

  const explainAt = (node: Node, query: Record<string, string>, token = node.token) =>
    node.agent.client.get(`/v1/explain?${new URLSearchParams(query)}`, { token });
  const addRoute = async (node: Node, service: string, name: string, route: Record<string, unknown>) => {
    const res = await node.agent.client.post(`/v1/services/${service}/routes`, {
      token: node.token,
      json: { routes: [route] },
    });
    assert.equal(res.status, 201, res.text);
    routeIds[name] = res.body.route_ids[0];
  };
  const createService = async (node: Node, json: Record<string, unknown>) => {
    const res = await node.agent.client.post('/v1/services', { token: node.token, json });
    assert.equal(res.status, 201, res.text);
    return res.body.id as string;
  };

  before(async () => {
    nodes = await startCluster(vendor, 3, LICENSE);
    [a, b, c] = nodes as [Node, Node, Node];
    s1 = await createService(a, { target_peer_id: b.peerId });
    s2 = await createService(a, { target_peer_id: c.peerId, bandwidth_limit_mbps: 50 });
    s3 = await createService(b, { target_peer_id: c.peerId });
    await addRoute(a, s1, 'wide', { priority: 10, dest_cidr: '10.92.0.0/16' });
    await addRoute(a, s2, 'narrow', { priority: 10, dest_cidr: '10.92.5.0/24' });
    await addRoute(a, s1, 'low', { priority: 1, source_cidr: '10.91.7.0/24', dest_cidr: '10.92.0.0/16' });
    await addRoute(b, s3, 'b', { priority: 5, dest_cidr: '172.16.0.0/12' });
    // Every agent holds every route before anyone is asked.
    for (const n of nodes) {
      for (;;) {
        const res = await n.agent.client.get(`/v1/services/${s3}/routes`, { token: n.token });
        const res1 = await n.agent.client.get(`/v1/services/${s1}/routes`, { token: n.token });
        if (res.status === 200 && res.body.length === 1 && res1.status === 200 && res1.body.length === 2)
          break;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  });

  after(async () => {
    await stopAll(nodes.map((n) => n.agent));
  });

  it('ranks the routes that select the packet, each with why it won or lost', async () => {
    const res = await explainAt(a, {
      source: '10.91.1.2',
      destination: '10.92.5.9',
      protocol: 'tcp',
      port: '443',
    });
    assert.equal(res.status, 200, res.text);
    const e = res.body;
    assert.equal(e.agent, a.peerId);
    assert.equal(e.dataplane, false);
    assert.deepEqual(e.packet, { source: '10.91.1.2', destination: '10.92.5.9', protocol: 'tcp', port: 443 });
    assert.deepEqual(
      e.ranking.map((r: { route_id: number; outcome: string; decided_by: string }) => [
        r.route_id,
        r.outcome,
        r.decided_by,
      ]),
      [
        [routeIds.narrow, 'wins', 'dest_prefix'],
        [routeIds.wide, 'loses', 'dest_prefix'],
      ],
    );
    assert.match(e.ranking[1].reason, /destination 10\.92\.5\.0\/24 is more specific than 10\.92\.0\.0\/16/);
    assert.equal(e.winner.service_id, s2);
    assert.equal(e.winner.target_peer_id, c.peerId);
    assert.equal(e.winner.exit_mode, 'nat');
    assert.equal(e.winner.bandwidth_limit_mbps, 50);
    assert.equal(e.winner.health, null);
    assert.match(
      e.verdict,
      new RegExp(`service ${s2} by route ${routeIds.narrow}, to peer ${c.peerId} over tcp`),
    );

    // From the source the low-priority-number route names, it wins over both.
    const low = await explainAt(a, { source: '10.91.7.1', destination: '10.92.5.9' });
    assert.equal(low.body.ranking[0].route_id, routeIds.low);
    assert.equal(low.body.ranking[1].decided_by, 'priority');
    assert.equal(low.body.ranking.length, 3);
  });

  it('nothing selects it: says so and names the closest route and why', async () => {
    const res = await explainAt(a, { source: '10.91.1.2', destination: '172.20.1.1' });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.selected, false);
    assert.deepEqual(res.body.ranking, []);
    assert.equal(res.body.closest.route_id, routeIds.b);
    assert.match(res.body.closest.why[0], new RegExp(`ingress is peer ${b.peerId}`));
    assert.match(res.body.verdict, /no route selects it at this agent/);
  });

  it('asked for another peer, the answer comes from that peer', async () => {
    const res = await explainAt(a, { source: '10.91.1.2', destination: '172.20.1.1', peer: b.peerId });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.agent, b.peerId);
    assert.equal(res.body.winner.service_id, s3);
    assert.equal(res.body.winner.route_id, routeIds.b);
    // Asking this agent by its own id is asking it.
    const self = await explainAt(a, { source: '10.91.1.2', destination: '172.20.1.1', peer: a.peerId });
    assert.equal(self.body.agent, a.peerId);
    assert.equal(self.body.selected, false);
  });

  it('an unknown peer is 404 NOT_FOUND; invalid addresses and the rest are 400 INVALID_REQUEST', async () => {
    assertError(
      await explainAt(a, { source: '10.91.1.2', destination: '10.92.0.1', peer: 'f'.repeat(32) }),
      404,
      'NOT_FOUND',
    );
    const bad: Record<string, string>[] = [
      { source: '10.91.1.256', destination: '10.92.0.1' },
      { source: '10.91.1.2', destination: 'example.com' },
      { source: '10.91.1.2/24', destination: '10.92.0.1' },
      { source: '10.91.1.2', destination: 'fd00::1' },
      { destination: '10.92.0.1' },
      { source: '10.91.1.2', destination: '10.92.0.1', protocol: 'sctp' },
      { source: '10.91.1.2', destination: '10.92.0.1', protocol: 'tcp', port: '70000' },
      { source: '10.91.1.2', destination: '10.92.0.1', protocol: 'icmp', port: '80' },
      { source: '10.91.1.2', destination: '10.92.0.1', port: 'x' },
    ];
    for (const query of bad) {
      assertError(await explainAt(a, query), 400, 'INVALID_REQUEST', JSON.stringify(query));
      // The same refusal when asked of another peer: checked here before anything is sent.
      assertError(
        await explainAt(a, { ...query, peer: b.peerId }),
        400,
        'INVALID_REQUEST',
        JSON.stringify(query),
      );
    }
  });

  it('with a proposed change: answers as if applied, writes nothing, refuses what a write would', async () => {
    const before = await a.agent.client.get(`/v1/services/${s1}/routes`, { token: a.token });
    const res = await a.agent.client.post('/v1/explain', {
      token: a.token,
      json: {
        source: '10.91.1.2',
        destination: '10.92.5.9',
        with: {
          routes: [{ service_id: s1, priority: 0, dest_cidr: '10.92.5.0/24' }],
          remove_routes: [routeIds.narrow],
        },
      },
    });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.proposed, true);
    assert.deepEqual(
      res.body.ranking.map((r: { route_id: number | null; proposed: boolean }) => [r.route_id, r.proposed]),
      [
        [null, true],
        [routeIds.wide, false],
      ],
    );
    const afterwards = await a.agent.client.get(`/v1/services/${s1}/routes`, { token: a.token });
    assert.deepEqual(afterwards.body, before.body);
    const narrow = await a.agent.client.get(`/v1/services/${s2}/routes`, { token: a.token });
    assert.equal(narrow.body.length, 1);

    // Asked of another peer, the proposal travels with the question.
    const atB = await a.agent.client.post('/v1/explain', {
      token: a.token,
      json: {
        source: '10.91.1.2',
        destination: '172.20.1.1',
        peer: b.peerId,
        with: { routes: [{ route_id: routeIds.b, dest_cidr: '192.168.0.0/16' }] },
      },
    });
    assert.equal(atB.status, 200, atB.text);
    assert.equal(atB.body.agent, b.peerId);
    assert.equal(atB.body.selected, false);

    const refusals: [unknown, number, string][] = [
      [{ routes: [{ service_id: s1, priority: 1, dest_cidr: '10.92.5.1/24' }] }, 400, 'INVALID_CIDR'],
      [{ routes: [{ service_id: s1, dest_cidr: '10.92.5.0/24' }] }, 400, 'INVALID_REQUEST'],
      [
        {
          routes: [
            { service_id: '00000000-0000-4000-8000-000000000000', priority: 1, dest_cidr: '10.0.0.0/8' },
          ],
        },
        404,
        'NOT_FOUND',
      ],
      [{ remove_routes: [12345] }, 404, 'NOT_FOUND'],
      [{ service: { target_peer_id: b.peerId } }, 409, 'ALREADY_EXISTS'],
      [{ routes: 'all' }, 400, 'INVALID_REQUEST'],
    ];
    for (const [proposal, status, code] of refusals) {
      const r = await a.agent.client.post('/v1/explain', {
        token: a.token,
        json: { source: '10.91.1.2', destination: '10.92.5.9', with: proposal },
      });
      assertError(r, status, code, JSON.stringify(proposal));
    }
    // The peer's refusal comes back as its own.
    const remote = await a.agent.client.post('/v1/explain', {
      token: a.token,
      json: {
        source: '10.91.1.2',
        destination: '10.92.5.9',
        peer: b.peerId,
        with: { remove_routes: [12345] },
      },
    });
    assertError(remote, 404, 'NOT_FOUND');
    assert.match(remote.body.error, new RegExp(`peer ${b.peerId}`));
  });

  it('needs services.read: another scope is 403, no token 401', async () => {
    const read = await scopedToken(a, 'services.read');
    assert.equal((await explainAt(a, { source: '10.91.1.2', destination: '10.92.5.9' }, read)).status, 200);
    const peersOnly = await scopedToken(a, 'peers.read');
    assertError(
      await explainAt(a, { source: '10.91.1.2', destination: '10.92.5.9' }, peersOnly),
      403,
      'FORBIDDEN',
    );
    const none = await a.agent.client.get('/v1/explain?source=10.91.1.2&destination=10.92.5.9');
    assertError(none, 401, 'UNAUTHORIZED');
  });

  it('mesh-agent explain prints the ranking as a table and the verdict in one line', async () => {
    const res = await a.agent.client.post('/v1/credentials', {
      token: a.token,
      json: { scopes: ['urn:vendor:service:services.read'] },
    });
    assert.equal(res.status, 201, res.text);
    const env = {
      XDG_CONFIG_HOME: mkdtempSync(join(tmpdir(), 'explain-cli-')),
      MESH_URL: a.agent.url,
      MESH_CLIENT_ID: res.body.client_id,
      MESH_CLIENT_SECRET: res.body.client_secret,
    };
    const out = await runCli(
      ['explain', '10.91.1.2', '10.92.5.9', '--protocol', 'tcp', '--port', '443'],
      env,
    );
    assert.equal(out.code, 0, out.stderr);
    const lines = out.stdout.trim().split('\n');
    assert.match(lines[0]!, /^RANK\s+ROUTE\s+SERVICE\s+PRIORITY\s+SOURCE\s+DEST\s+OUTCOME\s+WHY$/);
    assert.match(
      lines[1]!,
      new RegExp(`^1\\s+${routeIds.narrow}\\s+${s2}\\s+10\\s+-\\s+10\\.92\\.5\\.0/24\\s+wins\\s`),
    );
    assert.match(
      lines[2]!,
      new RegExp(`^2\\s+${routeIds.wide}\\s+${s1}\\s+10\\s+-\\s+10\\.92\\.0\\.0/16\\s+loses\\s`),
    );
    assert.match(lines.at(-1)!, /^10\.91\.1\.2 -> 10\.92\.5\.9 tcp\/443: service /);

    const peer = await runCli(['explain', '10.91.1.2', '172.20.1.1', '--peer', b.peerId, '--json'], env);
    assert.equal(peer.code, 0, peer.stderr);
    assert.equal(JSON.parse(peer.stdout).agent, b.peerId);

    const file = join(env.XDG_CONFIG_HOME, 'with.json');
    writeFileSync(file, JSON.stringify({ remove_routes: [routeIds.narrow] }));
    const proposed = await runCli(['explain', '10.91.1.2', '10.92.5.9', '--with', file], env);
    assert.equal(proposed.code, 0, proposed.stderr);
    assert.match(proposed.stdout, new RegExp(`service ${s1} by route ${routeIds.wide}`));

    const invalid = await runCli(['explain', '10.91.1.2', 'nowhere'], env);
    assert.equal(invalid.code, 1);
    assert.match(invalid.stderr, /error 400 INVALID_REQUEST: destination must be an IPv4 or IPv6 address/);
    const usage = await runCli(['explain', '10.91.1.2'], env);
    assert.equal(usage.code, 2);
  });
});
