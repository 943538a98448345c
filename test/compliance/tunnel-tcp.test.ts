/**
 * The tunnel compliance suite against the tcp transport over loopback: each peer an HTTP server
 * that hands upgrades to its TcpTransport, each dialer reaching its acceptor through a FaultProxy
 * (so a cut or a killed peer is silence, not a FIN), short keepalive and dead timers.
 */
import type { KeyObject } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { StaticPeerDirectory } from '../../src/transports/static-directory.js';
import { TcpTransport } from '../../src/transports/tcp.js';
import type { PeerDirectory } from '../../src/transports/tunnel.js';
import { newPeerIdentity } from '../helpers/peer-identity.js';
import { FaultProxy } from '../transports/fault-proxy.js';
import { type TunnelWorld, tunnelCompliance, type WorldTiming } from './tunnel-suite.js';

const timing: WorldTiming = {
  keepaliveIntervalMs: 200,
  deadAfterMs: 600,
  backoffMaxMs: 400,
  highWaterMark: 256 * 1024,
  marginMs: 400,
};

interface Slot {
  key: KeyObject;
  raw: Buffer;
  id: string;
  server: http.Server | undefined;
  transport: TcpTransport | undefined;
  killed: boolean;
}

async function makeTcpWorld(peers: number): Promise<TunnelWorld> {
  const slots: Slot[] = Array.from({ length: peers }, () => {
    return { ...newPeerIdentity(), server: undefined, transport: undefined, killed: false };
  }).sort((a, b) => (a.id < b.id ? -1 : 1));
  const ids = slots.map((s) => s.id);
  const base = new StaticPeerDirectory();
  for (const s of slots) base.set(s.id, s.raw, 'unused:1');
  // One proxy per pair, from the dialer (lower index) to the acceptor's server.
  const proxies = new Map<string, FaultProxy>();
  const cuts = new Set<string>();
  const pair = (i: number, j: number) => (i < j ? `${i}-${j}` : `${j}-${i}`);

  /** What peer `viewer` sees: the shared directory, with the pair's proxy as each peer's address. */
  const viewOf = (viewer: number): PeerDirectory => ({
    peerByKey: (raw) => base.peerByKey(raw),
    peer: (peerId) => {
      const entry = base.peer(peerId);
      const j = ids.indexOf(peerId);
      if (!entry || j < 0) return undefined;
      const proxy = proxies.get(pair(viewer, j));
      return { publicKey: entry.publicKey, address: proxy ? proxy.address : 'unused:1' };
    },
  });

  const applyFaults = () => {
    for (const [key, proxy] of proxies) {
      const [i, j] = key.split('-').map(Number) as [number, number];
      const silent = cuts.has(key) || slots[i]!.killed || slots[j]!.killed;
      if (silent && !proxy.isBlackholed) proxy.blackhole();
      else if (!silent && proxy.isBlackholed) proxy.restore();
    }
  };

  const startPeer = async (i: number) => {
    const slot = slots[i]!;
    const server = http.createServer((_req, res) => res.writeHead(404).end());
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
    const transport = new TcpTransport({
      localPeerId: slot.id,
      identityKey: slot.key,
      directory: viewOf(i),
      scheme: 'http',
      keepaliveIntervalMs: timing.keepaliveIntervalMs,
      deadAfterMs: timing.deadAfterMs,
      backoff: { minMs: 50, maxMs: timing.backoffMaxMs },
      highWaterMark: timing.highWaterMark,
      dialTimeoutMs: 2000,
    });
    server.on('upgrade', (req, socket, head) => {
      if (!transport.acceptUpgrade(req, socket, head)) socket.destroy();
    });
    slot.server = server;
    slot.transport = transport;
    const port = (server.address() as AddressInfo).port;
    for (let d = 0; d < i; d++) proxies.get(pair(d, i))!.targetPort = port;
  };

  const stopPeer = async (i: number) => {
    const slot = slots[i]!;
    await slot.transport?.close();
    const server = slot.server;
    if (server) {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  };

  for (let i = 0; i < peers; i++)
    for (let j = i + 1; j < peers; j++) proxies.set(pair(i, j), await FaultProxy.start(1));
  for (let i = 0; i < peers; i++) await startPeer(i);

  return {
    ids,
    timing,
    transport: (i) => slots[i]!.transport!,
    kill: async (i) => {
      // Silence first, so that the closing transport's FINs reach nobody.
      slots[i]!.killed = true;
      applyFaults();
      await stopPeer(i);
    },
    restart: async (i) => {
      await startPeer(i);
      slots[i]!.killed = false;
      applyFaults();
    },
    cut: (i, j) => {
      cuts.add(pair(i, j));
      applyFaults();
    },
    heal: (i, j) => {
      cuts.delete(pair(i, j));
      applyFaults();
    },
    deactivate: (i) => base.delete(ids[i]!),
    reactivate: (i) => base.set(ids[i]!, slots[i]!.raw, 'unused:1'),
    close: async () => {
      for (let i = 0; i < peers; i++) await stopPeer(i);
      for (const proxy of proxies.values()) await proxy.close();
    },
  };
}

tunnelCompliance('tcp', makeTcpWorld);
