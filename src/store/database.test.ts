import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { openDatabase, schemaVersion } from './database.js';
import { loadOrCreateSecretFile, removeStaleTempFiles, writeFileAtomic } from './key-files.js';
import { MIGRATIONS } from './migrations.js';

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
