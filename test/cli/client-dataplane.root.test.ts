/**
 * `mesh-agent status` and `services get` on agents whose data plane runs (each service with its
 * state and traffic): three real agents in network namespaces
 * (test/helpers/mesh-netns.ts; root, fails loudly without it), a service and a route made with
 * the CLI, real TCP traffic from the client namespace to the destination, and the counters the
 * CLI shows. Namespaces prefixed `mcli-`, management subnet index 61, removed in `after`.
 */
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { runCli } from '../helpers/cli.js';
import { HTTP, type MeshNetns, meshNetnsUp, waitUp } from '../helpers/mesh-netns.js';
import { IP } from '../helpers/netns-topology.js';

type Obj = Record<string, unknown>;

describe('mesh-agent status with a running data plane', { timeout: 180_000 }, () => {
  let mesh: MeshNetns;
  let env: Record<string, string>;
  let secret: string;
  let serviceId: string;

  async function ok(args: string[]): Promise<string> {
    const res = await runCli(args, env, 20_000);
    assert.equal(res.code, 0, `${args.join(' ')}: ${res.stderr}`);
    assert.ok(!res.stdout.includes(secret) && !res.stderr.includes(secret), 'no secret in the output');
    return res.stdout;
  }

  before(async () => {
    mesh = await meshNetnsUp('mcli', 61);
    const cred = await mesh.ingress.agent.client.post('/v1/credentials', {
      token: mesh.ingress.token,
      json: {},
    });
    assert.equal(cred.status, 201, cred.text);
    secret = cred.body.client_secret as string;
    env = {
      XDG_CONFIG_HOME: mkdtempSync(join(tmpdir(), 'mesh-cli-dp-')),
      MESH_PROFILE: '',
      MESH_URL: mesh.ingress.agent.url,
      MESH_CLIENT_ID: cred.body.client_id as string,
      MESH_CLIENT_SECRET: secret,
    };
  });

  after(async () => {
    await mesh?.down();
  });

  it('a service made with the CLI comes up, carries traffic, and status shows its state and counters', async () => {
    const created = JSON.parse(
      await ok(['services', 'create', '--target', mesh.exit.peerId, '--transport', 'tcp', '--json']),
    ) as Obj;
    serviceId = String(created.id);
    assert.match(
      await ok(['routes', 'add', serviceId, '--dest', '10.91.2.0/24']),
      /^added 1 route\(s\): \d+$/m,
    );
    await waitUp(serviceId, mesh.ingress, mesh.exit);

    const n = 200_000;
    const got = await mesh.topo.run(
      mesh.topo.ns.client,
      'sh',
      ['-c', `curl -sS --max-time 20 http://${IP.dest}:${HTTP}/bytes?n=${n} | wc -c`],
      30_000,
    );
    assert.equal(Number(got.trim()), n);

    const screen = await ok(['status']);
    assert.match(screen, /^PEERS \(3\)$/m);
    assert.match(
      screen,
      new RegExp(
        `^${serviceId}\\s+${mesh.ingress.peerId} -> ${mesh.exit.peerId}\\s+tcp\\s+active\\s+state up \\(ingress\\)$`,
        'm',
      ),
    );
    const traffic = /^ {4}traffic {2}sent .* streams open \d+ of (\d+) opened$/m.exec(screen);
    assert.ok(traffic, screen);
    assert.ok(Number(traffic[1]) >= 1, 'the curl connection was counted as a stream');
    // At its ingress, each route says whether it carries now (failover).
    assert.match(screen, /^ {4}route \d+\s+priority 100\s+- -> 10\.91\.2\.0\/24 {2}active$/m);
    assert.match(screen, /^ {4}health {3}healthy since \S+, carrying its routes$/m);
    // Every peer is heard from: reachable, with a last-seen time.
    for (const peer of [mesh.exit.peerId, mesh.exit2.peerId]) {
      assert.match(screen, new RegExp(`^${peer}\\s+\\S*\\s+\\S+\\s+false\\s+true\\s+true\\s+\\d{4}-`, 'm'));
    }

    const all = JSON.parse(await ok(['status', '--json'])) as { services: Obj[] };
    const dp = all.services.find((s) => s.id === serviceId)!.dataplane as Obj;
    assert.equal(dp.state, 'up');
    assert.ok((dp.stream_bytes_down as number) >= n, `stream bytes down ${dp.stream_bytes_down}`);

    const detail = await ok(['services', 'get', serviceId]);
    assert.match(detail, /^DATA PLANE \(this agent\)$/m);
    assert.match(detail, /^state\s+up$/m);
    assert.match(detail, /^role\s+ingress$/m);
  });
});
