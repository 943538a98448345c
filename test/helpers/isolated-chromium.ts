/**
 * Debian's headless Chromium in a network namespace of its own, reaching the test's agents on
 * the host's loopback through a relay, at the same addresses and ports (so the origin the page
 * sees is the agent's own, http://127.0.0.1:PORT).
 *
 * Why a namespace: Chromium watches its namespace's addresses over netlink and, when one
 * changes, fails every request in flight with net::ERR_NETWORK_CHANGED. The namespace suites
 * add and remove management addresses in the host's namespace all through a CI run, so a
 * browser there sees the host "change network" at random moments (a CI run failed on a
 * `/readyz` poll that way). In its own namespace, nothing changes under it.
 *
 * The relay: inside the namespace a small Node process listens on 127.0.0.1:PORT for each port
 * and passes each connection to a Unix socket; the test process, in the host's namespace,
 * accepts there and connects to the agent at 127.0.0.1:PORT. Unix sockets are files, so they
 * cross network namespaces. Needs root (`ip netns add`); it fails loudly otherwise. Closing kills
 * whatever still runs in the namespace and deletes it; a killed run's is removed by the next one.
 */
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Browser, chromium } from 'playwright-core';
import { Netns } from './tun-netns.js';

/** Debian's package (`apt-get install chromium`), not a browser playwright downloads. */
export const CHROMIUM = '/usr/bin/chromium';

/**
 * Runs in the namespace: argv is the directory of the Unix sockets, then the ports. The host's
 * side sends one byte once the agent accepted; a connection the agent refused is closed without
 * it, and the relay then resets the browser's connection, the nearest a relay that has already
 * accepted can come to a refusal.
 */
const RELAY_IN_NAMESPACE = `
const net = require('node:net');
const [dir, ...ports] = process.argv.slice(1);
let listening = 0;
for (const port of ports) {
  net
    .createServer((client) => {
      const host = net.connect(dir + '/' + port + '.sock');
      let accepted = false;
      host.once('data', (first) => {
        accepted = true;
        if (first.length > 1) client.write(first.subarray(1));
        client.pipe(host);
        host.pipe(client);
      });
      host.on('close', () => {
        if (!accepted) client.resetAndDestroy();
      });
      client.on('error', () => host.destroy());
      host.on('error', () => client.destroy());
    })
    .listen(Number(port), '127.0.0.1', () => {
      if (++listening === ports.length) process.stdout.write('ready\\n');
    });
}
`;

const ACCEPTED = Buffer.of(1);

export interface IsolatedChromium {
  browser: Browser;
  close(): Promise<void>;
}

/**
 * Launches Chromium in a fresh namespace where 127.0.0.1:PORT, for each port, is `host`:PORT in
 * the test's namespace (an agent in a namespace of its own is reached at its management address).
 */
export async function launchIsolatedChromium(ports: number[], host = '127.0.0.1'): Promise<IsolatedChromium> {
  const ns = Netns.create('mesh-browser');
  const dir = mkdtempSync(join(tmpdir(), 'mesh-browser-'));
  const servers: Server[] = [];
  const close = () => {
    ns.delete();
    for (const server of servers) server.close();
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    for (const port of ports) {
      const server = createServer((inner) => {
        const agent = connect(port, host, () => {
          inner.write(ACCEPTED);
          inner.pipe(agent).pipe(inner);
        });
        inner.on('error', () => agent.destroy());
        agent.on('error', () => inner.destroy());
      });
      servers.push(server);
      await new Promise<void>((resolve) => server.listen(join(dir, `${port}.sock`), resolve));
    }
    const relay = ns.spawn(process.execPath, ['-e', RELAY_IN_NAMESPACE, dir, ...ports.map(String)]);
    await new Promise<void>((resolve, reject) => {
      relay.stdout?.once('data', () => resolve());
      relay.once('exit', (code) => reject(new Error(`the relay in ${ns.name} exited with ${code}`)));
    });
    // Playwright speaks to Chromium over inherited pipes (fds 3 and 4), which `ip netns exec` keeps.
    const wrapper = join(dir, 'chromium');
    writeFileSync(wrapper, `#!/bin/sh\nexec ip netns exec ${ns.name} ${CHROMIUM} "$@"\n`);
    chmodSync(wrapper, 0o755);
    const browser = await chromium.launch({
      executablePath: wrapper,
      args: ['--no-sandbox'],
      timeout: 20_000,
    });
    return {
      browser,
      close: async () => {
        await browser.close();
        close();
      },
    };
  } catch (err) {
    close();
    throw err;
  }
}
