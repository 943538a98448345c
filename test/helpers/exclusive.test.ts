import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { exclusive } from './exclusive.js';

describe('exclusive (test lock between processes)', { timeout: 20_000 }, () => {
  const name = `self-test-${process.pid}`;

  it('a second holder waits until the first releases', async () => {
    const release = await exclusive(name, 1000);
    let second = false;
    const waiting = exclusive(name, 5000).then((r) => {
      second = true;
      return r;
    });
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(second, false, 'taken while held');
    release();
    (await waiting)();
    assert.equal(second, true);
  });

  it('times out naming the holder', async () => {
    const release = await exclusive(name, 1000);
    await assert.rejects(exclusive(name, 300), new RegExp(`held by pid ${process.pid}`));
    release();
  });

  it('takes over a lock whose owner died', async () => {
    const dead = spawnSync(process.execPath, [
      '-e',
      'process.stdout.write(String(process.pid))',
    ]).stdout.toString();
    const dir = join(tmpdir(), 'mesh-agent-test-locks', name);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'pid'), dead);
    (await exclusive(name, 1000))();
  });
});
