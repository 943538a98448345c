/**
 * The wire format of TCP streams carried over a peer tunnel (the stream path, docs/dataplane.md):
 * the tunnel messages of kinds 2..8, beside packet-frames.ts's KIND_PACKET = 1. Kinds 2..8 are RESERVED for streams,
 * one per frame type below; the data plane hands every message of these kinds to the StreamMux
 * (streams.ts). Pure: encoders and a decoder that never throws on garbage.
 *
 * Every frame is [kind u8][stream id u32 BE][...]. Layouts after the stream id:
 * - OPEN (2):      [service uuid 16][opener's receive window u32][family u8: 4|6]
 *                  [src addr 4|16][src port u16][dst addr 4|16][dst port u16][flags u8]
 *                  flags: bit 0 TRANSPARENT (fully_transparent: the exit connects from the src
 *                  address); other bits 0, ignored when read. A sender before the flags byte
 *                  left it out: read as 0.
 * - OPEN_OK (3):   [exit's receive window u32]
 * - OPEN_FAIL (4): [reason u8] (FAIL_REASONS; an unknown byte decodes as 'other')
 * - DATA (5):      [1..MAX_DATA_PAYLOAD bytes]
 * - WINDOW (6):    [credit u32 >= 1]
 * - FIN (7), RST (8): nothing
 * Each side announces the window it grants in OPEN / OPEN_OK, so two agents configured with
 * different windows still agree on the credit.
 *
 * WARNING: the numbers are on the wire: ONLY APPEND kinds and reasons.
 */
import { formatIp, parseIpv4, parseIpv6 } from '../domain/cidr.js';
import { MAX_MESSAGE_BYTES, type MessageParts, type TunnelMessage, wholeOf } from '../transports/tunnel.js';
import { uuidBytes, uuidText } from './packet-frames.js';

export const KIND_STREAM_OPEN = 2;
export const KIND_STREAM_OPEN_OK = 3;
export const KIND_STREAM_OPEN_FAIL = 4;
export const KIND_STREAM_DATA = 5;
export const KIND_STREAM_WINDOW = 6;
export const KIND_STREAM_FIN = 7;
export const KIND_STREAM_RST = 8;

/** Kinds 2..8: the messages the data plane routes to the StreamMux. */
export function isStreamKind(kind: number | undefined): boolean {
  return kind !== undefined && kind >= KIND_STREAM_OPEN && kind <= KIND_STREAM_RST;
}

const HEADER = 5;
/** The most payload one DATA frame holds: a tunnel message is at most 64 KiB. */
export const MAX_DATA_PAYLOAD = MAX_MESSAGE_BYTES - HEADER;
export const MAX_STREAM_ID = 0xffff_ffff;
export const MAX_WINDOW = 0xffff_ffff;

/** The four-tuple of a carried connection: the client's address and the original destination. */
export interface StreamEnds {
  family: 4 | 6;
  srcAddr: string;
  srcPort: number;
  dstAddr: string;
  dstPort: number;
}

/** Why an exit could not open a stream (sent in OPEN_FAIL). Index + 1 is the byte on the wire. */
export const FAIL_REASONS = ['refused', 'unreachable', 'timeout', 'unauthorized', 'other'] as const;
export type OpenFailReason = (typeof FAIL_REASONS)[number];

export type StreamFrame =
  | {
      kind: 'open';
      id: number;
      serviceId: string;
      window: number;
      ends: StreamEnds;
      /** The ingress asks the exit to connect from ends.srcAddr (fully_transparent). */
      transparent: boolean;
    }
  | { kind: 'open_ok'; id: number; window: number }
  | { kind: 'open_fail'; id: number; reason: OpenFailReason }
  | { kind: 'data'; id: number; payload: TunnelMessage }
  | { kind: 'window'; id: number; credit: number }
  | { kind: 'fin'; id: number }
  | { kind: 'rst'; id: number };

export type DecodedStreamFrame = StreamFrame | { kind: 'malformed'; reason: string };

function header(kind: number, id: number, rest: number): Buffer {
  if (!Number.isInteger(id) || id < 0 || id > MAX_STREAM_ID) throw new Error(`bad stream id ${id}`);
  const out = Buffer.allocUnsafe(HEADER + rest);
  out[0] = kind;
  out.writeUInt32BE(id, 1);
  return out;
}

function checkWindow(window: number): void {
  if (!Number.isInteger(window) || window < 1 || window > MAX_WINDOW) throw new Error(`bad window ${window}`);
}

function checkPort(port: number): void {
  if (!Number.isInteger(port) || port < 0 || port > 0xffff) throw new Error(`bad port ${port}`);
}

function addressBytes(family: 4 | 6, text: string): Uint8Array {
  const bytes = family === 4 ? parseIpv4(text) : parseIpv6(text);
  if (!bytes) throw new Error(`not an IPv${family} address: ${text}`);
  return bytes;
}

/** A service's id as 16 bytes, parsed once per service (every OPEN carries it). */
const idBytesCache = new Map<string, Buffer>();
function serviceIdBytes(serviceId: string): Buffer {
  let bytes = idBytesCache.get(serviceId);
  if (!bytes) {
    bytes = uuidBytes(serviceId);
    // Services are few (the license's max_services); a bound all the same.
    if (idBytesCache.size >= 4096) idBytesCache.clear();
    idBytesCache.set(serviceId, bytes);
  }
  return bytes;
}

/** OPEN flags (the byte after the destination port). */
const OPEN_FLAG_TRANSPARENT = 0x01;

/** Throws on an invalid argument (a bad address, port, window or service id): a caller's bug. */
export function encodeOpen(
  id: number,
  serviceId: string,
  window: number,
  ends: StreamEnds,
  transparent = false,
): Buffer {
  checkWindow(window);
  checkPort(ends.srcPort);
  checkPort(ends.dstPort);
  if (ends.family !== 4 && ends.family !== 6) throw new Error(`bad family ${String(ends.family)}`);
  const src = addressBytes(ends.family, ends.srcAddr);
  const dst = addressBytes(ends.family, ends.dstAddr);
  const service = serviceIdBytes(serviceId);
  const out = header(KIND_STREAM_OPEN, id, 16 + 4 + 1 + 2 * (src.length + 2) + 1);
  let at = HEADER;
  service.copy(out, at);
  at += 16;
  out.writeUInt32BE(window, at);
  at += 4;
  out[at++] = ends.family;
  out.set(src, at);
  at += src.length;
  out.writeUInt16BE(ends.srcPort, at);
  at += 2;
  out.set(dst, at);
  at += dst.length;
  out.writeUInt16BE(ends.dstPort, at);
  at += 2;
  out[at] = transparent ? OPEN_FLAG_TRANSPARENT : 0;
  return out;
}

export function encodeOpenOk(id: number, window: number): Buffer {
  checkWindow(window);
  const out = header(KIND_STREAM_OPEN_OK, id, 4);
  out.writeUInt32BE(window, HEADER);
  return out;
}

export function encodeOpenFail(id: number, reason: OpenFailReason): Buffer {
  const out = header(KIND_STREAM_OPEN_FAIL, id, 1);
  out[HEADER] = FAIL_REASONS.indexOf(reason) + 1;
  return out;
}

/**
 * One DATA frame holding `length` bytes taken from the front of `chunks` (which must have them),
 * as a header and views of the chunks: the payload is not copied (the transport writes long
 * pieces by reference), so the chunks must not change afterwards.
 */
export function encodeDataParts(id: number, chunks: readonly Buffer[], length: number): MessageParts {
  if (!Number.isInteger(length) || length < 1 || length > MAX_DATA_PAYLOAD)
    throw new Error(`bad DATA length ${length}`);
  const parts = [header(KIND_STREAM_DATA, id, 0)];
  let left = length;
  for (let i = 0; i < chunks.length && left > 0; i++) {
    const chunk = chunks[i]!;
    const piece = chunk.length <= left ? chunk : chunk.subarray(0, left);
    parts.push(piece);
    left -= piece.length;
  }
  if (left !== 0) throw new Error('DATA chunks are shorter than the length');
  return { parts, length: HEADER + length };
}

export function encodeWindow(id: number, credit: number): Buffer {
  checkWindow(credit);
  const out = header(KIND_STREAM_WINDOW, id, 4);
  out.writeUInt32BE(credit, HEADER);
  return out;
}

export function encodeFin(id: number): Buffer {
  return header(KIND_STREAM_FIN, id, 0);
}

export function encodeRst(id: number): Buffer {
  return header(KIND_STREAM_RST, id, 0);
}

const malformed = (reason: string): DecodedStreamFrame => ({ kind: 'malformed', reason });

/**
 * Decodes a stream message (kinds 2..8). Never throws: anything that is not exactly one of the
 * layouts above is 'malformed'. A DATA payload is a view into the message, or views into its
 * pieces when it came in pieces (not copied); other frames in pieces are copied together first.
 */
export function decodeStreamFrame(received: TunnelMessage): DecodedStreamFrame {
  if (!Buffer.isBuffer(received)) {
    const pieces = received.parts;
    const head = pieces[0];
    if (head && head.length >= HEADER && head[0] === KIND_STREAM_DATA && received.length > HEADER) {
      // Indexed, not spread: this runs for every DATA frame that arrived in pieces.
      const skip = head.length > HEADER ? 0 : 1;
      const parts: Buffer[] = new Array(pieces.length - skip);
      if (skip === 0) parts[0] = head.subarray(HEADER);
      for (let i = 1; i < pieces.length; i++) parts[i - skip] = pieces[i]!;
      const payload = { parts, length: received.length - HEADER };
      return { kind: 'data', id: head.readUInt32BE(1), payload };
    }
  }
  const message = wholeOf(received);
  if (message.length < HEADER) return malformed('short header');
  const kind = message[0]!;
  const id = message.readUInt32BE(1);
  const rest = message.length - HEADER;
  switch (kind) {
    case KIND_STREAM_OPEN: {
      if (rest < 16 + 4 + 1) return malformed('short OPEN');
      const window = message.readUInt32BE(HEADER + 16);
      const family = message[HEADER + 20];
      if (family !== 4 && family !== 6) return malformed(`OPEN family ${family}`);
      const size = family === 4 ? 4 : 16;
      const withoutFlags = 16 + 4 + 1 + 2 * (size + 2);
      if (rest !== withoutFlags && rest !== withoutFlags + 1) return malformed('OPEN length');
      if (window < 1) return malformed('OPEN window 0');
      let at = HEADER + 21;
      const srcAddr = formatIp(message.subarray(at, at + size));
      at += size;
      const srcPort = message.readUInt16BE(at);
      at += 2;
      const dstAddr = formatIp(message.subarray(at, at + size));
      at += size;
      const dstPort = message.readUInt16BE(at);
      at += 2;
      const flags = rest === withoutFlags ? 0 : message[at]!;
      return {
        kind: 'open',
        id,
        serviceId: uuidText(message, HEADER),
        window,
        ends: { family, srcAddr, srcPort, dstAddr, dstPort },
        transparent: (flags & OPEN_FLAG_TRANSPARENT) !== 0,
      };
    }
    case KIND_STREAM_OPEN_OK: {
      if (rest !== 4) return malformed('OPEN_OK length');
      const window = message.readUInt32BE(HEADER);
      if (window < 1) return malformed('OPEN_OK window 0');
      return { kind: 'open_ok', id, window };
    }
    case KIND_STREAM_OPEN_FAIL: {
      if (rest !== 1) return malformed('OPEN_FAIL length');
      // A reason this version does not know is still a failure: the client must hear of it.
      const reason = FAIL_REASONS[message[HEADER]! - 1] ?? 'other';
      return { kind: 'open_fail', id, reason };
    }
    case KIND_STREAM_DATA:
      if (rest < 1) return malformed('empty DATA');
      return { kind: 'data', id, payload: message.subarray(HEADER) };
    case KIND_STREAM_WINDOW: {
      if (rest !== 4) return malformed('WINDOW length');
      const credit = message.readUInt32BE(HEADER);
      if (credit < 1) return malformed('WINDOW credit 0');
      return { kind: 'window', id, credit };
    }
    case KIND_STREAM_FIN:
      return rest === 0 ? { kind: 'fin', id } : malformed('FIN length');
    case KIND_STREAM_RST:
      return rest === 0 ? { kind: 'rst', id } : malformed('RST length');
    default:
      return malformed(`not a stream kind: ${kind}`);
  }
}
