/**
 * `mesh-agent license keygen` and `license sign` (docs/decisions.md §1, §2): the key files and their
 * modes, the License printed on stdout, and that such a license bootstraps an agent trusting the
 * .pub (as a PEM file or as base64 of the raw key) and no other. Bad flags exit 2.
 */
import assert from 'node:assert/strict';
import { createPrivateKey, createPublicKey } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { AgentProcess } from '../helpers/agent-process.js';
import { assertError } from '../helpers/api-assertions.js';
import { runCli } from '../helpers/cli.js';

const LICENSE_FIELDS = [
  'customer_id',
  'expires_at',
  'issued_at',
  'license_id',
  'max_nodes',
  'max_services',
  'signature',
];
const ISO_MS_Z = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const inDays = (d: number) => new Date(Date.now() + d * 86_400_000).toISOString();

async function keygen(): Promise<{ dir: string; key: string; pub: string }> {
  const dir = join(mkdtempSync(join(tmpdir(), 'mesh-cli-')), 'keys', 'nested');
  const res = await runCli(['license', 'keygen', '--out', dir]);
  assert.equal(res.code, 0, res.stderr);
  return { dir, key: join(dir, 'license-signing.key'), pub: join(dir, 'license-signing.pub') };
}

function signArgs(key: string, overrides: Record<string, string> = {}): string[] {
  const flags: Record<string, string> = {
    '--key': key,
    '--customer-id': 'acme',
    '--license-id': 'lic-cli',
    '--max-nodes': '4',
    '--max-services': '9',
    '--expires-at': inDays(30),
    ...overrides,
  };
  return ['license', 'sign', ...Object.entries(flags).flat()];
}

async function sign(key: string, overrides: Record<string, string> = {}): Promise<Record<string, unknown>> {
  const res = await runCli(signArgs(key, overrides));
  assert.equal(res.code, 0, res.stderr);
  return JSON.parse(res.stdout) as Record<string, unknown>;
}

describe('mesh-agent license keygen and sign', () => {
  let keys: { dir: string; key: string; pub: string };
  let agent: AgentProcess;

  before(async () => {
    keys = await keygen();
    agent = await AgentProcess.start({ extraArgs: ['--license-public-key', keys.pub] });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('keygen writes a PKCS#8 PEM .key with mode 0600 and the matching SPKI PEM .pub, creating the directory', () => {
    const keyText = readFileSync(keys.key, 'utf8');
    const pubText = readFileSync(keys.pub, 'utf8');
    assert.match(keyText, /^-----BEGIN PRIVATE KEY-----\n/);
    assert.match(pubText, /^-----BEGIN PUBLIC KEY-----\n/);
    assert.equal(statSync(keys.key).mode & 0o777, 0o600, 'the private key is 0600');
    assert.equal(statSync(keys.pub).mode & 0o077 & 0o022, 0, 'the public key is not group/world writable');
    const priv = createPrivateKey(keyText);
    assert.equal(priv.asymmetricKeyType, 'ed25519');
    const pub = createPublicKey(pubText);
    assert.equal(pub.asymmetricKeyType, 'ed25519');
    assert.equal(
      createPublicKey(priv).export({ type: 'spki', format: 'pem' }).toString(),
      pub.export({ type: 'spki', format: 'pem' }).toString(),
      'the .pub is the public half of the .key',
    );
    // Nothing but the two files.
    assert.ok(!keyText.includes('PUBLIC'));
  });

  it('sign prints exactly the License object with UTC timestamps and integer limits', async () => {
    const before = Date.now();
    const lic = await sign(keys.key, { '--expires-at': '2031-06-01T12:00:00+02:00' });
    assert.deepEqual(Object.keys(lic).sort(), LICENSE_FIELDS);
    assert.equal(lic.customer_id, 'acme');
    assert.equal(lic.license_id, 'lic-cli');
    assert.equal(lic.max_nodes, 4);
    assert.equal(lic.max_services, 9);
    assert.equal(lic.expires_at, '2031-06-01T10:00:00.000Z');
    assert.match(lic.issued_at as string, ISO_MS_Z);
    assert.ok(Math.abs(Date.parse(lic.issued_at as string) - before) < 60_000, 'issued_at defaults to now');
    const sig = Buffer.from(lic.signature as string, 'base64');
    assert.equal(sig.length, 64, 'Ed25519 signature');
    assert.equal(sig.toString('base64'), lic.signature, 'standard base64 with padding');

    const explicit = await sign(keys.key, { '--issued-at': '2025-01-02T03:04:05Z' });
    assert.equal(explicit.issued_at, '2025-01-02T03:04:05.000Z');
  });

  it('a signed but expired license is refused with 422 LICENSE_EXPIRED', async () => {
    const lic = await sign(keys.key, { '--issued-at': inDays(-60), '--expires-at': inDays(-1) });
    const res = await agent.client.post('/v1/bootstrap', { json: { license: lic } });
    assertError(res, 422, 'LICENSE_EXPIRED');
  });

  it('a license signed by another keygen key is refused with 422 LICENSE_INVALID', async () => {
    const other = await keygen();
    const res = await agent.client.post('/v1/bootstrap', { json: { license: await sign(other.key) } });
    assertError(res, 422, 'LICENSE_INVALID');
  });

  it('a license from sign bootstraps the agent trusting the .pub file', async () => {
    const lic = await sign(keys.key, { '--max-services': '0', '--max-nodes': '1' });
    const res = await agent.client.post('/v1/bootstrap', { json: { license: lic, name: 'cli' } });
    assert.equal(res.status, 201, res.text);
    assert.equal(res.body.license_id, 'lic-cli');
    assert.equal(res.body.max_nodes, 1);
    assert.equal(res.body.max_services, 0);
    assert.equal(res.body.expires_at, lic.expires_at);
    const token = await agent.client.token(res.body.client_id, res.body.client_secret);
    assert.equal((await agent.client.get('/v1/peers', { token })).status, 200);
  });

  it('keygen refuses bad flags with exit code 2 and a usage message', async () => {
    const cases = [
      ['license', 'keygen'],
      ['license', 'keygen', '--out'],
      ['license', 'keygen', '--out', keys.dir, '--force-everything'],
    ];
    const results = await Promise.all(cases.map((args) => runCli(args)));
    cases.forEach((args, i) => {
      const res = results[i]!;
      assert.equal(res.code, 2, `${args.join(' ')}: ${res.stderr}`);
      assert.match(res.stderr, /usage|--out|unknown|unexpected/i, args.join(' '));
      assert.equal(res.stdout, '', 'nothing on stdout');
    });
  });

  it('keygen refuses to overwrite an existing signing key unless given --force', async () => {
    const before = readFileSync(keys.key, 'utf8');
    const refused = await runCli(['license', 'keygen', '--out', keys.dir]);
    assert.equal(refused.code, 2, refused.stderr);
    assert.match(refused.stderr, /exists; refusing to overwrite/);
    assert.equal(readFileSync(keys.key, 'utf8'), before, 'the key is untouched');
    const other = join(mkdtempSync(join(tmpdir(), 'mesh-cli-')), 'k');
    assert.equal((await runCli(['license', 'keygen', '--out', other])).code, 0);
    const first = readFileSync(join(other, 'license-signing.key'), 'utf8');
    assert.equal((await runCli(['license', 'keygen', '--out', other, '--force'])).code, 0);
    assert.notEqual(readFileSync(join(other, 'license-signing.key'), 'utf8'), first, '--force replaces it');
  });

  it('sign refuses bad flags with exit code 2 and names the flag', async () => {
    const required = [
      '--key',
      '--customer-id',
      '--license-id',
      '--max-nodes',
      '--max-services',
      '--expires-at',
    ];
    const cases: [Record<string, string>, string[], RegExp][] = [
      // Every required flag missing: one message names them all.
      [{}, required, new RegExp(required.join('.*'))],
      [{}, ['--license-id'], /--license-id/],
      [{ '--max-nodes': '0' }, [], /--max-nodes/],
      [{ '--max-nodes': '2.5' }, [], /--max-nodes/],
      [{ '--max-services': '-1' }, [], /--max-services/],
      [{ '--max-services=-1': '' }, ['--max-services'], /--max-services/],
      [{ '--max-services': 'many' }, [], /--max-services/],
      [{ '--expires-at': 'next year' }, [], /--expires-at/],
      [{ '--expires-at': '2030-01-01' }, [], /--expires-at/],
      [{ '--issued-at': 'yesterday' }, [], /--issued-at/],
      [{ '--colour': 'blue' }, [], /colour|unknown/i],
    ];
    const argLists = cases.map(([overrides, drop]) => {
      const args = signArgs(keys.key, overrides).filter((a) => a !== '');
      for (const flag of drop) args.splice(args.indexOf(flag), 2);
      return args;
    });
    const results = await Promise.all(argLists.map((args) => runCli(args)));
    cases.forEach(([overrides, drop, message], i) => {
      const res = results[i]!;
      const what = `${JSON.stringify(overrides)} without ${drop.join(',')}`;
      assert.equal(res.code, 2, `${what}: exit ${res.code} ${res.stderr}`);
      assert.match(res.stderr, message, what);
      assert.equal(res.stdout, '', `${what}: nothing on stdout`);
    });
    // An unknown sub-command is a usage error too.
    assert.equal((await runCli(['license', 'frobnicate'])).code, 2);
  });

  it('sign fails with a message (exit 1) for a key file that is missing or not a private key, printing no license', async () => {
    const junk = join(keys.dir, 'junk.key');
    writeFileSync(junk, 'not a key', { mode: 0o600 });
    const files = [join(keys.dir, 'missing.key'), keys.pub, junk];
    const results = await Promise.all(files.map((key) => runCli(signArgs(key))));
    files.forEach((key, i) => {
      const res = results[i]!;
      assert.ok(res.code === 1 || res.code === 2, `${key}: exit ${res.code}`);
      assert.match(res.stderr, /mesh-agent:/, key);
      assert.doesNotMatch(res.stderr, /\n\s+at /, `${key}: no stack trace`);
      assert.equal(res.stdout, '', key);
    });
  });
});

describe('a license from the CLI with the public key given as base64', () => {
  let keys: { dir: string; key: string; pub: string };
  let agent: AgentProcess;

  before(async () => {
    keys = await keygen();
    const raw = createPublicKey(readFileSync(keys.pub, 'utf8')).export({ format: 'jwk' }).x as string;
    const base64 = Buffer.from(raw, 'base64url').toString('base64');
    agent = await AgentProcess.start({ extraArgs: ['--license-public-key', base64] });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('bootstraps an agent started with --license-public-key <base64 of the 32 raw bytes>', async () => {
    assert.ok(existsSync(keys.key));
    const lic = await sign(keys.key, { '--license-id': 'lic-b64' });
    const res = await agent.client.post('/v1/bootstrap', { json: { license: lic } });
    assert.equal(res.status, 201, res.text);
    assert.equal(res.body.license_id, 'lic-b64');
  });
});
