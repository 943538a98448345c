/**
 * The exit's word on a service, sent to its ingress over their tunnel (tunnel message kind 9,
 * after packet-frames.ts's 1 and stream-frames.ts's 2..8): whether the exit can forward toward
 * every route's destination, and its probe's verdict. The ingress weighs it into the service's
 * health (health.ts). Sent when it changes and again now and then, so a new tunnel hears it soon.
 * Pure.
 *
 *     message = kind:u8 (9)  service:16 (UUID)  flags:u8  detail:utf8 (0..200 bytes)
 *     flags   bit 0: the forwarding check has run;  bit 1: it passed (toward every destination)
 *             bit 2: the service has a probe, with a verdict;  bit 3: the probe passes
 *
 * `detail` says what failed, for people (the destination without a usable route, the probe's
 * error). Unknown flag bits are ignored: a later version may add checks. An agent that does not
 * know kind 9 counts the message as malformed and carries on.
 */
import { uuidBytes, uuidText } from './packet-frames.js';

export const KIND_SERVICE_STATUS = 9;
const HEADER = 18;
const MAX_DETAIL_BYTES = 200;

const FORWARD_KNOWN = 1;
const FORWARD_OK = 2;
const PROBE_KNOWN = 4;
const PROBE_OK = 8;

export interface ServiceStatus {
  serviceId: string;
  /** null: not checked yet. */
  canForward: boolean | null;
  /** null: no probe, or no verdict yet. */
  probePassing: boolean | null;
  detail: string;
}

export function encodeServiceStatus(s: ServiceStatus): Buffer {
  const detail = Buffer.from(s.detail, 'utf8').subarray(0, MAX_DETAIL_BYTES);
  const out = Buffer.allocUnsafe(HEADER + detail.length);
  out[0] = KIND_SERVICE_STATUS;
  uuidBytes(s.serviceId).copy(out, 1);
  out[17] =
    (s.canForward === null ? 0 : FORWARD_KNOWN | (s.canForward ? FORWARD_OK : 0)) |
    (s.probePassing === null ? 0 : PROBE_KNOWN | (s.probePassing ? PROBE_OK : 0));
  detail.copy(out, HEADER);
  return out;
}

export type DecodedServiceStatus =
  | ({ kind: 'status' } & ServiceStatus)
  | { kind: 'malformed'; reason: string };

/** Decodes a kind-9 message; never throws. A detail cut inside a character decodes with U+FFFD. */
export function decodeServiceStatus(message: Buffer): DecodedServiceStatus {
  if (message[0] !== KIND_SERVICE_STATUS) return { kind: 'malformed', reason: `not a status: ${message[0]}` };
  if (message.length < HEADER) return { kind: 'malformed', reason: 'short status' };
  if (message.length > HEADER + MAX_DETAIL_BYTES)
    return { kind: 'malformed', reason: 'status detail too long' };
  const flags = message[17]!;
  return {
    kind: 'status',
    serviceId: uuidText(message, 1),
    canForward: flags & FORWARD_KNOWN ? (flags & FORWARD_OK) !== 0 : null,
    probePassing: flags & PROBE_KNOWN ? (flags & PROBE_OK) !== 0 : null,
    detail: message.toString('utf8', HEADER),
  };
}
