/**
 * The config event of a change to a replicated record (docs/events.md): which type, which
 * fields changed, before and after. Pure: the replica calls it with the record it held and the
 * one it holds now, for a local write and for a record gossip delivered alike, so every agent
 * derives the same event from the same change: the same id (the record's key and the change's
 * version key), the same time (the change's hybrid-clock stamp) and the same data.
 */
import type { EventActor, NewEvent } from '../events/event-log.js';
import { decodeStamp } from './hlc.js';
import {
  type CredentialBody,
  type CredentialKeyBody,
  epochOf,
  parseVkey,
  splitKey,
  type WireRecord,
} from './replicated-records.js';

/** Bookkeeping every write changes: not news in an event's before/after. */
const BOOKKEEPING = new Set(['version', 'created_at', 'updated_at', 'created_stamp']);

/** The cluster-wide id of the change that wrote `vkey` to `key`. */
export const changeEventId = (key: string, vkey: string): string => `${key}@${vkey}`;

/** The agent that made a change: the writer named in its version key's stamp. */
export function originOf(vkey: string): string | undefined {
  const v = parseVkey(vkey);
  return v && decodeStamp(v.stamp)?.origin;
}

/**
 * Who made a received change: the actor the record carries, or, from an agent that predates
 * actors (or whose event has left its log), client unknown and the writer from the stamp.
 */
export function actorOf(r: WireRecord, fallbackAgent: string): EventActor {
  const a = r.actor;
  if (
    typeof a === 'object' &&
    a !== null &&
    typeof a.agent === 'string' &&
    a.agent.length <= 128 &&
    (a.client_id === null || (typeof a.client_id === 'string' && a.client_id.length <= 128))
  ) {
    return { client_id: a.client_id, agent: a.agent };
  }
  return { client_id: null, agent: originOf(r.vkey) ?? fallbackAgent };
}

/**
 * What a record says, as an event shows it. The cluster credential shows its current key's
 * client id, version and rotation, never the key (a hash of the secret is a secret's form too).
 */
function visible(r: WireRecord | undefined): Record<string, unknown> | null {
  if (!r || r.body === null) return null;
  if (r.key === 'credential') {
    const c = (r.body as unknown as CredentialBody).current as CredentialKeyBody;
    return { client_id: c.client_id, version: c.version, rotated_by: c.rotated_by, rotated_at: c.rotated_at };
  }
  return Object.fromEntries(Object.entries(r.body).filter(([k]) => !BOOKKEEPING.has(k)));
}

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

/**
 * The event of the change from `before` (the record held, if any) to `after` (the record
 * written, a tombstone for a deletion), or undefined when nothing an operator sees changed (a
 * record lifted to a new epoch by a cluster merge, say, or a deletion of what was never held).
 */
export function recordEvent(
  before: WireRecord | undefined,
  after: WireRecord,
  actor: EventActor,
): NewEvent | undefined {
  const parts = splitKey(after.key);
  if (!parts) return undefined;
  const was = visible(before);
  const now = visible(after);
  if (was === null && now === null) return undefined;
  let data: { before: Record<string, unknown> | null; after: Record<string, unknown> | null };
  if (was === null || now === null) {
    data = { before: was, after: now };
  } else {
    const changed = [...new Set([...Object.keys(was), ...Object.keys(now)])].filter(
      (k) => !same(was[k], now[k]),
    );
    if (changed.length === 0) return undefined;
    data = {
      before: Object.fromEntries(changed.map((k) => [k, was[k] ?? null])),
      after: Object.fromEntries(changed.map((k) => [k, now[k] ?? null])),
    };
  }
  const type = eventType(parts.kind, data, before, after);
  const wall = decodeStamp(parseVkey(after.vkey)?.stamp ?? '')?.wall;
  return {
    id: changeEventId(after.key, after.vkey),
    type,
    ...(wall === undefined ? {} : { time: new Date(wall).toISOString() }),
    actor,
    resource: resourceOf(parts.kind, parts.id, now ?? was!),
    data,
  };
}

function eventType(
  kind: string,
  data: { before: Record<string, unknown> | null; after: Record<string, unknown> | null },
  before: WireRecord | undefined,
  after: WireRecord,
): string {
  const created = data.before === null;
  const deleted = data.after === null;
  switch (kind) {
    case 'peer':
      if (created) return 'peer.added';
      if (deleted) return 'peer.removed';
      if ('is_active' in data.after! && data.after!.is_active === false) return 'peer.left';
      if ('name' in data.after!) return 'peer.renamed';
      return 'peer.updated';
    case 'service':
    case 'route':
      return `${kind}.${created ? 'created' : deleted ? 'deleted' : 'updated'}`;
    case 'cluster':
      // A join adopts the surviving cluster's record at an epoch above both sides' (replicated-records.ts).
      return before && epochOf(after.vkey) > epochOf(before.vkey) ? 'cluster.merged' : 'cluster.initialized';
    default:
      return 'cluster_credential.rotated';
  }
}

function resourceOf(kind: string, id: string, body: Record<string, unknown>): { kind: string; id: string } {
  if (kind === 'cluster') return { kind, id: String(body.cluster_id ?? '') };
  if (kind === 'credential') return { kind: 'cluster_credential', id: String(body.client_id ?? '') };
  return { kind, id };
}
