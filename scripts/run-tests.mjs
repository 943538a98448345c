#!/usr/bin/env node
// Runs every compiled test file (dist/**/*.test.js) with Node's test runner and its closing
// summary. Node 20's --test takes no globs, so the files are listed here. A test that needs
// something the machine lacks fails; nothing is skipped silently.
import { spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';

function find(dir, out = []) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) find(path, out);
    else if (name.endsWith('.test.js')) out.push(path);
  }
  return out;
}

const filter = process.argv[2];
const files = [...find('dist/src'), ...find('dist/test')].filter((f) => !filter || f.includes(filter)).sort();
if (files.length === 0) {
  console.error('no test files found under dist/: run npm run build first');
  process.exit(1);
}
const result = spawnSync(
  process.execPath,
  [
    '--enable-source-maps',
    '--test',
    '--test-reporter=spec',
    '--test-concurrency=2',
    '--test-timeout=300000',
    ...files,
  ],
  { stdio: 'inherit' },
);
process.exit(result.status ?? 1);
