import assert from 'node:assert/strict';
import type { IncomingMessage } from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { after, describe, it } from 'node:test';
import {
  isTunnelPath,
  isTunnelUpgrade,
  requestUpgrade,
  UPGRADE_RESPONSE,
  UpgradeRefused,
} from './http-upgrade.js';

const request = (method: string, url: string, headers: Record<string, string>) =>
  ({ method, url, headers }) as unknown as IncomingMessage;

/** A TCP server answering the first chunk it receives with `answer`; its port. */
async function answering(answer: (socket: net.Socket, request: string) => void): Promise<number> {
  const server = net.createServer((socket) => {
    sockets.push(socket);
    socket.on('error', () => {});
    socket.once('data', (chunk) => answer(socket, chunk.toString('latin1')));
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  return (server.address() as AddressInfo).port;
}
const servers: net.Server[] = [];

async function dial(port: number): Promise<net.Socket> {
  const socket = net.connect({ host: '127.0.0.1', port });
  socket.on('error', () => {});
  await new Promise((resolve) => socket.once('connect', resolve));
  sockets.push(socket);
  return socket;
}
const sockets: net.Socket[] = [];

describe('http upgrade', { timeout: 30_000 }, () => {
  after(async () => {
    for (const s of sockets) s.destroy();
    await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
  });

  it('recognises exactly GET /internal/v1/tunnel with Connection: upgrade and Upgrade: mesh-tunnel/1', () => {
    const good = { connection: 'keep-alive, Upgrade', upgrade: 'Mesh-Tunnel/1' };
    assert.ok(isTunnelUpgrade(request('GET', '/internal/v1/tunnel', good)));
    assert.ok(!isTunnelUpgrade(request('POST', '/internal/v1/tunnel', good)));
    assert.ok(!isTunnelUpgrade(request('GET', '/internal/v1/tunnel?x=1', good)));
    assert.ok(!isTunnelUpgrade(request('GET', '/internal/v1/tunnel', { ...good, upgrade: 'websocket' })));
    assert.ok(!isTunnelUpgrade(request('GET', '/internal/v1/tunnel', { ...good, connection: 'close' })));
    assert.ok(!isTunnelUpgrade(request('GET', '/internal/v1/tunnel', { upgrade: 'mesh-tunnel/1' })));
    assert.ok(isTunnelPath(request('GET', '/internal/v1/tunnel?x=1', {})));
    assert.ok(!isTunnelPath(request('GET', '/internal/v1/tunnels', {})));
  });

  it('sends the request and leaves the bytes after a 101 head unread on the socket', async () => {
    let seen = '';
    const port = await answering((socket, req) => {
      seen = req;
      socket.write(`${UPGRADE_RESPONSE}first bytes of the tunnel`);
    });
    const socket = await dial(port);
    await requestUpgrade(socket, '127.0.0.1:1234', 1000);
    assert.equal(
      seen,
      'GET /internal/v1/tunnel HTTP/1.1\r\nHost: 127.0.0.1:1234\r\nConnection: Upgrade\r\nUpgrade: mesh-tunnel/1\r\n\r\n',
    );
    // Paused, the rest waiting in the socket's buffer for whoever takes the socket over.
    assert.ok(socket.isPaused());
    const rest = await new Promise<Buffer>((resolve) => {
      socket.once('data', resolve);
      socket.resume();
    });
    assert.equal(rest.toString(), 'first bytes of the tunnel');
  });

  it('takes the answer head in pieces', async () => {
    const port = await answering((socket) => {
      const head = Buffer.from(UPGRADE_RESPONSE);
      socket.write(head.subarray(0, 10));
      setTimeout(() => socket.write(head.subarray(10, 50)), 20);
      setTimeout(() => socket.write(head.subarray(50)), 40);
    });
    await requestUpgrade(await dial(port), 'x', 1000);
  });

  it('refuses any other answer, a head over 4 KiB, silence, and a closed connection', async () => {
    const cases: [string, (socket: net.Socket) => void, RegExp, new (message?: string) => Error][] = [
      ['200', (s) => s.write('HTTP/1.1 200 OK\r\n\r\n'), /answered "HTTP\/1.1 200 OK"/, UpgradeRefused],
      [
        '101 websocket',
        (s) => s.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n'),
        /upgraded to "websocket"/,
        UpgradeRefused,
      ],
      ['101 without Upgrade', (s) => s.write('HTTP/1.1 101 OK\r\n\r\n'), /upgraded to ""/, UpgradeRefused],
      [
        'HTTP/1.0',
        (s) => s.write('HTTP/1.0 101 OK\r\nUpgrade: mesh-tunnel/1\r\n\r\n'),
        /answered/,
        UpgradeRefused,
      ],
      [
        'huge head',
        (s) => s.write(`HTTP/1.1 101 OK\r\nX: ${'y'.repeat(5000)}`),
        /over 4 KiB/,
        UpgradeRefused,
      ],
      [
        'huge head, complete',
        (s) => s.write(`HTTP/1.1 101 OK\r\nUpgrade: mesh-tunnel/1\r\nX: ${'y'.repeat(4100)}\r\n\r\n`),
        /over 4 KiB/,
        UpgradeRefused,
      ],
      ['silence', () => {}, /in time/, UpgradeRefused],
      ['closed', (s) => s.end(), /closed before/, Error],
    ];
    for (const [name, answer, message, kind] of cases) {
      const port = await answering(answer);
      const socket = await dial(port);
      const started = performance.now();
      await assert.rejects(requestUpgrade(socket, 'x', 300), (error: Error) => {
        assert.ok(error instanceof kind, name);
        assert.match(error.message, message, name);
        return true;
      });
      // bounded by the 300 ms timeout, with room for a stall of the loaded machine
      assert.ok(performance.now() - started < 2000, `${name}: bounded in time`);
    }
  });
});
