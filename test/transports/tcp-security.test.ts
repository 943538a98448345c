/**
 * Security properties of the tcp transport with real sockets on 127.0.0.1: only active peers,
 * authenticated by their Ed25519 identity keys, can open, read or inject; tampering and replay
 * deliver nothing and the tunnel survives them; the HTTP entry takes nothing but the exact
 * upgrade. Each refusal is counted by reason in faults().
 */
import assert from 'node:assert/strict';
import type { KeyObject } from 'node:crypto';
import { once } from 'node:events';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { after, afterEach, describe, it } from 'node:test';
import tls from 'node:tls';
import { requestUpgrade, TUNNEL_PATH } from '../../src/transports/http-upgrade.js';
import { StaticPeerDirectory } from '../../src/transports/static-directory.js';
import { TcpTransport, type TcpTransportOptions } from '../../src/transports/tcp.js';
import type { FaultReason } from '../../src/transports/tunnel.js';
import { selfSignedCertificate } from '../../src/transports/tunnel-certificate.js';
import { ecdsaCertificate } from '../helpers/ecdsa-certificate.js';
import { encodeDataFrames } from '../helpers/frame-builders.js';
import { newPeerIdentity as identity } from '../helpers/peer-identity.js';
import { waitUntil } from '../helpers/wait-until.js';
import { FaultProxy } from './fault-proxy.js';

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const eventually = waitUntil;

interface Identity {
  key: KeyObject;
  raw: Buffer;
  id: string;
}

/** An identity whose id sorts below (or above) the given one, so it is (or is not) the dialer. */
function identityBelow(id: string, below = true): Identity {
  for (;;) {
    const candidate = identity();
    if (candidate.id < id === below) return candidate;
  }
}

/** Everything a test starts, closed after it. */
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function listen(server: http.Server | net.Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        if (server instanceof http.Server) server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return (server.address() as AddressInfo).port;
}

interface Peer {
  who: Identity;
  transport: TcpTransport;
  port: number;
  messages: { from: string; text: string }[];
}

/** A peer: an API server (404 for requests, upgrades to its transport) and its transport. */
async function startPeer(
  who: Identity,
  directory: StaticPeerDirectory,
  options: Partial<TcpTransportOptions> = {},
): Promise<Peer> {
  const transport = new TcpTransport({
    localPeerId: who.id,
    identityKey: who.key,
    directory,
    scheme: 'http',
    backoff: { minMs: 50, maxMs: 200 },
    ...options,
  });
  const server = http.createServer((_req, res) => res.writeHead(404).end());
  server.on('upgrade', (req, socket, head) => {
    if (!transport.acceptUpgrade(req, socket, head)) socket.destroy();
  });
  const port = await listen(server);
  cleanups.push(() => transport.close());
  const messages: { from: string; text: string }[] = [];
  transport.on('message', (from, m) => messages.push({ from, text: m.toString() }));
  return { who, transport, port, messages };
}

interface RawClient {
  socket: tls.TLSSocket;
  /** Bytes the server sent inside the TLS stream. */
  received: Buffer[];
  closed: Promise<void>;
}

/**
 * A hand-made tunnel client: upgrade, then TLS 1.3 presenting whatever certificate the test
 * wants (or none). Resolves once the client's side of the handshake is done.
 */
async function rawClient(
  port: number,
  credentials: { key?: KeyObject; cert?: string } = {},
  tlsOptions: tls.ConnectionOptions = {},
): Promise<RawClient> {
  const raw = net.connect({ host: '127.0.0.1', port });
  raw.on('error', () => {});
  await once(raw, 'connect');
  await requestUpgrade(raw, `127.0.0.1:${port}`, 2000);
  const socket = tls.connect({
    socket: raw,
    rejectUnauthorized: false,
    minVersion: 'TLSv1.3',
    ...(credentials.key ? { key: credentials.key.export({ type: 'pkcs8', format: 'pem' }) } : {}),
    ...(credentials.cert ? { cert: credentials.cert } : {}),
    ...tlsOptions,
  });
  const received: Buffer[] = [];
  socket.on('data', (chunk: Buffer) => received.push(chunk));
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  socket.on('error', () => {});
  // Not events.once: a refused handshake ends in 'error', which is an outcome here, not a failure.
  await Promise.race([new Promise((resolve) => socket.once('secureConnect', resolve)), closed]);
  cleanups.push(() => {
    socket.destroy();
  });
  return { socket, received, closed };
}

/** Resolves when the promise does; fails the test after timeoutMs. */
async function within<T>(what: string, promise: Promise<T>, timeoutMs = 5000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`timed out after ${timeoutMs} ms waiting for: ${what}`)),
      timeoutMs,
    );
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function faultsOf(peer: Peer): Readonly<Record<FaultReason, number>> {
  return peer.transport.faults();
}

/** A and B, A the lower id (the dialer), both in the directory, B reached at `address` by A. */
async function pairOfPeers(options: Partial<TcpTransportOptions> = {}) {
  const b = identity();
  const a = identityBelow(b.id);
  const directory = new StaticPeerDirectory();
  const peerA = await startPeer(a, directory, options);
  const peerB = await startPeer(b, directory, options);
  directory.set(a.id, a.raw, `127.0.0.1:${peerA.port}`);
  directory.set(b.id, b.raw, `127.0.0.1:${peerB.port}`);
  return { a: peerA, b: peerB, directory };
}

describe('tcp transport security', { timeout: 120_000 }, () => {
  after(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });

  it('a client with a valid but unknown Ed25519 key cannot open a tunnel, and is counted', async () => {
    const { b } = await pairOfPeers();
    const stranger = identity();
    // By hand: the TLS handshake completes on the client side, then the server refuses.
    const client = await rawClient(b.port, {
      key: stranger.key,
      cert: selfSignedCertificate(stranger.key, 'x'),
    });
    client.socket.write(encodeDataFrames([Buffer.from('let me in')]));
    await within('the server closes the connection', client.closed);
    assert.equal(Buffer.concat(client.received).length, 0, 'not even an ACCEPT frame');
    assert.equal(faultsOf(b)['unknown-peer'], 1);
    // With the real dialer (a stranger transport that believes B is its peer).
    const strangerDirectory = new StaticPeerDirectory().set(b.who.id, b.who.raw, `127.0.0.1:${b.port}`);
    const dialer = await startPeer(identityBelow(b.who.id), strangerDirectory);
    const states: string[] = [];
    dialer.transport.on('state', (_p, s) => states.push(s));
    const tunnel = dialer.transport.ensure(b.who.id);
    tunnel.send([Buffer.from('hello?')]);
    await eventually('refused several times', () => faultsOf(b)['unknown-peer'] >= 3);
    assert.ok(!states.includes('up'), 'the stranger never saw its tunnel up');
    assert.equal(tunnel.stats().connects, 0);
    assert.deepEqual(b.messages, []);
    assert.equal(b.transport.tunnel(dialer.who.id), undefined);
  });

  it('a removed peer cannot open a tunnel, and revalidate() after the removal closes its open one', async () => {
    const { a, b, directory } = await pairOfPeers();
    const tunnel = a.transport.ensure(b.who.id);
    b.transport.ensure(a.who.id);
    await eventually('up', () => tunnel.state === 'up');
    tunnel.send([Buffer.from('while active')]);
    await eventually('delivered', () => b.messages.length === 1);
    directory.delete(a.who.id);
    b.transport.revalidate();
    assert.equal(b.transport.tunnel(a.who.id)!.state, 'down');
    assert.equal(faultsOf(b).revoked, 1);
    await eventually('A sees it closed', () => tunnel.state !== 'up');
    await eventually('A redials and is refused', () => faultsOf(b)['unknown-peer'] >= 2);
    tunnel.send([Buffer.from('after removal')]);
    await sleep(100);
    assert.deepEqual(
      b.messages.map((m) => m.text),
      ['while active'],
    );
    assert.equal(b.transport.tunnel(a.who.id)!.stats().connects, 1);
  });

  it('an inbound connection from a peer that is not the pair’s dialer is refused', async () => {
    const { a, b } = await pairOfPeers();
    // B (the higher id) dials A by hand with its genuine key: A must not take it.
    const client = await rawClient(a.port, { key: b.who.key, cert: selfSignedCertificate(b.who.key, 'b') });
    await within('closed', client.closed);
    assert.equal(faultsOf(a)['not-dialer'], 1);
    assert.equal(a.transport.tunnel(b.who.id), undefined);
  });

  it('a dialer reaching a server with the wrong key refuses it and sends nothing', async () => {
    const { a, b, directory } = await pairOfPeers();
    // An impostor at B's address: a genuine transport with another key that would accept A.
    const impostorId = identityBelow(a.who.id, false);
    const impostorDirectory = new StaticPeerDirectory().set(a.who.id, a.who.raw, `127.0.0.1:${a.port}`);
    const impostor = await startPeer(impostorId, impostorDirectory);
    directory.set(b.who.id, b.who.raw, `127.0.0.1:${impostor.port}`);
    const tunnel = a.transport.ensure(b.who.id);
    await eventually('A refused the impostor several times', () => faultsOf(a)['wrong-key'] >= 3);
    assert.equal(tunnel.stats().connects, 0);
    assert.notEqual(tunnel.state, 'up');
    tunnel.send([Buffer.from('secret')]);
    await sleep(100);
    assert.deepEqual(impostor.messages, []);
    assert.equal(tunnel.stats().dropped, 1);
    // Back to the real B: up at the next attempt.
    directory.set(b.who.id, b.who.raw, `127.0.0.1:${b.port}`);
    await eventually('up with the real B', () => tunnel.state === 'up');
  });

  it('a dialer refuses whatever answers at the address without the upgrade or without our TLS', async () => {
    const { a, directory } = await pairOfPeers({ upgradeTimeoutMs: 300, dialTimeoutMs: 1000 });
    const target = identityBelow(a.who.id, false);
    const cases: { name: string; answer: (socket: net.Socket) => void; reason: FaultReason }[] = [
      {
        name: 'a 200',
        answer: (s) => s.end('HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n'),
        reason: 'upgrade',
      },
      {
        name: 'a 101 to another protocol',
        answer: (s) =>
          s.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n'),
        reason: 'upgrade',
      },
      {
        name: 'a head over 4 KiB',
        answer: (s) => s.write(`HTTP/1.1 101 Switching Protocols\r\nX-Pad: ${'a'.repeat(5000)}\r\n`),
        reason: 'upgrade',
      },
      { name: 'silence', answer: () => {}, reason: 'upgrade' },
      {
        name: 'a 101 and then no TLS',
        answer: (s) =>
          s.write(
            'HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: mesh-tunnel/1\r\n\r\nnot a TLS server hello, not at all\r\n',
          ),
        reason: 'handshake',
      },
    ];
    for (const c of cases) {
      const server = net.createServer((socket) => {
        socket.on('error', () => {});
        socket.once('data', () => c.answer(socket));
      });
      const port = await listen(server);
      directory.set(target.id, target.raw, `127.0.0.1:${port}`);
      const before = faultsOf(a)[c.reason];
      const tunnel = a.transport.ensure(target.id);
      await eventually(`${c.name}: refused as ${c.reason}`, () => faultsOf(a)[c.reason] > before, 5000);
      assert.equal(tunnel.stats().connects, 0, c.name);
      a.transport.release(target.id);
    }
  });

  it('a man in the middle flipping one byte: nothing altered is delivered, the tunnel drops and recovers', async () => {
    const { a, b, directory } = await pairOfPeers();
    const proxy = await FaultProxy.start(b.port);
    cleanups.push(() => proxy.close());
    directory.set(b.who.id, b.who.raw, proxy.address);
    const aMessages: string[] = [];
    a.transport.on('message', (_p, m) => aMessages.push(m.toString()));
    const tunnel = a.transport.ensure(b.who.id);
    const back = b.transport.ensure(a.who.id);
    await eventually('up', () => tunnel.state === 'up' && back.state === 'up');
    tunnel.send([Buffer.from('before')]);
    await eventually('delivered', () => b.messages.length === 1);
    for (const [direction, sender, receiverFaults, received] of [
      ['to-server', tunnel, () => faultsOf(b).corrupt, () => b.messages.map((m) => m.text)],
      ['to-client', back, () => faultsOf(a).corrupt, () => aMessages],
    ] as const) {
      const connectsBefore = tunnel.stats().connects;
      const corruptBefore = receiverFaults();
      const tampered = proxy.tamperNext(direction);
      sender.send([Buffer.from(`altered ${direction}`)]);
      await within('the proxy flipped a byte', tampered);
      await eventually(
        'the receiver drops the connection as corrupt',
        () => receiverFaults() > corruptBefore,
      );
      await eventually(
        'reconnected',
        () => tunnel.state === 'up' && back.state === 'up' && tunnel.stats().connects === connectsBefore + 1,
      );
      sender.send([Buffer.from(`after ${direction}`)]);
      await eventually('later messages flow', () => received().includes(`after ${direction}`));
      assert.ok(!received().includes(`altered ${direction}`), 'the altered message was never delivered');
    }
    assert.deepEqual(
      b.messages.map((m) => m.text),
      ['before', 'after to-server'],
    );
    assert.deepEqual(aMessages, ['after to-client']);
  });

  it('the bytes of a recorded connection, replayed in a new one, deliver nothing', async () => {
    const { a, b, directory } = await pairOfPeers();
    const proxy = await FaultProxy.start(b.port);
    cleanups.push(() => proxy.close());
    directory.set(b.who.id, b.who.raw, proxy.address);
    const tunnel = a.transport.ensure(b.who.id);
    await eventually('up', () => tunnel.state === 'up');
    tunnel.send([Buffer.from('one'), Buffer.from('two')]);
    await eventually('delivered', () => b.messages.length === 2);
    a.transport.release(b.who.id);
    await eventually('the recorded connection ended', () => proxy.open === 0);
    const [recording] = proxy.recorded();
    assert.ok(recording && recording.length > 500, 'a whole connection recorded');
    const handshakesBefore = faultsOf(b).handshake;
    // Replayed to B directly, in one write (so B's upgrade handler also gets TLS bytes as `head`).
    const replay = net.connect({ host: '127.0.0.1', port: b.port });
    replay.on('error', () => {});
    const answer: Buffer[] = [];
    replay.on('data', (chunk: Buffer) => answer.push(chunk));
    await once(replay, 'connect');
    replay.write(recording);
    await within('B closes the replayed connection', once(replay, 'close'));
    assert.match(
      Buffer.concat(answer).toString('latin1'),
      /^HTTP\/1\.1 101 /,
      'the upgrade itself was answered',
    );
    assert.equal(faultsOf(b).handshake, handshakesBefore + 1);
    assert.deepEqual(
      b.messages.map((m) => m.text),
      ['one', 'two'],
    );
    assert.equal(b.transport.tunnel(a.who.id), undefined);
  });

  it('refuses requests that are not exactly the tunnel upgrade', async () => {
    const { b } = await pairOfPeers();
    const ask = (method: string, path: string, headers: Record<string, string>) =>
      new Promise<{ status?: number; upgraded: boolean; closed: boolean }>((resolve) => {
        const req = http.request({ host: '127.0.0.1', port: b.port, method, path, headers });
        req.on('response', (res) => {
          res.resume();
          resolve({ status: res.statusCode, upgraded: false, closed: false });
        });
        req.on('upgrade', (_res, socket) => {
          socket.destroy();
          resolve({ upgraded: true, closed: false });
        });
        req.on('error', () => resolve({ upgraded: false, closed: true }));
        req.end();
      });
    // No Upgrade header: an ordinary request, for the API's router (404 here), never the tunnel.
    assert.deepEqual(await ask('GET', TUNNEL_PATH, {}), { status: 404, upgraded: false, closed: false });
    const upgrade = { Connection: 'Upgrade' };
    for (const [method, path, protocol] of [
      ['GET', TUNNEL_PATH, 'websocket'],
      ['GET', TUNNEL_PATH, 'mesh-tunnel/2'],
      ['POST', TUNNEL_PATH, 'mesh-tunnel/1'],
      ['GET', `${TUNNEL_PATH}/x`, 'mesh-tunnel/1'],
      ['GET', '/v1/services', 'mesh-tunnel/1'],
    ] as const) {
      const result = await ask(method, path, { ...upgrade, Upgrade: protocol });
      assert.deepEqual(result, { upgraded: false, closed: true }, `${method} ${path} ${protocol}`);
    }
    // Counted only when the path was the tunnel's.
    assert.equal(faultsOf(b).upgrade, 3);
    // The genuine upgrade is answered (and then needs TLS).
    const genuine = await ask('GET', TUNNEL_PATH, { ...upgrade, Upgrade: 'mesh-tunnel/1' });
    assert.deepEqual(genuine, { upgraded: true, closed: false });
  });

  it('refuses a client without a certificate, with a non-Ed25519 one, or with a forged self-signature', async () => {
    const { a, b } = await pairOfPeers();
    const none = await rawClient(b.port);
    await within('closed (no certificate)', none.closed);
    assert.equal(faultsOf(b).certificate, 1);
    // An ECDSA certificate and key, made by the openssl CLI.
    const { key: ecKey, cert: ecCert } = ecdsaCertificate('ecdsa');
    const ec = await rawClient(b.port, {}, { key: ecKey, cert: ecCert });
    await within('closed (ECDSA)', ec.closed);
    assert.equal(faultsOf(b).certificate, 2);
    // A's genuine key (so the TLS handshake's proof of possession holds), its certificate's signature broken.
    const genuine = selfSignedCertificate(a.who.key, 'a');
    const der = Buffer.from(genuine.replace(/-----[A-Z ]+-----|\s/g, ''), 'base64');
    der[der.length - 1]! ^= 0x01;
    const forged = `-----BEGIN CERTIFICATE-----\n${der.toString('base64').replace(/.{64}/g, '$&\n')}\n-----END CERTIFICATE-----\n`;
    const broken = await rawClient(b.port, { key: a.who.key, cert: forged });
    await within('closed (forged signature)', broken.closed);
    assert.equal(faultsOf(b).certificate, 3);
    assert.equal(b.transport.tunnel(a.who.id), undefined);
    assert.deepEqual(b.messages, []);
  });

  it('refuses TLS 1.2', async () => {
    const { a, b } = await pairOfPeers();
    const old = await rawClient(
      b.port,
      { key: a.who.key, cert: selfSignedCertificate(a.who.key, 'a') },
      { minVersion: 'TLSv1.2', maxVersion: 'TLSv1.2' },
    );
    await within('closed', old.closed);
    assert.equal(faultsOf(b).handshake, 1);
    assert.equal(b.transport.tunnel(a.who.id), undefined);
  });

  it('a genuine peer sending a malformed frame is cut off', async () => {
    const { a, b } = await pairOfPeers();
    const client = await rawClient(b.port, { key: a.who.key, cert: selfSignedCertificate(a.who.key, 'a') });
    await eventually('ACCEPT received', () =>
      Buffer.concat(client.received).equals(Buffer.from([4, 0, 0, 0])),
    );
    assert.equal(b.transport.tunnel(a.who.id)?.state, 'up');
    client.socket.write(encodeDataFrames([Buffer.from('fine')]));
    await eventually('the valid frame delivered', () => b.messages.length === 1);
    // A DATA frame announcing 65537 bytes.
    client.socket.write(Buffer.from([1, 0x01, 0x00, 0x01]));
    await within('closed', client.closed);
    assert.equal(faultsOf(b).protocol, 1);
    assert.equal(b.transport.tunnel(a.who.id), undefined);
  });

  it('bounds inbound handshakes: a stalled one times out, too many at once are refused', async () => {
    const { b } = await pairOfPeers({ handshakeTimeoutMs: 300, maxPendingHandshakes: 2 });
    const stalled: Promise<unknown>[] = [];
    for (let i = 0; i < 3; i++) {
      const socket = net.connect({ host: '127.0.0.1', port: b.port });
      socket.on('error', () => {});
      const closed = once(socket, 'close');
      // Reading, so that the server's close is seen.
      socket.resume();
      await once(socket, 'connect');
      cleanups.push(() => {
        socket.destroy();
      });
      // The upgrade, then nothing: no ClientHello.
      socket.write(
        `GET ${TUNNEL_PATH} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: mesh-tunnel/1\r\n\r\n`,
      );
      stalled.push(closed);
      await sleep(20);
    }
    await within('the third is refused at once', stalled[2]!, 1000);
    assert.equal(faultsOf(b).busy, 1);
    assert.equal(faultsOf(b).handshake, 0);
    await within('the first two time out', Promise.all(stalled.slice(0, 2)), 3000);
    assert.equal(faultsOf(b).handshake, 2);
  });
});
