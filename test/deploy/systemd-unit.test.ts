/**
 * deploy/mesh-agent.service: `systemd-analyze verify` accepts it without a single warning, and it
 * carries the hardening an agent with network capabilities needs (docs/operator-guide.md). verify checks that ExecStart's
 * program exists, so the test verifies a copy in a temporary directory whose ExecStart names this
 * machine's node (process.execPath) and this checkout's dist/src/cli/main.js instead of the
 * unit's /usr/bin/node and /opt/mesh-agent; nothing else is changed. Two controls show the check
 * bites: a missing program fails, a misspelt key is reported. Needs `systemd-analyze` (Debian
 * package `systemd`); fails loudly without it.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const UNIT = join(ROOT, 'deploy', 'mesh-agent.service');
const MAIN_JS = join(ROOT, 'dist', 'src', 'cli', 'main.js');

interface Verify {
  code: number;
  output: string;
}

function verify(text: string, dir: string): Promise<Verify> {
  const file = join(dir, 'mesh-agent.service');
  writeFileSync(file, text);
  return new Promise((resolve, reject) => {
    execFile('systemd-analyze', ['verify', file], { timeout: 20_000 }, (err, stdout, stderr) => {
      const e = err as (Error & { code?: number | string }) | null;
      if (e && e.code === 'ENOENT') {
        reject(new Error('systemd-analyze is missing: apt-get install systemd'));
        return;
      }
      resolve({ code: e ? Number(e.code ?? 1) : 0, output: `${stdout}${stderr}` });
    });
  });
}

/** The unit with ExecStart's paths replaced by ones that exist here. */
function localCopy(text: string): string {
  const out = text.replace(
    /^ExecStart=\/usr\/bin\/node \/opt\/mesh-agent\/dist\/src\/cli\/main\.js /m,
    `ExecStart=${process.execPath} ${MAIN_JS} `,
  );
  assert.notEqual(out, text, 'the unit ExecStart is the one this test substitutes');
  return out;
}

/** `Key=value` lines of the [Service] section. */
function serviceKeys(text: string): Map<string, string> {
  const section = /^\[Service\]$([\s\S]*?)(?=^\[|(?![\s\S]))/m.exec(text);
  assert.ok(section, 'a [Service] section');
  const keys = new Map<string, string>();
  for (const line of section[1]!.split('\n')) {
    const m = /^([A-Za-z]+)=(.*)$/.exec(line);
    if (m) keys.set(m[1]!, m[2]!);
  }
  return keys;
}

describe('deploy/mesh-agent.service', { timeout: 60_000 }, () => {
  const text = readFileSync(UNIT, 'utf8');
  const dir = mkdtempSync(join(tmpdir(), 'mesh-unit-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('passes systemd-analyze verify with no warning (ExecStart paths made local)', async () => {
    const res = await verify(localCopy(text), dir);
    assert.equal(res.code, 0, res.output);
    assert.equal(res.output.trim(), '', 'no warning at all');
  });

  it('the check bites: a missing program fails, a misspelt key is reported', async () => {
    const missing = await verify(
      text.replace(/^ExecStart=\/usr\/bin\/node/m, 'ExecStart=/nonexistent/node'),
      dir,
    );
    assert.notEqual(missing.code, 0);
    assert.match(missing.output, /not executable/);
    const typo = await verify(localCopy(text).replace(/^NoNewPrivileges=/m, 'NoNewPrivilegs='), dir);
    assert.match(typo.output, /Unknown key 'NoNewPrivilegs'/);
  });

  it('is hardened: its own user, only CAP_NET_ADMIN and CAP_NET_RAW, a read-only system', () => {
    const k = serviceKeys(text);
    assert.deepEqual(k.get('CapabilityBoundingSet')?.split(/\s+/).sort(), ['CAP_NET_ADMIN', 'CAP_NET_RAW']);
    assert.deepEqual(k.get('AmbientCapabilities')?.split(/\s+/).sort(), ['CAP_NET_ADMIN', 'CAP_NET_RAW']);
    assert.equal(k.get('User'), 'mesh-agent');
    assert.equal(k.get('NoNewPrivileges'), 'yes');
    assert.equal(k.get('StateDirectory'), 'mesh-agent');
    assert.equal(k.get('ProtectSystem'), 'strict');
    assert.equal(k.get('ProtectHome'), 'yes');
    assert.equal(k.get('PrivateTmp'), 'yes');
    assert.equal(k.get('Restart'), 'on-failure');
    assert.equal(k.get('KillSignal'), 'SIGTERM');
    assert.ok(k.get('TimeoutStopSec'));
    assert.match(k.get('EnvironmentFile') ?? '', /mesh-agent\.env$/);
    assert.match(k.get('ExecStart') ?? '', / serve --data-dir \$\{STATE_DIRECTORY\}$/);
  });

  it('explains its lines: every [Service] setting has a comment above it or its group', () => {
    // Each setting line follows a comment line or another setting of a commented group.
    const lines = text.split('\n');
    for (const [i, line] of lines.entries()) {
      if (!/^[A-Za-z]+=/.test(line)) continue;
      let j = i - 1;
      while (j >= 0 && /^[A-Za-z]+=/.test(lines[j]!)) j--;
      assert.ok(j >= 0 && (lines[j]!.startsWith('#') || lines[j]!.startsWith('[')), `line ${i + 1}: ${line}`);
    }
  });
});
