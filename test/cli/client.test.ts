/**
 * The `mesh-agent` client commands end to end (docs/cli.md): the compiled binary against two
 * real agents over real HTTP. Every command in table and --json form, the exit code of each
 * class (usage 2, API 4xx 1, unreachable and 5xx 3, not logged in 4), the API's code and text
 * on stderr, the profile's file modes, the token cache (reused, refreshed before expiry, fetched
 * again after a 401), and that no secret or token (webhook secrets included) appears in any
 * output but the one that created it.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { AgentProcess, MAIN_JS } from '../helpers/agent-process.js';
import { type CliResult, runCli } from '../helpers/cli.js';
import { eventually } from '../helpers/cluster.js';
import { makeVendor, type Vendor } from '../helpers/licenses.js';
import { bootstrapNode, type Node } from '../helpers/nodes.js';
import { freePort } from '../helpers/ports.js';
import { WebhookReceiver } from '../helpers/webhook-receiver.js';

type Obj = Record<string, unknown>;

/** Every command's output, with the secrets it may legitimately show. */
const outputs: { args: string[]; res: CliResult; allowed: Set<string> }[] = [];
/** Every secret and token the test came to know. */
const secrets = new Set<string>();

describe('mesh-agent client commands', { timeout: 180_000 }, () => {
  let vendor: Vendor;
  let a: AgentProcess;
  let b: Node;
  let home: string;
  let env: Record<string, string>;
  let aPeerId: string;
  let bootstrapSecret: string;
  let serviceId: string;

  /** Runs the CLI with the test's config home and no inherited MESH_* variables. */
  async function cli(
    args: string[],
    extra: Record<string, string> = {},
    allowed: string[] = [],
  ): Promise<CliResult> {
    const res = await runCli(args, { ...env, ...extra }, 20_000);
    outputs.push({ args, res, allowed: new Set(allowed) });
    return res;
  }
  async function ok(args: string[], extra: Record<string, string> = {}): Promise<CliResult> {
    const res = await cli(args, extra);
    assert.equal(res.code, 0, `${args.join(' ')}: ${res.stderr}`);
    return res;
  }
  async function json<T = Obj>(args: string[], extra: Record<string, string> = {}): Promise<T> {
    return JSON.parse((await ok([...args, '--json'], extra)).stdout) as T;
  }
  const tokenFile = (profile = 'default') => join(home, 'mesh-agent', `${profile}.token.json`);

  before(async () => {
    vendor = makeVendor();
    home = mkdtempSync(join(tmpdir(), 'mesh-cli-home-'));
    env = {
      XDG_CONFIG_HOME: home,
      MESH_URL: '',
      MESH_CLIENT_ID: '',
      MESH_CLIENT_SECRET: '',
      MESH_PROFILE: '',
    };
    a = await AgentProcess.start({ vendor, movableClock: true });
    b = await bootstrapNode(await AgentProcess.start({ vendor }), vendor);
  });

  after(async () => {
    await a?.stop();
    await b?.agent.stop();
  });

  it('help lists the client commands and the exit codes', async () => {
    const res = await ok(['help']);
    for (const word of [
      'login',
      'bootstrap',
      'peers ls',
      'services create',
      'routes add',
      'credentials',
      'cluster',
      'webhooks ls',
      'events',
      'status',
    ]) {
      assert.ok(res.stdout.includes(word), word);
    }
    assert.match(res.stdout, /Exit codes: 0 ok, 1 .*2 usage error,\s+3 .*4 not logged in/s);
    const sub = await ok(['routes', 'add', '--help']);
    assert.match(sub.stdout, /mesh-agent routes add SERVICE/);
  });

  it('usage errors exit 2 without contacting anything', async () => {
    for (const args of [
      ['peers'],
      ['peers', 'frob'],
      ['peers', 'get'],
      ['peers', 'ls', '--bogus'],
      ['services', 'create'],
      ['services', 'create', '--target', 'x', '--transport', 'udp'],
      ['services', 'update', 'x'],
      ['services', 'create', '--target', 'x', '--health-check', 'http:10.0.0.1:80'],
      ['services', 'create', '--target', 'x', '--health-check', '10.0.0.1:80'],
      ['services', 'create', '--target', 'x', '--health-check-failures', '5'],
      ['services', 'update', 'x', '--health-check-interval-ms', '500'],
      ['services', 'update', 'x', '--health-check', 'none', '--health-check-failures', '5'],
      ['services', 'update', 'x', '--health-check', 'icmp:10.0.0.1', '--health-check-interval-ms', '99'],
      ['services', 'update', 'x', '--health-check', 'icmp:10.0.0.1', '--health-check-failures', '11'],
      ['routes', 'add', 'svc'],
      ['routes', 'rm', 'svc', 'notanumber'],
      ['peers', 'leave'],
      ['bootstrap'],
      ['login', '--url', 'http://127.0.0.1:1'],
      ['status', '--profile', '../etc'],
    ]) {
      const res = await cli(args, {
        MESH_URL: 'http://127.0.0.1:1',
        MESH_CLIENT_ID: 'x',
        MESH_CLIENT_SECRET: 'y',
      });
      assert.equal(res.code, 2, `${args.join(' ')}: ${res.stderr}`);
      assert.match(res.stderr, /^mesh-agent: /);
      assert.equal(res.stdout, '');
    }
  });

  it('without a profile or environment: exit 4 (not logged in)', async () => {
    for (const extra of [{}, { MESH_URL: a.url }] as Record<string, string>[]) {
      const res = await cli(['peers', 'ls'], extra);
      assert.equal(res.code, 4, res.stderr);
      assert.match(res.stderr, /not logged in|no agent URL/);
    }
  });

  it('an agent that cannot be reached, or answers 5xx: exit 3', async () => {
    const closed = await freePort();
    const res = await cli(['peers', 'ls'], {
      MESH_URL: `http://127.0.0.1:${closed}`,
      MESH_CLIENT_ID: 'id',
      MESH_CLIENT_SECRET: 'secret-that-is-long-enough',
    });
    assert.equal(res.code, 3, res.stderr);
    assert.match(res.stderr, /cannot reach the agent at http:\/\/127\.0\.0\.1:\d+: ECONNREFUSED/);

    const server: Server = createServer((_req, reply) => {
      reply.writeHead(500, { 'content-type': 'application/json' });
      reply.end(JSON.stringify({ error: 'internal error', code: 'INTERNAL' }));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const port = (server.address() as AddressInfo).port;
      const res5 = await cli(['cluster', 'identity'], { MESH_URL: `http://127.0.0.1:${port}` });
      assert.equal(res5.code, 3, res5.stderr);
      assert.match(res5.stderr, /error 500 INTERNAL: internal error/);
    } finally {
      server.close();
    }
  });

  it('bootstrap prints the first credential once with a warning, and --login saves it (0600 in a 0700 dir)', async () => {
    const licenseFile = join(home, 'license.json');
    writeFileSync(licenseFile, JSON.stringify(vendor.sign()));
    const res = await runCli(
      ['bootstrap', '--license', licenseFile, '--url', a.url, '--name', 'site-a', '--login'],
      env,
    );
    assert.equal(res.code, 0, res.stderr);
    const secret = /^client_secret\s+(\S+)$/m.exec(res.stdout)?.[1];
    assert.ok(secret && secret.length >= 16, res.stdout);
    bootstrapSecret = secret;
    secrets.add(secret);
    outputs.push({ args: ['bootstrap'], res, allowed: new Set([secret]) });
    assert.match(res.stdout, /^peer_id\s+\S+$/m);
    assert.match(res.stderr, /WARNING: the client_secret above is shown this once/);
    aPeerId = /^peer_id\s+(\S+)$/m.exec(res.stdout)![1]!;
    a.client.secretsSeen.add(secret);

    const dir = join(home, 'mesh-agent');
    const profile = join(dir, 'default.json');
    assert.equal(statSync(dir).mode & 0o777, 0o700);
    assert.equal(statSync(profile).mode & 0o777, 0o600);
    const saved = JSON.parse(readFileSync(profile, 'utf8')) as Obj;
    assert.equal(saved.url, a.url);
    assert.equal(saved.client_secret, secret);

    // Once only: the second bootstrap is the API's 409, exit 1, with code and text.
    const again = await cli(['bootstrap', '--license', licenseFile, '--json']);
    assert.equal(again.code, 1);
    assert.match(again.stderr, /^mesh-agent: error 409 ALREADY_BOOTSTRAPPED: \S/m);
    assert.equal(again.stdout, '');
  });

  it('login: a refused credential exits 4 and writes nothing; a good one writes a 0600 profile', async () => {
    const bad = await cli([
      'login',
      '--url',
      a.url,
      '--client-id',
      'nobody',
      '--client-secret',
      'wrong-secret-0123456789',
      '--profile',
      'bad',
    ]);
    assert.equal(bad.code, 4, bad.stderr);
    assert.match(bad.stderr, /refused the credential nobody/);
    assert.equal(existsSync(join(home, 'mesh-agent', 'bad.json')), false);

    const saved = JSON.parse(readFileSync(join(home, 'mesh-agent', 'default.json'), 'utf8')) as Obj;
    const secretFile = join(home, 'secret.txt');
    writeFileSync(secretFile, `${bootstrapSecret}\n`, { mode: 0o600 });
    const res = await cli([
      'login',
      '--url',
      `${a.url}/`,
      '--client-id',
      String(saved.client_id),
      '--client-secret-file',
      secretFile,
      '--profile',
      'second',
    ]);
    assert.equal(res.code, 0, res.stderr);
    assert.match(res.stdout, /logged in: profile second/);
    assert.equal(statSync(join(home, 'mesh-agent', 'second.json')).mode & 0o777, 0o600);
    assert.equal(statSync(tokenFile('second')).mode & 0o777, 0o600);
    const viaSecond = await json<Obj[]>(['peers', 'ls', '--profile', 'second']);
    assert.equal(viaSecond.length, 1);
  });

  it('cluster identity|init|sync|credentials|rotate|license', async () => {
    const id = await json(['cluster', 'identity']);
    assert.equal(id.peer_id, aPeerId);
    assert.match(
      (await ok(['cluster', 'identity'])).stdout,
      new RegExp(`^cluster_id\\s+${id.cluster_id}$`, 'm'),
    );

    const init = await json(['cluster', 'init']);
    assert.equal(init.cluster_id, id.cluster_id);
    assert.equal(init.was_created, false);
    assert.match((await ok(['cluster', 'init'])).stdout, /^was_created\s+false$/m);

    assert.equal((await json(['cluster', 'sync'])).triggered, true);
    assert.match((await ok(['cluster', 'sync'])).stdout, /^triggered\s+true$/m);

    const cc = await json(['cluster', 'credentials']);
    assert.equal(typeof cc.client_id, 'string');
    assert.equal('client_secret' in cc, false);
    assert.match((await ok(['cluster', 'credentials'])).stdout, /^version\s+\d+$/m);

    // rotate hides the new secret unless asked; with --show-secret it comes with the warning.
    const rotated = await json(['cluster', 'rotate']);
    assert.equal(rotated.version, Number(cc.version) + 1);
    assert.equal('client_secret' in rotated, false);
    assert.doesNotMatch((await ok(['cluster', 'rotate'])).stdout, /client_secret/);
    const shown = await runCli(['cluster', 'rotate', '--show-secret', '--json'], env);
    assert.equal(shown.code, 0, shown.stderr);
    const shownSecret = (JSON.parse(shown.stdout) as Obj).client_secret as string;
    assert.ok(shownSecret.length >= 16);
    secrets.add(shownSecret);
    a.client.secretsSeen.add(shownSecret);
    outputs.push({
      args: ['cluster', 'rotate', '--show-secret'],
      res: shown,
      allowed: new Set([shownSecret]),
    });
    assert.match(shown.stderr, /WARNING/);

    const lic = await json(['cluster', 'license']);
    assert.equal(lic.license_id, 'license-test');
    assert.equal(lic.nodes_used, 1);
    assert.match((await ok(['cluster', 'license'])).stdout, /^days_to_expiry\s+\d+$/m);
  });

  it('peers ls|get|add|rename|rm, and the API errors they meet', async () => {
    const table = (await ok(['peers', 'ls'])).stdout;
    assert.match(table, /^ID\s+NAME\s+ADDRESS\s+LOCAL\s+ACTIVE\s+REACHABLE\s+LAST SEEN$/m);
    assert.match(
      table,
      new RegExp(`^${aPeerId}\\s+site-a\\s+127\\.0\\.0\\.1:${a.port}\\s+true\\s+true\\s+\\(self\\)`, 'm'),
    );

    const added = await json(['peers', 'add', `127.0.0.1:${b.agent.port}`]);
    assert.equal(added.id, b.peerId);
    assert.equal(added.is_local, false);
    const dup = await cli(['peers', 'add', `127.0.0.1:${b.agent.port}`]);
    assert.equal(dup.code, 1);
    assert.match(dup.stderr, /error 409 ALREADY_EXISTS: /);

    assert.equal((await json(['peers', 'rename', b.peerId, 'site-b'])).name, 'site-b');
    assert.match((await ok(['peers', 'rename', b.peerId, 'site-b2'])).stdout, /^name\s+site-b2$/m);
    assert.equal((await json(['peers', 'get', b.peerId])).name, 'site-b2');
    assert.match((await ok(['peers', 'get', b.peerId])).stdout, new RegExp(`^id\\s+${b.peerId}$`, 'm'));

    const local = await json<Obj[]>(['peers', 'ls', '--local']);
    assert.deepEqual(
      local.map((p) => p.id),
      [aPeerId],
    );
    const remote = await json<Obj[]>(['peers', 'ls', '--remote']);
    assert.deepEqual(
      remote.map((p) => p.id),
      [b.peerId],
    );
    assert.match((await ok(['peers', 'ls'])).stdout, new RegExp(`^${b.peerId}\\s+site-b2\\s+`, 'm'));

    const missing = await cli(['peers', 'get', 'no-such-peer']);
    assert.equal(missing.code, 1);
    assert.match(missing.stderr, /^mesh-agent: error 404 NOT_FOUND: \S/m);
    const self = await cli(['peers', 'rm', aPeerId]);
    assert.equal(self.code, 1);
    assert.match(self.stderr, /error 422 CANNOT_DELETE_LOCAL: /);
  });

  it('services create|ls|get|update|rm with a flag per field', async () => {
    const created = await json([
      'services',
      'create',
      '--target',
      b.peerId,
      '--transport',
      'kcp',
      '--bandwidth',
      '10',
      '--health-check',
      'tcp:10.77.0.1:8443',
    ]);
    serviceId = String(created.id);
    assert.deepEqual((await json(['services', 'get', serviceId])).health_check, {
      tcp: '10.77.0.1:8443',
      interval_ms: 1000,
      failures: 3,
    });
    assert.equal(created.source_peer_id, aPeerId);
    assert.equal(created.transport_type, 'kcp');

    // One service per source and target: the second one runs the other way, set up from here.
    const second = (
      await ok([
        'services',
        'create',
        '--target',
        aPeerId,
        '--source',
        b.peerId,
        '--interface',
        '--ipv4',
        '10.77.0.2/24',
        '--ipv6',
        'fd00:77::2/64',
      ])
    ).stdout;
    const secondId = /^id\s+(\S+)$/m.exec(second)![1]!;
    const detail = await json(['services', 'get', secondId]);
    assert.equal(detail.requires_interface, true);
    assert.equal(detail.interface_ipv4_cidr, '10.77.0.2/24');
    assert.equal(detail.interface_ipv6_cidr, 'fd00:77::2/64');

    assert.deepEqual(
      (await json<Obj[]>(['services', 'ls'])).map((s) => s.id).sort(),
      [serviceId, secondId].sort(),
    );
    assert.deepEqual(
      (await json<Obj[]>(['services', 'ls', '--target', b.peerId])).map((s) => s.id),
      [serviceId],
    );
    assert.deepEqual(
      (await json<Obj[]>(['services', 'ls', '--source', b.peerId])).map((s) => s.id),
      [secondId],
    );
    assert.deepEqual(
      (await json<Obj[]>(['services', 'ls', '--interface'])).map((s) => s.id),
      [secondId],
    );
    assert.deepEqual(
      (await json<Obj[]>(['services', 'ls', '--no-interface'])).map((s) => s.id),
      [serviceId],
    );
    const table = (await ok(['services', 'ls'])).stdout;
    assert.match(
      table,
      /^ID\s+SOURCE\s+TARGET\s+TRANSPORT\s+INTERFACE\s+IPV4\s+IPV6\s+TRANSPARENT\s+MBPS\s+ROUTES\s+ACTIVE$/m,
    );
    assert.match(
      table,
      new RegExp(
        `^${serviceId}\\s+${aPeerId}\\s+${b.peerId}\\s+kcp\\s+false\\s+-\\s+-\\s+false\\s+10\\s+0\\s+`,
        'm',
      ),
    );

    const updated = await json(['services', 'update', serviceId, '--bandwidth', '20']);
    assert.equal(updated.bandwidth_limit_mbps, 20);
    await ok(['services', 'update', secondId, '--ipv4', 'none', '--no-interface']);
    const cleared = await json(['services', 'get', secondId]);
    assert.equal(cleared.requires_interface, false);
    assert.equal(cleared.interface_ipv4_cidr, null);

    // The health check: set with its timings, replaced, refused by the API (exit 1), removed.
    const checked = await json([
      'services',
      'update',
      serviceId,
      '--health-check',
      'tcp:[FD00::1]:443',
      '--health-check-failures',
      '5',
    ]);
    assert.deepEqual(checked.health_check, { tcp: '[fd00::1]:443', interval_ms: 1000, failures: 5 });
    const pinged = await json([
      'services',
      'update',
      serviceId,
      '--health-check',
      'icmp:10.77.0.9',
      '--health-check-interval-ms',
      '250',
    ]);
    assert.deepEqual(pinged.health_check, { icmp: '10.77.0.9', interval_ms: 250, failures: 3 });
    const named = await cli(['services', 'update', serviceId, '--health-check', 'tcp:exit.example:443']);
    assert.equal(named.code, 1);
    assert.match(named.stderr, /error 400 INVALID_REQUEST: health_check\.tcp must be an IP address/);
    assert.match(
      (await ok(['services', 'get', serviceId])).stdout,
      /^health_check\s+\{"interval_ms":250,"failures":3,"icmp":"10\.77\.0\.9"\}$/m,
    );
    assert.equal(
      (await json(['services', 'update', serviceId, '--health-check', 'none'])).health_check,
      null,
    );

    const got = (await ok(['services', 'get', serviceId])).stdout;
    assert.match(got, /^bandwidth_limit_mbps\s+20$/m);
    assert.match(got, /^health_check\s+-$/m);
    assert.match(got, /^ROUTES\n\(none\)$/m);

    const nf = await cli(['services', 'create', '--target', 'no-such-peer']);
    assert.equal(nf.code, 1);
    assert.match(nf.stderr, /error 404 NOT_FOUND: /);

    assert.equal((await json(['services', 'rm', secondId])).deleted, true);
    assert.match((await cli(['services', 'rm', secondId])).stderr, /error 404 NOT_FOUND/);

    // --transparent: the flag reaches the API, which also judges its conditions.
    const transparent = await json([
      'services',
      'create',
      '--source',
      b.peerId,
      '--target',
      aPeerId,
      '--transparent',
      '--interface',
      '--ipv4',
      '10.78.0.2/24',
    ]);
    assert.equal((await json(['services', 'get', String(transparent.id)])).fully_transparent, true);
    assert.match(
      (await ok(['services', 'get', String(transparent.id)])).stdout,
      /^fully_transparent\s+true$/m,
    );
    assert.equal((await json(['services', 'rm', String(transparent.id)])).deleted, true);
    const refused = await cli([
      'services',
      'create',
      '--source',
      b.peerId,
      '--target',
      aPeerId,
      '--transparent',
    ]);
    assert.equal(refused.code, 1, refused.stderr);
    assert.match(refused.stderr, /^mesh-agent: error 4\d\d [A-Z_]+: \S/m);
  });

  it('routes add (one, several, from a file)|ls|update|rm', async () => {
    const one = await json(['routes', 'add', serviceId, '--dest', '10.1.0.0/16', '--priority', '5']);
    assert.equal(one.count, 1);
    const many = await json([
      'routes',
      'add',
      serviceId,
      '--route',
      'dest=10.2.0.0/16,priority=7',
      '--route',
      'source=192.168.5.0/24,dest=10.3.0.0/16',
    ]);
    assert.equal(many.count, 2);
    const file = join(home, 'routes.json');
    writeFileSync(
      file,
      JSON.stringify([{ dest_cidr: '10.4.0.0/16', priority: 9 }, { source_cidr: '172.16.0.0/12' }]),
    );
    assert.match(
      (await ok(['routes', 'add', serviceId, '--file', file])).stdout,
      /^added 2 route\(s\): \d+,\d+$/m,
    );

    const routes = await json<Obj[]>(['routes', 'ls', serviceId]);
    assert.equal(routes.length, 5);
    const byDest = (d: string) => routes.find((r) => r.dest_cidr === d)!;
    assert.equal(byDest('10.1.0.0/16').priority, 5);
    assert.equal(byDest('10.3.0.0/16').source_cidr, '192.168.5.0/24');
    assert.equal(byDest('10.3.0.0/16').priority, 100, 'the default priority');
    const table = (await ok(['routes', 'ls', serviceId])).stdout;
    assert.match(table, /^ID\s+PRIORITY\s+SOURCE\s+DEST$/m);
    assert.match(table, new RegExp(`^${byDest('10.1.0.0/16').id}\\s+5\\s+-\\s+10\\.1\\.0\\.0/16$`, 'm'));

    const rid = String(byDest('10.1.0.0/16').id);
    const upd = await json([
      'routes',
      'update',
      serviceId,
      rid,
      '--priority',
      '3',
      '--source',
      '10.9.0.0/16',
    ]);
    assert.equal(upd.priority, 3);
    assert.equal(upd.source_cidr, '10.9.0.0/16');
    assert.match(
      (await ok(['routes', 'update', serviceId, rid, '--priority', '4'])).stdout,
      new RegExp(`^${rid}\\s+4\\s+`, 'm'),
    );

    const bad = await cli(['routes', 'add', serviceId, '--dest', '10.0.0.300/8']);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /error 400 INVALID_CIDR: /);

    assert.equal((await json(['routes', 'rm', serviceId, rid])).deleted, true);
    const gone = await cli(['routes', 'rm', serviceId, rid]);
    assert.equal(gone.code, 1);
    assert.match(gone.stderr, /error 404 NOT_FOUND/);
    assert.equal((await json<Obj[]>(['routes', 'ls', serviceId])).length, 4);
  });

  it('credentials create (secret once, with a warning)|ls (no secret)|revoke; a narrow scope meets 403', async () => {
    const res = await runCli(['credentials', 'create', '--scope', 'peers.read'], env);
    assert.equal(res.code, 0, res.stderr);
    const clientId = /^client_id\s+(\S+)$/m.exec(res.stdout)![1]!;
    const secret = /^client_secret\s+(\S+)$/m.exec(res.stdout)![1]!;
    secrets.add(secret);
    a.client.secretsSeen.add(secret);
    outputs.push({ args: ['credentials', 'create'], res, allowed: new Set([secret]) });
    assert.match(res.stdout, /^scopes\s+urn:vendor:service:peers\.read$/m);
    assert.match(res.stderr, /WARNING: the client_secret above is shown this once/);

    const list = await json<Obj[]>(['credentials', 'ls']);
    assert.ok(list.some((c) => c.client_id === clientId));
    assert.ok(list.every((c) => !('client_secret' in c)));
    assert.match(
      (await ok(['credentials', 'ls'])).stdout,
      new RegExp(`^${clientId}\\s+peers\\.read\\s+license-test\\s+`, 'm'),
    );

    // The environment drives a command without any profile file.
    const narrow = {
      MESH_PROFILE: 'narrow',
      MESH_URL: a.url,
      MESH_CLIENT_ID: clientId,
      MESH_CLIENT_SECRET: secret,
    };
    assert.equal((await json<Obj[]>(['peers', 'ls'], narrow)).length, 2);
    const forbidden = await cli(['services', 'ls'], narrow);
    assert.equal(forbidden.code, 1);
    assert.match(forbidden.stderr, /^mesh-agent: error 403 FORBIDDEN: \S/m);
    // status without admin: no license line from /v1/cluster/license, still the rest... but
    // services need services.read: the API's 403 ends it.
    assert.equal((await cli(['status'], narrow)).code, 1);

    assert.equal((await json(['credentials', 'revoke', clientId])).deleted, true);
    const again = await cli(['credentials', 'revoke', clientId]);
    assert.equal(again.code, 1);
    assert.match(again.stderr, /error 404 NOT_FOUND/);
    // Its cached token no longer helps: the agent refuses it, and then the credential itself.
    const revoked = await cli(['peers', 'ls'], narrow);
    assert.equal(revoked.code, 4, revoked.stderr);

    const badScope = await cli(['credentials', 'create', '--scope', 'root']);
    assert.equal(badScope.code, 1);
    assert.match(badScope.stderr, /error 400 INVALID_REQUEST/);
  });

  it('status: cluster, peers with reachability and last seen, services with routes', async () => {
    const res = (await ok(['status'])).stdout;
    const id = await json(['cluster', 'identity']);
    assert.match(res, new RegExp(`^cluster\\s+${id.cluster_id}$`, 'm'));
    assert.match(res, /^license\s+license-test expires \S+ \(\d+ days\), nodes 2\/5, services 1\/10$/m);
    assert.match(res, /^PEERS \(2\)$/m);
    assert.match(
      res,
      new RegExp(
        `^${b.peerId}\\s+site-b2\\s+127\\.0\\.0\\.1:${b.agent.port}\\s+false\\s+true\\s+(true|false)\\s+\\S+`,
        'm',
      ),
    );
    assert.match(res, /^SERVICES \(1\)$/m);
    assert.match(
      res,
      new RegExp(
        `^${serviceId}\\s+${aPeerId} -> ${b.peerId}\\s+kcp\\s+active\\s+state - \\(no data plane on this agent\\)$`,
        'm',
      ),
    );
    assert.match(res, /^ {4}route \d+\s+priority 7\s+- -> 10\.2\.0\.0\/16$/m);

    const all = await json(['status']);
    assert.equal((all.identity as Obj).cluster_id, id.cluster_id);
    assert.equal((all.peers as Obj[]).length, 2);
    assert.equal(((all.services as Obj[])[0]!.routes as Obj[]).length, 4);
    assert.equal((all.license as Obj).max_services, 10);
  });

  it('the token is cached (0600), reused while fresh, refreshed before expiry and after a 401', async () => {
    const read = () =>
      JSON.parse(readFileSync(tokenFile(), 'utf8')) as { access_token: string; expires_at_ms: number };
    assert.equal(statSync(tokenFile()).mode & 0o777, 0o600);
    const first = read();
    secrets.add(first.access_token);
    assert.ok(first.expires_at_ms > Date.now() + 3_000_000, 'a one-hour token');
    await ok(['peers', 'ls']);
    assert.equal(read().access_token, first.access_token, 'a fresh token is reused');

    // 30 s left: below the margin, so a new token is fetched before the call.
    writeFileSync(tokenFile(), JSON.stringify({ ...first, expires_at_ms: Date.now() + 30_000 }), {
      mode: 0o600,
    });
    await ok(['peers', 'ls']);
    const refreshed = read();
    secrets.add(refreshed.access_token);
    assert.notEqual(refreshed.access_token, first.access_token);
    assert.ok(refreshed.expires_at_ms > Date.now() + 3_000_000);

    // The agent's clock two hours ahead: the cached token looks fresh here but is expired there.
    await a.advanceClock(2 * 3_600_000);
    const res = await ok(['peers', 'ls', '--json']);
    assert.equal((JSON.parse(res.stdout) as Obj[]).length, 2);
    const after401 = read();
    secrets.add(after401.access_token);
    assert.notEqual(after401.access_token, refreshed.access_token, 'a new token after the 401');
  });

  it('peers leave --yes (through the environment, on the second agent) and peers rm', async () => {
    const bCreds = await b.agent.client.post('/v1/credentials', { token: b.token, json: {} });
    assert.equal(bCreds.status, 201, bCreds.text);
    secrets.add(bCreds.body.client_secret);
    const envB = {
      MESH_PROFILE: 'site-b',
      MESH_URL: b.agent.url,
      MESH_CLIENT_ID: bCreds.body.client_id,
      MESH_CLIENT_SECRET: bCreds.body.client_secret,
    };
    const left = await json(['peers', 'leave', '--yes'], envB);
    assert.equal(left.peer_id, b.peerId);
    assert.equal(left.is_active, false);
    assert.equal((await json(['peers', 'rm', b.peerId])).deleted, true);
    assert.deepEqual(
      (await json<Obj[]>(['peers', 'ls'])).map((p) => p.id),
      [aPeerId],
    );
  });

  it('webhooks add (secret once, with a warning)|ls (no secret)|test|rm', async () => {
    const receiver = await WebhookReceiver.open();
    // Keeping time with the agent, whose clock an earlier test moved.
    receiver.clockOffsetMs = a.clock!.offsetMs;
    try {
      const res = await runCli(['webhooks', 'add', receiver.url, '--type', 'webhook.'], env);
      assert.equal(res.code, 0, res.stderr);
      const id = /^id\s+(\S+)$/m.exec(res.stdout)![1]!;
      const secret = /^secret\s+(whsec_\S+)$/m.exec(res.stdout)![1]!;
      receiver.secret = secret;
      secrets.add(secret);
      a.client.secretsSeen.add(secret);
      outputs.push({ args: ['webhooks', 'add'], res, allowed: new Set([secret]) });
      assert.match(res.stderr, /WARNING: the webhook secret above is shown this once/);

      const listed = await json<Obj[]>(['webhooks', 'ls']);
      assert.deepEqual(listed.find((w) => w.id === id)?.types, ['webhook.']);
      assert.ok(listed.every((w) => !('secret' in w)));
      assert.match(
        (await ok(['webhooks', 'ls'])).stdout,
        new RegExp(`^${id}\\s+${receiver.url}\\s+webhook\\.\\s`, 'm'),
      );

      const tested = await ok(['webhooks', 'test', id]);
      assert.match(tested.stdout, /^delivered: HTTP 204 in \d+ ms$/m);
      const last = receiver.received.at(-1)!;
      assert.equal(last.verifyError, undefined);
      assert.equal(last.event?.type, 'webhook.test');
      receiver.mode = { status: 500 };
      const failed = await cli(['webhooks', 'test', id]);
      assert.equal(failed.code, 1);
      assert.match(failed.stdout, /^not delivered after \d+ ms: HTTP 500$/m);

      assert.equal((await cli(['webhooks', 'add', 'ftp://127.0.0.1/x'])).code, 1);
      assert.equal((await json(['webhooks', 'rm', id])).deleted, true);
      const again = await cli(['webhooks', 'rm', id]);
      assert.equal(again.code, 1);
      assert.match(again.stderr, /error 404 NOT_FOUND/);
    } finally {
      await receiver.close();
    }
  });

  it('events: the trail as a table and as JSON lines; --follow prints what comes next', async () => {
    const lines = (await ok(['events', '--json'])).stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Obj);
    assert.ok(lines.length > 5, `${lines.length} events`);
    assert.equal(lines[0]!.type, 'agent.bootstrapped');
    const seqs = lines.map((e) => e.seq as number);
    assert.deepEqual(
      seqs,
      [...seqs].sort((x, y) => x - y),
    );
    const table = (await ok(['events', '--type', 'webhook.'])).stdout;
    assert.match(table, /^SEQ\s+TIME\s+TYPE\s+RESOURCE\s+ACTOR$/m);
    assert.match(table, /\swebhook\.created\s+webhook\//);
    assert.doesNotMatch(table, /peer\.renamed/);
    assert.equal((await cli(['events', '--since', 'x'])).code, 2);

    // --follow from the last seq: the next change appears, then Ctrl-C ends it cleanly.
    const child = spawn(
      process.execPath,
      [MAIN_JS, 'events', '--follow', '--json', '--since', String(seqs.at(-1))],
      {
        env: { ...process.env, ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let out = '';
    child.stdout.on('data', (c: Buffer) => {
      out += c.toString();
    });
    const exited = new Promise<number | null>((r) => child.on('close', r));
    try {
      await ok(['peers', 'rename', aPeerId, 'followed']);
      await eventually('the followed event', async () => (out.includes('"peer.renamed"') ? true : undefined));
      const followed = out
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as Obj);
      assert.ok(followed.every((e) => (e.seq as number) > seqs.at(-1)!));
      assert.deepEqual((followed.find((e) => e.type === 'peer.renamed')!.data as Obj).after, {
        name: 'followed',
      });
    } finally {
      child.kill('SIGINT');
    }
    assert.equal(await exited, 0);
    outputs.push({
      args: ['events', '--follow'],
      res: { code: 0, stdout: out, stderr: '' },
      allowed: new Set(),
    });
  });

  it('no secret or token in any output but the one command that created it', () => {
    for (const t of readTokens(home)) secrets.add(t);
    assert.ok(secrets.size >= 6, `secrets known: ${secrets.size}`);
    assert.ok(outputs.length > 60, `outputs captured: ${outputs.length}`);
    for (const { args, res, allowed } of outputs) {
      for (const secret of secrets) {
        if (allowed.has(secret)) continue;
        assert.ok(!res.stdout.includes(secret), `a secret in the stdout of ${args.join(' ')}`);
        assert.ok(!res.stderr.includes(secret), `a secret in the stderr of ${args.join(' ')}`);
      }
    }
    // And the agent never logged them (AgentProcess checks the secrets it was told of).
    a.assertNoSecretsInLogs();
  });
});

function readTokens(home: string): string[] {
  const dir = join(home, 'mesh-agent');
  const out: string[] = [];
  for (const name of ['default', 'second', 'narrow', 'site-b']) {
    const f = join(dir, `${name}.token.json`);
    if (existsSync(f))
      out.push((JSON.parse(readFileSync(f, 'utf8')) as { access_token: string }).access_token);
  }
  return out;
}
