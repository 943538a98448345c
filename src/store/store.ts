/**
 * Repositories over the agent's SQLite file. Every write runs in one transaction; callers see
 * typed records, never rows. The only module that issues SQL.
 */
import type { License } from '../domain/license.js';
import type { Scope } from '../domain/scopes.js';
import { type Db, openDatabase } from './database.js';
import type { AgentState, ClusterSecretRecord, CredentialRecord, PeerRecord } from './records.js';

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

  constructor(file: string) {
    this.db = openDatabase(file);
    const db = this.db;
    // Prepared once: the read paths sit under every authenticated request.
    this.stmts = {
      state: db.prepare('SELECT * FROM agent_state WHERE singleton = 1'),
      peerById: db.prepare('SELECT * FROM peers WHERE id = ?'),
      peers: db.prepare('SELECT * FROM peers ORDER BY created_at, id'),
      credentialById: db.prepare('SELECT * FROM credentials WHERE client_id = ?'),
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
    return this.db.transaction(fn)();
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
        }
      | undefined;
    if (!row) return undefined;
    return {
      license: JSON.parse(row.license_json) as License,
      localPeerId: row.local_peer_id,
      clusterId: row.cluster_id,
      description: row.description,
      bootstrappedAt: row.bootstrapped_at,
    };
  }

  /** Bootstrap writes the state, the local peer, the first credential and the cluster secret at once. */
  bootstrap(records: BootstrapRecords): void {
    const { state, localPeer, firstCredential, clusterSecret } = records;
    this.transaction(() => {
      this.db
        .prepare(
          `INSERT INTO agent_state (singleton, license_json, license_id, customer_id, issued_at, expires_at,
             max_nodes, max_services, local_peer_id, cluster_id, description, bootstrapped_at)
           VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
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

  private insertPeer(p: PeerRecord): void {
    this.stmts.insertPeer.run({ ...p, isActive: p.isActive ? 1 : 0 });
  }

  // --- API credentials ---------------------------------------------------------------------

  credential(clientId: string): CredentialRecord | undefined {
    const row = this.stmts.credentialById.get(clientId) as CredentialRow | undefined;
    return row && toCredential(row);
  }

  credentials(): CredentialRecord[] {
    return (this.stmts.credentials.all() as CredentialRow[]).map(toCredential);
  }

  insertCredential(c: CredentialRecord): void {
    this.stmts.insertCredential.run({ ...c, scopes: JSON.stringify(c.scopes) });
  }

  /** Returns false when there was no such credential. */
  deleteCredential(clientId: string): boolean {
    return this.stmts.deleteCredential.run(clientId).changes === 1;
  }

  touchCredential(clientId: string, at: string): void {
    this.stmts.touchCredential.run(at, clientId);
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
