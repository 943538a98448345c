/**
 * The tunnel compliance suite against the in-memory transport: a MemoryNetwork hub, kill and
 * partition from the hub, the directory a StaticPeerDirectory.
 */
import { randomBytes } from 'node:crypto';
import { peerIdFromPublicKey } from '../../src/domain/ids.js';
import { MemoryNetwork, type MemoryTransport, memoryPublicKey } from '../../src/transports/memory.js';
import { StaticPeerDirectory } from '../../src/transports/static-directory.js';
import { type TunnelWorld, tunnelCompliance, type WorldTiming } from './tunnel-suite.js';

const timing: WorldTiming = {
  // No keepalive: a silenced connection is noticed deadAfterMs after the silence, exactly.
  keepaliveIntervalMs: 0,
  deadAfterMs: 300,
  backoffMaxMs: 100,
  highWaterMark: 256 * 1024,
  marginMs: 200,
};

async function makeMemoryWorld(peers: number): Promise<TunnelWorld> {
  const network = new MemoryNetwork();
  const directory = new StaticPeerDirectory();
  const ids = Array.from({ length: peers }, () => peerIdFromPublicKey(randomBytes(32))).sort();
  for (const id of ids) directory.set(id, memoryPublicKey(id), 'memory');
  const start = (i: number) =>
    network.transport({
      localPeerId: ids[i]!,
      directory,
      deadAfterMs: timing.deadAfterMs,
      backoff: { minMs: 10, maxMs: timing.backoffMaxMs },
      highWaterMark: timing.highWaterMark,
    });
  const transports: MemoryTransport[] = ids.map((_, i) => start(i));
  return {
    ids,
    timing,
    transport: (i) => transports[i]!,
    kill: async (i) => network.kill(ids[i]!),
    restart: async (i) => {
      transports[i] = start(i);
    },
    cut: (i, j) => network.partition(ids[i]!, ids[j]!),
    heal: (i, j) => network.heal(ids[i]!, ids[j]!),
    deactivate: (i) => directory.delete(ids[i]!),
    reactivate: (i) => directory.set(ids[i]!, memoryPublicKey(ids[i]!), 'memory'),
    close: async () => {
      await Promise.all(transports.map((t) => t.close()));
    },
  };
}

tunnelCompliance('memory', makeMemoryWorld);
