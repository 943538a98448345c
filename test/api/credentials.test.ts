/**
 * /v1/credentials (API document, Credentials; docs/decisions.md §3, §4): the list form and its fields,
 * creation with scopes (empty or absent means admin), 400 for an invalid scope, 403 for scopes
 * wider than the caller's, revocation (404, 422 CANNOT_REVOKE_CURRENT, 200 and the token stops at
 * once), the scope guards and the 401 → 403 → 400 → 404 → 422 order.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ALL_SCOPES, scope } from '../../src/domain/scopes.js';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import { assertError, assertTimestamp, tokenWith } from '../helpers/api-assertions.js';
import { makeVendor } from '../helpers/licenses.js';

const ADMIN = scope('admin');
const LIST_FIELDS = ['client_id', 'created_at', 'last_used_at', 'license_id', 'scopes'];

describe('/v1/credentials', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  let admin: { clientId: string; clientSecret: string };
  let adminToken: string;
  const secrets: string[] = [];

  const create = (json: unknown, token = adminToken) => agent.client.post('/v1/credentials', { json, token });
  const list = (token = adminToken) => agent.client.get('/v1/credentials', { token });

  before(async () => {
    agent = await AgentProcess.start({ vendor });
    admin = await bootstrap(agent, vendor, { license_id: 'lic-creds' });
    secrets.push(admin.clientSecret);
    adminToken = await agent.client.token(admin.clientId, admin.clientSecret);
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('lists credentials with exactly the list-form fields and never a secret', async () => {
    const res = await list();
    assert.equal(res.status, 200);
    assert.ok(Array.isArray(res.body));
    assert.equal(res.body.length, 1);
    const [c] = res.body;
    assert.deepEqual(Object.keys(c).sort(), LIST_FIELDS);
    assert.equal(c.client_id, admin.clientId);
    assert.deepEqual(c.scopes, [ADMIN]);
    assert.equal(c.license_id, 'lic-creds');
    assertTimestamp(c.created_at, 'created_at', Date.now());
    // The token request above is the credential's first issuance.
    assertTimestamp(c.last_used_at, 'last_used_at', Date.now());
    assert.ok(Date.parse(c.last_used_at) >= Date.parse(c.created_at));
  });

  it('creates a credential with the given scopes: 201, secret once, last_used_at null until its first token', async () => {
    const wanted = [scope('peers.read'), scope('services.write')];
    const before = Date.now();
    const res = await create({ scopes: wanted });
    assert.equal(res.status, 201, res.text);
    assert.deepEqual(Object.keys(res.body).sort(), ['client_id', 'client_secret', 'created_at', 'scopes']);
    assert.deepEqual([...res.body.scopes].sort(), [...wanted].sort());
    assertTimestamp(res.body.created_at, 'created_at', before);
    assert.ok(Buffer.from(res.body.client_secret, 'base64url').length >= 32, 'secret of 32+ bytes');
    assert.notEqual(res.body.client_id, admin.clientId);
    secrets.push(res.body.client_secret);

    let listed = (await list()).body.find((c: { client_id: string }) => c.client_id === res.body.client_id);
    assert.ok(listed, 'the new credential is listed');
    assert.deepEqual(Object.keys(listed).sort(), LIST_FIELDS);
    assert.equal(listed.last_used_at, null);
    assert.equal(listed.license_id, 'lic-creds');
    assert.equal(listed.created_at, res.body.created_at);
    assert.deepEqual([...listed.scopes].sort(), [...wanted].sort());

    const tok = await agent.client.tokenResponse(res.body.client_id, res.body.client_secret);
    assert.equal(tok.status, 200);
    assert.deepEqual(tok.body.scope.split(' ').sort(), [...wanted].sort());
    listed = (await list()).body.find((c: { client_id: string }) => c.client_id === res.body.client_id);
    assertTimestamp(listed.last_used_at, 'last_used_at after the first token', Date.now());
  });

  it('creates an admin credential when scopes is empty or absent', async () => {
    for (const body of [{ scopes: [] }, {}, { unknown_field: 'ignored' }]) {
      const res = await create(body);
      assert.equal(res.status, 201, `${JSON.stringify(body)}: ${res.text}`);
      assert.deepEqual(res.body.scopes, [ADMIN], JSON.stringify(body));
      secrets.push(res.body.client_secret);
      const tok = await agent.client.tokenResponse(res.body.client_id, res.body.client_secret);
      assert.equal(tok.body.scope, ADMIN);
    }
  });

  it('accepts every documented scope value', async () => {
    const res = await create({ scopes: [...ALL_SCOPES] });
    assert.equal(res.status, 201, res.text);
    secrets.push(res.body.client_secret);
  });

  it('answers 400 INVALID_REQUEST for an invalid scope format', async () => {
    const bad: unknown[] = [
      { scopes: ['admin'] },
      { scopes: ['peers.read'] },
      { scopes: ['urn:vendor:service:root'] },
      { scopes: ['urn:vendor:service:admin '] },
      { scopes: ['URN:VENDOR:SERVICE:ADMIN'] },
      { scopes: [scope('peers.read'), 'urn:vendor:service:peers.delete'] },
      { scopes: [''] },
      { scopes: [null] },
      { scopes: [7] },
      { scopes: 'urn:vendor:service:admin' },
      { scopes: null },
      { scopes: { 0: ADMIN } },
    ];
    const count = (await list()).body.length;
    for (const body of bad) assertError(await create(body), 400, 'INVALID_REQUEST', JSON.stringify(body));
    assert.equal((await list()).body.length, count, 'nothing was created');
  });

  it('answers 400 INVALID_REQUEST for a body that is not JSON or not an object', async () => {
    for (const body of ['{"scopes": [', 'scopes=admin', '[]', '"admin"', 'null', '42']) {
      const res = await agent.client.post('/v1/credentials', {
        body,
        token: adminToken,
        headers: { 'content-type': 'application/json' },
      });
      assertError(res, 400, 'INVALID_REQUEST', body);
    }
  });

  it('answers 403 FORBIDDEN for scopes wider than the caller token (empty means admin)', async () => {
    const writer = await tokenWith(agent, admin, 'credentials.write');
    const ok = await create({ scopes: [scope('credentials.write')] }, writer);
    assert.equal(ok.status, 201, ok.text);
    secrets.push(ok.body.client_secret);
    for (const body of [{ scopes: [scope('peers.read')] }, { scopes: [ADMIN] }, { scopes: [] }, {}]) {
      assertError(await create(body, writer), 403, 'FORBIDDEN', JSON.stringify(body));
    }
  });

  it('guards by scope: GET needs credentials.read, POST and DELETE need credentials.write', async () => {
    const writer = await tokenWith(agent, admin, 'credentials.write');
    const reader = await tokenWith(agent, admin, 'credentials.read');
    const peers = await tokenWith(agent, admin, 'peers.read', 'peers.write', 'services.read');
    assertError(await list(writer), 403, 'FORBIDDEN', 'GET with credentials.write only');
    assertError(await list(peers), 403, 'FORBIDDEN', 'GET with peers/services scopes');
    assert.equal((await list(reader)).status, 200);
    assertError(
      await create({ scopes: [scope('credentials.read')] }, reader),
      403,
      'FORBIDDEN',
      'POST reader',
    );
    const del = await agent.client.delete(`/v1/credentials/${admin.clientId}`, { token: reader });
    assertError(del, 403, 'FORBIDDEN', 'DELETE reader');
  });

  it('answers 401 UNAUTHORIZED without a token, with a malformed one, or a forged one', async () => {
    const forged = `${adminToken.slice(0, -4)}AAAA`;
    const variants: Record<string, string>[] = [
      {},
      { authorization: 'Bearer' },
      { authorization: 'Bearer not-a-jwt' },
      { authorization: `Basic ${Buffer.from(`${admin.clientId}:${admin.clientSecret}`).toString('base64')}` },
      { authorization: `Bearer ${forged}` },
    ];
    for (const headers of variants) {
      assertError(
        await agent.client.get('/v1/credentials', { headers }),
        401,
        'UNAUTHORIZED',
        JSON.stringify(headers).slice(0, 40),
      );
      assertError(await agent.client.post('/v1/credentials', { headers, json: {} }), 401, 'UNAUTHORIZED');
      assertError(await agent.client.delete('/v1/credentials/x', { headers }), 401, 'UNAUTHORIZED');
    }
  });

  it('checks in order: 401, then 403, then 400, then 404 or 422', async () => {
    const reader = await tokenWith(agent, admin, 'credentials.read');
    const badBody = { body: 'not json', headers: { 'content-type': 'application/json' } };
    // POST with an invalid body: 401 without token, 403 with too narrow a token, then 400.
    assertError(await agent.client.post('/v1/credentials', badBody), 401, 'UNAUTHORIZED', 'POST no token');
    assertError(
      await agent.client.post('/v1/credentials', { ...badBody, token: reader }),
      403,
      'FORBIDDEN',
      'POST reader, bad body',
    );
    assertError(
      await agent.client.post('/v1/credentials', { json: { scopes: ['bogus'] }, token: reader }),
      403,
      'FORBIDDEN',
      'POST reader, bad scope',
    );
    // DELETE of an unknown id: 401, 403 before 404; a too long id is 400 before 404.
    assertError(await agent.client.delete('/v1/credentials/mc_unknown'), 401, 'UNAUTHORIZED');
    assertError(await agent.client.delete('/v1/credentials/mc_unknown', { token: reader }), 403, 'FORBIDDEN');
    assertError(
      await agent.client.delete(`/v1/credentials/${'x'.repeat(300)}`, { token: adminToken }),
      400,
      'INVALID_REQUEST',
      'over-long client_id',
    );
    assertError(
      await agent.client.delete(`/v1/credentials/${'x'.repeat(300)}`, { token: reader }),
      403,
      'FORBIDDEN',
    );
    // The caller's own credential: 403 for a reader, 422 for a writer.
    assertError(
      await agent.client.delete(`/v1/credentials/${admin.clientId}`, { token: reader }),
      403,
      'FORBIDDEN',
    );
  });

  it('DELETE answers 404 NOT_FOUND for an unknown client_id', async () => {
    for (const id of ['mc_doesnotexist', 'nothing', encodeURIComponent('mc_ü ')]) {
      assertError(
        await agent.client.delete(`/v1/credentials/${id}`, { token: adminToken }),
        404,
        'NOT_FOUND',
        id,
      );
    }
  });

  it('DELETE answers 422 CANNOT_REVOKE_CURRENT for the credential of the calling token, and keeps it', async () => {
    const res = await agent.client.delete(`/v1/credentials/${admin.clientId}`, { token: adminToken });
    assertError(res, 422, 'CANNOT_REVOKE_CURRENT');
    // Also with a narrowed token of the same credential.
    const writer = await tokenWith(agent, admin, 'credentials.write');
    assertError(
      await agent.client.delete(`/v1/credentials/${admin.clientId}`, { token: writer }),
      422,
      'CANNOT_REVOKE_CURRENT',
    );
    assert.equal((await list()).status, 200, 'the caller still works');
    assert.ok((await list()).body.some((c: { client_id: string }) => c.client_id === admin.clientId));
  });

  it('DELETE answers 200 {deleted: true}; the revoked credential vanishes and its token is 401 at once', async () => {
    const made = await create({ scopes: [scope('credentials.read'), scope('peers.read')] });
    assert.equal(made.status, 201);
    secrets.push(made.body.client_secret);
    const victimToken = await agent.client.token(made.body.client_id, made.body.client_secret);
    assert.equal((await list(victimToken)).status, 200, 'the token works before revocation');
    assert.equal((await agent.client.get('/v1/peers', { token: victimToken })).status, 200);

    const del = await agent.client.delete(`/v1/credentials/${made.body.client_id}`, { token: adminToken });
    assert.equal(del.status, 200, del.text);
    assert.deepEqual(del.body, { deleted: true });

    assertError(await list(victimToken), 401, 'UNAUTHORIZED', 'revoked token on credentials');
    assertError(
      await agent.client.get('/v1/peers', { token: victimToken }),
      401,
      'UNAUTHORIZED',
      'revoked on peers',
    );
    const again = await agent.client.tokenResponse(made.body.client_id, made.body.client_secret);
    assert.equal(again.status, 401, 'the revoked secret gets no new token');
    assert.ok(!(await list()).body.some((c: { client_id: string }) => c.client_id === made.body.client_id));
    assertError(
      await agent.client.delete(`/v1/credentials/${made.body.client_id}`, { token: adminToken }),
      404,
      'NOT_FOUND',
      'second delete',
    );
  });

  it('lets a credentials.write token revoke another credential, even an admin one', async () => {
    const other = await create({});
    secrets.push(other.body.client_secret);
    const writer = await tokenWith(agent, admin, 'credentials.write');
    const del = await agent.client.delete(`/v1/credentials/${other.body.client_id}`, { token: writer });
    assert.equal(del.status, 200);
    assert.deepEqual(del.body, { deleted: true });
  });

  it('never shows a secret again: no list entry carries one', async () => {
    const res = await list();
    assert.ok(res.body.length >= 5);
    for (const c of res.body) {
      assert.deepEqual(Object.keys(c).sort(), LIST_FIELDS);
      assertTimestamp(c.created_at, 'created_at');
      if (c.last_used_at !== null) assertTimestamp(c.last_used_at, 'last_used_at');
    }
    for (const s of secrets) assert.ok(!res.text.includes(s), 'a secret appears in the list');
  });
});
