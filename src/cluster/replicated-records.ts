/**
 * The replicated state as gossip carries it: one last-writer-wins register per record, keyed by
 * kind and id, ordered by a version key ("vkey"). Pure: no I/O.
 *
 *   vkey = epoch . ordinal . stamp        e.g. 000000.00000001.0193a8c2f1e0.000000.<peer id>
 *
 * - epoch (6 hex digits) rises only when two clusters merge (the merged cluster record must beat
 *   everything either side wrote before) or a removed peer is added again.
 * - ordinal (8 hex digits) ranks values that must win whatever their time: a tombstone beats a
 *   live record, a deactivated peer beats an active one (leaving is final), a newer cluster
 *   credential version beats an older one.
 * - stamp is the hybrid-logical-clock stamp of the write (hlc.ts), unique per write, ties broken
 *   by the writer's peer id.
 *
 * Merging keeps, per key, the record with the greater vkey. That is a maximum, so it is
 * commutative, associative and idempotent: agents that have received the same records hold the
 * same state, in whatever order and however often they arrived. Since a vkey is issued once and
 * names one value, comparing vkeys is enough to compare states (digests carry only vkeys).
 */
import { type HealthCheck, readHealthCheck } from '../domain/health-check.js';
import { decodeStamp } from './hlc.js';

export type RecordKind = 'peer' | 'service' | 'route' | 'cluster' | 'credential';

/** The record's key: `peer/<id>`, `service/<id>`, `route/<id>`, `cluster`, `credential`. */
export type RecordKey = string;

export interface WireRecord {
  key: RecordKey;
  vkey: string;
  /** null for a tombstone: the record was deleted (peers: removed) at this vkey. */
  body: Record<string, unknown> | null;
  /**
   * Who made this version (docs/events.md): the API client and the agent that took the request.
   * Absent from agents that predate events; never trusted beyond being shown in an event.
   */
  actor?: { client_id: string | null; agent: string };
}

export const PEER_RANK = { active: 0, inactive: 1, removed: 2 } as const;
export const LIVE_RANK = 0;
export const DELETED_RANK = 1;

const VKEY_PATTERN = /^([0-9a-f]{6})\.([0-9a-f]{8})\.(.+)$/;

export function makeVkey(epoch: number, ordinal: number, stamp: string): string {
  return `${epoch.toString(16).padStart(6, '0')}.${ordinal.toString(16).padStart(8, '0')}.${stamp}`;
}

export interface ParsedVkey {
  epoch: number;
  ordinal: number;
  stamp: string;
}

export function parseVkey(vkey: string): ParsedVkey | undefined {
  const m = VKEY_PATTERN.exec(vkey);
  if (!m || !decodeStamp(m[3]!)) return undefined;
  return { epoch: Number.parseInt(m[1]!, 16), ordinal: Number.parseInt(m[2]!, 16), stamp: m[3]! };
}

/** Wall milliseconds of the write that made this vkey. */
export function vkeyWall(vkey: string): number {
  const parsed = parseVkey(vkey);
  return parsed ? decodeStamp(parsed.stamp)!.wall : 0;
}

export function keyOf(kind: RecordKind, id?: string | number): RecordKey {
  return id === undefined ? kind : `${kind}/${id}`;
}

export function splitKey(key: RecordKey): { kind: RecordKind; id: string } | undefined {
  if (key === 'cluster' || key === 'credential') return { kind: key, id: '' };
  const slash = key.indexOf('/');
  const kind = key.slice(0, slash);
  const id = key.slice(slash + 1);
  if (slash < 0 || id.length === 0 || id.length > 128) return undefined;
  if (kind !== 'peer' && kind !== 'service' && kind !== 'route') return undefined;
  return { kind, id };
}

/** Order in which records of one batch are applied: parents before their children. */
export const APPLY_ORDER: Record<RecordKind, number> = {
  cluster: 0,
  credential: 1,
  peer: 2,
  service: 3,
  route: 4,
};

// --- bodies -----------------------------------------------------------------------------------
// What each body must hold. Gossip from a member is trusted to be authentic, not to be well
// formed: a record that fails these checks is dropped and counted, never stored.

export interface PeerBody {
  id: string;
  name: string;
  public_key: string;
  address: string;
  is_active: boolean;
  version: number;
  deactivated_at: string | null;
  created_at: string;
  updated_at: string;
}

export interface ServiceBody {
  id: string;
  source_peer_id: string;
  target_peer_id: string;
  transport_type: 'tcp' | 'kcp';
  requires_interface: boolean;
  desired_ipv4_cidr: string | null;
  desired_ipv6_cidr: string | null;
  fully_transparent: boolean;
  bandwidth_limit_mbps: number;
  /**
   * Absent from the records of agents that predate the field (docs/decisions.md §7): read as
   * null, no check.
   */
  health_check?: HealthCheck | null;
  version: number;
  created_at: string;
  updated_at: string;
  /** Hybrid-clock stamp of the creating write (ServiceRecord.createdStamp). */
  created_stamp: string;
}

export interface RouteBody {
  id: number;
  service_id: string;
  priority: number;
  source_cidr: string | null;
  dest_cidr: string | null;
  version: number;
  created_at: string;
  updated_at: string;
}

export interface ClusterBody {
  cluster_id: string;
  created_by: string;
}

/** One key of the cluster credential chain; `key` is the SHA-256 of the secret, base64. */
export interface CredentialKeyBody {
  client_id: string;
  version: number;
  key: string;
  rotated_by: string;
  rotated_at: string;
  /** null for the current key; the end of the grace period for a previous one. */
  valid_until: string | null;
}

export interface CredentialBody {
  current: CredentialKeyBody;
  /** Previous keys still inside their grace period when this version was made. */
  previous: CredentialKeyBody[];
}

type Check = (v: unknown) => boolean;
const str: Check = (v) => typeof v === 'string' && v.length <= 1024;
const strOrNull: Check = (v) => v === null || str(v);
const bool: Check = (v) => typeof v === 'boolean';
const int: Check = (v) => Number.isSafeInteger(v) && (v as number) >= 0;
const time: Check = (v) => str(v) && Number.isFinite(Date.parse(v as string));
const timeOrNull: Check = (v) => v === null || time(v);

function shaped(body: unknown, fields: Record<string, Check>): boolean {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return false;
  const o = body as Record<string, unknown>;
  return Object.entries(fields).every(([k, check]) => check(o[k]));
}

const PEER_FIELDS: Record<string, Check> = {
  id: str,
  name: str,
  public_key: str,
  address: str,
  is_active: bool,
  version: int,
  deactivated_at: timeOrNull,
  created_at: time,
  updated_at: time,
};
const SERVICE_FIELDS: Record<string, Check> = {
  id: str,
  source_peer_id: str,
  target_peer_id: str,
  transport_type: (v) => v === 'tcp' || v === 'kcp',
  requires_interface: bool,
  desired_ipv4_cidr: strOrNull,
  desired_ipv6_cidr: strOrNull,
  fully_transparent: bool,
  bandwidth_limit_mbps: int,
  health_check: (v) => v === undefined || v === null || 'check' in readHealthCheck(v),
  version: int,
  created_at: time,
  updated_at: time,
  created_stamp: (v) => str(v) && decodeStamp(v as string) !== undefined,
};
const ROUTE_FIELDS: Record<string, Check> = {
  id: (v) => Number.isSafeInteger(v) && (v as number) >= 1,
  service_id: str,
  priority: (v) => Number.isSafeInteger(v) && (v as number) >= 0 && (v as number) <= 65535,
  source_cidr: strOrNull,
  dest_cidr: strOrNull,
  version: int,
  created_at: time,
  updated_at: time,
};
const KEY_FIELDS: Record<string, Check> = {
  client_id: str,
  version: int,
  key: (v) => str(v) && Buffer.from(v as string, 'base64').length === 32,
  rotated_by: str,
  rotated_at: time,
  valid_until: timeOrNull,
};

/**
 * Whether a received record is well formed: a parseable vkey, a known key whose id matches the
 * body, a body of the right shape, and an ordinal that agrees with the body (a live record
 * cannot claim a tombstone's rank and so beat a deletion).
 */
export function isWellFormed(r: unknown): r is WireRecord {
  if (typeof r !== 'object' || r === null) return false;
  const { key, vkey, body } = r as Partial<WireRecord>;
  if (typeof key !== 'string' || typeof vkey !== 'string') return false;
  const parts = splitKey(key);
  const v = parseVkey(vkey);
  if (!parts || !v) return false;
  if (body === null) {
    if (parts.kind === 'cluster' || parts.kind === 'credential') return false;
    return v.ordinal === (parts.kind === 'peer' ? PEER_RANK.removed : DELETED_RANK);
  }
  switch (parts.kind) {
    case 'peer': {
      const p = body as unknown as PeerBody;
      const rank = p?.is_active ? PEER_RANK.active : PEER_RANK.inactive;
      return shaped(body, PEER_FIELDS) && p.id === parts.id && v.ordinal === rank;
    }
    case 'service':
      return (
        shaped(body, SERVICE_FIELDS) &&
        (body as unknown as ServiceBody).id === parts.id &&
        v.ordinal === LIVE_RANK
      );
    case 'route':
      return (
        shaped(body, ROUTE_FIELDS) &&
        String((body as unknown as RouteBody).id) === parts.id &&
        v.ordinal === LIVE_RANK
      );
    case 'cluster':
      return shaped(body, { cluster_id: str, created_by: str }) && v.ordinal === 0;
    case 'credential': {
      const c = body as unknown as CredentialBody;
      return (
        shaped(body, { current: (x) => shaped(x, KEY_FIELDS) }) &&
        Array.isArray(c.previous) &&
        c.previous.length <= 16 &&
        c.previous.every((x) => shaped(x, KEY_FIELDS)) &&
        c.current.valid_until === null &&
        v.ordinal === c.current.version
      );
    }
  }
}

/**
 * The record both agents of a merge adopt: the surviving cluster's record, lifted to an epoch
 * above everything either side holds, with its stamp unchanged. Both sides compute the same
 * vkey, so the two copies are one value and gossip has nothing to reconcile between them.
 */
export function liftToEpoch(record: WireRecord, epoch: number): WireRecord {
  const v = parseVkey(record.vkey)!;
  return { ...record, vkey: makeVkey(epoch, v.ordinal, v.stamp) };
}

export const epochOf = (vkey: string): number => parseVkey(vkey)?.epoch ?? 0;
