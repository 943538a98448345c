/**
 * The agent runs from an install without dev dependencies (`npm ci --omit=dev`), as a host that
 * only runs it is installed: every package the product imports is a declared runtime
 * dependency, not one that happens to be there because a dev tool or another package pulled it
 * in, and the agent starts from that install and answers requests that need its validator and
 * OpenAPI generator.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import {
  copyFileSync,
  cpSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
} from 'node:fs';
import { builtinModules } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { eventually } from '../helpers/cluster.js';
import { freePort } from '../helpers/ports.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));

function productFiles(dir: string, out: string[] = []): string[] {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) productFiles(path, out);
    else if (name.endsWith('.ts') && !name.endsWith('.test.ts')) out.push(path);
  }
  return out;
}

/** The package a bare import specifier names (`@scope/name/sub` -> `@scope/name`). */
const packageOf = (specifier: string): string =>
  specifier
    .split('/')
    .slice(0, specifier.startsWith('@') ? 2 : 1)
    .join('/');

describe('an install without dev dependencies', { timeout: 240_000 }, () => {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
    dependencies: Record<string, string>;
  };

  it('every package the product imports is a runtime dependency in package.json', () => {
    const imported = new Map<string, string>();
    for (const file of productFiles(join(ROOT, 'src'))) {
      const text = readFileSync(file, 'utf8');
      // TypeScript's own scanner: every import, export-from and import() of the file.
      for (const { fileName } of ts.preProcessFile(text, true, true).importedFiles) {
        if (fileName.startsWith('.')) continue;
        const name = packageOf(fileName);
        if (name.startsWith('node:') || builtinModules.includes(name)) continue;
        imported.set(name, file.slice(ROOT.length));
      }
    }
    assert.ok(imported.has('fastify'), 'the scan found the product’s imports');
    const undeclared = [...imported].filter(([name]) => !(name in pkg.dependencies));
    assert.deepEqual(undeclared, [], 'imported by product code but not in "dependencies"');
  });

  const dir = mkdtempSync(join(tmpdir(), 'mesh-omit-dev-'));
  let agent: ReturnType<typeof spawn> | undefined;
  after(async () => {
    if (agent && agent.exitCode === null) {
      const exited = new Promise((resolve) => agent!.once('exit', resolve));
      agent.kill('SIGTERM');
      await exited;
    }
    rmSync(dir, { recursive: true, force: true });
  });

  it('the agent starts from npm ci --omit=dev and answers', async () => {
    // What a build produces (the compiled code and the native addons) beside the manifests.
    for (const file of ['package.json', 'package-lock.json']) copyFileSync(join(ROOT, file), join(dir, file));
    cpSync(join(ROOT, 'dist/src'), join(dir, 'dist/src'), { recursive: true });
    // The web console's built files (docs/console.md): served from disk, no package needed.
    cpSync(join(ROOT, 'dist/ui'), join(dir, 'dist/ui'), { recursive: true });
    cpSync(join(ROOT, 'build/Release'), join(dir, 'build/Release'), {
      recursive: true,
      filter: (src) => statSync(src).isDirectory() || src.endsWith('.node'),
    });
    // Scripts stay off: the package's own prepare compiles TypeScript (a dev dependency; the
    // build above did it), and better-sqlite3's compiles from source for a minute and a half;
    // its binary, for the same locked version and Node, comes from the full install instead.
    const install = spawnSync(
      'npm',
      ['ci', '--omit=dev', '--ignore-scripts', '--prefer-offline', '--no-audit', '--no-fund'],
      { cwd: dir, encoding: 'utf8' },
    );
    assert.equal(install.status, 0, `npm ci --omit=dev failed:\n${install.stderr}`);
    const devOnly = ['typescript', '@biomejs/biome', 'playwright-core', 'fast-check', 'esbuild', 'preact'];
    const present = devOnly.filter((name) => {
      try {
        return statSync(join(dir, 'node_modules', name)).isDirectory();
      } catch {
        return false;
      }
    });
    assert.deepEqual(present, [], 'dev dependencies were installed');
    const sqlite = 'node_modules/better-sqlite3/build/Release';
    mkdirSync(join(dir, sqlite), { recursive: true });
    copyFileSync(join(ROOT, sqlite, 'better_sqlite3.node'), join(dir, sqlite, 'better_sqlite3.node'));

    const port = await freePort();
    agent = spawn(
      process.execPath,
      [
        'dist/src/cli/main.js',
        'serve',
        '--dev',
        // Under npm test (root), auto would run a data plane in the host's own namespace.
        '--dataplane',
        'off',
        '--data-dir',
        join(dir, 'data'),
        '--listen',
        `127.0.0.1:${port}`,
      ],
      { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let stderr = '';
    agent.stderr?.on('data', (d) => {
      stderr += d;
    });
    const base = `http://127.0.0.1:${port}`;
    await eventually(
      'the agent answering /readyz',
      async () => ((await fetch(`${base}/readyz`)).status === 200 ? true : undefined),
      30_000,
      () => stderr,
    );
    const openapi = await fetch(`${base}/openapi.json`);
    assert.equal(openapi.status, 200);
    assert.equal(((await openapi.json()) as { openapi: string }).openapi.slice(0, 3), '3.1');
    // The request validator (Ajv with its formats) refuses a bad body in the documented shape.
    const refused = await fetch(`${base}/v1/bootstrap`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ license: 'not an object' }),
    });
    assert.equal(refused.status, 400);
    assert.equal(((await refused.json()) as { code: string }).code, 'INVALID_REQUEST');
    const script = await fetch(`${base}/ui/app.js`);
    assert.equal(script.status, 200);
    assert.match(script.headers.get('content-security-policy') ?? '', /script-src 'self'/);
  });
});
