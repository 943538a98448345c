/**
 * The one-shot peer handshake between real agent processes on loopback (docs/decisions.md §5): success
 * both ways, and every refusal, each leaving both agents unchanged.
 */
import assert from 'node:assert/strict';
import { createHash, generateKeyPairSync, sign } from 'node:crypto';
import http from 'node:http';
import { after, before, describe, it } from 'node:test';
import { AgentProcess } from '../helpers/agent-process.js';
import { makeVendor } from '../helpers/licenses.js';
import { type Node, startNode } from '../helpers/nodes.js';
import { freePort } from '../helpers/ports.js';

const addressOf = (a: Node) => `127.0.0.1:${a.agent.port}`;
const clusterIdOf = async (x: Node) =>
  (await x.agent.client.get('/v1/cluster/identity')).body.cluster_id as string;
const peerIds = async (a: Node) =>
  ((await a.agent.client.get('/v1/peers', { token: a.token })).body as { id: string }[])
    .map((p) => p.id)
    .sort();

describe('peer handshake', () => {
  const vendor = makeVendor();
  let a: Node;
  let b: Node;
  let c: Node;
  before(async () => {
    [a, b, c] = await Promise.all([startNode(vendor), startNode(vendor), startNode(vendor)]);
  });
  after(async () => {
    for (const x of [a, b, c]) if (x) assert.equal(await x.agent.stop(), 0);
  });

  it('adds a peer: both agents then list each other, the new one with the name it was bootstrapped with', async () => {
    const res = await a.agent.client.post('/v1/peers', { token: a.token, json: { address: addressOf(b) } });
    assert.equal(res.status, 201, res.text);
    assert.equal(res.body.id, b.peerId);
    assert.equal(res.body.is_local, false);
    assert.equal(res.body.name, 'test'); // bootstrapAgent's name
    assert.equal(res.body.address, addressOf(b));
    assert.deepEqual(await peerIds(a), [a.peerId, b.peerId].sort());
    assert.deepEqual(await peerIds(b), [a.peerId, b.peerId].sort());
    const onB = (await b.agent.client.get(`/v1/peers/${a.peerId}`, { token: b.token })).body;
    assert.equal(onB.is_local, false);
    assert.equal(onB.address, addressOf(a));
    // One cluster: the id of the cluster whose oldest peer is older (ties: lower peer id).
    assert.equal(await clusterIdOf(a), await clusterIdOf(b));
  });

  it('works the other way: the third agent adds the first', async () => {
    const res = await c.agent.client.post('/v1/peers', { token: c.token, json: { address: addressOf(a) } });
    assert.equal(res.status, 201, res.text);
    assert.ok((await peerIds(a)).includes(c.peerId));
    assert.ok((await peerIds(c)).includes(a.peerId));
    assert.equal(await clusterIdOf(a), await clusterIdOf(c));
  });

  it('keeps both peers’ names and versions through a join (an operator walk-through found them wiped)', async () => {
    const [d, e] = await Promise.all([startNode(vendor), startNode(vendor)]);
    try {
      const rename = async (n: Node, name: string) => {
        const res = await n.agent.client.put(`/v1/peers/${n.peerId}`, { token: n.token, json: { name } });
        assert.equal(res.status, 200, res.text);
      };
      await rename(d, 'site-d');
      await rename(e, 'first-name');
      await rename(e, 'site-e');
      const added = await d.agent.client.post('/v1/peers', {
        token: d.token,
        json: { address: addressOf(e) },
      });
      assert.equal(added.status, 201, added.text);
      assert.equal(added.body.name, 'site-e');
      const expected = [
        { id: d.peerId, name: 'site-d', version: 2 },
        { id: e.peerId, name: 'site-e', version: 3 },
      ].sort((x, y) => x.id.localeCompare(y.id));
      const view = async (n: Node) => {
        const res = await n.agent.client.get('/v1/peers', { token: n.token });
        return (res.body as { id: string; name: string; version: number }[])
          .map(({ id, name, version }) => ({ id, name, version }))
          .sort((x, y) => x.id.localeCompare(y.id));
      };
      assert.deepEqual(await view(d), expected);
      assert.deepEqual(await view(e), expected);
      // Anti-entropy both ways changes nothing.
      for (const n of [d, e]) {
        assert.equal(
          (await n.agent.client.post('/v1/cluster/sync', { token: n.token, json: {} })).status,
          200,
        );
      }
      assert.deepEqual(await view(d), expected);
      assert.deepEqual(await view(e), expected);
    } finally {
      for (const x of [d, e]) assert.equal(await x.agent.stop(), 0);
    }
  });

  it('refuses re-adding a known address or peer: 409 ALREADY_EXISTS', async () => {
    const again = await a.agent.client.post('/v1/peers', { token: a.token, json: { address: addressOf(b) } });
    assert.equal(again.status, 409);
    assert.equal(again.body.code, 'ALREADY_EXISTS');
    const self = await a.agent.client.post('/v1/peers', { token: a.token, json: { address: addressOf(a) } });
    assert.equal(self.status, 409);
    // The same peer under another name for its address.
    const alias = await a.agent.client.post('/v1/peers', {
      token: a.token,
      json: { address: `localhost:${b.agent.port}` },
    });
    assert.equal(alias.status, 409, alias.text);
  });
});

describe('peer handshake refusals', () => {
  const vendor = makeVendor();
  let a: Node;
  before(async () => {
    a = await startNode(vendor, { max_nodes: 2 });
  });
  after(async () => {
    assert.equal(await a.agent.stop(), 0);
  });

  it('refuses an agent under another license: 422 LICENSE_MISMATCH, nothing changes', async () => {
    const other = await startNode(vendor, { license_id: 'another-license' });
    try {
      const res = await a.agent.client.post('/v1/peers', {
        token: a.token,
        json: { address: addressOf(other) },
      });
      assert.equal(res.status, 422);
      assert.equal(res.body.code, 'LICENSE_MISMATCH');
      assert.deepEqual(await peerIds(a), [a.peerId]);
      assert.deepEqual(await peerIds(other), [other.peerId]);
    } finally {
      assert.equal(await other.agent.stop(), 0);
    }
  });

  it('refuses an agent that is not bootstrapped: 422 LICENSE_MISMATCH', async () => {
    const bare = await AgentProcess.start({ vendor });
    try {
      const res = await a.agent.client.post('/v1/peers', {
        token: a.token,
        json: { address: `127.0.0.1:${bare.port}` },
      });
      assert.equal(res.status, 422);
      assert.equal(res.body.code, 'LICENSE_MISMATCH');
    } finally {
      assert.equal(await bare.stop(), 0);
    }
  });

  it('refuses an address where nothing answers: 422 HANDSHAKE_FAILED', async () => {
    const res = await a.agent.client.post('/v1/peers', {
      token: a.token,
      json: { address: `127.0.0.1:${await freePort()}` },
    });
    assert.equal(res.status, 422);
    assert.equal(res.body.code, 'HANDSHAKE_FAILED');
  });

  it('refuses a remote that serves a stolen identity but cannot sign for it: 422 HANDSHAKE_FAILED', async () => {
    const victim = await startNode(vendor);
    const stolen = (await victim.agent.client.get('/v1/cluster/identity')).body;
    const impostorKey = generateKeyPairSync('ed25519').privateKey;
    const double = http.createServer((req, res) => {
      let body = '';
      req.on('data', (c) => {
        body += c;
      });
      req.on('end', () => {
        res.setHeader('content-type', 'application/json');
        if (req.url === '/v1/cluster/identity') return res.end(JSON.stringify(stolen));
        if (req.url === '/internal/v1/handshake/hello') {
          const hello = JSON.parse(body);
          const responder = {
            peer_id: stolen.peer_id,
            public_key: stolen.public_key,
            address: 'x:1',
            license_id: stolen.license_id,
            cluster_id: stolen.cluster_id,
            cluster_created_by: stolen.peer_id,
            oldest_peer_id: stolen.peer_id,
            oldest_peer_created_at: new Date().toISOString(),
            active_peer_ids: [stolen.peer_id],
          };
          // Signed with the impostor's own key: it does not hold the victim's.
          const signature = sign(null, Buffer.from(hello.nonce_a), impostorKey).toString('base64');
          return res.end(JSON.stringify({ version: 1, responder, nonce_b: 'AAAA', signature_b: signature }));
        }
        res.statusCode = 404;
        return res.end('{}');
      });
    });
    const port = await freePort();
    await new Promise<void>((r) => double.listen(port, '127.0.0.1', r));
    try {
      const res = await a.agent.client.post('/v1/peers', {
        token: a.token,
        json: { address: `127.0.0.1:${port}` },
      });
      assert.equal(res.status, 422, res.text);
      assert.equal(res.body.code, 'HANDSHAKE_FAILED');
      assert.deepEqual(await peerIds(a), [a.peerId]);
    } finally {
      double.close();
      assert.equal(await victim.agent.stop(), 0);
    }
  });

  it('refuses a join that would exceed max_nodes: 422 NODE_LIMIT_EXCEEDED, neither side changes', async () => {
    const b = await startNode(vendor, { max_nodes: 2 });
    const c = await startNode(vendor, { max_nodes: 2 });
    try {
      assert.equal(
        (await a.agent.client.post('/v1/peers', { token: a.token, json: { address: addressOf(b) } })).status,
        201,
      );
      const res = await a.agent.client.post('/v1/peers', { token: a.token, json: { address: addressOf(c) } });
      assert.equal(res.status, 422, res.text);
      assert.equal(res.body.code, 'NODE_LIMIT_EXCEEDED');
      assert.equal((await peerIds(a)).length, 2);
      assert.deepEqual(await peerIds(c), [c.peerId]);
      // And from the other side: the full cluster refuses the newcomer's request too.
      const reverse = await c.agent.client.post('/v1/peers', {
        token: c.token,
        json: { address: addressOf(a) },
      });
      assert.equal(reverse.status, 422, reverse.text);
      assert.equal(reverse.body.code, 'NODE_LIMIT_EXCEEDED');
      assert.deepEqual(await peerIds(c), [c.peerId]);
    } finally {
      assert.equal(await b.agent.stop(), 0);
      assert.equal(await c.agent.stop(), 0);
    }
  });

  it('follows no redirect, waits at most 2 s and reads at most 64 KiB of an identity: 422 HANDSHAKE_FAILED', async () => {
    const real = await startNode(vendor);
    let hangs = 0;
    const double = http.createServer((req, res) => {
      if (req.url !== '/v1/cluster/identity') return res.writeHead(404).end();
      const kind = req.headers.host?.split(':')[0];
      if (kind === '127.0.0.2') {
        // A redirect to a genuine agent of the same license: following it would succeed.
        return res
          .writeHead(302, { location: `http://127.0.0.1:${real.agent.port}/v1/cluster/identity` })
          .end();
      }
      if (kind === '127.0.0.3') {
        hangs++;
        return; // never answers
      }
      // 127.0.0.4: a valid identity padded past 64 KiB.
      res.writeHead(200, { 'content-type': 'application/json' });
      return res.end(
        JSON.stringify({
          peer_id: 'x',
          public_key: 'y',
          license_id: 'license-test',
          pad: 'z'.repeat(70_000),
        }),
      );
    });
    const port = await freePort('0.0.0.0');
    await new Promise<void>((r) => double.listen(port, '0.0.0.0', r));
    const peersBefore = await peerIds(a);
    try {
      for (const host of ['127.0.0.2', '127.0.0.3', '127.0.0.4']) {
        const started = Date.now();
        const res = await a.agent.client.post('/v1/peers', {
          token: a.token,
          json: { address: `${host}:${port}` },
        });
        const took = Date.now() - started;
        assert.equal(res.status, 422, `${host}: ${res.text}`);
        assert.equal(res.body.code, 'HANDSHAKE_FAILED', host);
        if (host === '127.0.0.3') {
          assert.ok(took >= 1900 && took < 6000, `gave up after ${took} ms`);
          assert.match(res.body.error, /no answer within 2000 ms/);
        }
        // Without the cap the padded identity would be parsed and fail later for another reason.
        if (host === '127.0.0.4') assert.match(res.body.error, /larger than 65536 bytes/);
        if (host === '127.0.0.2') assert.match(res.body.error, /refused the handshake: status 302|not JSON/);
      }
      assert.equal(hangs, 1);
      assert.deepEqual(await peerIds(a), peersBefore, 'nothing added');
    } finally {
      double.closeAllConnections();
      double.close();
      assert.equal(await real.agent.stop(), 0);
    }
  });

  it('refuses a hello that claims the license_id without a license signed by a trusted key: 422, nothing stored', async () => {
    const identity = (await a.agent.client.get('/v1/cluster/identity')).body;
    const key = generateKeyPairSync('ed25519');
    const raw = Buffer.from(key.publicKey.export({ format: 'jwk' }).x as string, 'base64url');
    const peerId = createHash('sha256').update(raw).digest('hex').slice(0, 32);
    const initiator = (license: unknown) => ({
      peer_id: peerId,
      public_key: raw.toString('base64'),
      address: '127.0.0.1:1',
      created_at: new Date().toISOString(),
      license_id: identity.license_id,
      license,
      cluster_id: 'x',
      cluster_created_by: peerId,
      oldest_peer_id: peerId,
      oldest_peer_created_at: '1970-01-01T00:00:00.000Z',
      active_peer_ids: [],
      service_count: 0,
    });
    const otherVendor = makeVendor();
    const forgedLicenses = [
      otherVendor.sign({ license_id: identity.license_id }), // same id, untrusted signer
      { ...vendor.sign({ license_id: identity.license_id }), max_nodes: 1000 }, // altered after signing
    ];
    const before = await peerIds(a);
    for (const license of forgedLicenses) {
      const res = await a.agent.client.post('/internal/v1/handshake/hello', {
        json: { version: 1, initiator: initiator(license), nonce_a: 'AAAA' },
      });
      assert.equal(res.status, 422, res.text);
      assert.equal(res.body.code, 'LICENSE_MISMATCH');
    }
    assert.deepEqual(await peerIds(a), before);
    assert.notEqual((await a.agent.client.get('/v1/cluster/identity')).body.cluster_id, 'x');
  });

  it('lets an agent that has left neither join nor be joined: 422 HANDSHAKE_FAILED', async () => {
    const gone = await startNode(vendor);
    const other = await startNode(vendor);
    try {
      const left = await gone.agent.client.delete('/v1/peers/self', { token: gone.token });
      assert.equal(left.status, 200);
      const out = await gone.agent.client.post('/v1/peers', {
        token: gone.token,
        json: { address: addressOf(other) },
      });
      assert.equal(out.status, 422, out.text);
      assert.equal(out.body.code, 'HANDSHAKE_FAILED');
      const inbound = await other.agent.client.post('/v1/peers', {
        token: other.token,
        json: { address: addressOf(gone) },
      });
      assert.equal(inbound.status, 422, inbound.text);
      assert.equal(inbound.body.code, 'HANDSHAKE_FAILED');
      assert.deepEqual(await peerIds(other), [other.peerId]);
    } finally {
      assert.equal(await gone.agent.stop(), 0);
      assert.equal(await other.agent.stop(), 0);
    }
  });

  it('refuses malformed addresses without dialing: 400 INVALID_REQUEST', async () => {
    for (const address of ['127.0.0.1:0', '127.0.0.1:65536', '::1:7480', 'x'.repeat(10_000), '', 'host']) {
      const res = await a.agent.client.post('/v1/peers', { token: a.token, json: { address } });
      assert.equal(res.status, 400, address.slice(0, 30));
      assert.equal(res.body.code, 'INVALID_REQUEST');
    }
    const missing = await a.agent.client.post('/v1/peers', { token: a.token, json: {} });
    assert.equal(missing.status, 400);
  });
});
