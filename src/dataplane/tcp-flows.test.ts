import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { checksum, ipv4Bytes, ipv6Bytes, parseIPv4, parseIPv6 } from '../../test/helpers/ip-packets.js';
import { TcpFlowTable } from './tcp-flows.js';

const FIN = 0x01;
const SYN = 0x02;
const RST = 0x04;
const PSH = 0x08;
const ACK = 0x10;

/** A TCP segment in an IP packet; only what the flow table reads is filled in. */
function tcp(src: string, sport: number, dst: string, dport: number, flags: number, payload = 0): Buffer {
  const t = Buffer.alloc(20 + payload);
  t.writeUInt16BE(sport, 0);
  t.writeUInt16BE(dport, 2);
  t[12] = 5 << 4;
  t[13] = flags;
  if (src.includes(':')) {
    const ip = Buffer.alloc(40);
    ip[0] = 0x60;
    ip.writeUInt16BE(t.length, 4);
    ip[6] = 6;
    ip[7] = 64;
    ipv6Bytes(src).copy(ip, 8);
    ipv6Bytes(dst).copy(ip, 24);
    return Buffer.concat([ip, t]);
  }
  const ip = Buffer.alloc(20);
  ip[0] = 0x45;
  ip.writeUInt16BE(20 + t.length, 2);
  ip[8] = 64;
  ip[9] = 6;
  ipv4Bytes(src).copy(ip, 12);
  ipv4Bytes(dst).copy(ip, 16);
  return Buffer.concat([ip, t]);
}

const C = '10.91.1.2';
const S = '10.91.2.2';
const syn = (port = 40000) => tcp(C, port, S, 80, SYN);

/** Counter-based entropy, so that each probe's numbers are known. */
function counterRandom() {
  let n = 0;
  return (size: number) => Buffer.alloc(size, ++n);
}

describe('TcpFlowTable', () => {
  it("tracks a connection from the client's SYN, not from a SYN-ACK or plain data", () => {
    const t = new TcpFlowTable();
    t.fromServer(tcp(S, 80, C, 40001, SYN | ACK));
    t.fromClient(tcp(C, 40002, S, 80, ACK | PSH, 100));
    assert.equal(t.size, 0);
    t.fromClient(syn());
    t.fromServer(tcp(S, 80, C, 40000, SYN | ACK));
    t.fromClient(tcp(C, 40000, S, 80, ACK, 500));
    t.fromClient(syn()); // a retransmitted SYN is the same connection
    assert.equal(t.size, 1);
  });

  it('forgets a connection on a reset from either side', () => {
    const t = new TcpFlowTable();
    t.fromClient(syn(1));
    t.fromClient(syn(2));
    t.fromServer(tcp(S, 80, C, 1, RST));
    t.fromClient(tcp(C, 2, S, 80, RST | ACK));
    assert.equal(t.size, 0);
  });

  it('keeps a half-closed connection and forgets it once both sides sent FIN', () => {
    const t = new TcpFlowTable();
    t.fromClient(syn());
    t.fromClient(tcp(C, 40000, S, 80, FIN | ACK));
    assert.equal(t.size, 1, 'the server may still be sending');
    t.fromServer(tcp(S, 80, C, 40000, FIN | ACK));
    assert.equal(t.size, 0);
  });

  it('ignores non-TCP packets, fragments and garbage', () => {
    const t = new TcpFlowTable();
    const udp = syn();
    udp[9] = 17;
    const fragment = syn();
    fragment.writeUInt16BE(0x0010, 6); // fragment offset 16
    for (const p of [udp, fragment, Buffer.alloc(0), Buffer.from([0x45, 0, 0]), Buffer.alloc(30, 0x60)]) {
      t.fromClient(p);
    }
    assert.equal(t.size, 0);
  });

  it('evicts the oldest connection when full', () => {
    const t = new TcpFlowTable(2);
    t.fromClient(syn(1));
    t.fromClient(syn(2));
    t.fromClient(syn(3));
    assert.equal(t.size, 2);
    const ports = t.takeProbes().map((p) => parseIPv4(p).payload.readUInt16BE(2));
    assert.deepEqual(ports, [2, 2, 3, 3]);
  });

  it('probes an IPv4 client as if from its server: ACK with one byte, valid checksums, then forgets', () => {
    const t = new TcpFlowTable();
    t.fromClient(syn(40000));
    const probes = t.takeProbes(counterRandom());
    assert.equal(t.size, 0);
    assert.equal(probes.length, 2);
    probes.forEach((p, i) => {
      const ip = parseIPv4(p);
      assert.equal(ip.src, S);
      assert.equal(ip.dst, C);
      assert.equal(ip.protocol, 6);
      assert.equal(ip.totalLength, p.length);
      assert.ok(ip.headerChecksumOk);
      const seg = ip.payload;
      assert.equal(seg.length, 21);
      assert.equal(seg.readUInt16BE(0), 80);
      assert.equal(seg.readUInt16BE(2), 40000);
      assert.equal(seg[13], ACK);
      // Each probe has its own numbers.
      assert.equal(seg.readUInt32BE(4), (i + 1) * 0x01010101);
      const pseudo = Buffer.concat([ipv4Bytes(S), ipv4Bytes(C), Buffer.from([0, 6, 0, seg.length])]);
      assert.equal(checksum(pseudo, seg), 0, 'TCP checksum');
    });
  });

  it('probes an IPv6 client with a valid TCP checksum', () => {
    const c6 = 'fd91:1::2';
    const s6 = 'fd91:2::2';
    const t = new TcpFlowTable();
    t.fromClient(tcp(c6, 5555, s6, 8080, SYN));
    const [p] = t.takeProbes();
    const ip = parseIPv6(p!);
    assert.deepEqual(ip.src, ipv6Bytes(s6));
    assert.deepEqual(ip.dst, ipv6Bytes(c6));
    assert.equal(ip.nextHeader, 6);
    assert.equal(ip.payloadLength, 21);
    const seg = ip.payload;
    assert.equal(seg.readUInt16BE(0), 8080);
    assert.equal(seg.readUInt16BE(2), 5555);
    const pseudo = Buffer.concat([ipv6Bytes(s6), ipv6Bytes(c6), Buffer.from([0, 0, 0, 21, 0, 0, 0, 6])]);
    assert.equal(checksum(pseudo, seg), 0, 'TCP checksum');
  });
});
