/**
 * Keeps the layout of docs/architecture.md true: every error code is documented, every module says
 * what it is for in a header comment, and imports follow the arrows of its module table (domain
 * imports nothing with I/O, nothing imports api/ or cli/, only the store touches the SQLite
 * binding and runs SQL).
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { ERROR_STATUS } from '../../src/domain/errors.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const SRC = join(ROOT, 'src');

function sourceFiles(dir: string, out: string[] = []): string[] {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) sourceFiles(path, out);
    else if (name.endsWith('.ts') && !name.endsWith('.test.ts') && !name.endsWith('.d.ts')) out.push(path);
  }
  return out;
}

/** Which top-level folders of src/ each folder may import from. */
const ALLOWED: Record<string, string[]> = {
  domain: ['domain'],
  store: ['domain', 'store'],
  license: ['domain', 'license'],
  // auth and cluster record config events of their writes (docs/events.md).
  auth: ['domain', 'store', 'events', 'auth'],
  cluster: ['domain', 'store', 'auth', 'license', 'events', 'cluster'],
  native: ['native'],
  transports: ['domain', 'native', 'transports'],
  dataplane: ['domain', 'transports', 'native', 'dataplane'],
  events: ['domain', 'store', 'events'],
  webhooks: ['domain', 'store', 'events', 'webhooks'],
  // Pure logic the web console bundles (ui/): nothing of the agent's.
  console: ['console'],
  api: ['domain', 'store', 'auth', 'license', 'cluster', 'dataplane', 'events', 'webhooks', 'api'],
  'agent.ts': [
    'domain',
    'store',
    'auth',
    'license',
    'cluster',
    'dataplane',
    'transports',
    'native',
    'events',
    'webhooks',
    'api',
  ],
  cli: ['agent.ts', 'domain', 'store', 'license', 'native', 'cli'],
};

const topOf = (file: string) => relative(SRC, file).split('/')[0]!;

describe('architecture', () => {
  it('documents every error code with its status in docs/errors.md', () => {
    const doc = readFileSync(join(ROOT, 'docs/errors.md'), 'utf8');
    for (const [code, status] of Object.entries(ERROR_STATUS)) {
      assert.match(
        doc,
        new RegExp(`\\| \`${code}\` \\| ${status} \\|`),
        `${code} (${status}) missing from docs/errors.md`,
      );
    }
  });

  it('opens every module with a header comment saying what it is for', () => {
    const bare = sourceFiles(SRC).filter((f) => {
      const text = readFileSync(f, 'utf8').replace(/^#!.*\n/, '');
      return !/^\s*(\/\*\*|\/\/)/.test(text);
    });
    assert.deepEqual(
      bare.map((f) => relative(ROOT, f)),
      [],
    );
  });

  it('keeps the import arrows of docs/architecture.md', () => {
    const violations: string[] = [];
    for (const file of sourceFiles(SRC)) {
      const from = topOf(file);
      const allowed = ALLOWED[from];
      assert.ok(allowed, `no import rule for src/${from}`);
      const text = readFileSync(file, 'utf8');
      for (const m of text.matchAll(/^import[^'"]*['"]([^'"]+)['"]/gm)) {
        const spec = m[1]!;
        if (spec === 'better-sqlite3' && from !== 'store')
          violations.push(`${relative(ROOT, file)} imports the SQLite binding`);
        if (!spec.startsWith('.')) continue;
        const target = topOf(join(file, '..', spec));
        const targetKey = target.endsWith('.js') ? target.replace(/\.js$/, '.ts') : target;
        if (!allowed.includes(targetKey)) violations.push(`${relative(ROOT, file)} -> ${spec}`);
      }
    }
    assert.deepEqual(violations, []);
  });

  it('runs SQL only in the store: nothing else reaches into its database', () => {
    const reaching = sourceFiles(SRC)
      .filter((file) => topOf(file) !== 'store')
      .filter((file) => /\.db\.(prepare|exec|pragma|transaction)\(/.test(readFileSync(file, 'utf8')))
      .map((file) => relative(ROOT, file));
    assert.deepEqual(reaching, []);
  });
});
