/**
 * The rows the store keeps, as the rest of the agent sees them. Times are ISO 8601 strings as
 * the API shows them (DECISIONS §3), so nothing converts them twice.
 */
import type { License } from '../domain/license.js';
import type { Scope } from '../domain/scopes.js';

export interface AgentState {
  license: License;
  localPeerId: string;
  clusterId: string;
  description: string;
  bootstrappedAt: string;
  clusterCreatedBy: string;
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
  version: number;
  clientId: string;
  secretHash: Buffer;
  rotatedBy: string;
  rotatedAt: string;
  /** null for the current secret; the grace deadline for a rotated-out one. */
  validUntil: string | null;
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
  version: number;
  createdAt: string;
  updatedAt: string;
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
}
