/**
 * A full run at the most verbose log level — bootstrap (after a refused one), tokens by
 * client_secret_post and client_secret_basic, failed attempts with wrong secrets in the body and
 * in Basic, credential creation, cluster credential rotation, revocation — and then the whole
 * agent log is searched for every secret, token, Basic header and license signature the run
 * handled. The log is JSON lines, and request lines carry the request id as `reqId`.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { AgentProcess } from '../helpers/agent-process.js';
import { sleep } from '../helpers/api-assertions.js';
import { makeVendor } from '../helpers/licenses.js';

const basic = (id: string, secret: string) => `Basic ${Buffer.from(`${id}:${secret}`).toString('base64')}`;
const wrongSecret = () => randomBytes(32).toString('base64url');

describe('no secrets in the agent log', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  /** Everything that must never reach the log, with a label for the failure message. */
  const secrets = new Map<string, string>();
  const remember = (label: string, value: unknown) => {
    assert.equal(typeof value, 'string', label);
    assert.ok((value as string).length >= 16, `${label} is long enough to search for`);
    secrets.set(value as string, label);
  };
  const rememberToken = (label: string, token: string) => {
    remember(label, token);
    const [, payload, signature] = token.split('.');
    remember(`${label} (signature part)`, signature);
    assert.ok(payload);
  };
  let exitCode: number | null = null;

  before(async () => {
    agent = await AgentProcess.start({ vendor, extraArgs: ['--log-level', 'trace'] });
  });
  after(async () => {
    if (exitCode === null) await agent.stop();
  });

  it('runs bootstrap, tokens, failed attempts, credentials and rotation', async () => {
    const c = agent.client;
    const tampered = { ...vendor.sign({ license_id: 'lic-refused' }), max_nodes: 1000 };
    remember('refused license signature', tampered.signature);
    assert.equal((await c.post('/v1/bootstrap', { json: { license: tampered } })).status, 422);

    const license = vendor.sign({ license_id: 'lic-logs' });
    remember('license signature', license.signature);
    const boot = await c.post('/v1/bootstrap', { json: { license, name: 'logs' } });
    assert.equal(boot.status, 201);
    const admin = { id: boot.body.client_id as string, secret: boot.body.client_secret as string };
    remember('bootstrap client_secret', admin.secret);

    // client_secret_post
    const posted = await c.tokenResponse(admin.id, admin.secret);
    assert.equal(posted.status, 200);
    rememberToken('token (post)', posted.body.access_token);
    const token = posted.body.access_token as string;

    // client_secret_basic
    const basicHeader = basic(admin.id, admin.secret);
    remember('Basic header (admin)', basicHeader.slice('Basic '.length));
    const viaBasic = await c.post('/v1/oauth/token', {
      form: { grant_type: 'client_credentials' },
      headers: { authorization: basicHeader },
    });
    assert.equal(viaBasic.status, 200, viaBasic.text);
    rememberToken('token (basic)', viaBasic.body.access_token);

    // Wrong secrets: in the body, in Basic for a real client, in Basic for an unknown client.
    const wrong1 = wrongSecret();
    remember('wrong secret (post)', wrong1);
    assert.equal((await c.tokenResponse(admin.id, wrong1)).status, 401);
    const wrong2 = wrongSecret();
    remember('wrong secret (basic)', wrong2);
    remember('Basic header (wrong)', basic(admin.id, wrong2).slice(6));
    const r2 = await c.post('/v1/oauth/token', {
      form: { grant_type: 'client_credentials' },
      headers: { authorization: basic(admin.id, wrong2) },
    });
    assert.equal(r2.status, 401);
    const wrong3 = wrongSecret();
    remember('wrong secret (unknown client)', wrong3);
    remember('Basic header (unknown client)', basic('mc_nobody', wrong3).slice(6));
    const r3 = await c.post('/v1/oauth/token', {
      form: { grant_type: 'client_credentials' },
      headers: { authorization: basic('mc_nobody', wrong3) },
    });
    assert.equal(r3.status, 401);
    // A secret sent both ways at once is refused too, and not logged.
    const wrong4 = wrongSecret();
    remember('wrong secret (both ways)', wrong4);
    const r4 = await c.post('/v1/oauth/token', {
      form: { grant_type: 'client_credentials', client_id: admin.id, client_secret: wrong4 },
      headers: { authorization: basic(admin.id, admin.secret) },
    });
    assert.ok(r4.status === 400 || r4.status === 401, r4.text);

    // A forged bearer token and a malformed Authorization header.
    const forged = `${token.slice(0, -6)}AAAAAA`;
    remember('forged token', forged);
    assert.equal(
      (await c.get('/v1/credentials', { headers: { authorization: `Bearer ${forged}` } })).status,
      401,
    );
    const junkBearer = `Bearer ${wrongSecret()} extra`;
    remember('junk bearer', junkBearer.slice(7));
    assert.equal((await c.get('/v1/peers', { headers: { authorization: junkBearer } })).status, 401);

    // Credentials: create, use by Basic, revoke, and the revoked token refused.
    const made = await c.post('/v1/credentials', { json: { scopes: [] }, token });
    assert.equal(made.status, 201);
    remember('created client_secret', made.body.client_secret);
    const madeTok = await c.post('/v1/oauth/token', {
      form: { grant_type: 'client_credentials' },
      headers: { authorization: basic(made.body.client_id, made.body.client_secret) },
    });
    assert.equal(madeTok.status, 200);
    rememberToken('token of the created credential', madeTok.body.access_token);
    assert.equal((await c.get('/v1/credentials', { token: madeTok.body.access_token })).status, 200);
    assert.equal((await c.delete(`/v1/credentials/${made.body.client_id}`, { token })).status, 200);
    assert.equal((await c.get('/v1/credentials', { token: madeTok.body.access_token })).status, 401);
    assert.equal((await c.tokenResponse(made.body.client_id, made.body.client_secret)).status, 401);

    // Cluster credential rotation, twice.
    for (let i = 0; i < 2; i++) {
      const rot = await c.post('/v1/cluster/credentials/rotate', { token });
      assert.equal(rot.status, 200);
      remember(`cluster secret ${i + 1}`, rot.body.client_secret);
    }

    // Reads with the token, one with a request id of ours.
    assert.equal(
      (await c.get('/v1/peers', { token, headers: { 'x-request-id': 'trace-logs-1' } })).status,
      200,
    );
    assert.equal((await c.get('/v1/cluster/credentials', { token })).status, 200);
  });

  it('stops with exit code 0', async () => {
    exitCode = await agent.stop();
    assert.equal(exitCode, 0);
  });

  it('never wrote a secret, token, Basic header or license signature to the log', () => {
    assert.ok(secrets.size >= 20, `${secrets.size} values searched`);
    const log = agent.logs;
    assert.ok(log.length > 1000, 'the log is not empty');
    const leaked = [...secrets].filter(([value]) => log.includes(value)).map(([, label]) => label);
    assert.deepEqual(leaked, [], `found in the agent log: ${leaked.join(', ')}`);
    // And what the test client saw on its own (every client_secret and access_token answered).
    agent.assertNoSecretsInLogs();
  });

  /** Node's own process warnings on stderr (e.g. a dependency's deprecation notice). */
  const isNodeWarning = (line: string) => /^\(node:\d+\) /.test(line) || /^\(Use `node --trace-/.test(line);

  it('writes JSON lines, and every request line carries its request id as reqId', () => {
    const lines = agent.logs.split('\n').filter((l) => l.trim() !== '' && !isNodeWarning(l));
    const entries = lines.map((line): Record<string, unknown> => {
      try {
        return JSON.parse(line) as Record<string, unknown>;
      } catch {
        return assert.fail(`a log line is not JSON: ${line}`);
      }
    });
    // Request lines: Fastify's own (req/res, "incoming request", "request completed") or the
    // agent's one line per request ("request", with method, path and status).
    const isRequestLine = (e: Record<string, unknown>) =>
      'req' in e ||
      'res' in e ||
      ['incoming request', 'request completed', 'request'].includes(e.msg as string) ||
      ('method' in e && 'status' in e);
    const requestLines = entries.filter(isRequestLine);
    for (const e of requestLines) {
      assert.equal(typeof e.reqId, 'string', `request line without reqId: ${JSON.stringify(e)}`);
      assert.ok((e.reqId as string).length > 0);
    }
    // Every request of the run was logged: about 25 of them, each under its own id.
    const ids = new Set(requestLines.map((e) => e.reqId));
    assert.ok(ids.size >= 20, `${ids.size} requests logged`);
    // Lines the handlers write inside a request carry its id too.
    for (const msg of [
      'agent bootstrapped',
      'credential created',
      'credential revoked',
      'cluster credential rotated',
    ]) {
      const line = entries.find((e) => e.msg === msg);
      assert.ok(line, `a "${msg}" line`);
      assert.equal(typeof line.reqId, 'string', `"${msg}" carries reqId`);
      assert.ok(ids.has(line.reqId), `"${msg}" is tied to a logged request`);
    }
    // The caller's x-request-id is the reqId of its lines.
    assert.ok(
      requestLines.some((e) => e.reqId === 'trace-logs-1'),
      'x-request-id trace-logs-1 is the reqId',
    );
  });

  it('writes nothing but JSON to its output: no Node.js process warnings', () => {
    const warnings = agent.logs.split('\n').filter(isNodeWarning);
    assert.deepEqual(warnings, []);
  });
});

describe('no secrets in the agent log: a client_secret sent in the URL', () => {
  let agent: AgentProcess;
  before(async () => {
    agent = await AgentProcess.start({ vendor: makeVendor() });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('does not log a client_secret that a client wrongly put in the token request URL', async () => {
    const secret = wrongSecret();
    const res = await agent.client.raw('POST', `/v1/oauth/token?client_id=mc_x&client_secret=${secret}`, {
      form: 'grant_type=client_credentials',
    });
    assert.ok(res.status === 400 || res.status === 401, res.text);
    await sleep(100);
    assert.ok(!agent.logs.includes(secret), 'the secret from the URL is in the log');
  });
});
