import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import Database from 'better-sqlite3';
import { openDatabase, schemaVersion } from './database.js';
import { loadOrCreateSecretFile, removeStaleTempFiles, writeFileAtomic } from './key-files.js';
import { MIGRATIONS } from './migrations.js';
import { Store } from './store.js';

/**
 * A database file an older agent left at schema `version` (3 or later), with peers a, b and c and
 * the given services: what the migrations after it start from.
 */
function olderDatabase(
  version: number,
  services: [id: string, source: string, target: string, vkey: string][],
): string {
  const file = join(mkdtempSync(join(tmpdir(), 'db-')), 'old.db');
  const db = new Database(file);
  for (const sql of MIGRATIONS.slice(0, version)) db.exec(sql);
  db.pragma(`user_version = ${version}`);
  const t = '2026-01-01T00:00:00.000Z';
  db.exec(`INSERT INTO peers (id, public_key, address, created_at, updated_at) VALUES
    ('a', 'ka', 'h:1', '${t}', '${t}'), ('b', 'kb', 'h:2', '${t}', '${t}'), ('c', 'kc', 'h:3', '${t}', '${t}')`);
  const insert = db.prepare(`INSERT INTO services (id, source_peer_id, target_peer_id, transport_type,
    requires_interface, fully_transparent, bandwidth_limit_mbps, created_at, updated_at, vkey)
    VALUES (?, ?, ?, 'tcp', 0, 0, 0, '${t}', '${t}', ?)`);
  for (const row of services) insert.run(...row);
  db.close();
  return file;
}

describe('database', () => {
  it('migrates a new file to the latest version, once', () => {
    const file = join(mkdtempSync(join(tmpdir(), 'db-')), 'a.db');
    const db = openDatabase(file);
    assert.equal(schemaVersion(db), MIGRATIONS.length);
    assert.equal(db.pragma('journal_mode', { simple: true }), 'wal');
    assert.equal(db.pragma('synchronous', { simple: true }), 2, 'FULL');
    assert.equal(db.pragma('foreign_keys', { simple: true }), 1);
    db.close();
    const again = openDatabase(file);
    assert.equal(schemaVersion(again), MIGRATIONS.length);
    again.close();
  });

  it('migration 4 gives each replicated service its current stamp as creation stamp', () => {
    const stamp = '0193a8c2f1e0.000002.ab12';
    const file = olderDatabase(3, [
      ['s1', 'a', 'b', `000000.00000000.${stamp}`],
      ['s2', 'a', 'c', ''],
    ]);
    const migrated = openDatabase(file);
    const rows = migrated.prepare('SELECT id, created_stamp FROM services ORDER BY id').all();
    // A row never stamped keeps '' here; Replica.init() stamps it and its creation together.
    assert.deepEqual(rows, [
      { id: 's1', created_stamp: stamp },
      { id: 's2', created_stamp: '' },
    ]);
    migrated.close();
  });

  it('migration 5 gives every existing service no health check, and takes only JSON there', () => {
    const migrated = openDatabase(olderDatabase(4, [['s1', 'a', 'b', '']]));
    assert.deepEqual(migrated.prepare('SELECT id, health_check FROM services').all(), [
      { id: 's1', health_check: null },
    ]);
    assert.throws(
      () => migrated.prepare(`UPDATE services SET health_check = '{"tcp":' WHERE id = 's1'`).run(),
      /CHECK constraint failed/,
    );
    migrated.close();
  });

  it('migration 8 keeps every event and index read, and never gives a seq that version 7 gave', () => {
    const file = olderDatabase(7, []);
    const old = new Database(file);
    const insert = old.prepare(`INSERT INTO events (id, type, time, actor, resource_kind, resource_id, data)
      VALUES (?, ?, ?, '{"client_id":null,"agent":"a"}', 'peer', ?, '{"n":1}')`);
    for (let i = 1; i <= 6; i++)
      insert.run(`e${i}`, i % 2 ? 'peer.added' : 'peer.renamed', `2026-01-0${i}T00:00:00.000Z`, `p${i % 2}`);
    // Retention at version 7 deleted the newest (by time) and the oldest: sqlite_sequence keeps 6.
    old.exec('DELETE FROM events WHERE seq IN (1, 6)');
    old.close();

    const db = openDatabase(file);
    assert.equal(schemaVersion(db), 8);
    assert.deepEqual(db.prepare('SELECT id FROM events ORDER BY seq').pluck().all(), [
      'e2',
      'e3',
      'e4',
      'e5',
    ]);
    assert.deepEqual(db.prepare('SELECT seq FROM event_seq_floor').pluck().all(), [6]);
    const indexes = db
      .prepare(
        `SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' AND sql IS NOT NULL`,
      )
      .pluck()
      .all();
    assert.deepEqual(indexes.sort(), ['events_resource', 'events_type']);
    const plan = (sql: string) =>
      (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all() as { detail: string }[]).map((r) => r.detail).join('; ');
    assert.match(
      plan(`SELECT * FROM events WHERE resource_id = 'p1' AND seq > 0 ORDER BY seq`),
      /events_resource/,
    );
    assert.match(plan(`SELECT * FROM events WHERE type >= 'peer.r' AND type < 'peer.s'`), /events_type/);
    assert.match(plan(`SELECT * FROM events WHERE id = 'e3'`), /sqlite_autoindex_events/);
    db.close();

    // Through the store: the next event is 7, not 6, and an id kept before is kept once.
    const store = new Store(file);
    const events = store.eventTable;
    assert.equal(events.lastSeq(), 6);
    const e = (id: string) => ({
      id,
      type: 'peer.added',
      time: '2026-01-09T00:00:00.000Z',
      actor: { client_id: null, agent: 'a' },
      resource: { kind: 'peer', id: 'p1' },
      data: {},
    });
    assert.deepEqual([events.insert(e('e3')).event.seq, events.insert(e('e3')).inserted], [3, false]);
    assert.equal(events.insert(e('e7')).event.seq, 7);
    assert.deepEqual(
      events.after(0, 10, { resource: 'p1' }).map((x) => x.seq),
      [3, 5, 7],
    );
    store.close();
  });

  it('refuses a database made by a newer agent', () => {
    const file = join(mkdtempSync(join(tmpdir(), 'db-')), 'b.db');
    const db = openDatabase(file);
    db.pragma(`user_version = ${MIGRATIONS.length + 1}`);
    db.close();
    assert.throws(() => openDatabase(file), /newer than this agent knows/);
  });
});

describe('key files', () => {
  it('creates a key file once, with mode 0600, and reads it back', () => {
    const file = join(mkdtempSync(join(tmpdir(), 'key-')), 'k');
    let made = 0;
    const a = loadOrCreateSecretFile(file, () => `secret-${++made}`);
    const b = loadOrCreateSecretFile(file, () => `secret-${++made}`);
    assert.equal(a, 'secret-1');
    assert.equal(b, 'secret-1');
    assert.equal(statSync(file).mode & 0o777, 0o600);
  });

  it('removes only its own temp files left by an interrupted write', () => {
    const dir = mkdtempSync(join(tmpdir(), 'key-'));
    writeFileAtomic(join(dir, 'kept.key'), 'k');
    writeFileSync(join(dir, '.mesh-agent-0123456789ab.tmp'), 'half a key');
    writeFileSync(join(dir, '.someone-else.tmp'), 'not ours');
    assert.equal(removeStaleTempFiles(dir), 1);
    assert.deepEqual(readdirSync(dir).sort(), ['.someone-else.tmp', 'kept.key']);
    assert.ok(existsSync(join(dir, 'kept.key')));
  });
});
