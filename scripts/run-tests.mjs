#!/usr/bin/env node
// Runs the compiled tests with Node's test runner and its closing summary. The list comes from
// the sources (src/ and test/, `*.test.ts`), so a compiled file whose source was renamed or
// removed does not run. Node 20's --test takes no globs, so the files are listed here.
//
//   node scripts/run-tests.mjs [--unit] [part-of-a-file-name]
//
// --unit: the fast tier, no root, no network namespaces, no browsers: the unit tests beside
// their modules (src/) and test/internals/, without `*.root.test.ts`. Without it: every test.
// A test that needs something the machine lacks fails; nothing is skipped silently.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { findFiles } from './find-files.mjs';

const find = (dir) => findFiles(dir, '.test.ts');

const args = process.argv.slice(2);
const unit = args.includes('--unit');
const filter = args.find((a) => a !== '--unit');
const sources = unit
  ? [...find('src'), ...find('test/internals')].filter((f) => !f.endsWith('.root.test.ts'))
  : [...find('src'), ...find('test')];
const files = sources
  .map((f) => join('dist', f.replace(/\.ts$/, '.js')))
  .filter((f) => !filter || f.includes(filter))
  .sort();
const unbuilt = files.filter((f) => !existsSync(f));
if (files.length === 0 || unbuilt.length > 0) {
  console.error(
    files.length === 0
      ? 'no test files match'
      : `not compiled: ${unbuilt.join(', ')}: run npm run build first`,
  );
  process.exit(1);
}
const result = spawnSync(
  process.execPath,
  [
    '--enable-source-maps',
    '--test',
    '--test-reporter=spec',
    '--test-concurrency=2',
    // Per file, and counted from its start: the namespace suites wait for each other's lock
    // (test/helpers/exclusive.ts) before their own minutes of work.
    '--test-timeout=600000',
    ...files,
  ],
  { stdio: 'inherit' },
);
process.exit(result.status ?? 1);
