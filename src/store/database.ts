/**
 * Opens the agent's one SQLite file and brings its schema up to date. The sole user of the
 * SQLite binding is this folder.
 *
 * Durability (measured and explained in docs/store.md): WAL with synchronous=FULL, so a write
 * the API acknowledged survives a process crash and a power loss alike. better-sqlite3 is
 * synchronous, so a commit (one fsync of the WAL) blocks the event loop for its duration; the
 * management API writes rarely, and bench/store measures the cost.
 */
import Database from 'better-sqlite3';
import { MIGRATIONS } from './migrations.js';

export type Db = Database.Database;

export function openDatabase(file: string): Db {
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  db.pragma('foreign_keys = ON');
  // Another process (a second agent started on the same data dir by mistake) gets SQLITE_BUSY
  // after this long instead of at once.
  db.pragma('busy_timeout = 2000');
  migrate(db);
  return db;
}

export function schemaVersion(db: Db): number {
  return db.pragma('user_version', { simple: true }) as number;
}

function migrate(db: Db): void {
  const current = schemaVersion(db);
  if (current > MIGRATIONS.length) {
    throw new Error(
      `database schema version ${current} is newer than this agent knows (${MIGRATIONS.length}); refusing to downgrade`,
    );
  }
  for (let version = current; version < MIGRATIONS.length; version++) {
    db.transaction(() => {
      db.exec(MIGRATIONS[version]!);
      db.pragma(`user_version = ${version + 1}`);
    })();
  }
}
