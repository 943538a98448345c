/**
 * `npm run demo` (scripts/demo.mjs) end to end, as root (fails loudly without it):
 * run to completion, its output shows the destination's own log line of each request (the
 * client's address for the transparent service, site C's for the NAT one) and the status
 * screen; afterwards nothing is left (no `mdemo-*` namespace, no management link, no agent
 * started from the demo's temp dir, no destination server, no temp dir). Also interrupted with
 * SIGINT (Ctrl-C) in the middle: it exits 130 and leaves nothing either.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { requireNetnsSupport } from '../helpers/netns-topology.js';

const DEMO = fileURLToPath(new URL('../../../scripts/demo.mjs', import.meta.url));

interface Run {
  code: number | null;
  out: string;
}

/** Runs the demo; `interruptAt`: sends SIGINT once the output contains that text. */
function runDemo(timeoutMs: number, interruptAt?: string): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [DEMO], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let interrupted = false;
    const onData = (c: Buffer) => {
      out += c.toString();
      if (interruptAt && !interrupted && out.includes(interruptAt)) {
        interrupted = true;
        child.kill('SIGINT');
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

/** Fails if anything the demo made is still there. */
function assertNothingLeft(out: string): void {
  const namespaces = execFileSync('ip', ['netns', 'ls'], { encoding: 'utf8' });
  assert.doesNotMatch(namespaces, /^mdemo-/m, 'no mdemo-* namespace left');
  const links = execFileSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8' });
  assert.doesNotMatch(links, /\bmdemom\d/, 'no management link left');
  const work = /(\/\S*\/mesh-demo-[A-Za-z0-9]+)\//.exec(out)?.[1];
  assert.ok(work, 'the demo printed its temp dir');
  assert.equal(existsSync(work), false, `${work} removed`);
  const left: string[] = [];
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    let cmdline = '';
    try {
      cmdline = readFileSync(join('/proc', pid, 'cmdline'), 'utf8').replaceAll('\0', ' ');
    } catch {
      continue; // gone meanwhile
    }
    // The agents run with their data dirs in the demo's temp dir.
    if (cmdline.includes(work)) left.push(`${pid}: ${cmdline}`);
  }
  const server = /logs each request's source address \(pid (\d+)\)/.exec(out)?.[1];
  assert.ok(server, 'the demo printed its server pid');
  assert.equal(existsSync(join('/proc', server)), false, `destination server (pid ${server}) gone`);
  assert.deepEqual(left, [], 'no agent or server process left');
}

describe('npm run demo', { timeout: 240_000 }, () => {
  it('runs to completion: the destination logs the client address (transparent), status, clean teardown', async () => {
    await requireNetnsSupport();
    const { code, out } = await runDemo(150_000);
    assert.equal(code, 0, out);
    // The destination's own log lines, as the demo quotes them.
    assert.match(out, /the destination's own log: "remote 10\.91\.1\.2 \/demo-transparent"/);
    assert.match(out, /the destination's own log: "remote 10\.91\.4\.1 \/demo-nat"/);
    assert.match(out, /RESULT transparent \(via site B\): the destination saw source 10\.91\.1\.2$/m);
    // The status screen: three peers, both services up with their routes.
    assert.match(out, /\$ mesh-agent status\n\s+cluster\s+\S+/);
    assert.match(out, /license\s+demo-license expires .* nodes 3\/5, services 2\/10/);
    assert.match(out, /^\s+PEERS \(3\)$/m);
    assert.match(out, /^\s+SERVICES \(2\)$/m);
    assert.equal(out.match(/tcp {2}active {2}state up \(ingress\)$/gm)?.length, 2, out);
    assert.match(out, /route \d+\s+priority 100\s+10\.91\.1\.0\/24 -> 10\.91\.2\.0\/24/);
    assert.doesNotMatch(out, /client_secret\s+[A-Za-z0-9_-]{16,}/, 'no secret printed');
    assertNothingLeft(out);
  });

  it('Ctrl-C in the middle (SIGINT): exits 130 and leaves nothing behind', async () => {
    await requireNetnsSupport();
    const { code, out } = await runDemo(90_000, '== 6.');
    assert.match(out, /SIGINT: tearing the demo down/);
    assert.equal(code, 130, out);
    assertNothingLeft(out);
  });
});
