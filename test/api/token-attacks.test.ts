/**
 * Attacks on the bearer token check of the management API (docs/decisions.md §4, API document
 * "Authentication" 5), as real HTTP against real agent processes.
 *
 * Every attack must answer 401 `{error, code: "UNAUTHORIZED"}` on an authenticated endpoint, and
 * every test first proves its control case: the genuine token, or a token forged with the
 * agent's own signing key and nothing changed, gets 200 on the same request. So a test cannot
 * pass because the forging itself is broken, only because the one thing it changes is refused.
 */
import assert from 'node:assert/strict';
import {
  createHmac,
  createPrivateKey,
  createPublicKey,
  generateKeyPairSync,
  type KeyObject,
  randomUUID,
  sign,
} from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { calculateJwkThumbprint, decodeJwt, decodeProtectedHeader, exportJWK } from 'jose';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import type { ApiResponse } from '../helpers/api-client.js';
import { makeVendor } from '../helpers/licenses.js';

const SCOPE = (name: string) => `urn:vendor:service:${name}`;
/** An authenticated endpoint (credentials.read) that an admin token may call. */
const PROTECTED = '/v1/credentials';

type Json = Record<string, unknown>;
type Signer = (signingInput: string) => Buffer;

const b64u = (value: Buffer | string | Json): string =>
  (Buffer.isBuffer(value) || typeof value === 'string'
    ? Buffer.from(value)
    : Buffer.from(JSON.stringify(value))
  ).toString('base64url');

/** A compact JWS from exactly this header and payload (undefined members are left out). */
function compact(header: Json, payload: Json, signer: Signer): string {
  const input = `${b64u(header)}.${b64u(payload)}`;
  return `${input}.${signer(input).toString('base64url')}`;
}

const ed25519Signer =
  (key: KeyObject): Signer =>
  (input) =>
    sign(null, Buffer.from(input), key);
const hmacSigner =
  (secret: Buffer | string): Signer =>
  (input) =>
    createHmac('sha256', secret).update(input).digest();
const es256Signer =
  (key: KeyObject): Signer =>
  (input) =>
    sign('sha256', Buffer.from(input), { key, dsaEncoding: 'ieee-p1363' });

const nowSeconds = () => Math.floor(Date.now() / 1000);

describe('bearer token attacks on the management API', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  let other: AgentProcess;
  let adminId: string;
  let adminSecret: string;
  /** A genuine admin token issued by the agent. */
  let genuine: string;
  let otherGenuine: string;
  let signingKey: KeyObject;
  let publicKey: KeyObject;
  let kid: string;
  let genuineClaims: Json;
  let otherPeerId: string;

  before(async () => {
    [agent, other] = await Promise.all([AgentProcess.start({ vendor }), AgentProcess.start({ vendor })]);
    const [creds, otherCreds] = await Promise.all([bootstrap(agent, vendor), bootstrap(other, vendor)]);
    adminId = creds.clientId;
    adminSecret = creds.clientSecret;
    genuine = await agent.client.token(adminId, adminSecret);
    otherGenuine = await other.client.token(otherCreds.clientId, otherCreds.clientSecret);
    otherPeerId = (await other.client.get('/v1/cluster/identity')).body.peer_id;

    signingKey = createPrivateKey(readFileSync(join(agent.dataDir, 'token-signing.key')));
    publicKey = createPublicKey(signingKey);
    kid = await calculateJwkThumbprint(await exportJWK(publicKey));
    genuineClaims = decodeJwt(genuine) as Json;
    // The forging below rests on these: the key file is the key the agent signs with.
    assert.equal(decodeProtectedHeader(genuine).kid, kid);
    const jwks = await agent.client.get('/.well-known/jwks.json');
    assert.equal(jwks.body.keys[0].kid, kid);
  });

  after(async () => {
    assert.equal(await agent.stop(), 0);
    assert.equal(await other.stop(), 0);
  });

  /** Claims like the genuine token's, fresh iat/exp/jti, with overrides (undefined removes). */
  const claims = (overrides: Json = {}): Json => {
    const now = nowSeconds();
    return { ...genuineClaims, iat: now, exp: now + 3600, jti: randomUUID(), ...overrides };
  };
  const header = (overrides: Json = {}): Json => ({ alg: 'EdDSA', typ: 'at+jwt', kid, ...overrides });

  /** A token signed with the agent's real key; the log check also watches for it. */
  const forge = (headerOverrides: Json = {}, claimOverrides: Json = {}, signer?: Signer): string => {
    const token = compact(
      header(headerOverrides),
      claims(claimOverrides),
      signer ?? ed25519Signer(signingKey),
    );
    agent.client.secretsSeen.add(token);
    return token;
  };

  const call = (token: string): Promise<ApiResponse> =>
    agent.client.get(PROTECTED, { headers: { authorization: `Bearer ${token}` } });

  const callWithHeader = (authorization: string | undefined): Promise<ApiResponse> =>
    agent.client.get(PROTECTED, authorization === undefined ? {} : { headers: { authorization } });

  function assertUnauthorized(res: ApiResponse, what: string): void {
    assert.equal(res.status, 401, `${what}: expected 401, got ${res.status} ${res.text}`);
    assert.equal(res.body?.code, 'UNAUTHORIZED', `${what}: ${res.text}`);
    assert.equal(typeof res.body.error, 'string', `${what}: ${res.text}`);
    assert.deepEqual(Object.keys(res.body).sort(), ['code', 'error'], `${what}: ${res.text}`);
    // RFC 6750 §3: a 401 from a protected resource names the Bearer scheme.
    assert.match(String(res.headers['www-authenticate']), /^Bearer\b/, `${what}: WWW-Authenticate`);
  }

  async function assertOk(token: string, what = 'control'): Promise<void> {
    const res = await call(token);
    assert.equal(res.status, 200, `${what}: expected 200, got ${res.status} ${res.text}`);
  }

  /** The control: the genuine token and an untampered forgery both get 200. */
  async function controls(): Promise<void> {
    await assertOk(genuine, 'genuine token');
    await assertOk(forge(), 'token forged with the real key and genuine claims');
  }

  async function assertAllRejected(tokens: Record<string, string>): Promise<void> {
    for (const [what, token] of Object.entries(tokens)) assertUnauthorized(await call(token), what);
  }

  it('rejects alg none in any letter case, with and without a signature segment: 401', async () => {
    await controls();
    const tokens: Record<string, string> = {};
    for (const alg of ['none', 'None', 'NONE', 'nOnE']) {
      const input = `${b64u(header({ alg }))}.${b64u(claims())}`;
      tokens[`alg ${alg}, empty signature`] = `${input}.`;
      tokens[`alg ${alg}, no signature segment`] = input;
      tokens[`alg ${alg}, genuine signature kept`] = `${input}.${genuine.split('.')[2]}`;
      tokens[`alg ${alg}, EdDSA signature over the input`] =
        `${input}.${ed25519Signer(signingKey)(input).toString('base64url')}`;
    }
    for (const t of Object.values(tokens)) agent.client.secretsSeen.add(t);
    await assertAllRejected(tokens);
  });

  it('rejects HS256 signed with our public key as the HMAC secret (PEM, DER, JWK x): 401', async () => {
    await controls();
    const jwk = await exportJWK(publicKey);
    const pem = publicKey.export({ type: 'spki', format: 'pem' }).toString();
    const secrets: Record<string, Buffer | string> = {
      'SPKI PEM': pem,
      'SPKI PEM without trailing newline': pem.trimEnd(),
      'SPKI DER': publicKey.export({ type: 'spki', format: 'der' }),
      'JWK x as text': jwk.x!,
      'JWK x decoded (raw 32 bytes)': Buffer.from(jwk.x!, 'base64url'),
      'whole JWK JSON': JSON.stringify(jwk),
    };
    const tokens: Record<string, string> = {};
    for (const [what, secret] of Object.entries(secrets)) {
      tokens[`HS256 with ${what}`] = forge({ alg: 'HS256' }, {}, hmacSigner(secret));
      tokens[`HS256 with ${what}, typ JWT`] = forge({ alg: 'HS256', typ: 'JWT' }, {}, hmacSigner(secret));
    }
    await assertAllRejected(tokens);
  });

  it('rejects an ES256 header on our EdDSA kid, signed with another P-256 key: 401', async () => {
    await controls();
    const p256 = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey;
    await assertAllRejected({
      'ES256 on our kid': forge({ alg: 'ES256' }, {}, es256Signer(p256)),
      'ES256 without kid': forge({ alg: 'ES256', kid: undefined }, {}, es256Signer(p256)),
    });
  });

  it('rejects EdDSA under our kid signed by a different Ed25519 key, and an embedded jwk: 401', async () => {
    await controls();
    const attacker = generateKeyPairSync('ed25519');
    const attackerJwk = await exportJWK(attacker.publicKey);
    const attackerKid = await calculateJwkThumbprint(attackerJwk);
    const attackerSigner = ed25519Signer(attacker.privateKey);
    await assertAllRejected({
      'our kid, attacker key': forge({}, {}, attackerSigner),
      'embedded attacker jwk, attacker kid': forge(
        { kid: attackerKid, jwk: attackerJwk },
        {},
        attackerSigner,
      ),
      'embedded attacker jwk, our kid': forge({ jwk: attackerJwk }, {}, attackerSigner),
      'jku pointing elsewhere': forge(
        { kid: attackerKid, jku: 'http://127.0.0.1:1/jwks.json' },
        {},
        attackerSigner,
      ),
    });
  });

  it('rejects an unknown kid even when the signature is valid: 401', async () => {
    await controls();
    const unknownKid = await calculateJwkThumbprint(
      await exportJWK(generateKeyPairSync('ed25519').publicKey),
    );
    await assertAllRejected({
      'random thumbprint kid': forge({ kid: unknownKid }),
      'kid with a different letter case': forge({
        kid: kid.toUpperCase() === kid ? kid.toLowerCase() : kid.toUpperCase(),
      }),
      'kid with a trailing character': forge({ kid: `${kid}A` }),
    });
  });

  it('rejects malicious kid values: path traversal, SQL, very long, missing, not a string: 401', async () => {
    await controls();
    await assertAllRejected({
      'path traversal': forge({ kid: '../../etc/passwd' }),
      'path traversal to the key file': forge({ kid: '../token-signing.key' }),
      'NUL byte': forge({ kid: `${kid}\u0000` }),
      'SQL tautology': forge({ kid: "' OR '1'='1" }),
      'SQL union': forge({ kid: `${kid}' UNION SELECT 1 --` }),
      'very long (4096 chars)': forge({ kid: 'k'.repeat(4096) }),
      missing: forge({ kid: undefined }),
      'empty string': forge({ kid: '' }),
      null: forge({ kid: null }),
      number: forge({ kid: 1 }),
      'array holding our kid': forge({ kid: [kid] }),
    });
    // The agent is still healthy after all that.
    assert.equal((await agent.client.get('/livez')).status, 200);
    await assertOk(genuine);
  });

  it('rejects a signature that is altered or stripped: 401', async () => {
    await controls();
    const [h, p, s] = genuine.split('.') as [string, string, string];
    const sig = Buffer.from(s, 'base64url');
    const flip = (i: number) => {
      const copy = Buffer.from(sig);
      copy[i] = copy[i]! ^ 0x01;
      return `${h}.${p}.${copy.toString('base64url')}`;
    };
    const second = await agent.client.token(adminId, adminSecret);
    await assertAllRejected({
      'first signature byte flipped': flip(0),
      'middle signature byte flipped': flip(31),
      'last signature byte flipped': flip(63),
      'signature truncated by one byte': `${h}.${p}.${sig.subarray(0, 63).toString('base64url')}`,
      'signature stripped (header.payload.)': `${h}.${p}.`,
      'signature segment missing (header.payload)': `${h}.${p}`,
      'signature of another genuine token': `${h}.${p}.${second.split('.')[2]}`,
      'all-zero signature': `${h}.${p}.${Buffer.alloc(64).toString('base64url')}`,
    });
    // The genuine token is still accepted: the rejected variants did not poison the cache.
    await assertOk(genuine, 'genuine token after the altered ones');
  });

  it('rejects extra segments (4 and 5 parts): 401', async () => {
    await controls();
    const [h, p, s] = genuine.split('.') as [string, string, string];
    await assertAllRejected({
      '4 parts, trailing dot': `${genuine}.`,
      '4 parts, signature repeated': `${genuine}.${s}`,
      '4 parts, segment inserted': `${h}.${p}.${p}.${s}`,
      '5 parts (JWE shape)': `${h}.${p}.${s}.${s}.${s}`,
      '5 parts, empty extra segments': `${genuine}..`,
    });
  });

  it('rejects typ other than at+jwt (JWT, jwt, missing): 401', async () => {
    await controls();
    await assertAllRejected({
      'typ JWT': forge({ typ: 'JWT' }),
      'typ jwt': forge({ typ: 'jwt' }),
      'typ application/jwt': forge({ typ: 'application/jwt' }),
      'typ missing': forge({ typ: undefined }),
      'typ empty': forge({ typ: '' }),
    });
  });

  it('rejects an expired token validly signed with the real key: 401', async () => {
    await controls();
    const now = nowSeconds();
    await assertAllRejected({
      'exp one hour ago': forge({}, { iat: now - 7200, exp: now - 3600 }),
      'exp 10 s ago': forge({}, { iat: now - 3610, exp: now - 10 }),
      'exp equal to now': forge({}, { iat: now - 3600, exp: now }),
      'exp missing': forge({}, { exp: undefined }),
      'exp as a string': forge({}, { exp: String(now + 3600) }),
    });
  });

  it('stops accepting a cached token the moment its exp passes: 401', async () => {
    // exp is whole seconds: 5 s ahead leaves at least 4 s for the two calls on a loaded machine
    const exp = nowSeconds() + 5;
    const shortLived = forge({}, { exp });
    await assertOk(shortLived, 'short-lived token before exp');
    await assertOk(shortLived, 'short-lived token again (served from the verification cache)');
    await new Promise((r) => setTimeout(r, Math.max(0, exp * 1000 - Date.now()) + 1200));
    assertUnauthorized(await call(shortLived), 'short-lived token after exp');
    await assertOk(genuine);
  });

  it('rejects nbf in the future: 401', async () => {
    await controls();
    await assertOk(forge({}, { nbf: nowSeconds() - 5 }), 'nbf in the past');
    await assertAllRejected({
      'nbf in one hour': forge({}, { nbf: nowSeconds() + 3600 }),
      'nbf in 30 s': forge({}, { nbf: nowSeconds() + 30 }),
    });
  });

  it('rejects a wrong iss: 401', async () => {
    await controls();
    const iss = String(genuineClaims.iss);
    await assertAllRejected({
      'another host': forge({}, { iss: 'https://evil.example' }),
      'the other agent': forge({}, { iss: other.url }),
      'trailing slash': forge({}, { iss: `${iss}/` }),
      'https instead of http': forge({}, { iss: iss.replace(/^http:/, 'https:') }),
      'iss missing': forge({}, { iss: undefined }),
      'iss as an array': forge({}, { iss: [iss] }),
    });
  });

  it("rejects a wrong aud, including another agent's genuine token: 401", async () => {
    await controls();
    // Control on the other side: the other agent's token is genuine where it was issued.
    const there = await other.client.get(PROTECTED, { token: otherGenuine });
    assert.equal(there.status, 200, there.text);
    assert.equal(decodeJwt(otherGenuine).aud, `urn:mesh-agent:peer:${otherPeerId}`);
    await assertAllRejected({
      "the other agent's genuine token": otherGenuine,
      "the other agent's aud, signed with our key": forge({}, { aud: `urn:mesh-agent:peer:${otherPeerId}` }),
      'aud missing': forge({}, { aud: undefined }),
      'aud of an unrelated service': forge({}, { aud: 'https://api.example' }),
    });
  });

  it('rejects a payload with edited scope, not re-signed: 401', async () => {
    const narrow = await agent.client.token(adminId, adminSecret, SCOPE('peers.read'));
    // Control: the narrow token works for what it holds and is refused (403) what it lacks.
    const peers = await agent.client.get('/v1/peers', { token: narrow });
    assert.equal(peers.status, 200, peers.text);
    const forbidden = await agent.client.get(PROTECTED, { token: narrow });
    assert.equal(forbidden.status, 403, forbidden.text);
    assert.equal(forbidden.body.code, 'FORBIDDEN');
    await assertOk(genuine);

    const [h, p, s] = narrow.split('.') as [string, string, string];
    const payload = JSON.parse(Buffer.from(p, 'base64url').toString());
    assert.equal(payload.scope, SCOPE('peers.read'));
    const edit = (changes: Json) => `${h}.${b64u({ ...payload, ...changes })}.${s}`;
    await assertAllRejected({
      'scope edited to admin': edit({ scope: SCOPE('admin') }),
      'scope edited to credentials.read': edit({ scope: SCOPE('credentials.read') }),
      'scope widened by appending admin': edit({ scope: `${SCOPE('peers.read')} ${SCOPE('admin')}` }),
      'exp pushed out': edit({ exp: Number(payload.exp) + 86_400 }),
    });
  });

  it('rejects validly signed tokens with unknown scopes or for a client that does not exist: 401', async () => {
    await controls();
    const ghost = 'mc_AAAAAAAAAAAAAAAAAAAAAA';
    await assertAllRejected({
      'unknown scope value': forge({}, { scope: SCOPE('root') }),
      'empty scope': forge({}, { scope: '' }),
      'scope as an array': forge({}, { scope: [SCOPE('admin')] }),
      'client that does not exist': forge({}, { sub: ghost, client_id: ghost }),
      'sub and client_id disagree': forge({}, { sub: ghost }),
    });
  });

  it("rejects a revoked credential's token on the very next request: 401", async () => {
    const created = await agent.client.post('/v1/credentials', {
      token: genuine,
      json: { scopes: [SCOPE('credentials.read')] },
    });
    assert.equal(created.status, 201, created.text);
    const token = await agent.client.token(created.body.client_id, created.body.client_secret);
    await assertOk(token, 'token of the new credential');
    await assertOk(token, 'again, now from the verification cache');
    const revoked = await agent.client.delete(`/v1/credentials/${created.body.client_id}`, {
      token: genuine,
    });
    assert.equal(revoked.status, 200, revoked.text);
    assertUnauthorized(await call(token), 'token of the revoked credential');
    await assertOk(genuine, 'the revoking admin token');
  });

  it('rejects a request without an Authorization header: 401', async () => {
    await assertOk(genuine);
    assertUnauthorized(await callWithHeader(undefined), 'no Authorization header');
    const res = await callWithHeader(undefined);
    // RFC 6750 §3.1: a request with no authentication information gets no error code.
    assert.doesNotMatch(String(res.headers['www-authenticate']), /error=/);
  });

  it('rejects Bearer with no token: 401', async () => {
    await assertOk(genuine);
    assertUnauthorized(await callWithHeader('Bearer'), 'Bearer alone');
    assertUnauthorized(await callWithHeader('Bearer '), 'Bearer and a space');
    assertUnauthorized(await callWithHeader(''), 'empty header');
    assertUnauthorized(await callWithHeader(genuine), 'token without a scheme');
  });

  it('names invalid_token in WWW-Authenticate for a token it refuses (RFC 6750 §3.1)', async () => {
    const res = await call(forge({}, { exp: nowSeconds() - 60 }));
    assertUnauthorized(res, 'expired token');
    assert.match(String(res.headers['www-authenticate']), /error="invalid_token"/);
  });

  it('rejects the Basic scheme with valid client credentials on an API endpoint: 401', async () => {
    await assertOk(genuine);
    const basic = Buffer.from(`${adminId}:${adminSecret}`).toString('base64');
    assertUnauthorized(await callWithHeader(`Basic ${basic}`), 'Basic with the admin credential');
    assertUnauthorized(await callWithHeader(`Basic ${genuine}`), 'Basic carrying the token');
    assertUnauthorized(await callWithHeader(`Token ${genuine}`), 'unknown scheme carrying the token');
    assertUnauthorized(await callWithHeader(`DPoP ${genuine}`), 'DPoP scheme carrying the token');
  });

  it('does not take the token from the query string or a form body (RFC 6750 §2.2, §2.3): 401', async () => {
    await assertOk(genuine);
    // The agent logs request paths without their query, so even a token a client wrongly puts in
    // the URL stays out of the log: the log check at stop() covers this one too.
    const valid = forge();
    await assertOk(valid, 'the same token in the header');
    assertUnauthorized(
      await agent.client.get(`${PROTECTED}?access_token=${valid}`),
      'access_token in the query string',
    );
    const form = await agent.client.post(PROTECTED, { form: { access_token: genuine, scopes: '' } });
    assertUnauthorized(form, 'access_token in a form body');
  });

  // RFC 9110 §11.1 (and RFC 7235 §2.1 before it): "the authentication scheme is a
  // case-insensitive token"; RFC 6750 §2.1 writes its credentials with that syntax. So
  // `bearer <token>` is a valid way to present a bearer token.
  it('accepts the Bearer scheme in any letter case (RFC 9110 §11.1): 200', async () => {
    await assertOk(genuine);
    for (const scheme of ['bearer', 'BEARER', 'bEaReR']) {
      const res = await callWithHeader(`${scheme} ${genuine}`);
      assert.equal(res.status, 200, `${scheme}: ${res.status} ${res.text}`);
    }
  });
});
