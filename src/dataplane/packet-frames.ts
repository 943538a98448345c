/**
 * What the data plane puts in a tunnel message: a kind byte, then for a packet the 16 bytes of
 * its service's UUID and the IP packet. One tunnel per peer pair carries every service between
 * them, so the service id tells the receiver which TUN the packet belongs to, and lets it refuse
 * a packet for a service the sender is not the other end of. Pure.
 *
 * WARNING: ONLY APPEND kinds; the numbers are on the wire.
 */

export const KIND_PACKET = 1;
const HEADER = 17;

export function uuidBytes(uuid: string): Buffer {
  const hex = uuid.replace(/-/g, '');
  if (!/^[0-9a-f]{32}$/.test(hex)) throw new Error(`not a UUID: ${uuid}`);
  return Buffer.from(hex, 'hex');
}

/** The UUID text of the 16 bytes at `at`. */
export function uuidText(bytes: Buffer, at: number): string {
  const h = bytes.toString('hex', at, at + 16);
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** One message per packet: header and packet in one buffer (one copy of the packet). */
export function encodePacket(serviceIdBytes: Buffer, packet: Buffer): Buffer {
  const out = Buffer.allocUnsafe(HEADER + packet.length);
  out[0] = KIND_PACKET;
  serviceIdBytes.copy(out, 1);
  packet.copy(out, HEADER);
  return out;
}

export type DecodedMessage =
  | { kind: 'packet'; serviceId: string; packet: Buffer }
  | { kind: 'malformed'; reason: string };

/** Decodes a message; the packet is a view into it. An IP version nibble of 4 or 6 is required. */
export function decodeMessage(message: Buffer): DecodedMessage {
  if (message.length < 1) return { kind: 'malformed', reason: 'empty' };
  if (message[0] !== KIND_PACKET) return { kind: 'malformed', reason: `unknown kind ${message[0]}` };
  if (message.length < HEADER + 20) return { kind: 'malformed', reason: 'short packet' };
  const version = message[HEADER]! >> 4;
  if (version !== 4 && version !== 6) return { kind: 'malformed', reason: `IP version ${version}` };
  return { kind: 'packet', serviceId: uuidText(message, 1), packet: message.subarray(HEADER) };
}
