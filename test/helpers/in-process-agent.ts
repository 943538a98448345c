/**
 * An agent started inside the test's own process by the product's `startAgent`: the code
 * `mesh-agent serve` runs, on a data directory of its own, with a real HTTP listener and gossip
 * socket, and no data plane. A Node process takes about a second of CPU to start; a check that
 * needs a hundred peers, each made by the real handshake, would spend minutes on that alone.
 * Tests that kill, stop or restart an agent, or read its log, use AgentProcess.
 *
 * What stopping leaves behind: prom-client's default collectors (a GC observer and an event-loop
 * delay monitor per agent's registry), which prom-client cannot stop. In an agent's own process
 * they end with it; here they stay until the test process exits, idle but for a callback per GC.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { startAgent } from '../../src/agent.js';
import { parseLicensePublicKey } from '../../src/license/verify.js';
import { ApiClient } from './api-client.js';
import { GOSSIP_INTERVAL_MS } from './cluster.js';
import type { Vendor } from './licenses.js';
import { freePort } from './ports.js';

export interface InProcessAgent {
  port: number;
  client: ApiClient;
  /** Stops the agent and removes its data directory. */
  stop(): Promise<void>;
}

/** Its log goes nowhere: a hundred agents' lines would bury the test's own output. */
const discard = new Writable({ write: (_chunk, _encoding, done) => done() });

export async function startInProcessAgent(vendor: Vendor): Promise<InProcessAgent> {
  const port = await freePort();
  const dataDir = mkdtempSync(join(tmpdir(), 'mesh-agent-inproc-'));
  try {
    const agent = await startAgent({
      listenHost: '127.0.0.1',
      listenPort: port,
      advertise: `127.0.0.1:${port}`,
      dataDir,
      licenseKeys: [parseLicensePublicKey(readFileSync(vendor.publicKeyFile, 'utf8'))],
      publicUrl: `http://127.0.0.1:${port}`,
      logLevel: 'warn',
      logDestination: discard,
      gossipIntervalMs: GOSSIP_INTERVAL_MS,
      dataplane: 'off',
    });
    return {
      port,
      client: new ApiClient(`http://127.0.0.1:${port}`),
      async stop() {
        try {
          await agent.stop();
        } finally {
          rmSync(dataDir, { recursive: true, force: true });
        }
      },
    };
  } catch (err) {
    rmSync(dataDir, { recursive: true, force: true });
    throw err;
  }
}
