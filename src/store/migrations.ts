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
  // 2: services and routes; who created the cluster.
  `
  ALTER TABLE agent_state ADD COLUMN cluster_created_by TEXT NOT NULL DEFAULT '';
  UPDATE agent_state SET cluster_created_by = local_peer_id WHERE cluster_created_by = '';

  CREATE TABLE services (
    id                   TEXT PRIMARY KEY,
    source_peer_id       TEXT NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    target_peer_id       TEXT NOT NULL REFERENCES peers (id) ON DELETE CASCADE,
    transport_type       TEXT NOT NULL CHECK (transport_type IN ('tcp', 'kcp')),
    requires_interface   INTEGER NOT NULL CHECK (requires_interface IN (0, 1)),
    desired_ipv4_cidr    TEXT,
    desired_ipv6_cidr    TEXT,
    fully_transparent    INTEGER NOT NULL CHECK (fully_transparent IN (0, 1)),
    bandwidth_limit_mbps INTEGER NOT NULL CHECK (bandwidth_limit_mbps >= 0),
    version              INTEGER NOT NULL DEFAULT 1,
    created_at           TEXT NOT NULL,
    updated_at           TEXT NOT NULL,
    UNIQUE (source_peer_id, target_peer_id),
    CHECK (source_peer_id <> target_peer_id)
  ) STRICT;
  CREATE INDEX services_target ON services (target_peer_id);

  CREATE TABLE routes (
    id          INTEGER PRIMARY KEY CHECK (id BETWEEN 1 AND 9007199254740991),
    service_id  TEXT NOT NULL REFERENCES services (id) ON DELETE CASCADE,
    priority    INTEGER NOT NULL CHECK (priority BETWEEN 0 AND 65535),
    source_cidr TEXT,
    dest_cidr   TEXT,
    version     INTEGER NOT NULL DEFAULT 1,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    CHECK (source_cidr IS NOT NULL OR dest_cidr IS NOT NULL)
  ) STRICT;
  CREATE INDEX routes_service ON routes (service_id);
  `,
  // 3: replication (the cluster, docs/gossip.md): a version key on every replicated row, tombstones for
  // deleted records, and the cluster credential keyed by key id, so that two clusters' chains
  // (whose version numbers collide) can be held side by side after a merge.
  `
  ALTER TABLE peers ADD COLUMN vkey TEXT NOT NULL DEFAULT '';
  ALTER TABLE services ADD COLUMN vkey TEXT NOT NULL DEFAULT '';
  ALTER TABLE routes ADD COLUMN vkey TEXT NOT NULL DEFAULT '';
  ALTER TABLE agent_state ADD COLUMN cluster_vkey TEXT NOT NULL DEFAULT '';
  ALTER TABLE agent_state ADD COLUMN credential_vkey TEXT NOT NULL DEFAULT '';

  CREATE TABLE tombstones (
    key        TEXT PRIMARY KEY,
    vkey       TEXT NOT NULL,
    arrived_at INTEGER NOT NULL
  ) STRICT;

  CREATE TABLE cluster_keys (
    kid         TEXT PRIMARY KEY,
    client_id   TEXT NOT NULL,
    version     INTEGER NOT NULL CHECK (version >= 1),
    secret_hash BLOB NOT NULL,
    rotated_by  TEXT NOT NULL,
    rotated_at  TEXT NOT NULL,
    valid_until TEXT,
    replicated  INTEGER NOT NULL DEFAULT 1 CHECK (replicated IN (0, 1))
  ) STRICT;
  INSERT INTO cluster_keys (kid, client_id, version, secret_hash, rotated_by, rotated_at, valid_until)
    SELECT lower(hex(substr(secret_hash, 1, 8))), client_id, version, secret_hash, rotated_by, rotated_at, valid_until
    FROM cluster_secrets;
  DROP TABLE cluster_secrets;
  `,
  // 4: the creation stamp of each service (hybrid clock), which decides between two live services
  // on one pair. Rows replicated before it take their current stamp (the vkey's third part,
  // after "epoch.ordinal."); rows without a vkey yet get one, and this, from Replica.init().
  `
  ALTER TABLE services ADD COLUMN created_stamp TEXT NOT NULL DEFAULT '';
  UPDATE services SET created_stamp = substr(vkey, 17) WHERE vkey <> '';
  `,
  // 5: each service's active health check (docs/decisions.md §7), the canonical JSON of
  // src/domain/health-check.ts; NULL: none, which is what every service made before has.
  `
  ALTER TABLE services ADD COLUMN health_check TEXT
    CHECK (health_check IS NULL OR json_valid(health_check));
  `,
  // 6: the event log (src/events/event-log.ts, docs/events.md). AUTOINCREMENT so that a seq is
  // never handed out twice, even after the newest events are deleted; the indexes serve the
  // reads: after a seq (the key), by type prefix, by resource, and retention by time.
  `
  CREATE TABLE events (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT NOT NULL UNIQUE,
    type          TEXT NOT NULL,
    time          TEXT NOT NULL,
    actor         TEXT NOT NULL CHECK (json_valid(actor)),
    resource_kind TEXT NOT NULL,
    resource_id   TEXT NOT NULL,
    data          TEXT NOT NULL CHECK (json_valid(data))
  ) STRICT;
  CREATE INDEX events_type ON events (type, seq);
  CREATE INDEX events_resource ON events (resource_id, seq);
  CREATE INDEX events_time ON events (time);
  `,
  // 7: webhooks (src/webhooks/, docs/events.md "Webhooks"), local to this agent like API
  // credentials. Each row is one endpoint and its own queue: `cursor` is the seq of the event log
  // up to which it is done (delivered, given up or not matching its filter), so delivery goes on
  // after a restart from where it stood. `failures` counts failed attempts in a row; the next one
  // is not made before `next_attempt_at` (ms since the epoch). The secret signs deliveries, so it
  // is kept as given (an HMAC key cannot be hashed away); it leaves only in the create answer.
  `
  CREATE TABLE webhooks (
    id                TEXT PRIMARY KEY,
    url               TEXT NOT NULL,
    types             TEXT NOT NULL CHECK (json_valid(types)),
    secret            TEXT NOT NULL,
    created_at        TEXT NOT NULL,
    cursor            INTEGER NOT NULL CHECK (cursor >= 0),
    failures          INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0),
    next_attempt_at   INTEGER NOT NULL DEFAULT 0,
    failing_since     TEXT,
    last_error        TEXT,
    last_error_at     TEXT,
    last_delivered_at TEXT,
    delivered         INTEGER NOT NULL DEFAULT 0,
    given_up          INTEGER NOT NULL DEFAULT 0,
    last_given_up_seq INTEGER
  ) STRICT;
  `,
  // 8: the event log at a lower cost per write (docs/benchmarks.md, "Events"): each index is a
  // page more in every commit that records an event, and with synchronous=FULL a page more to
  // write and sync. Gone: the `time` index (retention by age walks from the oldest seq instead)
  // and AUTOINCREMENT, whose `sqlite_sequence` row was a page of its own in every commit; the
  // highest seq given to an event no longer kept moves to `event_seq_floor`, which only
  // retention writes, and a new event takes the greater of it and the newest kept, plus one.
  // The rows are copied as they are; the `(type, seq)` and `(resource_id, seq)` indexes stay.
  `
  CREATE TABLE events_v8 (
    seq           INTEGER PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    type          TEXT NOT NULL,
    time          TEXT NOT NULL,
    actor         TEXT NOT NULL CHECK (json_valid(actor)),
    resource_kind TEXT NOT NULL,
    resource_id   TEXT NOT NULL,
    data          TEXT NOT NULL CHECK (json_valid(data))
  ) STRICT;
  INSERT INTO events_v8 (seq, id, type, time, actor, resource_kind, resource_id, data)
    SELECT seq, id, type, time, actor, resource_kind, resource_id, data FROM events ORDER BY seq;

  CREATE TABLE event_seq_floor (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    seq       INTEGER NOT NULL CHECK (seq >= 0)
  ) STRICT;
  INSERT INTO event_seq_floor (singleton, seq)
    VALUES (1, coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'events'), 0));

  DROP TABLE events;
  ALTER TABLE events_v8 RENAME TO events;
  CREATE INDEX events_type ON events (type, seq);
  CREATE INDEX events_resource ON events (resource_id, seq);
  `,
];
