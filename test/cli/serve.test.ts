/**
 * `mesh-agent serve` (docs/decisions.md §1, §2): `--dev` writes a signing key, a trial license and a
 * bootstrap body into the data dir and prints curl lines that work as printed; without --dev
 * and without --license-public-key every bootstrap is 422 LICENSE_INVALID saying why; start-up
 * usage errors (a wildcard --listen without --advertise first) exit 2 with a message.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { AGENT_V8_FLAGS } from '../../src/cli/v8-flags.js';
import { AgentProcess } from '../helpers/agent-process.js';
import { assertError } from '../helpers/api-assertions.js';
import { runCli } from '../helpers/cli.js';
import { makeVendor } from '../helpers/licenses.js';
import { freePort } from '../helpers/ports.js';

function sh(line: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile('sh', ['-c', line], { timeout: 15_000 }, (err, stdout, stderr) => {
      const code = err ? ((err as { code?: unknown }).code as number) : 0;
      resolve({ code: typeof code === 'number' ? code : -1, stdout, stderr });
    });
  });
}

const runServe = (args: string[], env: Record<string, string> = {}, timeoutMs = 15_000) =>
  runCli(['serve', ...args], env, timeoutMs);

const DEV_FILES = [
  'dev-license-signing.key',
  'dev-license-signing.pub',
  'dev-license.json',
  'dev-bootstrap.json',
];

/** The process's command line as the kernel has it (NUL-separated in /proc). */
const cmdlineOf = (pid: number) => readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);

describe('serve: V8 flags (src/cli/v8-flags.ts)', { timeout: 60_000 }, () => {
  it('restarts in place with --initial-old-space-size: same pid, flag on its command line, API up', async () => {
    const agent = await AgentProcess.start();
    try {
      const cmdline = cmdlineOf(agent.pid);
      for (const flag of AGENT_V8_FLAGS) assert.ok(cmdline.includes(flag), cmdline.join(' '));
      assert.equal(cmdline.filter((a) => a === 'serve').length, 1, 'the rest of the command line kept once');
      assert.equal((await agent.client.raw('GET', '/livez')).status, 200);
      // stdout survives the exec (Node marks it close-on-exec; the addon clears that).
      assert.match(agent.logs, /"msg":"agent listening"/);
      assert.match(agent.logs, new RegExp(`"pid":${agent.pid}\\b`));
    } finally {
      assert.equal(await agent.stop(), 0);
    }
  });

  it('keeps the command line as it is with MESH_V8_FLAGS=off', async () => {
    const agent = await AgentProcess.start({ env: { MESH_V8_FLAGS: 'off' } });
    try {
      const cmdline = cmdlineOf(agent.pid);
      assert.ok(!cmdline.some((a) => a.startsWith('--initial-old-space-size')), cmdline.join(' '));
      assert.equal((await agent.client.raw('GET', '/livez')).status, 200);
    } finally {
      assert.equal(await agent.stop(), 0);
    }
  });
});

describe('serve --dev', () => {
  let agent: AgentProcess;
  before(async () => {
    agent = await AgentProcess.start({ extraArgs: ['--dev'] });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('creates the dev signing key (0600), a trial license and a bootstrap body in the data dir', () => {
    for (const f of DEV_FILES) assert.ok(existsSync(join(agent.dataDir, f)), `${f} exists`);
    assert.equal(statSync(join(agent.dataDir, 'dev-license-signing.key')).mode & 0o777, 0o600);
    assert.match(readFileSync(join(agent.dataDir, 'dev-license-signing.key'), 'utf8'), /BEGIN PRIVATE KEY/);
    assert.match(readFileSync(join(agent.dataDir, 'dev-license-signing.pub'), 'utf8'), /BEGIN PUBLIC KEY/);
    const license = JSON.parse(readFileSync(join(agent.dataDir, 'dev-license.json'), 'utf8'));
    assert.deepEqual(Object.keys(license).sort(), [
      'customer_id',
      'expires_at',
      'issued_at',
      'license_id',
      'max_nodes',
      'max_services',
      'signature',
    ]);
    assert.ok(Date.parse(license.expires_at) > Date.now() + 7 * 86_400_000, 'a trial of more than a week');
    assert.ok(license.max_nodes >= 1 && license.max_services >= 0);
    const body = JSON.parse(readFileSync(join(agent.dataDir, 'dev-bootstrap.json'), 'utf8'));
    assert.deepEqual(body.license, license, 'the bootstrap body carries the trial license');
  });

  it('names the web console, which the agent serves at that address', async () => {
    const line = agent.logs
      .split('\n')
      .map((l) => l.trim())
      .find((l) => l.endsWith('/ui/'));
    assert.equal(line, `${agent.url}/ui/`, `the console's address in:\n${agent.logs}`);
    const page = await agent.client.raw('GET', new URL(line).pathname);
    assert.equal(page.status, 200);
    assert.match(String(page.headers['content-type']), /^text\/html/);
    assert.match(page.text, /<script type="module" src="\/ui\/app\.js">/);
  });

  it('prints curl lines that bootstrap, get a token and list peers when run as printed', async () => {
    const lines = agent.logs
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l.startsWith('curl '));
    assert.equal(lines.length, 3, `three curl lines in:\n${agent.logs}`);
    for (const l of lines) assert.ok(l.includes(agent.url), `${l} uses ${agent.url}`);

    const boot = await sh(lines[0]!);
    assert.equal(boot.code, 0, boot.stderr);
    const creds = JSON.parse(boot.stdout);
    agent.client.secretsSeen.add(creds.client_secret);
    assert.equal(typeof creds.client_id, 'string');
    assert.equal(typeof creds.client_secret, 'string');
    const license = JSON.parse(readFileSync(join(agent.dataDir, 'dev-license.json'), 'utf8'));
    assert.equal(creds.license_id, license.license_id);

    assert.match(lines[1]!, /CLIENT_ID:CLIENT_SECRET/);
    const tok = await sh(
      lines[1]!.replace('CLIENT_ID:CLIENT_SECRET', `${creds.client_id}:${creds.client_secret}`),
    );
    assert.equal(tok.code, 0, tok.stderr);
    const token = JSON.parse(tok.stdout);
    agent.client.secretsSeen.add(token.access_token);
    assert.equal(token.token_type, 'Bearer');
    assert.equal(token.expires_in, 3600);

    assert.match(lines[2]!, /ACCESS_TOKEN/);
    const peers = await sh(lines[2]!.replace('ACCESS_TOKEN', token.access_token));
    assert.equal(peers.code, 0, peers.stderr);
    const list = JSON.parse(peers.stdout);
    assert.equal(list.length, 1);
    assert.equal(list[0].is_local, true);
    assert.equal(list[0].id, creds.peer_id);

    // Running the bootstrap line again is a clean 409, not a second bootstrap.
    const again = await sh(`${lines[0]!} -o /dev/null -w '%{http_code}'`);
    assert.equal(again.stdout, '409');
  });

  it('keeps its dev key and trial license across a restart, and stays bootstrapped', async () => {
    const pub = readFileSync(join(agent.dataDir, 'dev-license-signing.pub'), 'utf8');
    const license = readFileSync(join(agent.dataDir, 'dev-license.json'), 'utf8');
    assert.equal(await agent.stop(), 0);
    await agent.restart();
    assert.equal(readFileSync(join(agent.dataDir, 'dev-license-signing.pub'), 'utf8'), pub);
    assert.equal(readFileSync(join(agent.dataDir, 'dev-license.json'), 'utf8'), license);
    const id = await agent.client.get('/v1/cluster/identity');
    assert.equal(id.body.license_id, JSON.parse(license).license_id);
  });
});

describe('serve without --dev and without --license-public-key', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  before(async () => {
    agent = await AgentProcess.start({});
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('warns at start that no license key is trusted', () => {
    assert.match(agent.logs, /no license signing key is trusted/i);
    assert.ok(!existsSync(join(agent.dataDir, 'dev-license-signing.key')), 'no dev key without --dev');
  });

  it('refuses every bootstrap with 422 LICENSE_INVALID naming the reason, and stays unbootstrapped', async () => {
    const dev = makeVendor();
    for (const license of [vendor.sign(), dev.sign({ customer_id: 'dev' })]) {
      const res = await agent.client.post('/v1/bootstrap', { json: { license } });
      assertError(res, 422, 'LICENSE_INVALID');
      assert.match(res.body.error, /--license-public-key/);
      assert.match(res.body.error, /trust/i);
    }
    // Shape is still checked first.
    assertError(await agent.client.post('/v1/bootstrap', { json: { license: {} } }), 400, 'INVALID_REQUEST');
    const id = await agent.client.get('/v1/cluster/identity');
    assert.equal(id.body.license_id, null);
  });
});

describe('serve with a wildcard --listen and --advertise', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  const advertise = 'agent-a.example.test:7480';
  before(async () => {
    const port = await freePort();
    agent = await AgentProcess.start({
      vendor,
      port,
      extraArgs: ['--listen', `0.0.0.0:${port}`, '--advertise', advertise],
    });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('starts, and uses the advertised address for the local peer and the issuer', async () => {
    const res = await agent.client.post('/v1/bootstrap', { json: { license: vendor.sign() } });
    assert.equal(res.status, 201, res.text);
    const token = await agent.client.token(res.body.client_id, res.body.client_secret);
    const peers = await agent.client.get('/v1/peers', { token });
    assert.equal(peers.body[0].address, advertise);
    const d = await agent.client.get('/.well-known/openid-configuration');
    assert.equal(d.body.issuer, `http://${advertise}`);
  });
});

describe('serve start-up errors', () => {
  it('exits 2 with a message for a wildcard --listen without --advertise', async () => {
    const port = await freePort();
    const dataDir = mkdtempSync(join(tmpdir(), 'mesh-serve-'));
    const runs = await Promise.all([
      runServe(['--listen', `0.0.0.0:${port}`, '--data-dir', dataDir]),
      runServe(['--listen', `[::]:${port}`, '--data-dir', dataDir]),
      runServe(['--data-dir', dataDir], { MESH_LISTEN: `0.0.0.0:${port}` }),
      runServe(['--listen', `0.0.0.0:${port}`, '--data-dir', dataDir, '--dev']),
    ]);
    for (const r of runs) {
      assert.equal(r.code, 2, `exit ${r.code}: ${r.stderr}${r.stdout}`);
      assert.match(r.stderr, /--advertise/);
      assert.match(r.stderr, /wildcard|reachable/i);
      assert.doesNotMatch(r.stderr, /\n\s+at /, 'no stack trace');
    }
  });

  it('exits 2 with a message naming the flag for other bad serve flags', async () => {
    const port = await freePort();
    const dataDir = mkdtempSync(join(tmpdir(), 'mesh-serve-'));
    const base = ['--data-dir', dataDir];
    const cases: [string[], RegExp][] = [
      [['--listen', 'localhost'], /--listen/],
      [['--listen', '127.0.0.1:70000'], /--listen/],
      [['--listen', `127.0.0.1:${port}`, '--advertise', 'nowhere'], /--advertise/],
      [['--listen', `127.0.0.1:${port}`, '--license-public-key', 'not-a-key'], /--license-public-key/],
      [['--listen', `127.0.0.1:${port}`, '--dataplane', 'maybe'], /--dataplane/],
      [['--listen', `127.0.0.1:${port}`, '--tls-cert', '/nonexistent.pem'], /--tls-(cert|key)/],
      [['--listen', `127.0.0.1:${port}`, '--public-url', 'ftp://example.test'], /--public-url/],
      [['--listen', `127.0.0.1:${port}`, '--no-such-flag'], /no-such-flag|unknown/i],
      // The test hooks left the product (tests move clocks and cut gossip from outside).
      [['--listen', `127.0.0.1:${port}`, '--test-hooks'], /test-hooks/],
    ];
    const runs = await Promise.all(cases.map(([args]) => runServe([...base, ...args])));
    cases.forEach(([args, message], i) => {
      const r = runs[i]!;
      assert.equal(r.code, 2, `${args.join(' ')}: exit ${r.code}: ${r.stderr}${r.stdout}`);
      assert.match(r.stderr, message, args.join(' '));
    });
  });
});
