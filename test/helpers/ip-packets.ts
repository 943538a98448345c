/**
 * Raw IPv4/IPv6 packets for tests that talk to a TUN device: parse what the kernel sends (header fields,
 * checksums), answer ICMP/ICMPv6 echo requests, build UDP datagrams with valid checksums.
 * Test-only; no production module imports it.
 */
import { isIPv4, isIPv6 } from 'node:net';

/** Internet checksum (RFC 1071) over the given parts, as one's complement of the one's complement sum. */
export function checksum(...parts: Uint8Array[]): number {
  let sum = 0;
  for (const part of parts) {
    let i = 0;
    for (; i + 1 < part.length; i += 2) sum += (part[i]! << 8) | part[i + 1]!;
    if (i < part.length) sum += part[i]! << 8;
  }
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  return ~sum & 0xffff;
}

export function ipv4Bytes(addr: string): Buffer {
  if (!isIPv4(addr)) throw new Error(`not an IPv4 address: ${addr}`);
  return Buffer.from(addr.split('.').map(Number));
}

export function ipv4String(b: Uint8Array): string {
  return Array.from(b).join('.');
}

export function ipv6Bytes(addr: string): Buffer {
  if (!isIPv6(addr)) throw new Error(`not an IPv6 address: ${addr}`);
  const [head, tail] = addr.includes('::') ? addr.split('::') : [addr, undefined];
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  const groups =
    tail === undefined ? h : [...h, ...new Array<string>(8 - h.length - t.length).fill('0'), ...t];
  const out = Buffer.alloc(16);
  groups.forEach((g, i) => {
    out.writeUInt16BE(Number.parseInt(g, 16), i * 2);
  });
  return out;
}

export interface IPv4Header {
  version: number;
  ihl: number;
  totalLength: number;
  ttl: number;
  protocol: number;
  src: string;
  dst: string;
  headerChecksumOk: boolean;
  payload: Buffer;
}

export function parseIPv4(p: Buffer): IPv4Header {
  const ihl = p[0]! & 0x0f;
  return {
    version: p[0]! >> 4,
    ihl,
    totalLength: p.readUInt16BE(2),
    ttl: p[8]!,
    protocol: p[9]!,
    src: ipv4String(p.subarray(12, 16)),
    dst: ipv4String(p.subarray(16, 20)),
    headerChecksumOk: checksum(p.subarray(0, ihl * 4)) === 0,
    payload: p.subarray(ihl * 4),
  };
}

export interface IPv6Header {
  version: number;
  payloadLength: number;
  nextHeader: number;
  hopLimit: number;
  src: Buffer;
  dst: Buffer;
  payload: Buffer;
}

export function parseIPv6(p: Buffer): IPv6Header {
  return {
    version: p[0]! >> 4,
    payloadLength: p.readUInt16BE(4),
    nextHeader: p[6]!,
    hopLimit: p[7]!,
    src: p.subarray(8, 24),
    dst: p.subarray(24, 40),
    payload: p.subarray(40),
  };
}

function ipv4Header(src: Buffer, dst: Buffer, protocol: number, payloadLength: number, id = 0): Buffer {
  const h = Buffer.alloc(20);
  h[0] = 0x45;
  h.writeUInt16BE(20 + payloadLength, 2);
  h.writeUInt16BE(id & 0xffff, 4);
  h[8] = 64;
  h[9] = protocol;
  src.copy(h, 12);
  dst.copy(h, 16);
  h.writeUInt16BE(checksum(h), 10);
  return h;
}

function ipv6PseudoHeader(src: Uint8Array, dst: Uint8Array, length: number, nextHeader: number): Buffer {
  const ph = Buffer.alloc(40);
  ph.set(src, 0);
  ph.set(dst, 16);
  ph.writeUInt32BE(length, 32);
  ph[39] = nextHeader;
  return ph;
}

/** The echo reply to an IPv4 ICMP echo request: addresses swapped, type 0, checksums recomputed. */
export function icmpEchoReplyV4(request: Buffer): Buffer {
  const req = parseIPv4(request);
  const icmp = Buffer.from(req.payload);
  icmp[0] = 0;
  icmp.writeUInt16BE(0, 2);
  icmp.writeUInt16BE(checksum(icmp), 2);
  return Buffer.concat([ipv4Header(ipv4Bytes(req.dst), ipv4Bytes(req.src), 1, icmp.length), icmp]);
}

/** The echo reply to an ICMPv6 echo request: addresses swapped, type 129, checksum over the pseudo-header. */
export function icmpEchoReplyV6(request: Buffer): Buffer {
  const req = parseIPv6(request);
  const icmp = Buffer.from(req.payload.subarray(0, req.payloadLength));
  icmp[0] = 129;
  icmp.writeUInt16BE(0, 2);
  icmp.writeUInt16BE(checksum(ipv6PseudoHeader(req.dst, req.src, icmp.length, 58), icmp), 2);
  const h = Buffer.alloc(40);
  h[0] = 0x60;
  h.writeUInt16BE(icmp.length, 4);
  h[6] = 58;
  h[7] = 64;
  req.dst.copy(h, 8);
  req.src.copy(h, 24);
  return Buffer.concat([h, icmp]);
}

/** An IPv4 UDP datagram with valid IP and UDP checksums. */
export function udpV4(
  src: string,
  dst: string,
  sport: number,
  dport: number,
  payload: Uint8Array,
  id = 0,
): Buffer {
  const s = ipv4Bytes(src);
  const d = ipv4Bytes(dst);
  const udp = Buffer.alloc(8 + payload.length);
  udp.writeUInt16BE(sport, 0);
  udp.writeUInt16BE(dport, 2);
  udp.writeUInt16BE(udp.length, 4);
  udp.set(payload, 8);
  const pseudo = Buffer.alloc(12);
  s.copy(pseudo, 0);
  d.copy(pseudo, 4);
  pseudo[9] = 17;
  pseudo.writeUInt16BE(udp.length, 10);
  udp.writeUInt16BE(checksum(pseudo, udp) || 0xffff, 6);
  return Buffer.concat([ipv4Header(s, d, 17, udp.length, id), udp]);
}

/** A test payload: a 32-bit sequence number then bytes derived from it, so corruption and mix-ups show. */
export function seqPayload(seq: number, length: number): Buffer {
  const b = Buffer.alloc(Math.max(4, length));
  b.writeUInt32BE(seq >>> 0, 0);
  for (let i = 4; i < b.length; i++) b[i] = (seq + i) & 0xff;
  return b;
}

/** The sequence number of a seqPayload, or -1 if any byte does not match. */
export function checkSeqPayload(b: Uint8Array): number {
  if (b.length < 4) return -1;
  const seq = ((b[0]! << 24) | (b[1]! << 16) | (b[2]! << 8) | b[3]!) >>> 0;
  for (let i = 4; i < b.length; i++) if (b[i] !== ((seq + i) & 0xff)) return -1;
  return seq;
}
