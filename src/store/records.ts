/**
 * The rows the store keeps, as the rest of the agent sees them. Times are ISO 8601 strings as
 * the API shows them (docs/decisions.md §3), so nothing converts them twice.
 */
import type { HealthCheck } from '../domain/health-check.js';
import type { License } from '../domain/license.js';
import type { Scope } from '../domain/scopes.js';

export interface AgentState {
  license: License;
  localPeerId: string;
  clusterId: string;
  description: string;
  bootstrappedAt: string;
  clusterCreatedBy: string;
  /** Version keys of the replicated cluster and credential records (replicated-records.ts). */
  clusterVkey: string;
  credentialVkey: string;
}

export interface PeerRecord {
  id: string;
  name: string;
  publicKey: string;
  address: string;
  isActive: boolean;
  version: number;
  deactivatedAt: string | null;
  createdAt: string;
  updatedAt: string;
  /** Version key of the last write (src/cluster/replicated-records.ts); '' before replication. */
  vkey: string;
}

export interface CredentialRecord {
  clientId: string;
  secretHash: Buffer;
  scopes: Scope[];
  licenseId: string;
  createdAt: string;
  lastUsedAt: string | null;
}

export interface ClusterSecretRecord {
  /** Key id: hex of the first 8 bytes of secretHash; names the key in gossip messages. */
  kid: string;
  version: number;
  clientId: string;
  secretHash: Buffer;
  rotatedBy: string;
  rotatedAt: string;
  /** null for the current secret; the grace deadline for a rotated-out one. */
  validUntil: string | null;
  /**
   * Part of the replicated credential record. false for a key this agent keeps on its own for
   * a grace period after its cluster merged into another (its former cluster mates still use it).
   */
  replicated: boolean;
}

export type TransportType = 'tcp' | 'kcp';

export interface ServiceRecord {
  id: string;
  sourcePeerId: string;
  targetPeerId: string;
  transportType: TransportType;
  requiresInterface: boolean;
  desiredIpv4Cidr: string | null;
  desiredIpv6Cidr: string | null;
  fullyTransparent: boolean;
  bandwidthLimitMbps: number;
  /** health_check (docs/decisions.md §7) in canonical form; null: no active probe. */
  healthCheck: HealthCheck | null;
  version: number;
  createdAt: string;
  updatedAt: string;
  vkey: string;
  /**
   * The hybrid-clock stamp of the write that created the service; never changes. Two live
   * services on one pair keep the later-created one (replica.ts), which needs a creation order
   * that holds across hosts whose wall clocks disagree.
   */
  createdStamp: string;
}

export interface RouteRecord {
  id: number;
  serviceId: string;
  priority: number;
  sourceCidr: string | null;
  destCidr: string | null;
  version: number;
  createdAt: string;
  updatedAt: string;
  vkey: string;
}

/** A deleted record (or removed peer), kept so that gossip never brings it back. */
export interface TombstoneRecord {
  key: string;
  vkey: string;
  /** Local milliseconds when this agent learned of the deletion. */
  arrivedAt: number;
}

/** One entry of the event log (src/events/event-log.ts, where its fields are described). */
export interface EventRecord {
  seq: number;
  id: string;
  type: string;
  time: string;
  actor: { client_id: string | null; agent: string };
  resource: { kind: string; id: string };
  data: Record<string, unknown>;
}
