/**
 * The OAuth2 token endpoint (POST /v1/oauth/token), discovery and JWKS, as a mature OAuth server
 * answers them: RFC 6749 client credentials with client_secret_post and client_secret_basic,
 * RFC 6749 §5.2 errors, RFC 9068 access tokens, scope narrowing, throttling and a stock client
 * library end to end (API document "Authentication", docs/decisions.md §4). Real HTTP, real agents.
 *
 * Failed client authentications are throttled per source address, so each test that makes some
 * sends them from its own loopback address and cannot push another test over the limit.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { calculateJwkThumbprint, createLocalJWKSet, decodeJwt, decodeProtectedHeader, jwtVerify } from 'jose';
import * as oauth from 'oauth4webapi';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import type { ApiClient, ApiResponse } from '../helpers/api-client.js';
import { makeVendor } from '../helpers/licenses.js';

const SCOPE = (name: string) => `urn:vendor:service:${name}`;
const ALL_SCOPES = [
  'admin',
  'peers.read',
  'peers.write',
  'services.read',
  'services.write',
  'credentials.read',
  'credentials.write',
  'events.read',
].map(SCOPE);
const TOKEN = '/v1/oauth/token';
const GRANT = 'grant_type=client_credentials';
const ISO_MS_Z = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

const basic = (id: string, secret: string) => `Basic ${Buffer.from(`${id}:${secret}`).toString('base64')}`;
/** Percent-encodes every character (RFC 6749 appendix B allows any character to be encoded). */
const encodeAll = (s: string, lower = false) =>
  [...Buffer.from(s)]
    .map((b) => {
      const hex = b.toString(16).padStart(2, '0');
      return `%${lower ? hex : hex.toUpperCase()}`;
    })
    .join('');
const unknownClientId = () => `mc_${randomBytes(16).toString('base64url')}`;

/** A raw form token request, e.g. `grant_type=...&client_id=...`, with optional headers. */
const postForm = (client: ApiClient, form: string, headers: Record<string, string> = {}) =>
  client.post(TOKEN, {
    body: form,
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
  });

function assertOAuthError(res: ApiResponse, status: number, error: string, what: string): void {
  assert.equal(res.status, status, `${what}: expected ${status}, got ${res.status} ${res.text}`);
  assert.equal(res.body?.error, error, `${what}: ${res.text}`);
  assert.equal(typeof res.body.error_description, 'string', `${what}: ${res.text}`);
  assert.equal(typeof res.body.code, 'string', `${what}: ${res.text}`);
  assert.match(String(res.headers['cache-control']), /no-store/, `${what}: Cache-Control`);
  if (status === 401) {
    assert.equal(res.body.code, 'UNAUTHORIZED', what);
    assert.ok(res.headers['www-authenticate'], `${what}: a 401 invalid_client carries WWW-Authenticate`);
  }
  if (status === 400) assert.equal(res.body.code, 'INVALID_REQUEST', what);
}

describe('OAuth2 token endpoint, discovery and JWKS', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  let adminId: string;
  let adminSecret: string;
  let peerId: string;
  let adminToken: string;

  before(async () => {
    agent = await AgentProcess.start({ vendor });
    const creds = await bootstrap(agent, vendor);
    adminId = creds.clientId;
    adminSecret = creds.clientSecret;
    peerId = (await agent.client.get('/v1/cluster/identity')).body.peer_id;
    adminToken = await agent.client.token(adminId, adminSecret);
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  /** A client whose failed attempts count against its own source address only. */
  const from = (lastOctet: number) => agent.client.withLocalAddress(`127.0.0.${lastOctet}`);

  async function createCredential(scopes: string[] | undefined, token = adminToken) {
    const res = await agent.client.post('/v1/credentials', { token, json: scopes ? { scopes } : {} });
    assert.equal(res.status, 201, res.text);
    return { id: res.body.client_id as string, secret: res.body.client_secret as string, body: res.body };
  }

  function assertTokenResponse(res: ApiResponse, what: string): void {
    assert.equal(res.status, 200, `${what}: ${res.status} ${res.text}`);
    assert.match(String(res.headers['content-type']), /^application\/json/, what);
    assert.match(String(res.headers['cache-control']), /no-store/, `${what}: Cache-Control`);
    assert.equal(res.body.token_type, 'Bearer', what);
    assert.equal(res.body.expires_in, 3600, what);
    assert.equal(typeof res.body.access_token, 'string', what);
    assert.equal(res.body.access_token.split('.').length, 3, `${what}: a compact JWS`);
  }

  async function assertTokenWorks(token: string, what: string): Promise<void> {
    const res = await agent.client.get('/v1/peers', { token });
    assert.equal(res.status, 200, `${what}: ${res.status} ${res.text}`);
  }

  it('issues a token with client_secret_post: Bearer, expires_in 3600, Cache-Control no-store', async () => {
    const res = await agent.client.tokenResponse(adminId, adminSecret);
    assertTokenResponse(res, 'client_secret_post');
    assert.equal(res.body.scope, SCOPE('admin'));
    await assertTokenWorks(res.body.access_token, 'client_secret_post token');
  });

  it('issues a token with client_secret_basic', async () => {
    const res = await postForm(agent.client, GRANT, { authorization: basic(adminId, adminSecret) });
    assertTokenResponse(res, 'client_secret_basic');
    await assertTokenWorks(res.body.access_token, 'client_secret_basic token');
  });

  it('issues RFC 9068 access tokens: typ at+jwt, iss, sub = client_id, aud, scope, iat, exp, jti', async () => {
    const discovery = (await agent.client.get('/.well-known/openid-configuration')).body;
    const jwks = (await agent.client.get('/.well-known/jwks.json')).body;
    const before = Math.floor(Date.now() / 1000);
    const first = await agent.client.token(adminId, adminSecret);
    const second = await agent.client.token(adminId, adminSecret);
    const after = Math.ceil(Date.now() / 1000);

    const header = decodeProtectedHeader(first);
    assert.equal(header.typ, 'at+jwt');
    assert.ok(header.alg === 'EdDSA' || header.alg === 'ES256', `asymmetric alg, got ${header.alg}`);
    assert.equal(typeof header.kid, 'string');

    const claims = decodeJwt(first);
    assert.equal(claims.iss, discovery.issuer);
    assert.equal(claims.sub, adminId);
    assert.equal(claims.client_id, adminId);
    assert.equal(claims.aud, `urn:mesh-agent:peer:${peerId}`);
    assert.equal(claims.scope, SCOPE('admin'));
    assert.ok(
      Number.isInteger(claims.iat) && claims.iat! >= before - 1 && claims.iat! <= after + 1,
      `iat ${claims.iat}`,
    );
    assert.equal(claims.exp! - claims.iat!, 3600);
    assert.equal(typeof claims.jti, 'string');
    assert.ok((claims.jti as string).length >= 16, 'jti is long enough to be unique');
    assert.notEqual(decodeJwt(second).jti, claims.jti, 'each token has its own jti');

    // The signature verifies against the published key set, with every RFC 9068 check.
    const verified = await jwtVerify(first, createLocalJWKSet(jwks), {
      typ: 'at+jwt',
      issuer: discovery.issuer,
      audience: `urn:mesh-agent:peer:${peerId}`,
      requiredClaims: ['iss', 'sub', 'aud', 'exp', 'iat', 'jti', 'client_id'],
    });
    assert.equal(verified.payload.sub, adminId);
  });

  it('answers an unknown client and a wrong secret with the same 401 invalid_client body', async () => {
    const client = from(11);
    const answers: Record<string, ApiResponse> = {
      'post, unknown client': await client.tokenResponse(unknownClientId(), adminSecret),
      'post, wrong secret': await client.tokenResponse(adminId, randomBytes(32).toString('base64url')),
      'basic, unknown client': await postForm(client, GRANT, {
        authorization: basic(unknownClientId(), adminSecret),
      }),
      'basic, wrong secret': await postForm(client, GRANT, {
        authorization: basic(adminId, `${adminSecret}x`),
      }),
      'post, empty-looking secret': await postForm(client, `${GRANT}&client_id=${adminId}&client_secret=%20`),
    };
    const reference = answers['post, unknown client']!;
    for (const [what, res] of Object.entries(answers)) {
      assertOAuthError(res, 401, 'invalid_client', what);
      assert.equal(res.text, reference.text, `${what}: the same body as an unknown client`);
      assert.equal(res.headers['www-authenticate'], reference.headers['www-authenticate'], what);
    }
    assert.match(String(reference.headers['www-authenticate']), /^Basic realm="[^"]*"/);
  });

  it('accepts Basic credentials form-urlencoded as RFC 6749 appendix B says, every char percent-encoded', async () => {
    const variants: Record<string, string> = {
      'upper-case hex': basic(encodeAll(adminId), encodeAll(adminSecret)),
      'lower-case hex': basic(encodeAll(adminId, true), encodeAll(adminSecret, true)),
      'only the id encoded': basic(encodeAll(adminId), adminSecret),
      'only the secret encoded': basic(adminId, encodeAll(adminSecret)),
    };
    for (const [what, authorization] of Object.entries(variants)) {
      const res = await postForm(agent.client, GRANT, { authorization });
      assertTokenResponse(res, what);
      assert.equal(decodeJwt(res.body.access_token).sub, adminId, what);
    }
    // And client_secret_post with every character of the form values percent-encoded.
    const post = await postForm(
      agent.client,
      `${GRANT}&client_id=${encodeAll(adminId)}&client_secret=${encodeAll(adminSecret)}`,
    );
    assertTokenResponse(post, 'client_secret_post, every char encoded');
  });

  it('rejects a malformed Basic header: 401 invalid_client', async () => {
    const client = from(12);
    const headers: Record<string, string> = {
      'not base64': 'Basic !!!not*base64!!!',
      'no colon': `Basic ${Buffer.from(`${adminId}${adminSecret}`).toString('base64')}`,
      empty: 'Basic ',
      'scheme only': 'Basic',
      'empty id and secret': `Basic ${Buffer.from(':').toString('base64')}`,
      'empty id': `Basic ${Buffer.from(`:${adminSecret}`).toString('base64')}`,
      'broken percent-encoding': basic(adminId, '%zz'),
      'base64 of binary junk': `Basic ${randomBytes(24).toString('base64')}`,
    };
    for (const [what, authorization] of Object.entries(headers)) {
      assertOAuthError(await postForm(client, GRANT, { authorization }), 401, 'invalid_client', what);
    }
    // Nothing malformed above is a token: the right credentials still work from that address.
    assertTokenResponse(await client.tokenResponse(adminId, adminSecret), 'afterwards');
  });

  it('requires client authentication: none at all is 401 invalid_client, half of one is 400', async () => {
    const client = from(13);
    assertOAuthError(await postForm(client, GRANT), 401, 'invalid_client', 'no client authentication');
    assertOAuthError(
      await postForm(client, `${GRANT}&client_id=${adminId}`),
      400,
      'invalid_request',
      'no secret',
    );
    assertOAuthError(
      await postForm(client, `${GRANT}&client_secret=${adminSecret}`),
      400,
      'invalid_request',
      'no client_id',
    );
  });

  it('rejects credentials in both Basic and the body: 400 invalid_request', async () => {
    const client = from(14);
    const authorization = basic(adminId, adminSecret);
    const bodies: Record<string, string> = {
      'id and secret in both': `${GRANT}&client_id=${adminId}&client_secret=${adminSecret}`,
      'secret in the body too': `${GRANT}&client_secret=${adminSecret}`,
      'id in the body too': `${GRANT}&client_id=${adminId}`,
    };
    for (const [what, form] of Object.entries(bodies)) {
      assertOAuthError(await postForm(client, form, { authorization }), 400, 'invalid_request', what);
    }
  });

  it('rejects a missing grant_type (400 invalid_request) and any other grant (400 unsupported_grant_type)', async () => {
    const client = from(15);
    const creds = `client_id=${adminId}&client_secret=${adminSecret}`;
    assertOAuthError(await postForm(client, creds), 400, 'invalid_request', 'grant_type missing');
    assertOAuthError(
      await postForm(client, `grant_type=&${creds}`),
      400,
      'invalid_request',
      'grant_type empty',
    );
    for (const grant of [
      'password',
      'authorization_code',
      'refresh_token',
      'CLIENT_CREDENTIALS',
      'client_credentials ',
    ]) {
      const res = await postForm(client, `grant_type=${encodeURIComponent(grant)}&${creds}`);
      assertOAuthError(res, 400, 'unsupported_grant_type', `grant_type ${JSON.stringify(grant)}`);
    }
  });

  it('rejects repeated parameters: 400 invalid_request', async () => {
    const client = from(16);
    const id = `client_id=${adminId}`;
    const secret = `client_secret=${adminSecret}`;
    const forms: Record<string, string> = {
      grant_type: `${GRANT}&${GRANT}&${id}&${secret}`,
      client_id: `${GRANT}&${id}&${id}&${secret}`,
      client_secret: `${GRANT}&${id}&${secret}&${secret}`,
      scope: `${GRANT}&${id}&${secret}&scope=${SCOPE('peers.read')}&scope=${SCOPE('admin')}`,
      'client_id, second one different': `${GRANT}&${id}&client_id=${unknownClientId()}&${secret}`,
    };
    for (const [what, form] of Object.entries(forms)) {
      assertOAuthError(await postForm(client, form), 400, 'invalid_request', `repeated ${what}`);
    }
  });

  it('rejects a JSON body: 400 invalid_request', async () => {
    const res = await agent.client.post(TOKEN, {
      json: { grant_type: 'client_credentials', client_id: adminId, client_secret: adminSecret },
    });
    assertOAuthError(res, 400, 'invalid_request', 'JSON body');
  });

  it('narrows a token to the requested scopes: a peers.read token from admin gets 403 on credentials', async () => {
    const res = await agent.client.tokenResponse(adminId, adminSecret, SCOPE('peers.read'));
    assertTokenResponse(res, 'narrowed');
    assert.equal(res.body.scope, SCOPE('peers.read'));
    const narrow = res.body.access_token as string;
    assert.equal(decodeJwt(narrow).scope, SCOPE('peers.read'));
    await assertTokenWorks(narrow, 'peers.read token on GET /v1/peers');
    const creds = await agent.client.get('/v1/credentials', { token: narrow });
    assert.equal(creds.status, 403, creds.text);
    assert.equal(creds.body.code, 'FORBIDDEN');
    // The unnarrowed admin token of the same credential still reads credentials.
    assert.equal((await agent.client.get('/v1/credentials', { token: adminToken })).status, 200);

    // Several scopes, space-separated, in any order.
    const two = await agent.client.tokenResponse(
      adminId,
      adminSecret,
      `${SCOPE('credentials.read')} ${SCOPE('peers.read')}`,
    );
    assertTokenResponse(two, 'two scopes');
    assert.deepEqual(String(decodeJwt(two.body.access_token).scope).split(' ').sort(), [
      SCOPE('credentials.read'),
      SCOPE('peers.read'),
    ]);
    assert.equal((await agent.client.get('/v1/credentials', { token: two.body.access_token })).status, 200);
    await assertTokenWorks(two.body.access_token, 'two-scope token');
  });

  it("rejects a scope outside the credential's set: 400 invalid_scope", async () => {
    const reader = await createCredential([SCOPE('peers.read')]);
    for (const scope of [
      SCOPE('admin'),
      SCOPE('peers.write'),
      `${SCOPE('peers.read')} ${SCOPE('credentials.read')}`,
    ]) {
      const res = await agent.client.tokenResponse(reader.id, reader.secret, scope);
      assertOAuthError(res, 400, 'invalid_scope', `scope ${scope}`);
    }
    // Control: the credential's own scope, asked for or not, is granted.
    const own = await agent.client.tokenResponse(reader.id, reader.secret, SCOPE('peers.read'));
    assertTokenResponse(own, 'own scope');
    const implicit = await agent.client.tokenResponse(reader.id, reader.secret);
    assertTokenResponse(implicit, 'no scope parameter');
    assert.equal(implicit.body.scope, SCOPE('peers.read'));
  });

  it('rejects unknown scope values: 400 invalid_scope', async () => {
    for (const scope of [
      SCOPE('root'),
      'admin',
      'peers.read',
      'urn:vendor:service:ADMIN',
      `${SCOPE('peers.read')} ${SCOPE('superuser')}`,
      'openid',
    ]) {
      const res = await agent.client.tokenResponse(adminId, adminSecret, scope);
      assertOAuthError(res, 400, 'invalid_scope', `scope ${JSON.stringify(scope)}`);
    }
  });

  it('refuses scope escalation through POST /v1/credentials: 403 FORBIDDEN beyond the caller, 201 within', async () => {
    const writer = await createCredential([SCOPE('credentials.write')]);
    const writerToken = await agent.client.token(writer.id, writer.secret);
    const count = async () => (await agent.client.get('/v1/credentials', { token: adminToken })).body.length;
    const before = await count();

    const attempts: Record<string, unknown> = {
      admin: { scopes: [SCOPE('admin')] },
      'peers.read': { scopes: [SCOPE('peers.read')] },
      'credentials.read (read does not follow from write)': { scopes: [SCOPE('credentials.read')] },
      'credentials.write plus peers.read': { scopes: [SCOPE('credentials.write'), SCOPE('peers.read')] },
      'empty scopes (means admin)': { scopes: [] },
      'absent scopes (means admin)': {},
    };
    for (const [what, json] of Object.entries(attempts)) {
      const res = await agent.client.post('/v1/credentials', { token: writerToken, json });
      assert.equal(res.status, 403, `${what}: ${res.status} ${res.text}`);
      assert.equal(res.body.code, 'FORBIDDEN', what);
    }
    assert.equal(await count(), before, 'no refused request created a credential');

    const same = await agent.client.post('/v1/credentials', {
      token: writerToken,
      json: { scopes: [SCOPE('credentials.write')] },
    });
    assert.equal(same.status, 201, same.text);
    assert.deepEqual(same.body.scopes, [SCOPE('credentials.write')]);

    // What counts is the token's scope, not the credential's: an admin credential's token
    // narrowed to credentials.write cannot mint an admin credential either.
    const narrowed = await agent.client.token(adminId, adminSecret, SCOPE('credentials.write'));
    const viaNarrowed = await agent.client.post('/v1/credentials', {
      token: narrowed,
      json: { scopes: [SCOPE('admin')] },
    });
    assert.equal(viaNarrowed.status, 403, viaNarrowed.text);
    assert.equal(viaNarrowed.body.code, 'FORBIDDEN');
  });

  it('never issues a token for the cluster credential: 401 invalid_client', async () => {
    const client = from(17);
    const cluster = await agent.client.get('/v1/cluster/credentials', { token: adminToken });
    assert.equal(cluster.status, 200, cluster.text);
    const rotated = await agent.client.post('/v1/cluster/credentials/rotate', { token: adminToken });
    assert.equal(rotated.status, 200, rotated.text);
    assert.equal(rotated.body.client_id, cluster.body.client_id);
    const { client_id: id, client_secret: secret } = rotated.body as {
      client_id: string;
      client_secret: string;
    };
    assert.equal(typeof secret, 'string');

    const unknown = await client.tokenResponse(unknownClientId(), secret);
    const attempts: Record<string, ApiResponse> = {
      client_secret_post: await client.tokenResponse(id, secret),
      client_secret_basic: await postForm(client, GRANT, { authorization: basic(id, secret) }),
      'narrowed to peers.read': await client.tokenResponse(id, secret, SCOPE('peers.read')),
    };
    for (const [what, res] of Object.entries(attempts)) {
      assertOAuthError(res, 401, 'invalid_client', what);
      assert.equal(res.text, unknown.text, `${what}: indistinguishable from an unknown client`);
    }
  });

  it('sets last_used_at at the first issuance, and not again within a minute', async () => {
    const fresh = await createCredential([SCOPE('peers.read')]);
    const lastUsed = async () => {
      const list = await agent.client.get('/v1/credentials', { token: adminToken });
      assert.equal(list.status, 200, list.text);
      const item = list.body.find((c: { client_id: string }) => c.client_id === fresh.id);
      assert.ok(item, 'the new credential is listed');
      assert.equal('client_secret' in item, false, 'lists never carry secrets');
      return item.last_used_at as string | null;
    };
    assert.equal(await lastUsed(), null, 'never used yet');
    const t0 = Date.now();
    await agent.client.token(fresh.id, fresh.secret);
    const t1 = Date.now();
    const first = await lastUsed();
    assert.ok(first !== null, 'set by the first issuance');
    assert.match(first, ISO_MS_Z);
    const at = Date.parse(first);
    assert.ok(at >= t0 - 1000 && at <= t1 + 1000, `last_used_at ${first} is the issuance time`);
    await agent.client.token(fresh.id, fresh.secret);
    assert.equal(await lastUsed(), first, 'written at most once a minute');
  });

  it("publishes the discovery document of docs/decisions.md §4, and the JWKS holds the token's kid", async () => {
    const res = await agent.client.get('/.well-known/openid-configuration');
    assert.equal(res.status, 200, res.text);
    const doc = res.body;
    assert.equal(doc.issuer, agent.url, 'issuer is the public URL (by default the advertise address)');
    assert.equal(doc.token_endpoint, `${doc.issuer}${TOKEN}`);
    assert.equal(typeof doc.jwks_uri, 'string');
    assert.ok(doc.grant_types_supported.includes('client_credentials'));
    for (const method of ['client_secret_basic', 'client_secret_post']) {
      assert.ok(doc.token_endpoint_auth_methods_supported.includes(method), method);
    }
    assert.deepEqual([...doc.scopes_supported].sort(), [...ALL_SCOPES].sort());
    assert.ok(Array.isArray(doc.response_types_supported));
    assert.ok(Array.isArray(doc.id_token_signing_alg_values_supported));

    const jwksUrl = new URL(doc.jwks_uri);
    assert.equal(jwksUrl.origin, new URL(doc.issuer).origin);
    const jwks = await agent.client.get(jwksUrl.pathname);
    assert.equal(jwks.status, 200, jwks.text);
    const token = await agent.client.token(adminId, adminSecret);
    const { kid, alg } = decodeProtectedHeader(token);
    const key = jwks.body.keys.find((k: { kid: string }) => k.kid === kid);
    assert.ok(key, `the JWKS holds the token's kid ${kid}`);
    assert.equal(key.alg, alg);
    assert.equal(key.use, 'sig');
    assert.equal(key.kid, await calculateJwkThumbprint(key), 'kid is the RFC 7638 thumbprint');
    for (const k of jwks.body.keys) {
      for (const secretMember of ['d', 'p', 'q', 'dp', 'dq', 'qi', 'k']) {
        assert.equal(secretMember in k, false, `the JWKS never carries private member ${secretMember}`);
      }
    }
  });

  it('works end to end with a stock OAuth2 client (oauth4webapi): discover, get a token, call the API', async () => {
    const issuer = new URL(agent.url);
    const insecure = { [oauth.allowInsecureRequests]: true };
    const as = await oauth.processDiscoveryResponse(
      issuer,
      await oauth.discoveryRequest(issuer, { algorithm: 'oidc', ...insecure }),
    );
    const client: oauth.Client = { client_id: adminId };
    const methods: Record<string, oauth.ClientAuth> = {
      ClientSecretPost: oauth.ClientSecretPost(adminSecret),
      ClientSecretBasic: oauth.ClientSecretBasic(adminSecret),
    };
    for (const [what, auth] of Object.entries(methods)) {
      const response = await oauth.clientCredentialsGrantRequest(
        as,
        client,
        auth,
        new URLSearchParams({ scope: SCOPE('peers.read') }),
        insecure,
      );
      assert.match(String(response.headers.get('cache-control')), /no-store/, what);
      const result = await oauth.processClientCredentialsResponse(as, client, response);
      agent.client.secretsSeen.add(result.access_token);
      assert.equal(result.token_type, 'bearer', what);
      assert.equal(result.expires_in, 3600, what);
      assert.equal(result.scope, SCOPE('peers.read'), what);
      await assertTokenWorks(result.access_token, `${what} token`);
    }

    // The library reads the agent's refusals as what they are.
    const refused = await oauth.clientCredentialsGrantRequest(
      as,
      client,
      oauth.ClientSecretPost(`${adminSecret}wrong`),
      new URLSearchParams(),
      insecure,
    );
    await assert.rejects(oauth.processClientCredentialsResponse(as, client, refused), (err: unknown) => {
      assert.ok(err instanceof oauth.WWWAuthenticateChallengeError, String(err));
      assert.equal(err.status, 401);
      assert.equal(err.cause[0]?.scheme, 'basic');
      return true;
    });
    const badScope = await oauth.clientCredentialsGrantRequest(
      as,
      client,
      oauth.ClientSecretBasic(adminSecret),
      new URLSearchParams({ scope: SCOPE('nope') }),
      insecure,
    );
    await assert.rejects(oauth.processClientCredentialsResponse(as, client, badScope), (err: unknown) => {
      assert.ok(err instanceof oauth.ResponseBodyError, String(err));
      assert.equal(err.status, 400);
      assert.equal(err.error, 'invalid_scope');
      return true;
    });
  });
});

describe('OAuth2 token endpoint throttling', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  let adminId: string;
  let adminSecret: string;

  before(async () => {
    agent = await AgentProcess.start({ vendor });
    const creds = await bootstrap(agent, vendor);
    adminId = creds.clientId;
    adminSecret = creds.clientSecret;
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  function assertThrottled(res: ApiResponse, what: string): void {
    assert.equal(res.status, 429, `${what}: expected 429, got ${res.status} ${res.text}`);
    assert.equal(res.body.code, 'TOO_MANY_REQUESTS', what);
    assert.equal(typeof res.body.error, 'string', what);
    const retryAfter = String(res.headers['retry-after']);
    assert.match(retryAfter, /^\d+$/, `${what}: Retry-After in whole seconds`);
    assert.ok(Number(retryAfter) >= 1 && Number(retryAfter) <= 60, `${what}: Retry-After ${retryAfter}`);
  }

  it('throttles the 11th failure for one client from one address, but not the real client elsewhere', async () => {
    const attacker = agent.client.withLocalAddress('127.0.0.1');
    const wrong = () => randomBytes(32).toString('base64url');
    for (let i = 1; i <= 10; i++) {
      const res = await attacker.tokenResponse(adminId, wrong());
      assert.equal(res.status, 401, `failure ${i}: ${res.text}`);
      assert.equal(res.body.error, 'invalid_client');
    }
    assertThrottled(await attacker.tokenResponse(adminId, wrong()), '11th failure');
    // While throttled the address learns nothing, not even from the right secret.
    assertThrottled(
      await attacker.tokenResponse(adminId, adminSecret),
      'right secret from the throttled address',
    );

    const real = agent.client.withLocalAddress('127.0.0.2');
    const res = await real.tokenResponse(adminId, adminSecret);
    assert.equal(res.status, 200, `the real client elsewhere is not locked out: ${res.text}`);
    const peers = await real.get('/v1/peers', { token: res.body.access_token });
    assert.equal(peers.status, 200, peers.text);
  });

  it('throttles an address spraying different unknown client ids at the 11th attempt', async () => {
    const sprayer = agent.client.withLocalAddress('127.0.0.3');
    for (let i = 1; i <= 10; i++) {
      const res = await sprayer.tokenResponse(unknownClientId(), randomBytes(32).toString('base64url'));
      assert.equal(res.status, 401, `attempt ${i}: ${res.text}`);
      assert.equal(res.body.error, 'invalid_client');
    }
    assertThrottled(
      await sprayer.tokenResponse(unknownClientId(), randomBytes(32).toString('base64url')),
      '11th unknown client id',
    );
    const basicSpray = await sprayer.post(TOKEN, {
      body: GRANT,
      headers: {
        'content-type': 'application/x-www-form-urlencoded',
        authorization: basic(unknownClientId(), 'x'.repeat(43)),
      },
    });
    assertThrottled(basicSpray, 'the same address switching to client_secret_basic');

    const res = await agent.client.withLocalAddress('127.0.0.4').tokenResponse(adminId, adminSecret);
    assert.equal(res.status, 200, `the real client elsewhere is not locked out: ${res.text}`);
  });
});

describe('OAuth2 issuer with --public-url', () => {
  const vendor = makeVendor();
  const publicUrl = 'https://mesh-agent.example.test:8443';
  let agent: AgentProcess;

  before(async () => {
    agent = await AgentProcess.start({ vendor, extraArgs: ['--public-url', publicUrl] });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('uses the public URL as discovery issuer, in its endpoint URLs and as the token iss', async () => {
    const creds = await bootstrap(agent, vendor);
    const doc = (await agent.client.get('/.well-known/openid-configuration')).body;
    assert.equal(doc.issuer, publicUrl);
    assert.equal(doc.token_endpoint, `${publicUrl}${TOKEN}`);
    assert.ok(String(doc.jwks_uri).startsWith(`${publicUrl}/`), doc.jwks_uri);
    const token = await agent.client.token(creds.clientId, creds.clientSecret);
    assert.equal(decodeJwt(token).iss, publicUrl);
    const peers = await agent.client.get('/v1/peers', { token });
    assert.equal(peers.status, 200, peers.text);
  });
});
