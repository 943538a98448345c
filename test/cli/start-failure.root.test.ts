/**
 * A start-up that fails part way (here: the API's port is taken) leaves nothing open behind it
 * and says why in one line. Root, because only with the data plane on does the agent open its
 * tunnel sockets (the kcp transport's UDP socket takes the API's port number).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { startAgent } from '../../src/agent.js';
import { sleep } from '../helpers/api-assertions.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));

/** Handles of the kinds an agent opens: listening and connected sockets, UDP sockets, timers. */
const openHandles = (): string[] =>
  process
    .getActiveResourcesInfo()
    .filter((r) => /TCP|UDP|Pipe|Timeout|FSReq/.test(r))
    .sort();

describe('a start-up that fails part way', { timeout: 60_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'mesh-start-failure-'));
  const blocker = net.createServer();
  let port = 0;
  before(async () => {
    if (process.getuid?.() !== 0)
      throw new Error('this test needs root (the data plane opens the tunnel sockets)');
    await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
    port = (blocker.address() as net.AddressInfo).port;
  });
  after(() => {
    blocker.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('in process: startAgent rejects with the cause and has closed everything it opened', async () => {
    const before = openHandles();
    const logs: string[] = [];
    await assert.rejects(
      startAgent({
        listenHost: '127.0.0.1',
        listenPort: port,
        advertise: `127.0.0.1:${port}`,
        dataDir: join(dir, 'in-process'),
        licenseKeys: [],
        publicUrl: `http://127.0.0.1:${port}`,
        logLevel: 'info',
        logDestination: new Writable({
          write(chunk, _encoding, done) {
            logs.push(String(chunk));
            done();
          },
        }),
        dataplane: 'on',
      }),
      /EADDRINUSE/,
    );
    // A handle being closed stays on the list until libuv's close callback has run; one left
    // open stays there for good.
    const deadline = Date.now() + 2000;
    while (Date.now() < deadline && openHandles().join() !== before.join()) await sleep(20);
    assert.deepEqual(openHandles(), before, `handles left open; the agent's log:\n${logs.join('')}`);
    // The UDP port is free again, and the store closed cleanly (its WAL checkpointed away).
    const udp = createSocket('udp4');
    await new Promise<void>((resolve, reject) => {
      udp.once('error', reject);
      udp.bind(port, '127.0.0.1', resolve);
    });
    udp.close();
    assert.equal(existsSync(join(dir, 'in-process', 'mesh-agent.db-wal')), false, 'the store was not closed');
  });

  it('mesh-agent serve exits 1 with one line that names the cause', () => {
    const run = spawnSync(
      process.execPath,
      [
        join(ROOT, 'dist/src/cli/main.js'),
        'serve',
        '--listen',
        `127.0.0.1:${port}`,
        '--data-dir',
        join(dir, 'cli'),
        '--dataplane',
        'on',
        '--log-level',
        'error',
      ],
      { encoding: 'utf8', timeout: 30_000 },
    );
    assert.equal(run.status, 1, `stdout: ${run.stdout}\nstderr: ${run.stderr}`);
    const lines = run.stderr.trim().split('\n');
    assert.equal(lines.length, 1, `stderr: ${run.stderr}`);
    assert.match(lines[0]!, new RegExp(`^mesh-agent: .*EADDRINUSE.*127\\.0\\.0\\.1:${port}`));
  });
});
