/**
 * Versioned schema migrations, in code. `PRAGMA user_version` holds the number of migrations
 * applied; each runs in its own transaction with the version bump, so a crash mid-migration
 * leaves the previous version intact.
 *
 * ONLY APPEND TO THIS LIST: a migration that has shipped is part of every database file made
 * since, and editing it would leave those files on a schema the code no longer describes.
 */

export const MIGRATIONS: readonly string[] = [
  // 1: single-node agent: bootstrap state, peers, API credentials, cluster credential.
  `
  CREATE TABLE agent_state (
    singleton       INTEGER PRIMARY KEY CHECK (singleton = 1),
    license_json    TEXT NOT NULL,
    license_id      TEXT NOT NULL,
    customer_id     TEXT NOT NULL,
    issued_at       TEXT NOT NULL,
    expires_at      TEXT NOT NULL,
    max_nodes       INTEGER NOT NULL CHECK (max_nodes >= 1),
    max_services    INTEGER NOT NULL CHECK (max_services >= 0),
    local_peer_id   TEXT NOT NULL,
    cluster_id      TEXT NOT NULL,
    description     TEXT NOT NULL DEFAULT '',
    bootstrapped_at TEXT NOT NULL
  ) STRICT;

  CREATE TABLE peers (
    id             TEXT PRIMARY KEY,
    name           TEXT NOT NULL DEFAULT '',
    public_key     TEXT NOT NULL UNIQUE,
    address        TEXT NOT NULL,
    is_active      INTEGER NOT NULL DEFAULT 1 CHECK (is_active IN (0, 1)),
    version        INTEGER NOT NULL DEFAULT 1,
    deactivated_at TEXT,
    created_at     TEXT NOT NULL,
    updated_at     TEXT NOT NULL
  ) STRICT;

  CREATE TABLE credentials (
    client_id    TEXT PRIMARY KEY,
    secret_hash  BLOB NOT NULL,
    scopes       TEXT NOT NULL,
    license_id   TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    last_used_at TEXT
  ) STRICT;

  CREATE TABLE cluster_secrets (
    version     INTEGER PRIMARY KEY CHECK (version >= 1),
    client_id   TEXT NOT NULL,
    secret_hash BLOB NOT NULL,
    rotated_by  TEXT NOT NULL,
    rotated_at  TEXT NOT NULL,
    valid_until TEXT
  ) STRICT;
  `,
];
