/**
 * The tunnel compliance suite against the kcp transport over loopback UDP: each peer a
 * KcpTransport on its own UDP port, each dialer reaching its acceptor through a UdpRelay (so a cut
 * or a killed peer is silence), short keepalive and dead timers, as tunnel-tcp.test.ts.
 */
import type { KeyObject } from 'node:crypto';
import { KcpTransport } from '../../src/transports/kcp-transport.js';
import { StaticPeerDirectory } from '../../src/transports/static-directory.js';
import type { PeerDirectory } from '../../src/transports/tunnel.js';
import { newPeerIdentity } from '../helpers/peer-identity.js';
import { UdpRelay } from '../transports/udp-relay.js';
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
  transport: KcpTransport | undefined;
  killed: boolean;
}

async function makeKcpWorld(peers: number): Promise<TunnelWorld> {
  const slots: Slot[] = Array.from({ length: peers }, () => {
    return { ...newPeerIdentity(), transport: undefined, killed: false };
  }).sort((a, b) => (a.id < b.id ? -1 : 1));
  const ids = slots.map((s) => s.id);
  const base = new StaticPeerDirectory();
  for (const s of slots) base.set(s.id, s.raw, 'unused:1');
  const relays = new Map<string, UdpRelay>();
  const cuts = new Set<string>();
  const pair = (i: number, j: number) => (i < j ? `${i}-${j}` : `${j}-${i}`);

  const viewOf = (viewer: number): PeerDirectory => ({
    peerByKey: (raw) => base.peerByKey(raw),
    peer: (peerId) => {
      const entry = base.peer(peerId);
      const j = ids.indexOf(peerId);
      if (!entry || j < 0) return undefined;
      const relay = relays.get(pair(viewer, j));
      return { publicKey: entry.publicKey, address: relay ? relay.address : 'unused:1' };
    },
  });

  const applyFaults = () => {
    for (const [key, relay] of relays) {
      const [i, j] = key.split('-').map(Number) as [number, number];
      relay.blackholed = cuts.has(key) || slots[i]!.killed || slots[j]!.killed;
    }
  };

  const startPeer = async (i: number) => {
    const slot = slots[i]!;
    const transport = await KcpTransport.start({
      localPeerId: slot.id,
      identityKey: slot.key,
      directory: viewOf(i),
      bind: { address: '127.0.0.1', port: 0 },
      keepaliveIntervalMs: timing.keepaliveIntervalMs,
      deadAfterMs: timing.deadAfterMs,
      backoff: { minMs: 50, maxMs: timing.backoffMaxMs },
      highWaterMark: timing.highWaterMark,
      handshakeTimeoutMs: 2000,
      handshakeRetryMs: 250,
    });
    slot.transport = transport;
    for (let d = 0; d < i; d++) relays.get(pair(d, i))!.targetPort = transport.address().port;
  };

  for (let i = 0; i < peers; i++)
    for (let j = i + 1; j < peers; j++) relays.set(pair(i, j), await UdpRelay.start(1));
  for (let i = 0; i < peers; i++) await startPeer(i);

  return {
    ids,
    timing,
    transport: (i) => slots[i]!.transport!,
    kill: async (i) => {
      slots[i]!.killed = true;
      applyFaults();
      await slots[i]!.transport?.close();
      // Its last datagrams (the CLOSEs) may still wait in the relays' sockets: let the relays read
      // and drop them while still silent, or a restart right after would let them through.
      await new Promise((resolve) => setTimeout(resolve, 50));
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
      for (const s of slots) await s.transport?.close();
      for (const relay of relays.values()) await relay.close();
    },
  };
}

tunnelCompliance('kcp', makeKcpWorld);
