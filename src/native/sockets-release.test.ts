// The socket addon's connects are released once they are over: thousands of connects (accepted,
// refused, aborted) through connectSocket leave no native Connect object alive, so an exit that
// opens a connection per relayed stream does not grow with every connection it has made. Plain
// loopback connects need no root.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { queryObjects } from 'node:v8';
import { loadAddon } from './load-addon.js';
import { connectNetSocket, connectSocket } from './sockets.js';

// The same constructor the wrapper uses: the addon is loaded once per process.
const { Connect } = loadAddon<{ Connect: new (...args: never[]) => object }>('mesh_sockets.node');

/** Live Connect objects, after a full collection (queryObjects collects first). */
const liveConnects = (): number => queryObjects(Connect, { format: 'count' }) as number;

describe('native connects are released once over', { timeout: 120_000 }, () => {
  const server = net.createServer((s) => s.destroy());
  let port = 0;
  let closedPort = 0;
  before(async () => {
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as net.AddressInfo).port;
    const probe = net.createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    closedPort = (probe.address() as net.AddressInfo).port;
    await new Promise((resolve) => probe.close(resolve));
  });
  after(() => server.close());

  it('counts the connects in flight (the count can see them)', async () => {
    const inFlight = Array.from({ length: 50 }, () =>
      connectSocket({ family: 4, address: '127.0.0.1', port }),
    );
    assert.ok(liveConnects() >= 50, 'connects in flight are alive');
    for (const fd of await Promise.all(inFlight)) new net.Socket({ fd }).destroy();
  });

  it('after 3000 accepted, 300 refused and 300 aborted connects at most the last few are alive', async () => {
    const signal = new AbortController().signal; // one that never aborts, as a caller's may be
    for (let i = 0; i < 3000; i++)
      (await connectNetSocket({ family: 4, address: '127.0.0.1', port, signal })).destroy();
    for (let i = 0; i < 300; i++)
      await assert.rejects(connectSocket({ family: 4, address: '127.0.0.1', port: closedPort }), {
        code: 'ECONNREFUSED',
      });
    for (let i = 0; i < 300; i++) {
      const ctl = new AbortController();
      const connecting = connectSocket({ family: 4, address: '127.0.0.1', port, signal: ctl.signal });
      ctl.abort();
      await assert.rejects(connecting, { code: 'ABORT_ERR' });
    }
    // A leaked connect stays for good (one per connect: 3600 here); the last one or two may still
    // be held for a moment by the scopes that ran them.
    await new Promise((resolve) => setTimeout(resolve, 50));
    const live = liveConnects();
    assert.ok(live <= 3, `${live} Connect objects alive after 3600 connects`);
  });
});
