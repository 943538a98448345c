import assert from 'node:assert/strict';
import { createPublicKey, generateKeyPairSync } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import https from 'node:https';
import net, { type AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { afterEach, describe, it } from 'node:test';
import tls from 'node:tls';
import { newPeerIdentity as identity } from '../../test/helpers/peer-identity.js';
import { waitUntil } from '../../test/helpers/wait-until.js';
import { requestUpgrade } from './http-upgrade.js';
import { StaticPeerDirectory } from './static-directory.js';
import { TcpTransport, type TcpTransportOptions } from './tcp.js';
import { wholeOf } from './tunnel.js';
import { selfSignedCertificate } from './tunnel-certificate.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const eventually = waitUntil;

const cleanups: (() => Promise<unknown> | undefined)[] = [];
// Bounded: a close that never finishes fails here, naming the test, instead of holding the whole
// file until the runner's limit (seen once in CI, not reproduced in 20 runs under load).
afterEach(
  async () => {
    for (const c of cleanups.splice(0).reverse()) await c();
  },
  { timeout: 30_000 },
);

async function serve(server: net.Server, host = '127.0.0.1'): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, host, () => resolve()));
  cleanups.push(() => {
    if (server instanceof http.Server || server instanceof https.Server) server.closeAllConnections();
    return new Promise((resolve) => server.close(resolve));
  });
  return (server.address() as AddressInfo).port;
}

/** Two peers, each behind an API server of the given scheme; [dialer, acceptor]. */
async function twoPeers(
  scheme: 'http' | 'https',
  options: Partial<TcpTransportOptions> = {},
  host = '127.0.0.1',
  serverOptions: http.ServerOptions = {},
) {
  const directory = new StaticPeerDirectory();
  const made = [identity(), identity()].sort((x, y) => (x.id < y.id ? -1 : 1));
  const apiKey = generateKeyPairSync('ed25519').privateKey;
  const apiTls = {
    key: apiKey.export({ type: 'pkcs8', format: 'pem' }),
    cert: selfSignedCertificate(apiKey, 'api'),
  };
  const peers = [];
  for (const who of made) {
    const transport = new TcpTransport({
      localPeerId: who.id,
      identityKey: who.key,
      directory,
      scheme,
      ...options,
    });
    const handler = (_req: http.IncomingMessage, res: http.ServerResponse) => res.writeHead(404).end();
    const server =
      scheme === 'https'
        ? https.createServer({ ...apiTls, ...serverOptions }, handler)
        : http.createServer(serverOptions, handler);
    // What fastify's connectionTimeout sets.
    if (serverOptions.requestTimeout) server.setTimeout(serverOptions.requestTimeout);
    server.on('upgrade', (req, socket, head) => {
      if (!transport.acceptUpgrade(req, socket, head)) socket.destroy();
    });
    const port = await serve(server, host);
    // Closed before its server (cleanups run in reverse), which waits for the tunnel's socket.
    cleanups.push(() => transport.close());
    directory.set(who.id, who.raw, host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`);
    const got: Buffer[] = [];
    transport.on('message', (_p, m) => got.push(wholeOf(m)));
    peers.push({ who, transport, port, got });
  }
  return Object.assign(peers as [(typeof peers)[0], (typeof peers)[0]], { directory });
}

describe('tcp transport', { timeout: 60_000 }, () => {
  it('refuses to start with a key that is not an Ed25519 private key, or not the peer id’s', () => {
    const me = identity();
    const directory = new StaticPeerDirectory();
    const base = { localPeerId: me.id, identityKey: me.key, directory, scheme: 'http' as const };
    assert.throws(
      () => new TcpTransport({ ...base, identityKey: createPublicKey(me.key) }),
      /Ed25519 identity/,
    );
    assert.throws(
      () => new TcpTransport({ ...base, identityKey: generateKeyPairSync('x25519').privateKey }),
      /Ed25519 identity/,
    );
    assert.throws(() => new TcpTransport({ ...base, localPeerId: identity().id }), /peer id/);
    assert.throws(() => new TcpTransport({ ...base, highWaterMark: 1024 }), /highWaterMark/);
    assert.throws(() => new TcpTransport({ ...base, deadAfterMs: 0 }), /deadAfterMs/);
    assert.throws(() => new TcpTransport({ ...base, backoff: { minMs: 0 } }), RangeError);
    assert.equal(new TcpTransport(base).kind, 'tcp');
  });

  it('runs inside an HTTPS API port too (TLS in TLS), both ways, 64 KiB messages included', async () => {
    const [a, b] = await twoPeers('https');
    const tunnel = a.transport.ensure(b.who.id);
    await eventually('up', () => tunnel.state === 'up' && b.transport.tunnel(a.who.id)?.state === 'up');
    const big = Buffer.alloc(65_536, 0xab);
    tunnel.send([Buffer.from('small'), big]);
    b.transport.tunnel(a.who.id)!.send([big, Buffer.from('back')]);
    await eventually('delivered', () => b.got.length === 2 && a.got.length === 2);
    assert.equal(b.got[0]!.toString(), 'small');
    assert.ok(b.got[1]!.equals(big));
    assert.ok(a.got[0]!.equals(big));
    assert.equal(a.got[1]!.toString(), 'back');
  });

  it('bounds the unsent bytes of each tunnel socket to 4 ms of its send rate, 64 KiB to 4 MiB', async () => {
    const bounds = new Map<Duplex, number[]>();
    const [a, b] = await twoPeers('http', {
      keepaliveIntervalMs: 100,
      boundUnsent: (socket, bytes) => {
        const list = bounds.get(socket) ?? [];
        list.push(bytes);
        bounds.set(socket, list);
      },
    });
    const tunnel = a.transport.ensure(b.who.id);
    await eventually('up', () => tunnel.state === 'up' && b.transport.tunnel(a.who.id)?.state === 'up');
    // Each end's link bounds its own socket as soon as it is up.
    assert.equal(bounds.size, 2);
    for (const list of bounds.values()) assert.equal(list[0], 64 * 1024);
    // A second of bulk from a to b: a's bound follows the rate up.
    const block = Buffer.alloc(65_536);
    let drained = () => {};
    a.transport.on('drain', () => drained());
    let received = 0;
    const until = performance.now() + 1000;
    while (performance.now() < until) {
      // What arrived is counted, not kept: a second of loopback is hundreds of MB.
      received += b.got.reduce((n, m) => n + m.length, 0);
      b.got.length = 0;
      if (!tunnel.send([block])) {
        await Promise.race([
          new Promise<void>((resolve) => (drained = resolve)),
          new Promise((_, reject) => setTimeout(() => reject(new Error('no drain within 5 s')), 5000)),
        ]);
      }
    }
    const sent = Math.max(...[...bounds.values()].map((l) => l.length));
    const dialer = [...bounds.values()].find((l) => l.length === sent)!;
    const top = Math.max(...dialer);
    console.log(`# bounds ${dialer.map((x) => Math.round(x / 1024)).join(' ')} KiB; ${received} bytes`);
    assert.ok(top > 64 * 1024 && top <= 4 * 1024 * 1024, `the bound rose: ${top}`);
    // Idle again: back to the least.
    await eventually('back to 64 KiB', () => dialer.at(-1) === 64 * 1024);
  });

  it('dials an IPv6 address ([::1]:port)', async () => {
    const [a, b] = await twoPeers('http', {}, '::1');
    const tunnel = a.transport.ensure(b.who.id);
    await eventually('up', () => tunnel.state === 'up');
    tunnel.send([Buffer.from('over v6')]);
    await eventually('delivered', () => b.got.length === 1);
    assert.equal(b.got[0]!.toString(), 'over v6');
  });

  it('outlives the API server’s request, headers, idle and keep-alive timeouts', async () => {
    const short = {
      requestTimeout: 300,
      headersTimeout: 200,
      keepAliveTimeout: 100,
      connectionsCheckingInterval: 50,
    };
    const [a, b] = await twoPeers('http', {}, '127.0.0.1', short);
    const tunnel = a.transport.ensure(b.who.id);
    await eventually('up', () => tunnel.state === 'up');
    await sleep(1200);
    assert.equal(tunnel.state, 'up');
    assert.equal(tunnel.stats().connects, 1);
    tunnel.send([Buffer.from('still here')]);
    await eventually('delivered', () => b.got.length === 1);
  });

  it('the acceptor chooses AES-128-GCM over the client’s preference, and still speaks ChaCha20 alone', async () => {
    const [a, b] = await twoPeers('http');
    const connect = async (ciphers?: string) => {
      const raw = net.connect({ host: '127.0.0.1', port: b.port });
      await once(raw, 'connect');
      await requestUpgrade(raw, 'x', 1000);
      const socket = tls.connect({
        socket: raw,
        key: a.who.key.export({ type: 'pkcs8', format: 'pem' }),
        cert: selfSignedCertificate(a.who.key, 'a'),
        rejectUnauthorized: false,
        ...(ciphers ? { ciphers } : {}),
      });
      await once(socket, 'secureConnect');
      const cipher = socket.getCipher().standardName;
      socket.destroy();
      return cipher;
    };
    // OpenSSL's default client order puts AES-256-GCM first.
    assert.equal(await connect(), 'TLS_AES_128_GCM_SHA256');
    assert.equal(await connect('TLS_CHACHA20_POLY1305_SHA256'), 'TLS_CHACHA20_POLY1305_SHA256');
  });

  it('survives a stall of its own event loop longer than deadAfterMs', async () => {
    const [a, b] = await twoPeers('http', { keepaliveIntervalMs: 50, deadAfterMs: 200 });
    const tunnel = a.transport.ensure(b.who.id);
    await eventually('up', () => tunnel.state === 'up');
    await sleep(100);
    // Both ends live in this process: a busy second stalls them both, PINGs pile up unread.
    const until = performance.now() + 1000;
    while (performance.now() < until) {}
    await sleep(300);
    assert.equal(tunnel.state, 'up');
    assert.equal(tunnel.stats().connects, 1);
    assert.equal(a.transport.faults().dead + b.transport.faults().dead, 0);
    // And a peer that really goes silent is still found dead.
    await b.transport.close();
    await eventually('down after the peer closed', () => tunnel.state !== 'up', 1000);
  });

  it('gives a dial up after dialTimeoutMs when the handshake stalls, and tries again', async () => {
    const peers = await twoPeers('http', { dialTimeoutMs: 300, backoff: { minMs: 20, maxMs: 50 } });
    const [a] = peers;
    const directory = peers.directory;
    // A peer a dials (a higher id) whose address answers the upgrade and then says nothing.
    let silent = identity();
    while (silent.id < a.who.id) silent = identity();
    let attempts = 0;
    const port = await serve(
      net.createServer((socket) => {
        attempts++;
        socket.on('error', () => {});
        socket.once('data', () =>
          socket.write(
            'HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: mesh-tunnel/1\r\n\r\n',
          ),
        );
      }),
    );
    directory.set(silent.id, silent.raw, `127.0.0.1:${port}`);
    const tunnel = a.transport.ensure(silent.id);
    const started = performance.now();
    await eventually('two dials timed out', () => a.transport.faults().handshake >= 2, 3000);
    const elapsed = performance.now() - started;
    assert.ok(elapsed >= 550, `two 300 ms timeouts took ${elapsed.toFixed(0)} ms`);
    assert.ok(attempts >= 2);
    assert.equal(tunnel.stats().connects, 0);
  });
});
