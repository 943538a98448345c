/**
 * The cluster credential: the secret agents use to authenticate to each other (never to the
 * management API). Rotation makes a new secret current at once and keeps each previous one
 * valid for a 24-hour grace period (API document, Limits). Gossip will carry rotations in the
 * cluster issue; on one node this is the whole story.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { type Clock, isoTime } from '../domain/clock.js';
import { ApiError } from '../domain/errors.js';
import { newClientSecret } from '../domain/ids.js';
import type { ClusterSecretRecord } from '../store/records.js';
import type { Store } from '../store/store.js';

export const CLUSTER_SECRET_GRACE_MS = 24 * 60 * 60 * 1000;

/**
 * The cluster secret's stored form. Unlike API secrets it is unkeyed: every peer must be able to
 * check it and gossip carries only this hash, never the secret. The secret is 32 random bytes,
 * so a fast hash leaves nothing to guess.
 */
export function hashClusterSecret(secret: string): Buffer {
  return createHash('sha256').update(secret, 'utf8').digest();
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
  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
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

  rotate(rotatedBy: string): RotatedClusterCredential {
    const previous = this.currentRecord();
    const nowMs = this.clock.now();
    const secret = newClientSecret();
    const next: ClusterSecretRecord = {
      version: previous.version + 1,
      clientId: previous.clientId,
      secretHash: hashClusterSecret(secret),
      rotatedBy,
      rotatedAt: isoTime(nowMs),
      validUntil: null,
    };
    this.store.rotateClusterSecret(next, previous.version, isoTime(nowMs + CLUSTER_SECRET_GRACE_MS));
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

  private currentRecord(): ClusterSecretRecord {
    const current = this.store.clusterSecrets()[0];
    if (!current)
      throw new ApiError('NOT_FOUND', 'this agent is not bootstrapped: it has no cluster credential');
    return current;
  }
}
