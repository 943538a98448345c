/**
 * The in-memory twin of the tcp transport, for the dataplane's unit tests: the same Tunnel
 * semantics (the keeper in tunnel-keeper.ts is shared: dialing rule, directory checks, ordering,
 * drop-while-down, replacement, counters) over a MemoryNetwork hub instead of sockets. Faults are
 * controlled by the test: kill(peer) makes a transport vanish without a goodbye,
 * partition(a, b) silently stops a pair's traffic; the other side notices after deadAfterMs, as
 * tcp's keepalive would, and the dialer redials with backoff.
 *
 * Differences that are deliberate: a transport "authenticates" with a raw public key it is given
 * (no cryptography); a dial to an unreachable peer fails at once instead of timing out; messages
 * are delivered on the next turn of the event loop, all that is queued at once.
 */
import { createHash } from 'node:crypto';
import type { BackoffOptions } from './backoff.js';
import type { FaultReason, PeerDirectory, TransportLogger, TunnelMessage } from './tunnel.js';
import { type Link, type LinkSink, TunnelKeeper } from './tunnel-keeper.js';

export interface MemoryTransportOptions {
  localPeerId: string;
  directory: PeerDirectory;
  /** The key this transport presents to peers. Default memoryPublicKey(localPeerId). */
  publicKey?: Buffer;
  /** A silenced connection (kill, partition) is noticed after this long. Default 0 (next turn). */
  deadAfterMs?: number;
  /** Redial delays. Default 10 ms to 200 ms, 20 % jitter (fast, for unit tests). */
  backoff?: BackoffOptions;
  /** send() returns false above this many bytes not yet delivered. Default 256 KiB, as tcp. */
  highWaterMark?: number;
  logger?: TransportLogger;
  random?: () => number;
}

/** The key a memory transport presents by default: derived from its peer id, 32 bytes. */
export function memoryPublicKey(peerId: string): Buffer {
  return createHash('sha256').update(`mesh-agent memory transport\0${peerId}`).digest();
}

/** The hub memory transports meet in; one per test. */
export class MemoryNetwork {
  private readonly nodes = new Map<string, MemoryTransport>();
  private readonly cuts = new Set<string>();
  private readonly pairs = new Set<MemoryPair>();

  /** A transport for this peer on the network (a peer that was killed may come back). */
  transport(options: MemoryTransportOptions): MemoryTransport {
    if (this.nodes.has(options.localPeerId))
      throw new Error(`peer ${options.localPeerId} is already on the memory network`);
    const transport = new MemoryTransport(this, options);
    this.nodes.set(options.localPeerId, transport);
    return transport;
  }

  /** The peer's transport vanishes: its connections go silent (no close is seen) and it stops. */
  kill(peerId: string): void {
    const transport = this.nodes.get(peerId);
    for (const pair of this.pairs) if (pair.involves(peerId)) pair.silence();
    this.nodes.delete(peerId);
    void transport?.close();
  }

  /** The two peers stop hearing each other: open connections go silent, new dials fail. */
  partition(a: string, b: string): void {
    this.cuts.add(pairKey(a, b));
    for (const pair of this.pairs) if (pair.between(a, b)) pair.silence();
  }

  heal(a: string, b: string): void {
    this.cuts.delete(pairKey(a, b));
  }

  /** @internal A dial from one transport to a peer: the two ends, or why not. */
  connect(from: MemoryTransport, to: string): { link: Link } | { error: string } {
    const target = this.nodes.get(to);
    if (!target || this.nodes.get(from.localPeerId) !== from || this.cuts.has(pairKey(from.localPeerId, to)))
      return { error: 'peer unreachable' };
    const pair = new MemoryPair(this, from, target);
    this.pairs.add(pair);
    return { link: pair.dialerEnd };
  }

  /** @internal */
  forget(pair: MemoryPair): void {
    this.pairs.delete(pair);
  }

  /** @internal */
  leave(transport: MemoryTransport): void {
    if (this.nodes.get(transport.localPeerId) === transport) this.nodes.delete(transport.localPeerId);
  }
}

export class MemoryTransport extends TunnelKeeper {
  readonly kind = 'memory';
  readonly publicKey: Buffer;
  readonly deadAfterMs: number;
  readonly highWaterMark: number;

  constructor(
    private readonly network: MemoryNetwork,
    options: MemoryTransportOptions,
  ) {
    super({ ...options, backoff: options.backoff ?? { minMs: 10, maxMs: 200 } });
    this.publicKey = options.publicKey ?? memoryPublicKey(options.localPeerId);
    this.deadAfterMs = options.deadAfterMs ?? 0;
    this.highWaterMark = options.highWaterMark ?? 256 * 1024;
  }

  protected async connect(peerId: string, signal: AbortSignal): Promise<Link> {
    // Asynchronous like a real dial, so that states and events interleave as they do on tcp.
    await new Promise((resolve) => setImmediate(resolve));
    if (signal.aborted) throw new Error('dial aborted');
    if (!this.directory.peer(peerId)) throw new Error('not an active peer');
    const made = this.network.connect(this, peerId);
    if ('error' in made) throw new Error(made.error);
    const link = made.link as MemoryEnd;
    // As in TLS: the dialer checks the key the peer presents, the peer checks the dialer's.
    const wrong = this.authorizeOutbound(peerId, link.peerKey);
    if (wrong) this.fault(wrong, { peer: peerId, key: link.peerKey.toString('base64') });
    const refused = wrong ?? link.pair.offer();
    if (refused) {
      link.pair.discard();
      throw new Error(`refused: ${refused}`);
    }
    return link;
  }

  /** @internal The acceptor's half of a dial: authorize the dialer's key, adopt the link. */
  accept(end: MemoryEnd): FaultReason | undefined {
    const authorized = this.authorizeInbound(end.peerKey);
    if ('refused' in authorized) {
      this.fault(authorized.refused, { key: end.peerKey.toString('base64') });
      return authorized.refused;
    }
    this.adopt(authorized.peerId, end);
    return undefined;
  }

  /** @internal */
  recordFault(reason: FaultReason, details: Record<string, unknown>): void {
    this.fault(reason, details);
  }

  protected async shutdown(): Promise<void> {
    this.network.leave(this);
  }
}

/** A connection between two memory transports: two ends that hand each other copies. */
class MemoryPair {
  readonly dialerEnd: MemoryEnd;
  readonly acceptorEnd: MemoryEnd;
  silent = false;

  constructor(
    private readonly network: MemoryNetwork,
    readonly dialer: MemoryTransport,
    readonly acceptor: MemoryTransport,
  ) {
    // Each end knows the key the other side presented.
    this.dialerEnd = new MemoryEnd(this, dialer, acceptor.publicKey);
    this.acceptorEnd = new MemoryEnd(this, acceptor, dialer.publicKey);
    this.dialerEnd.other = this.acceptorEnd;
    this.acceptorEnd.other = this.dialerEnd;
  }

  involves(peerId: string): boolean {
    return this.dialer.localPeerId === peerId || this.acceptor.localPeerId === peerId;
  }

  between(a: string, b: string): boolean {
    return this.involves(a) && this.involves(b);
  }

  /** The acceptor's decision on the dialer's key. */
  offer(): FaultReason | undefined {
    return this.acceptor.accept(this.acceptorEnd);
  }

  /** Nothing passes any more and neither end hears of it: each notices after its deadAfterMs. */
  silence(): void {
    if (this.silent) return;
    this.silent = true;
    this.dialerEnd.silenced();
    this.acceptorEnd.silenced();
  }

  discard(): void {
    this.dialerEnd.close();
    this.acceptorEnd.close();
    this.network.forget(this);
  }

  ended(): void {
    if (this.dialerEnd.finished && this.acceptorEnd.finished) this.network.forget(this);
  }
}

class MemoryEnd implements Link {
  other!: MemoryEnd;
  finished = false;
  private sink: LinkSink | undefined;
  private inbox: Buffer[] = [];
  private inboxBytes = 0;
  private deliveryScheduled = false;
  private wantDrain = false;
  private deadTimer: NodeJS.Timeout | undefined;
  /** When the pair went silent: no keepalive would be answered from then on. */
  private silencedAt: number | undefined;

  constructor(
    readonly pair: MemoryPair,
    private readonly owner: MemoryTransport,
    readonly peerKey: Buffer,
  ) {}

  open(sink: LinkSink): void {
    if (this.finished) {
      sink.closed(undefined, 'closed before it was opened');
      return;
    }
    this.sink = sink;
    sink.rtt(0);
    if (this.inbox.length > 0) this.scheduleDelivery();
  }

  send(messages: readonly TunnelMessage[]): boolean {
    if (this.finished) return true;
    // Into the void, as a write to a connection whose peer is gone: the sender cannot tell yet.
    if (this.pair.silent) return true;
    const other = this.other;
    for (const m of messages) {
      other.inbox.push(Buffer.isBuffer(m) ? Buffer.from(m) : Buffer.concat(m.parts, m.length));
      other.inboxBytes += m.length;
    }
    other.scheduleDelivery();
    if (other.inboxBytes <= this.owner.highWaterMark) return true;
    this.wantDrain = true;
    return false;
  }

  close(): void {
    if (this.finished) return;
    this.end();
    // An orderly close reaches the other end, unless nothing passes any more.
    if (!this.pair.silent) {
      const other = this.other;
      setImmediate(() => other.finish(undefined, 'closed by the peer'));
    }
  }

  /** A connected pair answers every keepalive: silent only from the partition on. */
  silentMs(): number {
    return this.silencedAt === undefined ? 0 : performance.now() - this.silencedAt;
  }

  silenced(): void {
    this.silencedAt = performance.now();
    this.inbox = [];
    this.inboxBytes = 0;
    if (this.finished) return;
    this.deadTimer = setTimeout(
      () => this.finish('dead', `nothing received for ${this.owner.deadAfterMs} ms`),
      this.owner.deadAfterMs,
    );
    this.deadTimer.unref();
  }

  private scheduleDelivery(): void {
    if (this.deliveryScheduled || !this.sink) return;
    this.deliveryScheduled = true;
    setImmediate(() => this.deliver());
  }

  private deliver(): void {
    this.deliveryScheduled = false;
    const messages = this.inbox;
    this.inbox = [];
    this.inboxBytes = 0;
    for (const m of messages) {
      const sink = this.sink;
      if (!sink || this.pair.silent) break;
      sink.message(m);
    }
    this.other.delivered();
  }

  /** The other end took everything queued for it. */
  private delivered(): void {
    if (!this.wantDrain || this.finished) return;
    this.wantDrain = false;
    this.sink?.drain();
  }

  private finish(reason: FaultReason | undefined, detail: string): void {
    if (this.finished) return;
    const sink = this.sink;
    this.end();
    sink?.closed(reason, detail);
    // Reasons are counted by the keeper once the link is open; before, nobody else would.
    if (!sink && reason) this.owner.recordFault(reason, { detail });
  }

  private end(): void {
    this.finished = true;
    this.sink = undefined;
    this.inbox = [];
    this.inboxBytes = 0;
    if (this.deadTimer) clearTimeout(this.deadTimer);
    this.deadTimer = undefined;
    this.pair.ended();
  }
}

function pairKey(a: string, b: string): string {
  return a < b ? `${a}|${b}` : `${b}|${a}`;
}
