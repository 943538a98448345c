/**
 * The product holds no switch that exists only for tests: no `--test-hooks`, no route under
 * /internal/v1/test/, no movable clock and no fault switch in the gossip engine's send or receive
 * path. Tests move an agent's clock with libfaketime (test/helpers/faketime.ts) and cut its gossip
 * with nftables (test/helpers/gossip-cut.ts), from outside the process.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { ROUTE_SCOPES } from '../../src/api/route-scopes.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));

/** The product's source files under `dir`: its unit tests (`*.test.ts`) left out. */
function sources(dir: string, out: string[] = []): string[] {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) sources(path, out);
    else if (/\.(ts|js|mjs|cjs)$/.test(name) && !name.endsWith('.test.ts')) out.push(path);
  }
  return out;
}

/** What no file under src/ may hold, with what it would be. */
const FORBIDDEN: [RegExp, string][] = [
  [/test-hooks|testHooks|TestHook/, 'the --test-hooks flag or its wiring'],
  [/\/internal\/v1\/test\//, 'a test-only route'],
  [/OffsetClock|advance_ms/, 'a clock the API can move'],
  [/fault switch|FaultSwitch|blocked_peer_ids/i, 'a gossip fault switch'],
];

describe('no test switch in the product', () => {
  it('src/ holds no test hook, test route, movable clock or fault switch', () => {
    const files = sources(join(ROOT, 'src'));
    assert.ok(files.length > 100, `only ${files.length} source files found`);
    const found: string[] = [];
    for (const file of files) {
      const lines = readFileSync(file, 'utf8').split('\n');
      lines.forEach((line, i) => {
        for (const [pattern, what] of FORBIDDEN) {
          if (pattern.test(line)) found.push(`${relative(ROOT, file)}:${i + 1}: ${what}: ${line.trim()}`);
        }
      });
    }
    assert.deepEqual(found, []);
  });

  it('the gossip engine neither drops nor refuses by any switch: it has no faults at all', () => {
    const files = sources(join(ROOT, 'src', 'cluster'));
    const found = files.filter((f) => /\bfaults?\b/.test(readFileSync(f, 'utf8')));
    assert.deepEqual(
      found.map((f) => relative(ROOT, f)),
      [],
    );
  });

  it('no route under /internal/v1/ but the agent-to-agent ones', () => {
    const internal = Object.keys(ROUTE_SCOPES).filter((r) => r.includes(' /internal/'));
    assert.deepEqual(internal.sort(), [
      'POST /internal/v1/gossip',
      'POST /internal/v1/handshake/confirm',
      'POST /internal/v1/handshake/hello',
    ]);
  });
});
