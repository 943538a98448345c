/**
 * Repositories over the agent's SQLite file. Every write runs in one transaction; callers see
 * typed records, never rows. The only module that issues SQL.
 */
import { type HealthCheck, healthCheckJson } from '../domain/health-check.js';
import type { License } from '../domain/license.js';
import type { Scope } from '../domain/scopes.js';
import { type Db, openDatabase } from './database.js';
import { EventTable } from './event-table.js';
import type {
  AgentState,
  ClusterSecretRecord,
  CredentialRecord,
  PeerRecord,
  RouteRecord,
  ServiceRecord,
  TombstoneRecord,
  TransportType,
} from './records.js';
import { WebhookTable } from './webhook-table.js';

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
  vkey: string;
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
  health_check: string | null;
  version: number;
  created_at: string;
  updated_at: string;
  vkey: string;
  created_stamp: string;
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
  vkey: string;
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
  kid: string;
  version: number;
  client_id: string;
  secret_hash: Buffer;
  rotated_by: string;
  rotated_at: string;
  valid_until: string | null;
  replicated: number;
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
  vkey: r.vkey,
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
  // Written only by serviceParams, from a checked value: the text is canonical JSON.
  healthCheck: r.health_check === null ? null : (JSON.parse(r.health_check) as HealthCheck),
  version: r.version,
  createdAt: r.created_at,
  updatedAt: r.updated_at,
  vkey: r.vkey,
  createdStamp: r.created_stamp,
});

const serviceParams = (s: ServiceRecord) => ({
  ...s,
  requiresInterface: s.requiresInterface ? 1 : 0,
  fullyTransparent: s.fullyTransparent ? 1 : 0,
  healthCheck: s.healthCheck ? healthCheckJson(s.healthCheck) : null,
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
  vkey: r.vkey,
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
  kid: r.kid,
  version: r.version,
  clientId: r.client_id,
  secretHash: r.secret_hash,
  rotatedBy: r.rotated_by,
  rotatedAt: r.rotated_at,
  validUntil: r.valid_until,
  replicated: r.replicated === 1,
});

interface TombstoneRow {
  key: string;
  vkey: string;
  arrived_at: number;
}

const toTombstone = (r: TombstoneRow): TombstoneRecord => ({
  key: r.key,
  vkey: r.vkey,
  arrivedAt: r.arrived_at,
});

/**
 * The configuration as of the last write, table by table: see Store.cached(). Each table is read
 * on its first use after a write to it, so a gossip merge that writes one service leaves the
 * peers, the credentials and the cluster keys cached.
 */
interface Cached {
  state: { value: AgentState | undefined };
  peers: { list: PeerRecord[]; byId: Map<string, PeerRecord>; activeIds: string[] };
  services: {
    list: ServiceRecord[];
    byId: Map<string, ServiceRecord>;
    /** `source target` -> service id. */
    pairs: Map<string, string>;
  };
  routes: { byService: Map<string, RouteRecord[]>; byId: Map<number, RouteRecord> };
  credentials: Map<string, CredentialRecord>;
  clusterKeys: ClusterSecretRecord[];
  tombstones: Map<string, TombstoneRecord>;
}
type Table = keyof Cached;

export interface BootstrapRecords {
  state: AgentState;
  localPeer: PeerRecord;
  firstCredential: CredentialRecord;
  clusterSecret: ClusterSecretRecord;
}

export class Store {
  readonly db: Db;
  private readonly stmts;
  private readonly cache: Partial<Cached> = {};
  private writes = 0;
  private readonly writeListeners: (() => void)[] = [];
  /** What waits for the outermost transaction under way to commit: see afterCommit(). */
  private readonly commitQueue: (() => void)[] = [];
  /** The event log's table (src/events/event-log.ts); its writes join the transaction under way. */
  readonly eventTable: EventTable;
  /** The webhook endpoints and their queues (src/webhooks/); local to this agent, never gossiped. */
  readonly webhookTable: WebhookTable;

  constructor(file: string) {
    this.db = openDatabase(file);
    const db = this.db;
    this.eventTable = new EventTable(db);
    this.webhookTable = new WebhookTable(db);
    // Prepared once: the read paths sit under every authenticated request.
    this.stmts = {
      state: db.prepare('SELECT * FROM agent_state WHERE singleton = 1'),
      insertState: db.prepare(
        `INSERT INTO agent_state (singleton, license_json, license_id, customer_id, issued_at, expires_at,
           max_nodes, max_services, local_peer_id, cluster_id, description, bootstrapped_at, cluster_created_by,
           cluster_vkey, credential_vkey)
         VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      ),
      // Rows inserted, updated or deleted on this connection so far (rolled back ones included).
      totalChanges: db.prepare('SELECT total_changes()').pluck(),
      peerById: db.prepare('SELECT * FROM peers WHERE id = ?'),
      credentialById: db.prepare('SELECT * FROM credentials WHERE client_id = ?'),
      allServices: db.prepare('SELECT * FROM services ORDER BY created_at, id'),
      allRoutes: db.prepare('SELECT * FROM routes ORDER BY priority, id'),
      peers: db.prepare('SELECT * FROM peers ORDER BY created_at, id'),
      credentials: db.prepare('SELECT * FROM credentials ORDER BY created_at, client_id'),
      insertCredential: db.prepare(
        `INSERT INTO credentials (client_id, secret_hash, scopes, license_id, created_at, last_used_at)
         VALUES (@clientId, @secretHash, @scopes, @licenseId, @createdAt, @lastUsedAt)`,
      ),
      deleteCredential: db.prepare('DELETE FROM credentials WHERE client_id = ?'),
      touchCredential: db.prepare('UPDATE credentials SET last_used_at = ? WHERE client_id = ?'),
      // The current key first: replicated and without an end; then the newest.
      clusterSecrets: db.prepare(
        `SELECT * FROM cluster_keys
         ORDER BY (valid_until IS NULL AND replicated = 1) DESC, replicated DESC, version DESC, rotated_at DESC`,
      ),
      upsertClusterSecret: db.prepare(
        `INSERT INTO cluster_keys (kid, version, client_id, secret_hash, rotated_by, rotated_at, valid_until, replicated)
         VALUES (@kid, @version, @clientId, @secretHash, @rotatedBy, @rotatedAt, @validUntil, @replicated)
         ON CONFLICT (kid) DO UPDATE SET version = excluded.version, client_id = excluded.client_id,
           rotated_by = excluded.rotated_by, rotated_at = excluded.rotated_at,
           valid_until = excluded.valid_until, replicated = excluded.replicated`,
      ),
      retireClusterSecret: db.prepare('UPDATE cluster_keys SET valid_until = ? WHERE kid = ?'),
      demoteClusterSecrets: db.prepare(
        `UPDATE cluster_keys SET replicated = 0,
           valid_until = CASE WHEN valid_until IS NULL OR valid_until > @until THEN @until ELSE valid_until END
         WHERE replicated = 1`,
      ),
      deleteExpiredClusterSecrets: db.prepare(
        'DELETE FROM cluster_keys WHERE valid_until IS NOT NULL AND valid_until < ?',
      ),
      setCredentialVkey: db.prepare('UPDATE agent_state SET credential_vkey = ? WHERE singleton = 1'),
      updatePeer: db.prepare(
        `UPDATE peers SET name = @name, address = @address, is_active = @isActive, version = @version,
           deactivated_at = @deactivatedAt, updated_at = @updatedAt, vkey = @vkey WHERE id = @id`,
      ),
      upsertPeer: db.prepare(
        `INSERT INTO peers (id, name, public_key, address, is_active, version, deactivated_at, created_at, updated_at, vkey)
         VALUES (@id, @name, @publicKey, @address, @isActive, @version, @deactivatedAt, @createdAt, @updatedAt, @vkey)
         ON CONFLICT (id) DO UPDATE SET name = excluded.name, address = excluded.address,
           is_active = excluded.is_active, version = excluded.version, deactivated_at = excluded.deactivated_at,
           created_at = excluded.created_at, updated_at = excluded.updated_at, vkey = excluded.vkey`,
      ),
      upsertService: db.prepare(
        `INSERT INTO services (id, source_peer_id, target_peer_id, transport_type, requires_interface,
           desired_ipv4_cidr, desired_ipv6_cidr, fully_transparent, bandwidth_limit_mbps, health_check,
           version, created_at, updated_at, vkey, created_stamp)
         VALUES (@id, @sourcePeerId, @targetPeerId, @transportType, @requiresInterface, @desiredIpv4Cidr,
           @desiredIpv6Cidr, @fullyTransparent, @bandwidthLimitMbps, @healthCheck, @version, @createdAt, @updatedAt,
           @vkey, @createdStamp)
         ON CONFLICT (id) DO UPDATE SET requires_interface = excluded.requires_interface,
           desired_ipv4_cidr = excluded.desired_ipv4_cidr, desired_ipv6_cidr = excluded.desired_ipv6_cidr,
           bandwidth_limit_mbps = excluded.bandwidth_limit_mbps, health_check = excluded.health_check,
           version = excluded.version, created_at = excluded.created_at, updated_at = excluded.updated_at,
           vkey = excluded.vkey`,
      ),
      upsertRoute: db.prepare(
        `INSERT INTO routes (id, service_id, priority, source_cidr, dest_cidr, version, created_at, updated_at, vkey)
         VALUES (@id, @serviceId, @priority, @sourceCidr, @destCidr, @version, @createdAt, @updatedAt, @vkey)
         ON CONFLICT (id) DO UPDATE SET priority = excluded.priority, source_cidr = excluded.source_cidr,
           dest_cidr = excluded.dest_cidr, version = excluded.version, created_at = excluded.created_at,
           updated_at = excluded.updated_at, vkey = excluded.vkey`,
      ),
      tombstones: db.prepare('SELECT * FROM tombstones'),
      putTombstone: db.prepare(
        `INSERT INTO tombstones (key, vkey, arrived_at) VALUES (@key, @vkey, @arrivedAt)
         ON CONFLICT (key) DO UPDATE SET vkey = excluded.vkey, arrived_at = excluded.arrived_at`,
      ),
      deleteTombstone: db.prepare('DELETE FROM tombstones WHERE key = ?'),
      tombstoneByKey: db.prepare('SELECT * FROM tombstones WHERE key = ?'),
      deletePeer: db.prepare('DELETE FROM peers WHERE id = ?'),
      activePeerIds: db.prepare('SELECT id FROM peers WHERE is_active = 1'),
      setCluster: db.prepare(
        'UPDATE agent_state SET cluster_id = ?, cluster_created_by = ?, cluster_vkey = ? WHERE singleton = 1',
      ),
      serviceById: db.prepare('SELECT * FROM services WHERE id = ?'),
      servicePair: db.prepare('SELECT id FROM services WHERE source_peer_id = ? AND target_peer_id = ?'),
      serviceCount: db.prepare('SELECT count(*) AS n FROM services'),
      insertService: db.prepare(
        `INSERT INTO services (id, source_peer_id, target_peer_id, transport_type, requires_interface,
           desired_ipv4_cidr, desired_ipv6_cidr, fully_transparent, bandwidth_limit_mbps, health_check,
           version, created_at, updated_at, vkey, created_stamp)
         VALUES (@id, @sourcePeerId, @targetPeerId, @transportType, @requiresInterface, @desiredIpv4Cidr,
           @desiredIpv6Cidr, @fullyTransparent, @bandwidthLimitMbps, @healthCheck, @version, @createdAt, @updatedAt,
           @vkey, @createdStamp)`,
      ),
      updateService: db.prepare(
        `UPDATE services SET requires_interface = @requiresInterface, desired_ipv4_cidr = @desiredIpv4Cidr,
           desired_ipv6_cidr = @desiredIpv6Cidr, bandwidth_limit_mbps = @bandwidthLimitMbps,
           health_check = @healthCheck, version = @version, updated_at = @updatedAt, vkey = @vkey,
           created_stamp = @createdStamp
         WHERE id = @id`,
      ),
      deleteService: db.prepare('DELETE FROM services WHERE id = ?'),
      routesOf: db.prepare('SELECT * FROM routes WHERE service_id = ? ORDER BY priority, id'),
      routeById: db.prepare('SELECT * FROM routes WHERE id = ?'),
      insertRoute: db.prepare(
        `INSERT INTO routes (id, service_id, priority, source_cidr, dest_cidr, version, created_at, updated_at, vkey)
         VALUES (@id, @serviceId, @priority, @sourceCidr, @destCidr, @version, @createdAt, @updatedAt, @vkey)`,
      ),
      updateRoute: db.prepare(
        `UPDATE routes SET priority = @priority, source_cidr = @sourceCidr, dest_cidr = @destCidr,
           version = @version, updated_at = @updatedAt, vkey = @vkey WHERE id = @id`,
      ),
      deleteRoute: db.prepare('DELETE FROM routes WHERE id = ?'),
      insertPeer: db.prepare(
        `INSERT INTO peers (id, name, public_key, address, is_active, version, deactivated_at, created_at, updated_at, vkey)
         VALUES (@id, @name, @publicKey, @address, @isActive, @version, @deactivatedAt, @createdAt, @updatedAt, @vkey)`,
      ),
    };
  }

  close(): void {
    if (this.db.open) this.db.close();
  }

  /** Whether the database still answers a read of one of its tables: the agent's liveness check. */
  isReadable(): boolean {
    try {
      this.stmts.state.get();
      return true;
    } catch {
      return false;
    }
  }

  /**
   * Runs `fn` in one transaction: all of its writes land, or none. One that changed no row (a
   * gossip merge of records this agent already holds, which is most of them: every change
   * reaches each agent about fanout times) keeps the cached tables, the generation and everything
   * cached on it, and tells no write listener. bench/cluster: rebuilding them after each such
   * merge was a fifth of the CPU of 50 agents replicating 200 services.
   */
  transaction<T>(fn: () => T): T {
    const changesBefore = this.stmts.totalChanges.get();
    const outermost = !this.db.inTransaction;
    const queued = this.commitQueue.length;
    let committed = false;
    try {
      const result = this.db.transaction(fn)();
      committed = true;
      return result;
    } finally {
      // A nested transaction that rolled back (a savepoint) takes its callbacks with it.
      if (!committed) this.commitQueue.length = queued;
      // Each write inside dropped what it touched from the cache (write()), and reads inside a
      // transaction do not fill it: committed or rolled back, what is cached is what is stored.
      if (this.stmts.totalChanges.get() !== changesBefore) {
        this.writes++;
        // Once, when the outermost ends: see onWrite().
        if (outermost) this.notifyWrite();
      }
      if (outermost) for (const f of this.commitQueue.splice(0)) f();
    }
  }

  /**
   * Runs `fn` once what has been written so far is durable: at once outside a transaction,
   * after the outermost one commits inside one, and never if it rolls back (the event log tells
   * its listeners this way, so none hears of an event that was not kept).
   */
  afterCommit(fn: () => void): void {
    if (this.db.inTransaction) this.commitQueue.push(fn);
    else fn();
  }

  /**
   * Called after every write outside a transaction, and once after a transaction that wrote
   * ends: gossip pushes what changed, the data plane reads its view. Not per write inside one:
   * a merge of 1,000 gossiped routes then had the data plane read every route 1,000 times (10 s
   * of an exit's event loop), and a listener would have seen writes not yet committed. Listeners
   * must not write synchronously.
   */
  onWrite(listener: () => void): void {
    this.writeListeners.push(listener);
  }

  private notifyWrite(): void {
    for (const l of this.writeListeners) l();
  }

  /**
   * Reads outside a transaction come from an in-memory copy of each table, read on the first
   * read after a write to that table and dropped by every write to it. Through this binding a
   * 100-row read costs about 0.3 ms on the benchmark machine, which made GET /v1/services cost a
   * millisecond (bench/api); the tables are small (bounded by the license) and only this process
   * writes them. Per table, because gossip writes often and narrowly: rebuilding every table
   * after each merge was a sixth of a simulated cluster's CPU (test/sim). Reads inside a
   * transaction go to SQLite, so they see that transaction's own writes. Returned records are
   * shared: read them, never change them.
   */
  private cached<T extends Table>(table: T): Cached[T] {
    const held = this.cache[table];
    if (held !== undefined) return held as Cached[T];
    const loaded = this.load[table]();
    this.cache[table] = loaded;
    return loaded;
  }

  private readonly load: { [T in Table]: () => Cached[T] } = {
    state: () => ({ value: this.readState() }),
    peers: () => {
      const list = (this.stmts.peers.all() as PeerRow[]).map(toPeer);
      return {
        list,
        byId: new Map(list.map((p) => [p.id, p])),
        activeIds: list.filter((p) => p.isActive).map((p) => p.id),
      };
    },
    services: () => {
      const list = (this.stmts.allServices.all() as ServiceRow[]).map(toService);
      return {
        list,
        byId: new Map(list.map((x) => [x.id, x])),
        pairs: new Map(list.map((x) => [`${x.sourcePeerId} ${x.targetPeerId}`, x.id])),
      };
    },
    routes: () => {
      const routes = (this.stmts.allRoutes.all() as RouteRow[]).map(toRoute);
      const byService = new Map<string, RouteRecord[]>();
      for (const r of routes) {
        const list = byService.get(r.serviceId) ?? [];
        list.push(r);
        byService.set(r.serviceId, list);
      }
      return { byService, byId: new Map(routes.map((r) => [r.id, r])) };
    },
    credentials: () =>
      new Map(
        (this.stmts.credentials.all() as CredentialRow[]).map(toCredential).map((c) => [c.clientId, c]),
      ),
    clusterKeys: () => (this.stmts.clusterSecrets.all() as ClusterSecretRow[]).map(toClusterSecret),
    tombstones: () => new Map(this.readTombstones().map((t) => [t.key, t])),
  };

  /**
   * Every write goes through here, naming the tables it may change (with what a foreign key
   * cascades to), so no cached table outlives a change.
   */
  private write<T>(tables: readonly Table[], fn: () => T, replicated = true): T {
    try {
      return fn();
    } finally {
      for (const t of tables) delete this.cache[t];
      this.writes++;
      // API credentials are local to the agent (docs/decisions.md §5): nothing for gossip to do.
      // Inside a transaction, transaction() tells when it ends.
      if (replicated && !this.db.inTransaction) this.notifyWrite();
    }
  }

  /**
   * Changes whenever anything may have been written: what is derived from reads (a rendered
   * list, say) stays valid while this stays the same.
   */
  get generation(): number {
    return this.writes;
  }

  // --- agent state -------------------------------------------------------------------------

  agentState(): AgentState | undefined {
    return this.db.inTransaction ? this.readState() : this.cached('state').value;
  }

  private readState(): AgentState | undefined {
    const row = this.stmts.state.get() as
      | {
          license_json: string;
          local_peer_id: string;
          cluster_id: string;
          description: string;
          bootstrapped_at: string;
          cluster_created_by: string;
          cluster_vkey: string;
          credential_vkey: string;
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
      clusterVkey: row.cluster_vkey,
      credentialVkey: row.credential_vkey,
    };
  }

  /** Bootstrap writes the state, the local peer, the first credential and the cluster secret at once. */
  bootstrap(records: BootstrapRecords): void {
    const { state, localPeer, firstCredential, clusterSecret } = records;
    this.transaction(() => {
      this.write(['state'], () =>
        this.stmts.insertState.run(
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
          state.clusterVkey,
          state.credentialVkey,
        ),
      );
      this.insertPeer(localPeer);
      this.insertCredential(firstCredential);
      this.insertClusterSecret(clusterSecret);
    });
  }

  setCluster(clusterId: string, createdBy: string, vkey: string): void {
    this.write(['state'], () => this.stmts.setCluster.run(clusterId, createdBy, vkey));
  }

  // --- peers -------------------------------------------------------------------------------

  peer(id: string): PeerRecord | undefined {
    if (!this.db.inTransaction) return this.cached('peers').byId.get(id);
    const row = this.stmts.peerById.get(id) as PeerRow | undefined;
    return row && toPeer(row);
  }

  /** Ordered by created_at, then id. */
  peers(): readonly PeerRecord[] {
    return this.db.inTransaction
      ? (this.stmts.peers.all() as PeerRow[]).map(toPeer)
      : this.cached('peers').list;
  }

  activePeerIds(): readonly string[] {
    if (!this.db.inTransaction) return this.cached('peers').activeIds;
    return (this.stmts.activePeerIds.all() as { id: string }[]).map((r) => r.id);
  }

  insertPeer(p: PeerRecord): void {
    this.write(['peers'], () => this.stmts.insertPeer.run({ ...p, isActive: p.isActive ? 1 : 0 }));
  }

  /** Writes every field of the peer except id, public key and created_at. */
  updatePeer(p: PeerRecord): void {
    this.write(['peers'], () => this.stmts.updatePeer.run({ ...p, isActive: p.isActive ? 1 : 0 }));
  }

  /** Inserts or overwrites a peer received by gossip (public key and id never change). */
  upsertPeer(p: PeerRecord): void {
    this.write(['peers'], () => this.stmts.upsertPeer.run({ ...p, isActive: p.isActive ? 1 : 0 }));
  }

  /** Deletes the peer and, by cascade, every service (and its routes) that involves it. */
  deletePeer(id: string): boolean {
    return this.write(['peers', 'services', 'routes'], () => this.stmts.deletePeer.run(id).changes === 1);
  }

  // --- services ----------------------------------------------------------------------------

  service(id: string): ServiceRecord | undefined {
    if (!this.db.inTransaction) return this.cached('services').byId.get(id);
    const row = this.stmts.serviceById.get(id) as ServiceRow | undefined;
    return row && toService(row);
  }

  serviceIdForPair(sourcePeerId: string, targetPeerId: string): string | undefined {
    if (!this.db.inTransaction) return this.cached('services').pairs.get(`${sourcePeerId} ${targetPeerId}`);
    return (this.stmts.servicePair.get(sourcePeerId, targetPeerId) as { id: string } | undefined)?.id;
  }

  /** Ordered by created_at, then id. */
  services(filter: ServiceFilter = {}): ServiceRecord[] {
    const all = this.db.inTransaction
      ? (this.stmts.allServices.all() as ServiceRow[]).map(toService)
      : this.cached('services').list;
    return all.filter(
      (x) =>
        (filter.sourcePeerId === undefined || x.sourcePeerId === filter.sourcePeerId) &&
        (filter.targetPeerId === undefined || x.targetPeerId === filter.targetPeerId) &&
        (filter.requiresInterface === undefined || x.requiresInterface === filter.requiresInterface),
    );
  }

  serviceCount(): number {
    if (!this.db.inTransaction) return this.cached('services').list.length;
    return (this.stmts.serviceCount.get() as { n: number }).n;
  }

  routeCount(serviceId: string): number {
    return this.routesOf(serviceId).length;
  }

  insertService(s: ServiceRecord): void {
    this.write(['services'], () => this.stmts.insertService.run(serviceParams(s)));
  }

  /** Inserts or overwrites a service received by gossip (its peers never change). */
  upsertService(s: ServiceRecord): void {
    this.write(['services'], () => this.stmts.upsertService.run(serviceParams(s)));
  }

  /** Writes the fields PUT may change, plus version and updated_at. */
  updateService(s: ServiceRecord): void {
    this.write(['services'], () => this.stmts.updateService.run(serviceParams(s)));
  }

  /** Deletes the service and, by cascade, its routes. */
  deleteService(id: string): boolean {
    return this.write(['services', 'routes'], () => this.stmts.deleteService.run(id).changes === 1);
  }

  // --- routes ------------------------------------------------------------------------------

  /** Ordered by priority, then id. */
  routesOf(serviceId: string): readonly RouteRecord[] {
    if (!this.db.inTransaction) return this.cached('routes').byService.get(serviceId) ?? [];
    return (this.stmts.routesOf.all(serviceId) as RouteRow[]).map(toRoute);
  }

  route(id: number): RouteRecord | undefined {
    if (!this.db.inTransaction) return this.cached('routes').byId.get(id);
    const row = this.stmts.routeById.get(id) as RouteRow | undefined;
    return row && toRoute(row);
  }

  insertRoute(r: RouteRecord): void {
    this.write(['routes'], () => this.stmts.insertRoute.run(r));
  }

  upsertRoute(r: RouteRecord): void {
    this.write(['routes'], () => this.stmts.upsertRoute.run(r));
  }

  updateRoute(r: RouteRecord): void {
    this.write(['routes'], () => this.stmts.updateRoute.run(r));
  }

  deleteRoute(id: number): boolean {
    return this.write(['routes'], () => this.stmts.deleteRoute.run(id).changes === 1);
  }

  // --- API credentials ---------------------------------------------------------------------

  /** Read on every authenticated request (the revocation check): from the cached table. */
  credential(clientId: string): Readonly<CredentialRecord> | undefined {
    if (!this.db.inTransaction) return this.cached('credentials').get(clientId);
    const row = this.stmts.credentialById.get(clientId) as CredentialRow | undefined;
    return row && toCredential(row);
  }

  /** Ordered by created_at, then client_id. */
  credentials(): Readonly<CredentialRecord>[] {
    if (!this.db.inTransaction) return [...this.cached('credentials').values()];
    return (this.stmts.credentials.all() as CredentialRow[]).map(toCredential);
  }

  insertCredential(c: CredentialRecord): void {
    this.write(
      ['credentials'],
      () => this.stmts.insertCredential.run({ ...c, scopes: JSON.stringify(c.scopes) }),
      false,
    );
  }

  /** Returns false when there was no such credential. */
  deleteCredential(clientId: string): boolean {
    return this.write(['credentials'], () => this.stmts.deleteCredential.run(clientId).changes === 1, false);
  }

  touchCredential(clientId: string, at: string): void {
    this.write(['credentials'], () => this.stmts.touchCredential.run(at, clientId), false);
  }

  // --- cluster credential ------------------------------------------------------------------

  /** The current key first, then the newest: see the statement. */
  clusterSecrets(): readonly ClusterSecretRecord[] {
    if (!this.db.inTransaction) return this.cached('clusterKeys');
    return (this.stmts.clusterSecrets.all() as ClusterSecretRow[]).map(toClusterSecret);
  }

  insertClusterSecret(s: ClusterSecretRecord): void {
    this.write(['clusterKeys'], () =>
      this.stmts.upsertClusterSecret.run({ ...s, replicated: s.replicated ? 1 : 0 }),
    );
  }

  /** Makes `next` current and starts the grace period of the one it replaces, in one transaction. */
  rotateClusterSecret(
    next: ClusterSecretRecord,
    previousKid: string,
    graceUntil: string,
    vkey: string,
  ): void {
    this.transaction(() => {
      this.write(['clusterKeys'], () => this.stmts.retireClusterSecret.run(graceUntil, previousKid));
      this.insertClusterSecret(next);
      this.setCredentialVkey(vkey);
    });
  }

  /**
   * Adopts a credential record received by gossip: its keys become the replicated set; keys of
   * ours that it does not hold stay usable on this agent alone until `localGraceUntil` (after a
   * merge, our former cluster mates keep using them until gossip reaches them).
   */
  adoptClusterSecrets(keys: readonly ClusterSecretRecord[], vkey: string, localGraceUntil: string): void {
    this.write(['clusterKeys', 'state'], () => {
      this.stmts.demoteClusterSecrets.run({ until: localGraceUntil });
      for (const k of keys) this.stmts.upsertClusterSecret.run({ ...k, replicated: 1 });
      this.stmts.setCredentialVkey.run(vkey);
    });
  }

  /** Forgets keys whose grace period ended before `before`. */
  deleteExpiredClusterSecrets(before: string): number {
    return this.write(['clusterKeys'], () => this.stmts.deleteExpiredClusterSecrets.run(before).changes);
  }

  setCredentialVkey(vkey: string): void {
    this.write(['state'], () => this.stmts.setCredentialVkey.run(vkey));
  }

  // --- tombstones --------------------------------------------------------------------------

  tombstones(): ReadonlyMap<string, TombstoneRecord> {
    if (!this.db.inTransaction) return this.cached('tombstones');
    return new Map(this.readTombstones().map((t) => [t.key, t]));
  }

  private readTombstones(): TombstoneRecord[] {
    return (this.stmts.tombstones.all() as TombstoneRow[]).map(toTombstone);
  }

  /** One tombstone by key: a single-row read inside a transaction, where merges look keys up. */
  tombstone(key: string): TombstoneRecord | undefined {
    if (!this.db.inTransaction) return this.cached('tombstones').get(key);
    const row = this.stmts.tombstoneByKey.get(key) as TombstoneRow | undefined;
    return row && toTombstone(row);
  }

  putTombstone(t: TombstoneRecord): void {
    this.write(['tombstones'], () => this.stmts.putTombstone.run(t));
  }

  deleteTombstone(key: string): boolean {
    return this.write(['tombstones'], () => this.stmts.deleteTombstone.run(key).changes === 1);
  }
}
