/**
 * Identifier formats (docs/decisions.md §8). Every id is made without coordination between agents,
 * so that records created on different peers never collide once the cluster replicates them
 * (docs/decisions.md §5).
 */
import { createHash, randomBytes, randomUUID } from 'node:crypto';

/** A peer id is derived from its Ed25519 public key, so no agent can claim another's id. */
export function peerIdFromPublicKey(rawPublicKey: Uint8Array): string {
  return createHash('sha256').update(rawPublicKey).digest('hex').slice(0, 32);
}

export const newClusterId = (): string => randomUUID();
export const newServiceId = (): string => randomUUID();
export const newLicenseId = (): string => randomUUID();

/** API client ids: `mc_` and 16 random bytes, base64url. */
export const newClientId = (): string => `mc_${randomBytes(16).toString('base64url')}`;
/** The cluster credential's client id; its own prefix keeps it apart from API clients. */
export const newClusterClientId = (): string => `mcc_${randomBytes(16).toString('base64url')}`;

/** Client secrets: 32 random bytes, base64url (docs/decisions.md §4). */
export const newClientSecret = (): string => randomBytes(32).toString('base64url');

/** Route ids: random integers in [1, 2^53 - 1] (docs/decisions.md §5). */
export function newRouteId(random: (n: number) => Buffer = randomBytes): number {
  for (;;) {
    const id = Number(random(8).readBigUInt64BE() & 0x1f_ffff_ffff_ffffn);
    if (id >= 1) return id;
  }
}
