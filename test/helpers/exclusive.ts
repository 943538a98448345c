/**
 * A lock between test processes (the runner runs two test files at once): the data-plane suites
 * that push traffic through three agents take it for their whole run, so two of them never share
 * the 2 cores. Their throughput assertions (the bandwidth limits, 100 MB under loss) measure the
 * agent, not another suite's load: a CI dry run saw the kcp suite's 100 Mbit/s upload at 72
 * Mbit/s while another traffic suite ran beside it. Light tests still run in parallel.
 *
 * The lock is a directory (mkdir is atomic) holding the owner's pid; a lock whose owner is dead
 * (kill -9, a crashed run) is taken over.
 */
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

const ROOT = join(tmpdir(), 'mesh-agent-test-locks');

/** Whether a process with this pid exists (one owned by another user counts). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Waits until this process holds the lock `name` (at most timeoutMs); returns its release. */
export async function exclusive(name: string, timeoutMs: number): Promise<() => void> {
  const dir = join(ROOT, name);
  const owner = join(dir, 'pid');
  const deadline = Date.now() + timeoutMs;
  mkdirSync(ROOT, { recursive: true });
  for (;;) {
    try {
      mkdirSync(dir);
      writeFileSync(owner, String(process.pid));
      let released = false;
      return () => {
        if (released) return;
        released = true;
        rmSync(dir, { recursive: true, force: true });
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    let holder = Number.NaN;
    try {
      holder = Number(readFileSync(owner, 'utf8'));
    } catch {
      // Taken a moment ago, its pid not written yet: wait.
    }
    if (Number.isInteger(holder) && holder > 0 && !processAlive(holder)) {
      rmSync(dir, { recursive: true, force: true });
      continue;
    }
    if (Date.now() > deadline) {
      throw new Error(`the test lock ${name} is still held by pid ${holder} after ${timeoutMs} ms`);
    }
    await sleep(200);
  }
}
