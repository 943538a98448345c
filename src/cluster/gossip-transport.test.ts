/**
 * The gossip transport against a real local HTTP server: answers come back, and the bytes it
 * reports for each exchange are exactly what the server's side of the kept-alive connection read
 * and wrote for it (the figures behind mesh_gossip_http_bytes_total); with a source address, its
 * connections come from that address.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { after, before, describe, it } from 'node:test';
import type { Envelope } from './gossip-envelope.js';
import { GOSSIP_PATH, gossipSourceAddress, HttpGossipTransport } from './gossip-transport.js';

describe('HttpGossipTransport', { timeout: 20_000 }, () => {
  let server: http.Server;
  let address = '';
  const sockets = new Set<Socket>();
  /** Per request, what the server's side of the connection read and wrote for it. */
  const seen: { read: number; written: number }[] = [];
  /** Per request, the address the server saw it come from. */
  const from: string[] = [];
  /** The connection's counters at the end of the previous exchange (one exchange at a time). */
  let readBefore = 0;
  let writtenBefore = 0;
  const transport = new HttpGossipTransport('http');

  before(async () => {
    server = http.createServer((req, res) => {
      const socket = req.socket;
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        assert.equal(req.url, GOSSIP_PATH);
        from.push(socket.remoteAddress ?? '');
        const read = socket.bytesRead - readBefore;
        readBefore = socket.bytesRead;
        const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Envelope;
        const answer = JSON.stringify({ echoed: body.payload, pad: 'x'.repeat(body.payload.length) });
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(answer, () => {
          seen.push({ read, written: socket.bytesWritten - writtenBefore });
          writtenBefore = socket.bytesWritten;
        });
      });
    });
    server.on('connection', (s) => sockets.add(s));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  });

  after(async () => {
    transport.close();
    for (const s of sockets) s.destroy();
    await new Promise((r) => server.close(r));
  });

  it('reports each exchange’s bytes on its kept-alive connection, exactly', async () => {
    const sizes = [10, 2_000, 70_000];
    const reported: { sent: number; received: number }[] = [];
    for (const n of sizes) {
      const envelope: Envelope = { payload: 'p'.repeat(n), kid: 'k', mac: 'm', sig: 's' };
      const reply = await transport.post(address, envelope, 5_000);
      assert.equal(reply.status, 200);
      assert.equal((reply.body as { echoed: string }).echoed, envelope.payload);
      assert.ok(reply.wireBytes, 'bytes reported');
      reported.push(reply.wireBytes);
    }
    assert.equal(sockets.size, 1, 'one kept-alive connection carried all three');
    for (const [i, r] of reported.entries()) {
      assert.deepEqual(
        r,
        { sent: seen[i]!.read, received: seen[i]!.written },
        `exchange ${i}: what the server read and wrote for it`,
      );
      assert.ok(r.sent > sizes[i]! && r.sent < sizes[i]! + 400, `request ${i}: its body and its headers`);
    }
  });

  it('connects from its source address when it has one, by route otherwise', async () => {
    const envelope: Envelope = { payload: 'p', kid: 'k', mac: 'm', sig: 's' };
    const bound = new HttpGossipTransport('http', '127.0.0.7');
    try {
      from.length = 0;
      assert.equal((await bound.post(address, envelope, 5_000)).status, 200);
      assert.equal((await transport.post(address, envelope, 5_000)).status, 200);
      assert.deepEqual(from, ['127.0.0.7', '127.0.0.1']);
    } finally {
      bound.close();
    }
  });
});

describe('gossipSourceAddress', () => {
  it('is the listen address only when that is also the advertised one', () => {
    for (const [listen, advertise, want] of [
      ['127.0.0.1', '127.0.0.1:7480', '127.0.0.1'],
      ['10.1.2.3', '10.1.2.3:7480', '10.1.2.3'],
      ['fd00::5', '[fd00::5]:7480', 'fd00::5'],
      ['10.1.2.3', '203.0.113.9:7480', undefined],
      ['127.0.0.1', 'mesh.example.com:443', undefined],
      ['0.0.0.0', '10.1.2.3:7480', undefined],
      ['::', '[fd00::5]:7480', undefined],
    ] as const) {
      assert.equal(gossipSourceAddress(listen, advertise), want, `${listen} advertised as ${advertise}`);
    }
  });
});
