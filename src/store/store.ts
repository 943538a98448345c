/**
 * Repositories over the agent's SQLite file. Every write runs in one transaction; callers see
 * typed records, never rows. The only module that issues SQL.
 */
import type { License } from '../domain/license.js';
import type { Scope } from '../domain/scopes.js';
import { type Db, openDatabase } from './database.js';
import type {
  AgentState,
  ClusterSecretRecord,
  CredentialRecord,
  PeerRecord,
  RouteRecord,
  ServiceRecord,
  TransportType,
} from './records.js';

interface PeerRow {
  id: string;
  name: string;
  public_key: string;
  address: string;
  is_active: number;
  version: number;
  deactivated_at: string | null;
  created_at: string;
  updated_at: string;
}

interface ServiceRow {
  id: string;
  source_peer_id: string;
  target_peer_id: string;
  transport_type: TransportType;
  requires_interface: number;
  desired_ipv4_cidr: string | null;
  desired_ipv6_cidr: string | null;
  fully_transparent: number;
  bandwidth_limit_mbps: number;
  version: number;
  created_at: string;
  updated_at: string;
}

interface RouteRow {
  id: number;
  service_id: string;
  priority: number;
  source_cidr: string | null;
  dest_cidr: string | null;
  version: number;
  created_at: string;
  updated_at: string;
}

interface CredentialRow {
  client_id: string;
  secret_hash: Buffer;
  scopes: string;
  license_id: string;
  created_at: string;
  last_used_at: string | null;
}

interface ClusterSecretRow {
  version: number;
  client_id: string;
  secret_hash: Buffer;
  rotated_by: string;
  rotated_at: string;
  valid_until: string | null;
}

const toPeer = (r: PeerRow): PeerRecord => ({
  id: r.id,
  name: r.name,
  publicKey: r.public_key,
  address: r.address,
  isActive: r.is_active === 1,
  version: r.version,
  deactivatedAt: r.deactivated_at,
  createdAt: r.created_at,
  updatedAt: r.updated_at,
});

const toService = (r: ServiceRow): ServiceRecord => ({
  id: r.id,
  sourcePeerId: r.source_peer_id,
  targetPeerId: r.target_peer_id,
  transportType: r.transport_type,
  requiresInterface: r.requires_interface === 1,
  desiredIpv4Cidr: r.desired_ipv4_cidr,
  desiredIpv6Cidr: r.desired_ipv6_cidr,
  fullyTransparent: r.fully_transparent === 1,
  bandwidthLimitMbps: r.bandwidth_limit_mbps,
  version: r.version,
  createdAt: r.created_at,
  updatedAt: r.updated_at,
});

const serviceParams = (s: ServiceRecord) => ({
  ...s,
  requiresInterface: s.requiresInterface ? 1 : 0,
  fullyTransparent: s.fullyTransparent ? 1 : 0,
});

const toRoute = (r: RouteRow): RouteRecord => ({
  id: r.id,
  serviceId: r.service_id,
  priority: r.priority,
  sourceCidr: r.source_cidr,
  destCidr: r.dest_cidr,
  version: r.version,
  createdAt: r.created_at,
  updatedAt: r.updated_at,
});

export interface ServiceFilter {
  sourcePeerId?: string | undefined;
  targetPeerId?: string | undefined;
  requiresInterface?: boolean | undefined;
}

const toCredential = (r: CredentialRow): CredentialRecord => ({
  clientId: r.client_id,
  secretHash: r.secret_hash,
  scopes: JSON.parse(r.scopes) as Scope[],
  licenseId: r.license_id,
  createdAt: r.created_at,
  lastUsedAt: r.last_used_at,
});

const toClusterSecret = (r: ClusterSecretRow): ClusterSecretRecord => ({
  version: r.version,
  clientId: r.client_id,
  secretHash: r.secret_hash,
  rotatedBy: r.rotated_by,
  rotatedAt: r.rotated_at,
  validUntil: r.valid_until,
});

export interface BootstrapRecords {
  state: AgentState;
  localPeer: PeerRecord;
  firstCredential: CredentialRecord;
  clusterSecret: ClusterSecretRecord;
}

export class Store {
  readonly db: Db;
  private readonly stmts;
  private credentialCache: Map<string, CredentialRecord> | undefined;

  constructor(file: string) {
    this.db = openDatabase(file);
    const db = this.db;
    // Prepared once: the read paths sit under every authenticated request.
    this.stmts = {
      state: db.prepare('SELECT * FROM agent_state WHERE singleton = 1'),
      peerById: db.prepare('SELECT * FROM peers WHERE id = ?'),
      peers: db.prepare('SELECT * FROM peers ORDER BY created_at, id'),
      credentials: db.prepare('SELECT * FROM credentials ORDER BY created_at, client_id'),
      insertCredential: db.prepare(
        `INSERT INTO credentials (client_id, secret_hash, scopes, license_id, created_at, last_used_at)
         VALUES (@clientId, @secretHash, @scopes, @licenseId, @createdAt, @lastUsedAt)`,
      ),
      deleteCredential: db.prepare('DELETE FROM credentials WHERE client_id = ?'),
      touchCredential: db.prepare('UPDATE credentials SET last_used_at = ? WHERE client_id = ?'),
      clusterSecrets: db.prepare('SELECT * FROM cluster_secrets ORDER BY version DESC'),
      insertClusterSecret: db.prepare(
        `INSERT INTO cluster_secrets (version, client_id, secret_hash, rotated_by, rotated_at, valid_until)
         VALUES (@version, @clientId, @secretHash, @rotatedBy, @rotatedAt, @validUntil)`,
      ),
      retireClusterSecret: db.prepare('UPDATE cluster_secrets SET valid_until = ? WHERE version = ?'),
      updatePeer: db.prepare(
        `UPDATE peers SET name = @name, address = @address, is_active = @isActive, version = @version,
           deactivated_at = @deactivatedAt, updated_at = @updatedAt WHERE id = @id`,
      ),
      deletePeer: db.prepare('DELETE FROM peers WHERE id = ?'),
      activePeerIds: db.prepare('SELECT id FROM peers WHERE is_active = 1'),
      setCluster: db.prepare(
        'UPDATE agent_state SET cluster_id = ?, cluster_created_by = ? WHERE singleton = 1',
      ),
      serviceById: db.prepare('SELECT * FROM services WHERE id = ?'),
      servicePair: db.prepare('SELECT id FROM services WHERE source_peer_id = ? AND target_peer_id = ?'),
      services: db.prepare(
        `SELECT * FROM services
         WHERE (@sourcePeerId IS NULL OR source_peer_id = @sourcePeerId)
           AND (@targetPeerId IS NULL OR target_peer_id = @targetPeerId)
           AND (@requiresInterface IS NULL OR requires_interface = @requiresInterface)
         ORDER BY created_at, id`,
      ),
      serviceCount: db.prepare('SELECT count(*) AS n FROM services'),
      routeCounts: db.prepare('SELECT service_id, count(*) AS n FROM routes GROUP BY service_id'),
      insertService: db.prepare(
        `INSERT INTO services (id, source_peer_id, target_peer_id, transport_type, requires_interface,
           desired_ipv4_cidr, desired_ipv6_cidr, fully_transparent, bandwidth_limit_mbps, version, created_at, updated_at)
         VALUES (@id, @sourcePeerId, @targetPeerId, @transportType, @requiresInterface, @desiredIpv4Cidr,
           @desiredIpv6Cidr, @fullyTransparent, @bandwidthLimitMbps, @version, @createdAt, @updatedAt)`,
      ),
      updateService: db.prepare(
        `UPDATE services SET requires_interface = @requiresInterface, desired_ipv4_cidr = @desiredIpv4Cidr,
           desired_ipv6_cidr = @desiredIpv6Cidr, bandwidth_limit_mbps = @bandwidthLimitMbps,
           version = @version, updated_at = @updatedAt WHERE id = @id`,
      ),
      deleteService: db.prepare('DELETE FROM services WHERE id = ?'),
      routesOf: db.prepare('SELECT * FROM routes WHERE service_id = ? ORDER BY priority, id'),
      routeById: db.prepare('SELECT * FROM routes WHERE id = ?'),
      insertRoute: db.prepare(
        `INSERT INTO routes (id, service_id, priority, source_cidr, dest_cidr, version, created_at, updated_at)
         VALUES (@id, @serviceId, @priority, @sourceCidr, @destCidr, @version, @createdAt, @updatedAt)`,
      ),
      updateRoute: db.prepare(
        `UPDATE routes SET priority = @priority, source_cidr = @sourceCidr, dest_cidr = @destCidr,
           version = @version, updated_at = @updatedAt WHERE id = @id`,
      ),
      deleteRoute: db.prepare('DELETE FROM routes WHERE id = ?'),
      insertPeer: db.prepare(
        `INSERT INTO peers (id, name, public_key, address, is_active, version, deactivated_at, created_at, updated_at)
         VALUES (@id, @name, @publicKey, @address, @isActive, @version, @deactivatedAt, @createdAt, @updatedAt)`,
      ),
    };
  }

  close(): void {
    if (this.db.open) this.db.close();
  }

  /** Runs `fn` in one transaction: all of its writes land, or none. */
  transaction<T>(fn: () => T): T {
    try {
      return this.db.transaction(fn)();
    } finally {
      // Committed or rolled back, cached reads taken inside may no longer be what is stored.
      this.credentialCache = undefined;
    }
  }

  // --- agent state -------------------------------------------------------------------------

  agentState(): AgentState | undefined {
    const row = this.stmts.state.get() as
      | {
          license_json: string;
          local_peer_id: string;
          cluster_id: string;
          description: string;
          bootstrapped_at: string;
          cluster_created_by: string;
        }
      | undefined;
    if (!row) return undefined;
    return {
      license: JSON.parse(row.license_json) as License,
      localPeerId: row.local_peer_id,
      clusterId: row.cluster_id,
      description: row.description,
      bootstrappedAt: row.bootstrapped_at,
      clusterCreatedBy: row.cluster_created_by,
    };
  }

  /** Bootstrap writes the state, the local peer, the first credential and the cluster secret at once. */
  bootstrap(records: BootstrapRecords): void {
    const { state, localPeer, firstCredential, clusterSecret } = records;
    this.transaction(() => {
      this.db
        .prepare(
          `INSERT INTO agent_state (singleton, license_json, license_id, customer_id, issued_at, expires_at,
             max_nodes, max_services, local_peer_id, cluster_id, description, bootstrapped_at, cluster_created_by)
           VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
        )
        .run(
          JSON.stringify(state.license),
          state.license.license_id,
          state.license.customer_id,
          state.license.issued_at,
          state.license.expires_at,
          state.license.max_nodes,
          state.license.max_services,
          state.localPeerId,
          state.clusterId,
          state.description,
          state.bootstrappedAt,
          state.clusterCreatedBy,
        );
      this.insertPeer(localPeer);
      this.insertCredential(firstCredential);
      this.insertClusterSecret(clusterSecret);
    });
  }

  // --- peers -------------------------------------------------------------------------------

  peer(id: string): PeerRecord | undefined {
    const row = this.stmts.peerById.get(id) as PeerRow | undefined;
    return row && toPeer(row);
  }

  peers(): PeerRecord[] {
    return (this.stmts.peers.all() as PeerRow[]).map(toPeer);
  }

  insertPeer(p: PeerRecord): void {
    this.stmts.insertPeer.run({ ...p, isActive: p.isActive ? 1 : 0 });
  }

  /** Writes every field of the peer except id, public key and created_at. */
  updatePeer(p: PeerRecord): void {
    this.stmts.updatePeer.run({ ...p, isActive: p.isActive ? 1 : 0 });
  }

  /** Deletes the peer and, by cascade, every service (and its routes) that involves it. */
  deletePeer(id: string): boolean {
    return this.stmts.deletePeer.run(id).changes === 1;
  }

  activePeerIds(): string[] {
    return (this.stmts.activePeerIds.all() as { id: string }[]).map((r) => r.id);
  }

  setCluster(clusterId: string, createdBy: string): void {
    this.stmts.setCluster.run(clusterId, createdBy);
  }

  // --- services ----------------------------------------------------------------------------

  service(id: string): ServiceRecord | undefined {
    const row = this.stmts.serviceById.get(id) as ServiceRow | undefined;
    return row && toService(row);
  }

  serviceIdForPair(sourcePeerId: string, targetPeerId: string): string | undefined {
    return (this.stmts.servicePair.get(sourcePeerId, targetPeerId) as { id: string } | undefined)?.id;
  }

  services(filter: ServiceFilter = {}): ServiceRecord[] {
    const rows = this.stmts.services.all({
      sourcePeerId: filter.sourcePeerId ?? null,
      targetPeerId: filter.targetPeerId ?? null,
      requiresInterface: filter.requiresInterface === undefined ? null : filter.requiresInterface ? 1 : 0,
    }) as ServiceRow[];
    return rows.map(toService);
  }

  serviceCount(): number {
    return (this.stmts.serviceCount.get() as { n: number }).n;
  }

  routeCounts(): Map<string, number> {
    const rows = this.stmts.routeCounts.all() as { service_id: string; n: number }[];
    return new Map(rows.map((r) => [r.service_id, r.n]));
  }

  insertService(s: ServiceRecord): void {
    this.stmts.insertService.run(serviceParams(s));
  }

  /** Writes the fields PUT may change, plus version and updated_at. */
  updateService(s: ServiceRecord): void {
    this.stmts.updateService.run(serviceParams(s));
  }

  /** Deletes the service and, by cascade, its routes. */
  deleteService(id: string): boolean {
    return this.stmts.deleteService.run(id).changes === 1;
  }

  // --- routes ------------------------------------------------------------------------------

  routesOf(serviceId: string): RouteRecord[] {
    return (this.stmts.routesOf.all(serviceId) as RouteRow[]).map(toRoute);
  }

  route(id: number): RouteRecord | undefined {
    const row = this.stmts.routeById.get(id) as RouteRow | undefined;
    return row && toRoute(row);
  }

  insertRoute(r: RouteRecord): void {
    this.stmts.insertRoute.run(r);
  }

  updateRoute(r: RouteRecord): void {
    this.stmts.updateRoute.run(r);
  }

  deleteRoute(id: number): boolean {
    return this.stmts.deleteRoute.run(id).changes === 1;
  }

  // --- API credentials ---------------------------------------------------------------------

  /** The record is shared with the cache: read it, never change it. */
  credential(clientId: string): Readonly<CredentialRecord> | undefined {
    return this.cachedCredentials().get(clientId);
  }

  credentials(): Readonly<CredentialRecord>[] {
    return [...this.cachedCredentials().values()];
  }

  insertCredential(c: CredentialRecord): void {
    this.stmts.insertCredential.run({ ...c, scopes: JSON.stringify(c.scopes) });
    this.credentialCache = undefined;
  }

  /** Returns false when there was no such credential. */
  deleteCredential(clientId: string): boolean {
    const deleted = this.stmts.deleteCredential.run(clientId).changes === 1;
    this.credentialCache = undefined;
    return deleted;
  }

  touchCredential(clientId: string, at: string): void {
    this.stmts.touchCredential.run(at, clientId);
    this.credentialCache = undefined;
  }

  /**
   * Every authenticated request reads its credential (revocation check) and the token endpoint
   * reads one per grant; two SQLite reads per request cost more than the rest of a read
   * (bench/api/ladder.ts). The table is small and only this process writes it, so it is held in
   * memory, dropped on every write and reloaded on the next read: a revocation is seen by the
   * very next request.
   */
  private cachedCredentials(): Map<string, CredentialRecord> {
    if (!this.credentialCache) {
      const rows = this.stmts.credentials.all() as CredentialRow[];
      this.credentialCache = new Map(rows.map((r) => [r.client_id, toCredential(r)]));
    }
    return this.credentialCache;
  }

  // --- cluster credential ------------------------------------------------------------------

  /** Newest first. */
  clusterSecrets(): ClusterSecretRecord[] {
    return (this.stmts.clusterSecrets.all() as ClusterSecretRow[]).map(toClusterSecret);
  }

  insertClusterSecret(s: ClusterSecretRecord): void {
    this.stmts.insertClusterSecret.run(s);
  }

  /** Makes `next` current and starts the grace period of the one it replaces, in one transaction. */
  rotateClusterSecret(next: ClusterSecretRecord, previousVersion: number, graceUntil: string): void {
    this.transaction(() => {
      this.stmts.retireClusterSecret.run(graceUntil, previousVersion);
      this.insertClusterSecret(next);
    });
  }
}
