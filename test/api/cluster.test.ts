/**
 * Cluster and discovery endpoints on one agent (API document, Token and discovery, Cluster,
 * Peers; docs/decisions.md §4, §5): the public identity before and after bootstrap, the cluster
 * credential and its rotation, the OIDC discovery document and the JWKS, and the peer reads.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { createLocalJWKSet, decodeProtectedHeader, jwtVerify } from 'jose';
import { ALL_SCOPES } from '../../src/domain/scopes.js';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import { assertError, assertTimestamp, tokenWith } from '../helpers/api-assertions.js';
import { makeVendor } from '../helpers/licenses.js';

const PACKAGE_VERSION = (
  JSON.parse(readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version: string }
).version;

const CLUSTER_CREDENTIAL_FIELDS = ['client_id', 'rotated_at', 'rotated_by', 'version'];
const PEER_FIELDS = ['address', 'created_at', 'id', 'is_local', 'name', 'public_key'];

describe('cluster identity, cluster credential and peers', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  let admin: { clientId: string; clientSecret: string; body: Record<string, unknown> };
  let adminToken: string;
  let identityBefore: Record<string, unknown>;

  before(async () => {
    agent = await AgentProcess.start({ vendor });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('serves the identity before bootstrap, without a token: license_id and cluster_id null', async () => {
    const res = await agent.client.get('/v1/cluster/identity');
    assert.equal(res.status, 200);
    identityBefore = res.body;
    for (const f of ['peer_id', 'public_key', 'license_id', 'cluster_id', 'version']) {
      assert.ok(f in res.body, `identity has ${f}`);
    }
    assert.equal(typeof res.body.peer_id, 'string');
    assert.ok(res.body.peer_id.length > 0);
    assert.equal(Buffer.from(res.body.public_key, 'base64').length, 32, 'Ed25519 public key, base64');
    assert.equal(res.body.license_id, null);
    assert.equal(res.body.cluster_id, null);
    assert.equal(res.body.version, PACKAGE_VERSION);
  });

  it('serves the identity after bootstrap with the license and cluster ids, same peer and key', async () => {
    admin = await bootstrap(agent, vendor, { license_id: 'lic-cluster' });
    adminToken = await agent.client.token(admin.clientId, admin.clientSecret);
    const res = await agent.client.get('/v1/cluster/identity');
    assert.equal(res.status, 200);
    assert.equal(res.body.peer_id, identityBefore.peer_id);
    assert.equal(res.body.public_key, identityBefore.public_key);
    assert.equal(res.body.peer_id, admin.body.peer_id);
    assert.equal(res.body.license_id, 'lic-cluster');
    assert.equal(res.body.cluster_id, admin.body.cluster_id);
    assert.equal(res.body.version, PACKAGE_VERSION);
    // A token is not needed and does not change the answer.
    const withToken = await agent.client.get('/v1/cluster/identity', { token: adminToken });
    assert.deepEqual(withToken.body, res.body);
  });

  it('GET /v1/cluster/credentials: client_id, version 1, rotated_by the local peer, rotated_at; no secret', async () => {
    const res = await agent.client.get('/v1/cluster/credentials', { token: adminToken });
    assert.equal(res.status, 200, res.text);
    assert.deepEqual(Object.keys(res.body).sort(), CLUSTER_CREDENTIAL_FIELDS);
    assert.equal(typeof res.body.client_id, 'string');
    assert.notEqual(res.body.client_id, admin.clientId);
    assert.equal(res.body.version, 1);
    assert.equal(res.body.rotated_by, admin.body.peer_id);
    assertTimestamp(res.body.rotated_at, 'rotated_at', Date.now());
    assert.ok(!('client_secret' in res.body));
  });

  it('GET /v1/cluster/credentials: 401 without a valid token, 403 without admin', async () => {
    assertError(await agent.client.get('/v1/cluster/credentials'), 401, 'UNAUTHORIZED');
    assertError(
      await agent.client.get('/v1/cluster/credentials', { token: `${adminToken}x` }),
      401,
      'UNAUTHORIZED',
    );
    // credentials.read and credentials.write together are still not admin.
    const notAdmin = await tokenWith(
      agent,
      admin,
      'credentials.read',
      'credentials.write',
      'peers.read',
      'peers.write',
      'services.read',
      'services.write',
    );
    assertError(
      await agent.client.get('/v1/cluster/credentials', { token: notAdmin }),
      403,
      'FORBIDDEN',
      'all scopes but admin',
    );
  });

  it('rotates: 200, version +1 each time, rotated_by the local peer, a new secret returned once and never by GET', async () => {
    const writer = await tokenWith(agent, admin, 'credentials.write');
    const start = (await agent.client.get('/v1/cluster/credentials', { token: adminToken })).body;
    const seen = new Set<string>();
    for (let i = 1; i <= 3; i++) {
      const res = await agent.client.post('/v1/cluster/credentials/rotate', {
        token: i === 2 ? adminToken : writer,
      });
      assert.equal(res.status, 200, res.text);
      assert.deepEqual(Object.keys(res.body).sort(), [...CLUSTER_CREDENTIAL_FIELDS, 'client_secret'].sort());
      assert.equal(res.body.version, start.version + i);
      assert.equal(res.body.client_id, start.client_id, 'the cluster client id stays');
      assert.equal(res.body.rotated_by, admin.body.peer_id);
      assertTimestamp(res.body.rotated_at, 'rotated_at', Date.now());
      assert.ok(Buffer.from(res.body.client_secret, 'base64url').length >= 32, 'secret of 32+ bytes');
      assert.ok(!seen.has(res.body.client_secret), 'a fresh secret each rotation');
      seen.add(res.body.client_secret);

      const got = await agent.client.get('/v1/cluster/credentials', { token: adminToken });
      assert.deepEqual(Object.keys(got.body).sort(), CLUSTER_CREDENTIAL_FIELDS);
      assert.equal(got.body.version, res.body.version);
      assert.equal(got.body.rotated_at, res.body.rotated_at);
      assert.equal(got.body.rotated_by, res.body.rotated_by);
      for (const s of seen) assert.ok(!got.text.includes(s), 'GET never returns a secret');
    }
  });

  it('rotate: 401 without a valid token, 403 without credentials.write', async () => {
    assertError(await agent.client.post('/v1/cluster/credentials/rotate'), 401, 'UNAUTHORIZED');
    assertError(
      await agent.client.post('/v1/cluster/credentials/rotate', {
        headers: { authorization: 'Bearer abc.def.ghi' },
      }),
      401,
      'UNAUTHORIZED',
    );
    const before = (await agent.client.get('/v1/cluster/credentials', { token: adminToken })).body.version;
    for (const names of [['credentials.read'], ['peers.write', 'services.write']] as const) {
      const token = await tokenWith(agent, admin, ...names);
      assertError(
        await agent.client.post('/v1/cluster/credentials/rotate', { token }),
        403,
        'FORBIDDEN',
        names.join(','),
      );
    }
    const afterVersion = (await agent.client.get('/v1/cluster/credentials', { token: adminToken })).body
      .version;
    assert.equal(afterVersion, before, 'refused rotations change nothing');
  });

  it('GET /v1/peers lists the local peer with every documented field', async () => {
    const res = await agent.client.get('/v1/peers', { token: adminToken });
    assert.equal(res.status, 200);
    assert.equal(res.body.length, 1);
    const [p] = res.body;
    for (const f of PEER_FIELDS) assert.ok(f in p, `peer has ${f}`);
    assert.equal(p.id, admin.body.peer_id);
    assert.equal(p.name, 'test');
    assert.equal(p.public_key, admin.body.peer_public_key);
    assert.equal(p.is_local, true);
    assert.equal(p.address, `127.0.0.1:${agent.port}`);
    assertTimestamp(p.created_at, 'created_at', Date.now());
    // docs/decisions.md §5 extra fields.
    assert.equal(p.is_active, true);
    assert.ok(Number.isInteger(p.version));
    assert.equal(p.deactivated_at, null);
  });

  it('GET /v1/peers?is_local=true|false filters; any other value is 400', async () => {
    const local = await agent.client.get('/v1/peers?is_local=true', { token: adminToken });
    assert.equal(local.status, 200);
    assert.deepEqual(
      local.body.map((p: { id: string }) => p.id),
      [admin.body.peer_id],
    );
    const remote = await agent.client.get('/v1/peers?is_local=false', { token: adminToken });
    assert.equal(remote.status, 200);
    assert.deepEqual(remote.body, []);
    for (const q of ['yes', 'maybe', '', '2']) {
      assertError(
        await agent.client.get(`/v1/peers?is_local=${q}`, { token: adminToken }),
        400,
        'INVALID_REQUEST',
        `is_local=${q}`,
      );
    }
  });

  it('GET /v1/peers/{id}: the local peer; 404 NOT_FOUND for an unknown id', async () => {
    const res = await agent.client.get(`/v1/peers/${admin.body.peer_id}`, { token: adminToken });
    assert.equal(res.status, 200);
    const listed = (await agent.client.get('/v1/peers', { token: adminToken })).body[0];
    assert.deepEqual(res.body, listed);
    for (const id of ['0123456789abcdef0123456789abcdef', 'nope']) {
      assertError(await agent.client.get(`/v1/peers/${id}`, { token: adminToken }), 404, 'NOT_FOUND', id);
    }
  });

  it('peers: 401 without a token, 403 without peers.read (peers.write does not imply it), 401/403 before 400/404', async () => {
    const writer = await tokenWith(agent, admin, 'peers.write');
    const reader = await tokenWith(agent, admin, 'peers.read');
    for (const path of ['/v1/peers', '/v1/peers?is_local=true', `/v1/peers/${admin.body.peer_id}`]) {
      assertError(await agent.client.get(path), 401, 'UNAUTHORIZED', path);
      assertError(await agent.client.get(path, { token: writer }), 403, 'FORBIDDEN', path);
      assert.equal((await agent.client.get(path, { token: reader })).status, 200, path);
    }
    // Order: 401 and 403 before 400 (bad filter) and 404 (unknown id).
    assertError(await agent.client.get('/v1/peers?is_local=maybe'), 401, 'UNAUTHORIZED');
    assertError(await agent.client.get('/v1/peers?is_local=maybe', { token: writer }), 403, 'FORBIDDEN');
    assertError(await agent.client.get('/v1/peers/unknown'), 401, 'UNAUTHORIZED');
    assertError(await agent.client.get('/v1/peers/unknown', { token: writer }), 403, 'FORBIDDEN');
  });
});

describe('OIDC discovery and JWKS', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  before(async () => {
    agent = await AgentProcess.start({ vendor });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('serves the discovery document with the fields of docs/decisions.md §4 and issuer = the agent URL', async () => {
    const res = await agent.client.get('/.well-known/openid-configuration');
    assert.equal(res.status, 200);
    assert.match(String(res.headers['content-type']), /^application\/json/);
    const d = res.body;
    assert.equal(d.issuer, agent.url);
    assert.equal(d.token_endpoint, `${agent.url}/v1/oauth/token`);
    assert.equal(d.jwks_uri, `${agent.url}/.well-known/jwks.json`);
    assert.ok(d.grant_types_supported.includes('client_credentials'));
    assert.deepEqual([...d.token_endpoint_auth_methods_supported].sort(), [
      'client_secret_basic',
      'client_secret_post',
    ]);
    assert.deepEqual([...d.scopes_supported].sort(), [...ALL_SCOPES].sort());
    assert.ok(Array.isArray(d.response_types_supported) && d.response_types_supported.length > 0);
    assert.ok(Array.isArray(d.id_token_signing_alg_values_supported));
    assert.ok(d.id_token_signing_alg_values_supported.length > 0);
  });

  it('serves the JWKS: public Ed25519 keys with kid, alg and use, and no private part', async () => {
    const res = await agent.client.get('/.well-known/jwks.json');
    assert.equal(res.status, 200);
    assert.ok(Array.isArray(res.body.keys) && res.body.keys.length >= 1);
    const kids = new Set<string>();
    for (const k of res.body.keys) {
      assert.equal(k.kty, 'OKP');
      assert.equal(k.crv, 'Ed25519');
      assert.equal(Buffer.from(k.x, 'base64url').length, 32);
      assert.equal(k.alg, 'EdDSA');
      assert.equal(k.use, 'sig');
      assert.equal(typeof k.kid, 'string');
      assert.ok(k.kid.length > 0);
      assert.ok(!kids.has(k.kid), 'kids are unique');
      kids.add(k.kid);
      for (const priv of ['d', 'p', 'q', 'dp', 'dq', 'qi', 'k'])
        assert.ok(!(priv in k), `no ${priv} in a public JWK`);
    }
  });

  it('issues tokens that verify against the discovered JWKS with the discovered issuer', async () => {
    const admin = await bootstrap(agent, vendor);
    const discovery = (await agent.client.get('/.well-known/openid-configuration')).body;
    const jwksPath = new URL(discovery.jwks_uri).pathname;
    const jwks = (await agent.client.get(jwksPath)).body;
    const token = await agent.client.token(admin.clientId, admin.clientSecret);
    const header = decodeProtectedHeader(token);
    assert.equal(header.typ, 'at+jwt');
    assert.equal(header.alg, 'EdDSA');
    assert.ok(
      jwks.keys.some((k: { kid: string }) => k.kid === header.kid),
      'the token kid is in the JWKS',
    );
    const { payload } = await jwtVerify(token, createLocalJWKSet(jwks), { issuer: discovery.issuer });
    assert.equal(payload.sub, admin.clientId);
    assert.equal(payload.client_id, admin.clientId);
  });
});

describe('discovery with --public-url', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  const publicUrl = 'https://mesh.example.test:8443/agent';
  before(async () => {
    agent = await AgentProcess.start({ vendor, extraArgs: ['--public-url', `${publicUrl}/`] });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('uses the public URL as issuer and as the base of the document URLs, and tokens carry it', async () => {
    const d = (await agent.client.get('/.well-known/openid-configuration')).body;
    assert.equal(d.issuer, publicUrl);
    assert.equal(d.token_endpoint, `${publicUrl}/v1/oauth/token`);
    assert.equal(d.jwks_uri, `${publicUrl}/.well-known/jwks.json`);
    const admin = await bootstrap(agent, vendor);
    const token = await agent.client.token(admin.clientId, admin.clientSecret);
    const jwks = (await agent.client.get('/.well-known/jwks.json')).body;
    const { payload } = await jwtVerify(token, createLocalJWKSet(jwks), { issuer: publicUrl });
    assert.equal(payload.iss, publicUrl);
    assert.equal((await agent.client.get('/v1/peers', { token })).status, 200, 'the token works');
  });
});
