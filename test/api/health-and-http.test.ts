/**
 * Health probes and the generic HTTP rules of docs/decisions.md §3: unknown path 404 NOT_FOUND, wrong
 * method 405 METHOD_NOT_ALLOWED with Allow, a body that is not a JSON object 400, 413 over 1 MiB
 * (lightly: fuzzing covers it), 201 for creates and 200 `{deleted: true}`, timestamps in UTC
 * with milliseconds and Z, and the request id echoed in `x-request-id`.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { REQUEST_TIMEOUT_MS } from '../../src/api/app.js';
import { scope } from '../../src/domain/scopes.js';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import { assertError, assertTimestamp, ISO_MS_Z } from '../helpers/api-assertions.js';
import type { ApiResponse } from '../helpers/api-client.js';
import { makeVendor } from '../helpers/licenses.js';

const allowOf = (res: ApiResponse): string[] =>
  String(res.headers.allow ?? '')
    .split(',')
    .map((m) => m.trim())
    .filter(Boolean);

describe('health probes and HTTP rules', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  let admin: { clientId: string; clientSecret: string };
  let adminToken: string;

  before(async () => {
    agent = await AgentProcess.start({ vendor });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('GET /livez and /readyz answer 200 {status: ok, timestamp} without a token, before bootstrap', async () => {
    for (const path of ['/livez', '/readyz']) {
      const res = await agent.client.get(path);
      assert.equal(res.status, 200, `${path}: ${res.text}`);
      assert.match(String(res.headers['content-type']), /^application\/json/);
      assert.equal(res.body.status, 'ok');
      assertTimestamp(res.body.timestamp, `${path} timestamp`, Date.now());
      assert.ok(!('reasons' in res.body) || res.body.reasons.length === 0);
    }
  });

  it('GET /livez and /readyz still answer 200 after bootstrap, and ignore a bad token', async () => {
    admin = await bootstrap(agent, vendor);
    adminToken = await agent.client.token(admin.clientId, admin.clientSecret);
    for (const path of ['/livez', '/readyz']) {
      const res = await agent.client.get(path, { headers: { authorization: 'Bearer garbage' } });
      assert.equal(res.status, 200);
      assert.equal(res.body.status, 'ok');
    }
    const head = await agent.client.raw('HEAD', '/livez');
    assert.equal(head.status, 200);
    assert.equal(head.text, '');
  });

  it('answers 404 NOT_FOUND with the error body for unknown paths, with or without a token', async () => {
    const paths = [
      '/',
      '/v1',
      '/v1/',
      '/v1/nothing',
      '/v2/peers',
      '/livez/',
      '/livez/extra',
      '/v1/credentials/a/b',
      '/v1/peers/a/b',
      '/.well-known/nothing',
      '/v1/cluster',
      '/V1/PEERS',
    ];
    for (const path of paths) {
      assertError(await agent.client.get(path), 404, 'NOT_FOUND', `GET ${path}`);
      assertError(await agent.client.get(path, { token: adminToken }), 404, 'NOT_FOUND', `GET ${path} token`);
      assertError(await agent.client.post(path, { json: {} }), 404, 'NOT_FOUND', `POST ${path}`);
    }
  });

  it('answers 405 METHOD_NOT_ALLOWED with Allow for a wrong method on a known path, before any token check', async () => {
    const cases: [string, string, string[]][] = [
      ['DELETE', '/livez', ['GET']],
      ['POST', '/readyz', ['GET']],
      ['GET', '/v1/bootstrap', ['POST']],
      ['PUT', '/v1/bootstrap', ['POST']],
      ['GET', '/v1/oauth/token', ['POST']],
      ['POST', '/.well-known/openid-configuration', ['GET']],
      ['PUT', '/.well-known/jwks.json', ['GET']],
      ['POST', '/v1/cluster/identity', ['GET']],
      ['PUT', '/v1/credentials', ['GET', 'POST']],
      ['PATCH', '/v1/credentials', ['GET', 'POST']],
      ['DELETE', '/v1/credentials', ['GET', 'POST']],
      ['GET', '/v1/credentials/mc_x', ['DELETE']],
      ['POST', '/v1/credentials/mc_x', ['DELETE']],
      ['DELETE', '/v1/cluster/credentials', ['GET']],
      ['GET', '/v1/cluster/credentials/rotate', ['POST']],
      ['PATCH', '/v1/peers', ['GET']],
    ];
    for (const [method, path, expected] of cases) {
      for (const token of [undefined, adminToken]) {
        const res = await agent.client.request(method, path, {
          json: method === 'GET' ? undefined : {},
          token,
        });
        const what = `${method} ${path}${token ? ' with token' : ''}`;
        assertError(res, 405, 'METHOD_NOT_ALLOWED', what);
        const allow = allowOf(res);
        for (const m of expected) assert.ok(allow.includes(m), `${what}: Allow ${allow} has ${m}`);
        assert.ok(!allow.includes(method), `${what}: Allow ${allow} does not list ${method}`);
      }
    }
  });

  it('answers 405 with Allow for OPTIONS on a known path', async () => {
    const res = await agent.client.raw('OPTIONS', '/v1/credentials');
    assertError(res, 405, 'METHOD_NOT_ALLOWED', 'OPTIONS /v1/credentials');
    assert.ok(allowOf(res).includes('GET'));
  });

  it('answers 400 INVALID_REQUEST for a body that is not JSON or not a JSON object', async () => {
    const bodies: [string, Record<string, string>][] = [
      ['{"license": ', { 'content-type': 'application/json' }],
      ['{license: 1}', { 'content-type': 'application/json' }],
      ['', { 'content-type': 'application/json' }],
      ['[]', { 'content-type': 'application/json' }],
      ['"text"', { 'content-type': 'application/json' }],
      ['null', { 'content-type': 'application/json' }],
      ['123', { 'content-type': 'application/json' }],
      ['true', { 'content-type': 'application/json' }],
      ['hello', { 'content-type': 'text/plain' }],
      ['license=x', { 'content-type': 'application/x-www-form-urlencoded' }],
      ['{"a":1}', { 'content-type': 'application/xml' }],
      ['{"a":1}', {}],
    ];
    for (const path of ['/v1/bootstrap', '/v1/credentials']) {
      for (const [body, headers] of bodies) {
        const res = await agent.client.post(path, { body, headers, token: adminToken });
        assertError(
          res,
          400,
          'INVALID_REQUEST',
          `${path} ${headers['content-type']} ${JSON.stringify(body)}`,
        );
      }
    }
    // A POST with no body at all.
    assertError(await agent.client.post('/v1/bootstrap'), 400, 'INVALID_REQUEST', 'no body');
  });

  it('answers 413 PAYLOAD_TOO_LARGE for a body over 1 MiB, and takes one just under', async () => {
    const big = JSON.stringify({ scopes: [], padding: 'x'.repeat(1024 * 1024 + 10) });
    assertError(
      await agent.client.post('/v1/bootstrap', {
        body: big,
        headers: { 'content-type': 'application/json' },
      }),
      413,
      'PAYLOAD_TOO_LARGE',
      'bootstrap',
    );
    assertError(
      await agent.client.post('/v1/credentials', {
        body: big,
        token: adminToken,
        headers: { 'content-type': 'application/json' },
      }),
      413,
      'PAYLOAD_TOO_LARGE',
      'credentials',
    );
    const justUnder = JSON.stringify({
      scopes: [scope('peers.read')],
      padding: 'x'.repeat(1024 * 1024 - 100),
    });
    assert.ok(Buffer.byteLength(justUnder) <= 1024 * 1024);
    const ok = await agent.client.post('/v1/credentials', {
      body: justUnder,
      token: adminToken,
      headers: { 'content-type': 'application/json' },
    });
    assert.equal(ok.status, 201, ok.text.slice(0, 200));
  });

  it('after an early 413, reads the rest of the body before it closes, so the client keeps the answer', async () => {
    // The client reads the 413 before it has sent most of its body, then sends the rest. An
    // agent that closed at once would leave those bytes unread, and its kernel would answer
    // them with a reset: the client's writes fail and an unread answer is lost.
    const length = 2 * 1024 * 1024;
    const socket = net.connect(agent.port, '127.0.0.1');
    const errors: string[] = [];
    socket.on('error', (err: NodeJS.ErrnoException) => errors.push(String(err.code)));
    let received = '';
    const answered = new Promise<void>((resolve) =>
      socket.on('data', (d) => {
        received += d.toString('latin1');
        if (received.includes('\r\n\r\n')) resolve();
      }),
    );
    const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
    socket.write(
      `POST /v1/bootstrap HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${length}\r\n\r\n`,
    );
    socket.write(Buffer.alloc(64 * 1024, 0x20));
    await answered;
    assert.match(received, /^HTTP\/1\.1 413 /);
    const rest = Buffer.alloc(length - 64 * 1024, 0x20);
    for (let at = 0; at < rest.length && !socket.destroyed; at += 256 * 1024) {
      await new Promise<void>((resolve) => socket.write(rest.subarray(at, at + 256 * 1024), () => resolve()));
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    // A request pipelined behind the refused body is never handled: it would write, and its
    // answer could not be sent.
    const credentialsBefore = (await agent.client.get('/v1/credentials', { token: adminToken })).body.length;
    const pipelined = JSON.stringify({ scopes: [scope('peers.read')] });
    socket.write(
      `POST /v1/credentials HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${adminToken}\r\n` +
        `content-type: application/json\r\ncontent-length: ${pipelined.length}\r\n\r\n${pipelined}`,
    );
    await closed;
    assert.equal(
      (await agent.client.get('/v1/credentials', { token: adminToken })).body.length,
      credentialsBefore,
    );
    assert.equal(received.match(/HTTP\/1\.1 /g)?.length, 1, 'one answer only');
    assert.deepEqual(errors, [], 'the client was reset while it sent the refused body');
    const body = JSON.parse(received.slice(received.indexOf('\r\n\r\n') + 4));
    assert.equal(body.code, 'PAYLOAD_TOO_LARGE');
  });

  it('answers 201 for creates, 200 for rotate, 200 {deleted: true} for DELETE', async () => {
    const created = await agent.client.post('/v1/credentials', { json: { scopes: [] }, token: adminToken });
    assert.equal(created.status, 201);
    const rotated = await agent.client.post('/v1/cluster/credentials/rotate', { token: adminToken });
    assert.equal(rotated.status, 200);
    const deleted = await agent.client.delete(`/v1/credentials/${created.body.client_id}`, {
      token: adminToken,
    });
    assert.equal(deleted.status, 200);
    assert.deepEqual(deleted.body, { deleted: true });
  });

  it('ignores unknown query parameters and unknown body fields', async () => {
    assert.equal((await agent.client.get('/v1/credentials?page=2&x=y', { token: adminToken })).status, 200);
    assert.equal((await agent.client.get('/v1/peers?sort=name', { token: adminToken })).status, 200);
    const res = await agent.client.post('/v1/credentials', {
      json: { scopes: [scope('peers.read')], comment: 'extra', nested: { a: [1] } },
      token: adminToken,
    });
    assert.equal(res.status, 201, res.text);
  });

  it('writes every timestamp it answers in UTC with milliseconds and Z', async () => {
    const seen: [string, unknown][] = [];
    const collect = (where: string, value: unknown, key = ''): void => {
      if (Array.isArray(value)) {
        for (const [i, v] of value.entries()) collect(`${where}[${i}]`, v);
      } else if (value && typeof value === 'object') {
        for (const [k, v] of Object.entries(value)) collect(`${where}.${k}`, v, k);
      } else if (/(_at|timestamp)$/.test(key) && value !== null) seen.push([where, value]);
    };
    collect('livez', (await agent.client.get('/livez')).body);
    collect('readyz', (await agent.client.get('/readyz')).body);
    collect('credentials', (await agent.client.get('/v1/credentials', { token: adminToken })).body);
    collect('created', (await agent.client.post('/v1/credentials', { json: {}, token: adminToken })).body);
    collect(
      'cluster credential',
      (await agent.client.get('/v1/cluster/credentials', { token: adminToken })).body,
    );
    collect(
      'rotate',
      (await agent.client.post('/v1/cluster/credentials/rotate', { token: adminToken })).body,
    );
    collect('peers', (await agent.client.get('/v1/peers', { token: adminToken })).body);
    assert.ok(seen.length >= 8, `saw ${seen.length} timestamps`);
    for (const [where, value] of seen) assert.match(String(value), ISO_MS_Z, where);
  });

  it('echoes a plain x-request-id, on success and on every kind of error', async () => {
    const answers: [string, ApiResponse][] = [
      ['livez', await agent.client.get('/livez', { headers: { 'x-request-id': 'trace-0001' } })],
      ['404', await agent.client.get('/nothing', { headers: { 'x-request-id': 'trace-0002' } })],
      ['405', await agent.client.raw('DELETE', '/livez', { headers: { 'x-request-id': 'trace-0003' } })],
      [
        '400',
        await agent.client.post('/v1/bootstrap', {
          body: '{',
          headers: { 'x-request-id': 'trace-0004', 'content-type': 'application/json' },
        }),
      ],
      ['401', await agent.client.get('/v1/credentials', { headers: { 'x-request-id': 'trace-0005' } })],
      [
        '201',
        await agent.client.post('/v1/credentials', {
          json: {},
          token: adminToken,
          headers: { 'x-request-id': 'trace-0006' },
        }),
      ],
    ];
    answers.forEach(([what, res], i) => {
      assert.equal(res.headers['x-request-id'], `trace-000${i + 1}`, what);
    });
  });

  it('gives a fresh request id when none or an unsafe one is sent', async () => {
    const ids = new Set<string>();
    for (const given of [undefined, 'has space', 'x'.repeat(65), 'semi;colon', '../../etc']) {
      const res = await agent.client.get('/livez', {
        headers: given === undefined ? {} : { 'x-request-id': given },
      });
      const id = res.headers['x-request-id'];
      assert.equal(typeof id, 'string', `an id for ${given}`);
      assert.ok((id as string).length > 0);
      assert.notEqual(id, given);
      assert.match(id as string, /^[A-Za-z0-9._-]{1,64}$/);
      ids.add(id as string);
    }
    assert.equal(ids.size, 5, 'ids differ between requests');
  });

  it('keeps an idle connection 72 s: peers keep theirs to it between gossip rounds', async () => {
    const keepAlive = new http.Agent({ keepAlive: true });
    const headers = await new Promise<http.IncomingHttpHeaders>((resolve, reject) =>
      http
        .get({ host: '127.0.0.1', port: agent.port, path: '/livez', agent: keepAlive }, (res) => {
          res.resume();
          resolve(res.headers);
        })
        .on('error', reject),
    );
    keepAlive.destroy();
    assert.equal(headers['keep-alive'], 'timeout=72');
  });

  it('answers 408 REQUEST_TIMEOUT and closes when a request does not arrive whole in 30 s', {
    timeout: 60_000,
  }, async () => {
    // Headers and the start of a body, then nothing: without a limit the connection stays for good.
    const socket = net.connect(agent.port, '127.0.0.1');
    const started = Date.now();
    socket.write(
      'POST /v1/oauth/token HTTP/1.1\r\nhost: a\r\ncontent-type: application/x-www-form-urlencoded\r\ncontent-length: 1000\r\n\r\ngrant_type=',
    );
    let answer = '';
    socket.on('data', (c: Buffer) => {
      answer += c.toString();
    });
    await new Promise((resolve) => socket.once('close', resolve));
    const waited = Date.now() - started;
    assert.ok(waited >= REQUEST_TIMEOUT_MS - 1000, `closed after ${waited} ms, before the request's time`);
    // Node looks for stalled requests every second here (every 30 s by default).
    assert.ok(waited < REQUEST_TIMEOUT_MS + 15_000, `closed only after ${waited} ms`);
    assert.match(answer, /^HTTP\/1\.1 408 /);
    assert.equal(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)).code, 'REQUEST_TIMEOUT');
    // A request that arrives in time is untouched.
    assert.equal((await agent.client.get('/livez')).status, 200);
  });
});
