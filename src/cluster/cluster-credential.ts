/**
 * The cluster credential: the secret agents use to authenticate to each other (never to the
 * management API). Rotation makes a new secret current at once and keeps each previous one
 * valid for a 24-hour grace period (API document, Limits). A rotation is a replicated record
 * (replicated-records.ts): gossip carries it, and of two concurrent rotations the one with the
 * greater vkey wins on every agent.
 *
 * Every gossip message carries an HMAC under a key derived from a live cluster key (gossip-
 * envelope.ts), named by its key id, so holding the current or a graced key is what the
 * credential authorizes.
 */
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { type Clock, isoTime } from '../domain/clock.js';
import { ApiError } from '../domain/errors.js';
import { newClientSecret } from '../domain/ids.js';
import type { EventActor } from '../events/event-log.js';
import type { ClusterSecretRecord } from '../store/records.js';
import type { Store } from '../store/store.js';
import type { Replica } from './replica.js';

export const CLUSTER_SECRET_GRACE_MS = 24 * 60 * 60 * 1000;

/**
 * The cluster secret's stored form. Unlike API secrets it is unkeyed: every peer must be able to
 * check it and gossip carries only this hash, never the secret. The secret is 32 random bytes,
 * so a fast hash leaves nothing to guess.
 */
export function hashClusterSecret(secret: string): Buffer {
  return createHash('sha256').update(secret, 'utf8').digest();
}

/** Names a key in gossip without revealing it: the first 8 of its 32 hash bytes, hex. */
export const keyId = (secretHash: Buffer): string => secretHash.subarray(0, 8).toString('hex');

/** The gossip MAC key of a cluster key: derived, so the stored hash is never used directly. */
export const macKeyOf = (secretHash: Buffer): Buffer =>
  createHmac('sha256', secretHash).update('mesh-agent gossip mac v1').digest();

/** Keys kept in a credential record besides the current one; older ones fall out at rotation. */
const MAX_PREVIOUS_KEYS = 15;

export interface MacKey {
  kid: string;
  key: Buffer;
}

export interface ClusterCredentialView {
  client_id: string;
  version: number;
  rotated_by: string;
  rotated_at: string;
}

export interface RotatedClusterCredential extends ClusterCredentialView {
  client_secret: string;
}

export class ClusterCredential {
  private derived:
    | {
        secrets: readonly ClusterSecretRecord[];
        keys: { kid: string; key: Buffer; untilMs: number | null }[];
      }
    | undefined;

  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    private readonly replica: Pick<Replica, 'nextVkey' | 'change'>,
  ) {}

  current(): ClusterCredentialView {
    const current = this.currentRecord();
    return {
      client_id: current.clientId,
      version: current.version,
      rotated_by: current.rotatedBy,
      rotated_at: current.rotatedAt,
    };
  }

  /** `actor`: who asked, for the config event (docs/events.md). */
  rotate(rotatedBy: string, actor: EventActor): RotatedClusterCredential {
    const previous = this.currentRecord();
    const nowMs = this.clock.now();
    const secret = newClientSecret();
    const secretHash = hashClusterSecret(secret);
    const next: ClusterSecretRecord = {
      kid: keyId(secretHash),
      version: previous.version + 1,
      clientId: previous.clientId,
      secretHash,
      rotatedBy,
      rotatedAt: isoTime(nowMs),
      validUntil: null,
      replicated: true,
    };
    const state = this.store.agentState();
    this.replica.change('credential', actor, () => {
      this.store.deleteExpiredClusterSecrets(isoTime(nowMs));
      // The record stays bounded: the oldest graced keys beyond the cap leave it.
      const graced = this.store.clusterSecrets().filter((k) => k.replicated && k.kid !== previous.kid);
      for (const old of graced.slice(MAX_PREVIOUS_KEYS - 1)) {
        this.store.insertClusterSecret({ ...old, replicated: false });
      }
      this.store.rotateClusterSecret(
        next,
        previous.kid,
        isoTime(nowMs + CLUSTER_SECRET_GRACE_MS),
        this.replica.nextVkey(state?.credentialVkey || undefined, next.version),
      );
    });
    return {
      client_id: next.clientId,
      client_secret: secret,
      version: next.version,
      rotated_by: next.rotatedBy,
      rotated_at: next.rotatedAt,
    };
  }

  /** True for the current secret and for a previous one still inside its grace period. */
  accepts(clientId: string, secret: string): boolean {
    const nowMs = this.clock.now();
    const candidate = hashClusterSecret(secret);
    let accepted = false;
    // Every live secret is compared, so the time taken does not tell which one matched.
    for (const s of this.store.clusterSecrets()) {
      const live = s.validUntil === null || Date.parse(s.validUntil) > nowMs;
      const same = timingSafeEqual(candidate, s.secretHash);
      accepted = (live && same && s.clientId === clientId) || accepted;
    }
    return accepted;
  }

  /**
   * Keys this agent may MAC gossip with, current first: the current and every graced one. Every
   * gossip message sent, opened or answered asks for them, so the derived keys are kept while the
   * store's cached cluster keys are the same (bench/cluster: reading and deriving them per
   * message was 8 % of the CPU of a 50-agent cluster); only the expiry check runs each time. A
   * new array each call.
   */
  macKeys(): MacKey[] {
    const nowMs = this.clock.now();
    const secrets = this.store.clusterSecrets();
    if (this.derived?.secrets !== secrets) {
      this.derived = {
        secrets,
        keys: secrets.map((s) => ({
          kid: s.kid,
          key: macKeyOf(s.secretHash),
          untilMs: s.validUntil === null ? null : Date.parse(s.validUntil),
        })),
      };
    }
    return this.derived.keys
      .filter((k) => k.untilMs === null || k.untilMs > nowMs)
      .map((k) => ({ kid: k.kid, key: k.key }));
  }

  /** The MAC key named `kid`, if that key is live here. */
  macKey(kid: string): Buffer | undefined {
    return this.macKeys().find((k) => k.kid === kid)?.key;
  }

  private currentRecord(): ClusterSecretRecord {
    const current = this.store.clusterSecrets()[0];
    if (!current)
      throw new ApiError('NOT_FOUND', 'this agent is not bootstrapped: it has no cluster credential');
    return current;
  }
}
