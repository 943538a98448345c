/**
 * The world the tcp and kcp compliance runs share: real transports on loopback, each dialer
 * (the lower index of a pair) reaching its acceptor through a relay of its own, so that a cut or
 * a killed peer is silence, not a goodbye. Each pair's relay is silenced while the pair is cut
 * or either end is killed, and retargeted when the acceptor restarts on a new port. The
 * transport-specific parts (how a peer starts and stops, which relay) come from `RelayedPeers`.
 */
import type { KeyObject } from 'node:crypto';
import { StaticPeerDirectory } from '../../src/transports/static-directory.js';
import type { PeerDirectory, TunnelTransport } from '../../src/transports/tunnel.js';
import { newPeerIdentity } from '../helpers/peer-identity.js';
import type { TunnelWorld, WorldTiming } from './tunnel-suite.js';

/** Short keepalive and dead timers, so that deaths and recoveries show within a test. */
export const RELAYED_TIMING: WorldTiming = {
  keepaliveIntervalMs: 200,
  deadAfterMs: 600,
  backoffMaxMs: 400,
  highWaterMark: 256 * 1024,
  marginMs: 400,
};

/** A relay from a dialer to an acceptor's port (FaultProxy for TCP, UdpRelay for UDP). */
export interface PairRelay {
  readonly address: string;
  targetPort: number;
  close(): Promise<void>;
}

export interface PeerIdentity {
  key: KeyObject;
  raw: Buffer;
  id: string;
}

export interface RelayedPeers<P extends { transport: TunnelTransport; port: number }, R extends PairRelay> {
  /** Starts a peer that reads `directory`; its transport and the port its acceptor listens on. */
  start(identity: PeerIdentity, directory: PeerDirectory): Promise<P>;
  /** Stops a started peer (kill and close: its relays are already silent for a kill). */
  stop(peer: P): Promise<void>;
  /** A relay whose target port is set once the acceptor has started. */
  relay(): Promise<R>;
  /** Makes a relay drop everything both ways (a cut, a dead host), or forward again. */
  silence(relay: R, silent: boolean): void;
}

export async function relayedWorld<
  P extends { transport: TunnelTransport; port: number },
  R extends PairRelay,
>(peers: number, timing: WorldTiming, impl: RelayedPeers<P, R>): Promise<TunnelWorld> {
  const slots = Array.from({ length: peers }, () => ({
    ...newPeerIdentity(),
    peer: undefined as P | undefined,
    killed: false,
  })).sort((a, b) => (a.id < b.id ? -1 : 1));
  const ids = slots.map((s) => s.id);
  const base = new StaticPeerDirectory();
  for (const s of slots) base.set(s.id, s.raw, 'unused:1');
  const relays = new Map<string, R>();
  const cuts = new Set<string>();
  const pair = (i: number, j: number) => (i < j ? `${i}-${j}` : `${j}-${i}`);

  /** What peer `viewer` sees: the shared directory, with the pair's relay as each peer's address. */
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
      impl.silence(relay, cuts.has(key) || slots[i]!.killed || slots[j]!.killed);
    }
  };

  const startPeer = async (i: number) => {
    const slot = slots[i]!;
    slot.peer = await impl.start(slot, viewOf(i));
    for (let d = 0; d < i; d++) relays.get(pair(d, i))!.targetPort = slot.peer.port;
  };
  const stopPeer = async (i: number) => {
    const peer = slots[i]!.peer;
    if (peer) await impl.stop(peer);
  };

  for (let i = 0; i < peers; i++)
    for (let j = i + 1; j < peers; j++) relays.set(pair(i, j), await impl.relay());
  for (let i = 0; i < peers; i++) await startPeer(i);

  return {
    ids,
    timing,
    transport: (i) => slots[i]!.peer!.transport,
    kill: async (i) => {
      // Silence first, so that whatever the closing transport says on its way out reaches nobody.
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
      for (const relay of relays.values()) await relay.close();
    },
  };
}
