/**
 * POST /v1/bootstrap (API document, Bootstrap; docs/decisions.md §2): the shape checks (400), the
 * signature checks (422 LICENSE_INVALID), expiry (422 LICENSE_EXPIRED), the one success and the
 * 409 after it. After every refusal the agent must still be unbootstrapped.
 */
import assert from 'node:assert/strict';
import { createPublicKey } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { AgentProcess } from '../helpers/agent-process.js';
import { assertError, assertTimestamp } from '../helpers/api-assertions.js';
import { makeVendor } from '../helpers/licenses.js';

type Json = Record<string, unknown>;

const LICENSE_FIELDS = [
  'customer_id',
  'license_id',
  'issued_at',
  'expires_at',
  'max_nodes',
  'max_services',
  'signature',
] as const;

describe('POST /v1/bootstrap', () => {
  const vendor = makeVendor();
  const otherVendor = makeVendor();
  let agent: AgentProcess;

  const post = (body: unknown) => agent.client.post('/v1/bootstrap', { json: body });
  const license = (overrides: Parameters<typeof vendor.sign>[0] = {}) =>
    vendor.sign(overrides) as unknown as Json;

  async function assertNotBootstrapped(context: string): Promise<void> {
    const id = await agent.client.get('/v1/cluster/identity');
    assert.equal(id.status, 200);
    assert.equal(id.body.license_id, null, `${context}: license_id must still be null`);
    assert.equal(id.body.cluster_id, null, `${context}: cluster_id must still be null`);
  }

  async function expectRefused(body: unknown, status: number, code: string, context: string) {
    const res = await post(body);
    assertError(res, status, code, context);
    await assertNotBootstrapped(context);
    return res;
  }

  before(async () => {
    agent = await AgentProcess.start({ vendor });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('answers 400 INVALID_REQUEST when license is missing, null or not an object', async () => {
    await expectRefused({}, 400, 'INVALID_REQUEST', 'no license');
    await expectRefused({ name: 'x' }, 400, 'INVALID_REQUEST', 'only a name');
    await expectRefused({ license: null }, 400, 'INVALID_REQUEST', 'license null');
    await expectRefused({ license: 'abc' }, 400, 'INVALID_REQUEST', 'license a string');
    await expectRefused({ license: [license()] }, 400, 'INVALID_REQUEST', 'license an array');
    await expectRefused([{ license: license() }], 400, 'INVALID_REQUEST', 'body an array');
  });

  it('answers 400 INVALID_REQUEST for each missing license field', async () => {
    for (const field of LICENSE_FIELDS) {
      const lic = license();
      delete lic[field];
      await expectRefused({ license: lic }, 400, 'INVALID_REQUEST', `missing ${field}`);
    }
  });

  it('answers 400 INVALID_REQUEST for each wrong-typed license field', async () => {
    const wrong: Record<(typeof LICENSE_FIELDS)[number], unknown[]> = {
      customer_id: [42, null, true, ['c']],
      license_id: [7, null, { id: 'l' }],
      issued_at: [1_700_000_000, null, 'yesterday'],
      expires_at: [Date.now() + 86_400_000, null, '2031-13-45T99:00:00Z'],
      max_nodes: ['5', 5.5, null, true],
      max_services: ['10', 1.5, null, false],
      signature: [12345, null, ['AAAA']],
    };
    for (const [field, values] of Object.entries(wrong)) {
      for (const value of values) {
        const lic = license();
        lic[field] = value;
        await expectRefused({ license: lic }, 400, 'INVALID_REQUEST', `${field} = ${JSON.stringify(value)}`);
      }
    }
  });

  it('answers 400 INVALID_REQUEST for max_nodes < 1 and max_services < 0, even when signed', async () => {
    for (const overrides of [
      { max_nodes: 0 },
      { max_nodes: -1 },
      { max_services: -1 },
      { max_services: -100 },
    ]) {
      await expectRefused(
        { license: license(overrides) },
        400,
        'INVALID_REQUEST',
        `signed with ${JSON.stringify(overrides)}`,
      );
    }
  });

  it('lets max_nodes 1 and max_services 0 through the shape check to the signature check', async () => {
    const lic = otherVendor.sign({ max_nodes: 1, max_services: 0 });
    await expectRefused({ license: lic }, 422, 'LICENSE_INVALID', 'max_nodes 1, max_services 0, foreign key');
  });

  it('answers 400 INVALID_REQUEST for a name over 255 characters or a description over 1024', async () => {
    await expectRefused({ license: license(), name: 'n'.repeat(256) }, 400, 'INVALID_REQUEST', 'name 256');
    await expectRefused(
      { license: license(), description: 'd'.repeat(1025) },
      400,
      'INVALID_REQUEST',
      'description 1025',
    );
    await expectRefused({ license: license(), name: 5 }, 400, 'INVALID_REQUEST', 'name a number');
    await expectRefused(
      { license: license(), description: null },
      400,
      'INVALID_REQUEST',
      'description null',
    );
  });

  it('answers 400 INVALID_REQUEST for a body that is not JSON', async () => {
    const res = await agent.client.post('/v1/bootstrap', {
      body: '{"license": ',
      headers: { 'content-type': 'application/json' },
    });
    assertError(res, 400, 'INVALID_REQUEST', 'truncated JSON');
    await assertNotBootstrapped('truncated JSON');
  });

  it('answers 422 LICENSE_INVALID for each changed field', async () => {
    const changes: Record<string, unknown> = {
      customer_id: 'customer-other',
      license_id: 'license-other',
      issued_at: new Date(Date.now() - 120_000).toISOString(),
      expires_at: new Date(Date.now() + 3650 * 86_400_000).toISOString(),
      max_nodes: 500,
      max_services: 1000,
    };
    for (const [field, value] of Object.entries(changes)) {
      const lic = license();
      assert.notEqual(lic[field], value);
      lic[field] = value;
      await expectRefused({ license: lic }, 422, 'LICENSE_INVALID', `changed ${field}`);
    }
  });

  it('answers 422 LICENSE_INVALID for an added field', async () => {
    await expectRefused({ license: { ...license(), extra: 1 } }, 422, 'LICENSE_INVALID', 'added extra');
    await expectRefused(
      { license: { ...license(), features: ['all'] } },
      422,
      'LICENSE_INVALID',
      'added features',
    );
  });

  it('answers 422 LICENSE_INVALID for a signature by another key', async () => {
    const res = await expectRefused({ license: otherVendor.sign() }, 422, 'LICENSE_INVALID', 'other vendor');
    assert.match(res.body.error, /signature/i);
  });

  it('answers 422 LICENSE_INVALID for a signature that is not valid base64 of 64 bytes', async () => {
    const good = license().signature as string;
    const bad = [
      '!!!not-base64!!!',
      good.replace(/=+$/, ''), // padding dropped: not standard base64
      good.replace(/\+/g, '-').replace(/\//g, '_'), // URL alphabet
      Buffer.from(good, 'base64').subarray(0, 63).toString('base64'), // 63 bytes
      Buffer.alloc(64).toString('base64'), // right length, zero bytes
      `${good.slice(0, 10)} ${good.slice(10)}`, // whitespace inside
    ].filter((s) => s !== good);
    assert.ok(bad.length >= 5);
    for (const signature of bad) {
      await expectRefused(
        { license: { ...license(), signature } },
        422,
        'LICENSE_INVALID',
        `signature ${signature}`,
      );
    }
  });

  it('answers 422 LICENSE_EXPIRED for an expired license, and LICENSE_INVALID when it is also tampered', async () => {
    const past = {
      issued_at: new Date(Date.now() - 60 * 86_400_000).toISOString(),
      expires_at: new Date(Date.now() - 1000).toISOString(),
    };
    const expired = license(past);
    const res = await expectRefused({ license: expired }, 422, 'LICENSE_EXPIRED', 'expired');
    assert.match(res.body.error, /expire/i);
    await expectRefused(
      { license: { ...expired, max_nodes: 99 } },
      422,
      'LICENSE_INVALID',
      'expired and tampered',
    );
    await expectRefused({ license: otherVendor.sign(past) }, 422, 'LICENSE_INVALID', 'expired, foreign key');
  });

  let first: Json;
  let firstLicense: Json;

  it('bootstraps: 201 with every documented field, name up to 255 and description up to 1024', async () => {
    firstLicense = license({ license_id: 'license-first', max_nodes: 3, max_services: 7 });
    const name = 'n'.repeat(255);
    const res = await post({ license: firstLicense, name, description: 'd'.repeat(1024) });
    assert.equal(res.status, 201, res.text);
    first = res.body;
    const expected = [
      'peer_id',
      'peer_public_key',
      'client_id',
      'client_secret',
      'license_id',
      'cluster_id',
      'expires_at',
      'max_nodes',
      'max_services',
    ];
    for (const field of expected) assert.ok(field in first, `bootstrap answer has ${field}`);

    const id = await agent.client.get('/v1/cluster/identity');
    assert.equal(first.peer_id, id.body.peer_id);
    assert.equal(first.peer_public_key, id.body.public_key);
    assert.equal(first.cluster_id, id.body.cluster_id);
    assert.equal(first.license_id, 'license-first');
    assert.equal(id.body.license_id, 'license-first');
    assert.equal(first.expires_at, firstLicense.expires_at);
    assertTimestamp(first.expires_at, 'expires_at');
    assert.equal(first.max_nodes, 3);
    assert.equal(first.max_services, 7);
    assert.equal(typeof first.cluster_id, 'string');
    assert.ok((first.cluster_id as string).length > 0);

    // peer_public_key: base64 of the 32 raw bytes of an Ed25519 key.
    const raw = Buffer.from(first.peer_public_key as string, 'base64');
    assert.equal(raw.length, 32);
    assert.equal(raw.toString('base64'), first.peer_public_key);
    const key = createPublicKey({
      key: { kty: 'OKP', crv: 'Ed25519', x: raw.toString('base64url') },
      format: 'jwk',
    });
    assert.equal(key.asymmetricKeyType, 'ed25519');

    // The secret carries at least 32 random bytes.
    const secret = first.client_secret as string;
    assert.ok(Buffer.from(secret, 'base64url').length >= 32, 'client_secret of at least 32 bytes');

    // The credential is the first admin credential and it works.
    const token = await agent.client.token(first.client_id as string, secret);
    const creds = await agent.client.get('/v1/credentials', { token });
    assert.equal(creds.status, 200);
    assert.equal(creds.body.length, 1);
    assert.equal(creds.body[0].client_id, first.client_id);
    assert.deepEqual(creds.body[0].scopes, ['urn:vendor:service:admin']);
    assert.equal(creds.body[0].license_id, 'license-first');
    assert.ok(!('client_secret' in creds.body[0]));

    // The local peer carries the name and the advertised address.
    const peers = await agent.client.get('/v1/peers', { token });
    assert.equal(peers.body.length, 1);
    assert.equal(peers.body[0].id, first.peer_id);
    assert.equal(peers.body[0].name, name);
    assert.equal(peers.body[0].address, `127.0.0.1:${agent.port}`);
  });

  it('refuses a second bootstrap: 409 ALREADY_BOOTSTRAPPED whatever the license, and changes nothing', async () => {
    assert.ok(first, 'the bootstrap test ran first');
    const again = [
      { license: license({ license_id: 'license-second' }), name: 'second' },
      { license: firstLicense },
      { license: { ...license(), max_nodes: 99 } },
      { license: otherVendor.sign() },
      {
        license: license({
          issued_at: new Date(Date.now() - 9e9).toISOString(),
          expires_at: new Date(Date.now() - 1000).toISOString(),
        }),
      },
    ];
    for (const body of again) {
      assertError(await post(body), 409, 'ALREADY_BOOTSTRAPPED', JSON.stringify(body).slice(0, 60));
    }
    // A malformed request is still 400 first.
    assertError(await post({ license: { license_id: 'x' } }), 400, 'INVALID_REQUEST', 'malformed after');

    const id = await agent.client.get('/v1/cluster/identity');
    assert.equal(id.body.license_id, 'license-first');
    assert.equal(id.body.cluster_id, first.cluster_id);
    assert.equal(id.body.peer_id, first.peer_id);
    const token = await agent.client.token(first.client_id as string, first.client_secret as string);
    const creds = await agent.client.get('/v1/credentials', { token });
    assert.deepEqual(
      creds.body.map((c: Json) => c.client_id),
      [first.client_id],
    );
    const peers = await agent.client.get('/v1/peers', { token });
    assert.equal(peers.body.length, 1);
    assert.equal(peers.body[0].name, 'n'.repeat(255));
  });
});

describe('POST /v1/bootstrap, concurrent and with offset timestamps', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  before(async () => {
    agent = await AgentProcess.start({ vendor });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('bootstraps exactly once when eight requests race, and answers expires_at in UTC with ms and Z', async () => {
    // Offset form in the signed license; the answer's timestamp must still be UTC with ms and Z.
    const bodies = Array.from({ length: 8 }, (_, i) => ({
      license: vendor.sign({
        license_id: `race-${i}`,
        issued_at: '2020-01-01T02:00:00+02:00',
        expires_at: '2099-06-01T12:00:00+02:00',
      }),
    }));
    const answers = await Promise.all(bodies.map((json) => agent.client.post('/v1/bootstrap', { json })));
    const winners = answers.filter((r) => r.status === 201);
    assert.equal(winners.length, 1, answers.map((r) => r.status).join(','));
    for (const r of answers) if (r.status !== 201) assertError(r, 409, 'ALREADY_BOOTSTRAPPED');
    const win = winners[0]!.body;
    const id = await agent.client.get('/v1/cluster/identity');
    assert.equal(id.body.license_id, win.license_id);
    assert.equal(id.body.cluster_id, win.cluster_id);
    assertTimestamp(win.expires_at, 'expires_at of a license signed with an offset');
    assert.equal(win.expires_at, '2099-06-01T10:00:00.000Z');
  });
});
