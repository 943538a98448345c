/**
 * Bootstrap: the one-time move from "not bootstrapped" to "bootstrapped" (API document, States).
 * Verifies the license, then creates the local peer, the cluster id, the cluster credential and
 * the first admin API credential in one transaction.
 */
import type { KeyObject } from 'node:crypto';
import type { SecretHasher } from '../auth/secret-hash.js';
import { type Clock, isoTime } from '../domain/clock.js';
import { ApiError } from '../domain/errors.js';
import { newClientId, newClientSecret, newClusterClientId, newClusterId } from '../domain/ids.js';
import type { License } from '../domain/license.js';
import { ADMIN } from '../domain/scopes.js';
import type { EventLog } from '../events/event-log.js';
import { verifyLicense } from '../license/verify.js';
import type { Store } from '../store/store.js';
import { hashClusterSecret, keyId } from './cluster-credential.js';
import type { Identity } from './identity.js';
import type { Replica } from './replica.js';
import { PEER_RANK } from './replicated-records.js';

export interface BootstrapInput {
  license: License;
  name?: string | undefined;
  description?: string | undefined;
}

export interface BootstrapResult {
  peer_id: string;
  peer_public_key: string;
  client_id: string;
  client_secret: string;
  license_id: string;
  cluster_id: string;
  expires_at: string;
  max_nodes: number;
  max_services: number;
}

export interface BootstrapDeps {
  store: Store;
  identity: Identity;
  hasher: SecretHasher;
  trustedLicenseKeys: readonly KeyObject[];
  clock: Clock;
  /** The address other agents reach this one at: the local peer's `address`. */
  advertiseAddress: string;
  /** Issues the version keys of the first replicated records. */
  replica: Pick<Replica, 'nextVkey'>;
  /** Takes the `agent.bootstrapped` event, in the bootstrap's transaction. */
  events: EventLog;
}

export function bootstrapAgent(deps: BootstrapDeps, input: BootstrapInput): BootstrapResult {
  const { store, identity, hasher, clock } = deps;
  if (store.agentState()) throw new ApiError('ALREADY_BOOTSTRAPPED', 'this agent is already bootstrapped');
  const { expiresAtMs } = verifyLicense(input.license, deps.trustedLicenseKeys, clock.now());

  const now = isoTime(clock.now());
  const clientId = newClientId();
  const clientSecret = newClientSecret();
  const clusterId = newClusterId();
  const clusterSecretHash = hashClusterSecret(newClientSecret());
  const vkey = (ordinal: number) => deps.replica.nextVkey(undefined, ordinal);
  const bootstrapped = () =>
    deps.events.record({
      type: 'agent.bootstrapped',
      resource: { kind: 'agent', id: identity.peerId },
      // The first credential's id, never its secret.
      data: {
        before: null,
        after: {
          peer_id: identity.peerId,
          name: input.name ?? '',
          address: deps.advertiseAddress,
          cluster_id: clusterId,
          license_id: input.license.license_id,
          client_id: clientId,
        },
      },
    });
  store.transaction(() => {
    store.bootstrap({
      state: {
        license: input.license,
        localPeerId: identity.peerId,
        clusterId,
        description: input.description ?? '',
        bootstrappedAt: now,
        clusterCreatedBy: identity.peerId,
        clusterVkey: vkey(0),
        credentialVkey: vkey(1),
      },
      localPeer: {
        id: identity.peerId,
        name: input.name ?? '',
        publicKey: identity.publicKeyBase64,
        address: deps.advertiseAddress,
        isActive: true,
        version: 1,
        deactivatedAt: null,
        createdAt: now,
        updatedAt: now,
        vkey: vkey(PEER_RANK.active),
      },
      firstCredential: {
        clientId,
        secretHash: hasher.hash(clientSecret),
        scopes: [ADMIN],
        licenseId: input.license.license_id,
        createdAt: now,
        lastUsedAt: null,
      },
      clusterSecret: {
        kid: keyId(clusterSecretHash),
        version: 1,
        clientId: newClusterClientId(),
        secretHash: clusterSecretHash,
        rotatedBy: identity.peerId,
        rotatedAt: now,
        validUntil: null,
        replicated: true,
      },
    });
    bootstrapped();
  });
  return {
    peer_id: identity.peerId,
    peer_public_key: identity.publicKeyBase64,
    client_id: clientId,
    client_secret: clientSecret,
    license_id: input.license.license_id,
    cluster_id: clusterId,
    // The license keeps the text it was signed with; the answer gives the time in the API's
    // one timestamp form (UTC, milliseconds, Z: docs/decisions.md §3), whatever offset the vendor used.
    expires_at: isoTime(expiresAtMs),
    max_nodes: input.license.max_nodes,
    max_services: input.license.max_services,
  };
}
