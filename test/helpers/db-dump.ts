/**
 * Reads a running agent's SQLite file from the test process, read-only (WAL lets a second
 * process read while the agent writes), and returns a deterministic dump: every table's rows in
 * a fixed order, blobs as hex, plus `PRAGMA integrity_check`. Two dumps are equal exactly when
 * the stored state is equal, so a test can assert that a refused request changed nothing.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';

/** The agent's database file name inside its data dir (src/agent.ts DATABASE_FILE). */
export const DATABASE_FILE = 'mesh-agent.db';

export type DumpValue = string | number | null;

export interface DbDump {
  /** `PRAGMA user_version`: the number of migrations applied. */
  schemaVersion: number;
  /** Table name → rows; each row's columns in declaration order, rows sorted by every column. */
  tables: Record<string, Record<string, DumpValue>[]>;
  /** `ok`, or SQLite's list of problems joined by newlines. */
  integrity: string;
  /** `tables` and `schemaVersion` as one canonical JSON text, for equality checks and diffs. */
  text: string;
}

export function databasePath(dataDir: string): string {
  return join(dataDir, DATABASE_FILE);
}

/** Opens the file read-only, dumps it and closes it again; throws when the file does not exist. */
export function dumpDatabase(dataDir: string): DbDump {
  const file = databasePath(dataDir);
  if (!existsSync(file)) throw new Error(`no database at ${file}`);
  const db = new Database(file, { readonly: true, fileMustExist: true });
  try {
    db.pragma('busy_timeout = 5000');
    // One read transaction, so every table is read from the same snapshot.
    return db.transaction(() => dumpOpen(db))();
  } finally {
    db.close();
  }
}

function dumpOpen(db: Database.Database): DbDump {
  const schemaVersion = db.pragma('user_version', { simple: true }) as number;
  const names = (
    db
      .prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_stat%' ORDER BY name",
      )
      .all() as { name: string }[]
  ).map((r) => r.name);
  const tables: DbDump['tables'] = {};
  for (const name of names) {
    const columns = (db.prepare(`PRAGMA table_info(${quoteIdent(name)})`).all() as { name: string }[]).map(
      (c) => c.name,
    );
    const order = columns.map((_, i) => String(i + 1)).join(', ');
    const rows = db
      .prepare(`SELECT * FROM ${quoteIdent(name)}${order ? ` ORDER BY ${order}` : ''}`)
      .all() as Record<string, unknown>[];
    tables[name] = rows.map((row) => {
      const out: Record<string, DumpValue> = {};
      for (const column of columns) out[column] = dumpValue(row[column]);
      return out;
    });
  }
  const integrity = (db.prepare('PRAGMA integrity_check').all() as { integrity_check: string }[])
    .map((r) => r.integrity_check)
    .join('\n');
  return { schemaVersion, tables, integrity, text: JSON.stringify({ schemaVersion, tables }) };
}

function dumpValue(v: unknown): DumpValue {
  if (v === null || v === undefined) return null;
  if (Buffer.isBuffer(v)) return `x'${v.toString('hex')}'`;
  if (typeof v === 'bigint') return v.toString();
  if (typeof v === 'number' || typeof v === 'string') return v;
  return String(v);
}

const quoteIdent = (name: string): string => `"${name.replace(/"/g, '""')}"`;

/** Only `PRAGMA integrity_check` (`ok` when the file is sound), without reading every row. */
export function integrityCheck(dataDir: string): string {
  const db = new Database(databasePath(dataDir), { readonly: true, fileMustExist: true });
  try {
    db.pragma('busy_timeout = 5000');
    return (db.prepare('PRAGMA integrity_check').all() as { integrity_check: string }[])
      .map((r) => r.integrity_check)
      .join('\n');
  } finally {
    db.close();
  }
}

/** A short description of how two dumps differ, for assertion messages. */
export function diffDumps(before: DbDump, after: DbDump): string {
  const lines: string[] = [];
  if (before.schemaVersion !== after.schemaVersion) {
    lines.push(`schema version ${before.schemaVersion} → ${after.schemaVersion}`);
  }
  const names = [...new Set([...Object.keys(before.tables), ...Object.keys(after.tables)])].sort();
  for (const name of names) {
    const a = (before.tables[name] ?? []).map((r) => JSON.stringify(r));
    const b = (after.tables[name] ?? []).map((r) => JSON.stringify(r));
    const setA = new Set(a);
    const setB = new Set(b);
    for (const r of a) if (!setB.has(r)) lines.push(`${name}: - ${r}`);
    for (const r of b) if (!setA.has(r)) lines.push(`${name}: + ${r}`);
  }
  return lines.join('\n') || 'no difference';
}
