/**
 * The TCP connections an ingress carries as packets, so that their clients can be told at once
 * when the tunnel dies instead of waiting forever. Pure: it reads packet headers and builds
 * packets; the data plane (dataplane.ts) feeds it and writes what it builds into the TUN.
 *
 * Why: a client that only receives (a download) sends nothing while its server has gone silent,
 * so the kernel's refuse rule (plan.ts: `reject with tcp reset` on the way into a dead tunnel)
 * never sees a packet of it, and the client hangs. Making a reset the client accepts needs its
 * exact next expected sequence number (RFC 5961), which only the client's kernel knows. So the
 * ingress writes a probe into the TUN for each open connection, as if from the server: one byte
 * far outside the receive window. The client's kernel answers any such segment with an ACK
 * carrying that number (RFC 793 §3.9; Linux tcp_validate_incoming, never rate-limited for a
 * segment with data); that ACK heads into the dead tunnel, the refuse rule rejects it, and the
 * kernel's reset takes its sequence number from the ACK's acknowledgment field, which is exactly
 * what the client expects. The client's read then fails with ECONNRESET.
 *
 * Only SYN, FIN and RST segments touch the table; every other packet costs a few byte reads.
 */
import { randomBytes } from 'node:crypto';

const TCP = 6;
const FIN = 0x01;
const SYN = 0x02;
const RST = 0x04;
const ACK = 0x10;

/** Where the TCP header of an unfragmented IPv4/IPv6 TCP packet starts; -1 for anything else. */
function tcpOffset(p: Buffer): number {
  const version = p.length > 0 ? p[0]! >> 4 : 0;
  if (version === 4) {
    const ihl = (p[0]! & 0x0f) * 4;
    if (ihl < 20 || p.length < ihl + 20 || p[9] !== TCP || (p.readUInt16BE(6) & 0x1fff) !== 0) return -1;
    return ihl;
  }
  // Extension headers are not followed: a TCP packet behind one is simply not tracked.
  if (version === 6) return p.length >= 60 && p[6] === TCP ? 40 : -1;
  return -1;
}

/** Client address, server address, client port, server port: the flow's identity. */
interface FlowEnds {
  family: 4 | 6;
  client: Buffer;
  server: Buffer;
  clientPort: number;
  serverPort: number;
}

interface Flow {
  ends: FlowEnds;
  clientFin: boolean;
  serverFin: boolean;
}

function endsOf(p: Buffer, tcp: number, fromClient: boolean): FlowEnds {
  const family = p[0]! >> 4 === 4 ? 4 : 6;
  const [srcAt, dstAt, len] = family === 4 ? [12, 16, 4] : [8, 24, 16];
  const src = Buffer.from(p.subarray(srcAt, srcAt + len));
  const dst = Buffer.from(p.subarray(dstAt, dstAt + len));
  const srcPort = p.readUInt16BE(tcp);
  const dstPort = p.readUInt16BE(tcp + 2);
  return fromClient
    ? { family, client: src, server: dst, clientPort: srcPort, serverPort: dstPort }
    : { family, client: dst, server: src, clientPort: dstPort, serverPort: srcPort };
}

function keyOf(e: FlowEnds): string {
  return `${e.client.toString('hex')}/${e.clientPort}>${e.server.toString('hex')}/${e.serverPort}`;
}

export class TcpFlowTable {
  /** Insertion-ordered, so the oldest flow is the first one evicted when the table is full. */
  private readonly flows = new Map<string, Flow>();

  constructor(private readonly maxFlows = 16_384) {}

  get size(): number {
    return this.flows.size;
  }

  /** A packet from this side (the client's) on its way into the tunnel. */
  fromClient(p: Buffer): void {
    this.see(p, true);
  }

  /** A packet from the tunnel on its way to this side's client. */
  fromServer(p: Buffer): void {
    this.see(p, false);
  }

  private see(p: Buffer, fromClient: boolean): void {
    const tcp = tcpOffset(p);
    if (tcp < 0) return;
    const flags = p[tcp + 13]!;
    if ((flags & (SYN | FIN | RST)) === 0) return;
    const ends = endsOf(p, tcp, fromClient);
    const key = keyOf(ends);
    if (flags & RST) {
      this.flows.delete(key);
      return;
    }
    if (flags & SYN) {
      // A connection starts with the client's SYN; a SYN-ACK only confirms it.
      if (fromClient && !(flags & ACK) && !this.flows.has(key)) {
        if (this.flows.size >= this.maxFlows) this.flows.delete(this.flows.keys().next().value!);
        this.flows.set(key, { ends, clientFin: false, serverFin: false });
      }
      return;
    }
    const flow = this.flows.get(key);
    if (!flow) return;
    if (fromClient) flow.clientFin = true;
    else flow.serverFin = true;
    // A half-closed connection still carries data the other way; it ends when both sides closed.
    if (flow.clientFin && flow.serverFin) this.flows.delete(key);
  }

  /**
   * Two probes per open connection (see the header comment), then the table is emptied. Two,
   * because a probe whose random sequence number falls inside the client's window may go
   * unanswered; both doing so is a one-in-a-million event.
   */
  takeProbes(random: (size: number) => Buffer = randomBytes): Buffer[] {
    const probes = [...this.flows.values()].flatMap((f) => [
      probePacket(f.ends, random(8)),
      probePacket(f.ends, random(8)),
    ]);
    this.flows.clear();
    return probes;
  }
}

/**
 * From the server to the client: ACK with one byte of data, its sequence and acknowledgment
 * numbers random (8 bytes of `entropy`). A random sequence number lands inside a receive window
 * of a few MiB about once in a thousand; then it may go unanswered (an acknowledgment of data
 * never sent makes Linux discard the segment silently).
 */
export function probePacket(e: FlowEnds, entropy: Buffer): Buffer {
  const tcp = Buffer.alloc(21);
  tcp.writeUInt16BE(e.serverPort, 0);
  tcp.writeUInt16BE(e.clientPort, 2);
  entropy.copy(tcp, 4, 0, 8); // sequence and acknowledgment numbers
  tcp[12] = 5 << 4; // header length: 5 words, no options
  tcp[13] = ACK;
  tcp.writeUInt16BE(1024, 14); // window
  const length = Buffer.alloc(4);
  length.writeUInt32BE(tcp.length);
  const pseudo =
    e.family === 4
      ? Buffer.concat([e.server, e.client, Buffer.from([0, TCP]), length.subarray(2)])
      : Buffer.concat([e.server, e.client, length, Buffer.from([0, 0, 0, TCP])]);
  tcp.writeUInt16BE(internetChecksum(pseudo, tcp), 16);
  if (e.family === 4) {
    const ip = Buffer.alloc(20);
    ip[0] = 0x45;
    ip.writeUInt16BE(20 + tcp.length, 2);
    ip.writeUInt16BE(0x4000, 6); // don't fragment
    ip[8] = 64;
    ip[9] = TCP;
    e.server.copy(ip, 12);
    e.client.copy(ip, 16);
    ip.writeUInt16BE(internetChecksum(ip), 10);
    return Buffer.concat([ip, tcp]);
  }
  const ip = Buffer.alloc(40);
  ip[0] = 0x60;
  ip.writeUInt16BE(tcp.length, 4);
  ip[6] = TCP;
  ip[7] = 64;
  e.server.copy(ip, 8);
  e.client.copy(ip, 24);
  return Buffer.concat([ip, tcp]);
}

/** RFC 1071 over the parts as if concatenated (each part but the last has an even length). */
function internetChecksum(...parts: Buffer[]): number {
  let sum = 0;
  for (const part of parts) {
    let i = 0;
    for (; i + 1 < part.length; i += 2) sum += part.readUInt16BE(i);
    if (i < part.length) sum += part[i]! << 8;
  }
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  return ~sum & 0xffff;
}
