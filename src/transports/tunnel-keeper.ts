/**
 * What every transport does the same way, so that tcp and its in-memory twin cannot drift apart:
 * the table of tunnels, the dialing rule (the LOWER peer id dials, redials with backoff, the other
 * side waits), adopting inbound connections from active peers (a newer connection replaces an
 * older one), the directory checks, counters, drop-while-down, the drain promise and the events.
 * A transport supplies authenticated Links: connect() for the dialing side, adopt() for inbound
 * ones. SinkSlot is the sink end both real links (tcp.ts, kcp-transport.ts) keep. Used by
 * src/transports only (tcp.ts, kcp-transport.ts, memory.ts).
 */
import { EventEmitter } from 'node:events';
import { Backoff, type BackoffOptions } from './backoff.js';
import { FaultLog } from './fault-log.js';
import {
  type FaultReason,
  MAX_MESSAGE_BYTES,
  type PeerDirectory,
  type TransportLogger,
  type Tunnel,
  type TunnelMessage,
  type TunnelState,
  type TunnelStats,
  type TunnelTransport,
  type TunnelTransportEvents,
} from './tunnel.js';

/** How a link reports to the keeper. */
export interface LinkSink {
  message(message: TunnelMessage): void;
  /** The backlog fell below the high-water mark after send() returned false. */
  drain(): void;
  rtt(ms: number): void;
  /** Exactly once, as soon as the link knows it is finished; a fault reason if it was one. */
  closed(reason?: FaultReason, detail?: string): void;
}

/**
 * A link's end toward its sink, the same in every transport: messages that arrive before the
 * keeper opens the link are held, and an end that comes first is kept, until open() hands them
 * over; after the end the sink hears nothing more. `ended` is the link's "finished" state.
 */
export class SinkSlot {
  private sink: LinkSink | undefined;
  private held: TunnelMessage[] = [];
  /** Why it ended before open(), told to the sink when it opens. */
  private early: { reason?: FaultReason; detail: string } | undefined;
  private done = false;

  get ended(): boolean {
    return this.done;
  }

  /** Why the link ended before it was opened, if that was a fault. */
  get endReason(): FaultReason | undefined {
    return this.early?.reason;
  }

  /**
   * Link.open(): tells the sink of an end that came first, else delivers what was held. True while
   * the link stays open to this sink (a held message may have made the sink close it).
   */
  open(sink: LinkSink): boolean {
    if (this.done) {
      sink.closed(this.early?.reason, this.early?.detail);
      return false;
    }
    this.sink = sink;
    const held = this.held;
    this.held = [];
    for (const message of held) {
      if (this.sink !== sink) return false;
      sink.message(message);
    }
    return this.sink === sink;
  }

  message(message: TunnelMessage): void {
    if (this.sink) this.sink.message(message);
    else if (!this.done) this.held.push(message);
  }

  drain(): void {
    this.sink?.drain();
  }

  rtt(ms: number): void {
    this.sink?.rtt(ms);
  }

  /** The link ended by itself: its sink hears why now, or when it opens. */
  end(reason: FaultReason | undefined, detail: string): void {
    const sink = this.detach();
    if (sink) sink.closed(reason, detail);
    else this.early = { ...(reason ? { reason } : {}), detail };
  }

  /** The link ends without a word to the sink (close(), or never handed out); the sink it had. */
  detach(): LinkSink | undefined {
    const sink = this.sink;
    this.done = true;
    this.sink = undefined;
    this.held = [];
    return sink;
  }
}

/** One authenticated connection to a peer, as a transport provides it. */
export interface Link {
  /** The raw Ed25519 key the peer authenticated with. */
  readonly peerKey: Buffer;
  /** Starts delivering to the sink (messages received before are held until then). */
  open(sink: LinkSink): void;
  /** Queues the messages (sizes already checked); false above the high-water mark. */
  send(messages: readonly TunnelMessage[]): boolean;
  /** Closes it; the sink hears nothing more. Idempotent. */
  close(): void;
  /**
   * Milliseconds since anything authenticated last arrived on it (keepalive answers included):
   * the tunnel's health evidence (see Tunnel.silentMs for when to read it).
   */
  silentMs(): number;
}

export interface KeeperOptions {
  localPeerId: string;
  directory: PeerDirectory;
  backoff?: BackoffOptions;
  logger?: TransportLogger;
  /** For the backoff's jitter; tests pass a seeded one. */
  random?: () => number;
}

type Authorized = { peerId: string } | { refused: FaultReason };

export abstract class TunnelKeeper implements TunnelTransport {
  abstract readonly kind: string;
  readonly localPeerId: string;
  protected readonly directory: PeerDirectory;
  protected readonly logger: TransportLogger | undefined;
  protected closed = false;
  private readonly entries = new Map<string, KeptTunnel>();
  private readonly events = new EventEmitter();
  private readonly backoffOptions: BackoffOptions;
  private readonly random: () => number;
  private faultLog: FaultLog | undefined;

  constructor(options: KeeperOptions) {
    this.localPeerId = options.localPeerId;
    this.directory = options.directory;
    this.logger = options.logger;
    this.backoffOptions = options.backoff ?? {};
    this.random = options.random ?? Math.random;
    new Backoff(this.backoffOptions); // validates the options now rather than at the first redial
    // Many tunnels share one event per kind; the default limit of 10 listeners is not a leak sign here.
    this.events.setMaxListeners(0);
  }

  /** Dials the peer (the keeper only asks when this side is the dialer): an authenticated link. */
  protected abstract connect(peerId: string, signal: AbortSignal): Promise<Link>;

  /** Releases what the transport holds beyond links (a listener, pending handshakes). */
  protected abstract shutdown(): Promise<void>;

  ensure(peerId: string): Tunnel {
    if (peerId === this.localPeerId) throw new Error('a tunnel to this peer itself was asked for');
    if (this.closed) throw new Error(`${this.kind} transport is closed`);
    let entry = this.entries.get(peerId);
    if (!entry) {
      entry = new KeptTunnel(peerId, new Backoff(this.backoffOptions, this.random));
      this.entries.set(peerId, entry);
    }
    entry.ensured = true;
    if (this.isDialerFor(peerId)) this.dial(entry);
    return entry;
  }

  release(peerId: string): void {
    const entry = this.entries.get(peerId);
    if (!entry) return;
    this.entries.delete(peerId);
    entry.ensured = false;
    this.stopDialing(entry);
    const link = entry.link;
    if (link) {
      entry.link = undefined;
      link.close();
    }
    entry.wantDrain = false;
    this.setState(entry, 'down');
  }

  tunnel(peerId: string): Tunnel | undefined {
    return this.entries.get(peerId);
  }

  revalidate(): void {
    for (const entry of [...this.entries.values()]) {
      const link = entry.link;
      if (!link) continue;
      const peer = this.directory.peer(entry.peerId);
      if (peer?.publicKey.equals(link.peerKey)) continue;
      this.detach(entry, link, 'revoked', 'no longer an active peer with this key');
      link.close();
    }
  }

  faults(): Readonly<Record<FaultReason, number>> {
    return this.faultLogOf().snapshot();
  }

  on<E extends keyof TunnelTransportEvents>(event: E, listener: TunnelTransportEvents[E]): this {
    this.events.on(event, listener);
    return this;
  }

  off<E extends keyof TunnelTransportEvents>(event: E, listener: TunnelTransportEvents[E]): this {
    this.events.off(event, listener);
    return this;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const entry of [...this.entries.values()]) this.release(entry.peerId);
    await this.shutdown();
  }

  /** The lower peer id dials; comparing the hex ids as strings is the same as comparing numbers. */
  protected isDialerFor(peerId: string): boolean {
    return this.localPeerId < peerId;
  }

  protected fault(reason: FaultReason, details: Record<string, unknown>): void {
    this.faultLogOf().record(reason, details);
  }

  /**
   * Whether an inbound connection authenticated with this key may be adopted, and as which peer:
   * an active peer other than us, with a lower id than ours (it is the pair's dialer).
   */
  protected authorizeInbound(rawKey: Buffer): Authorized {
    if (this.closed) return { refused: 'busy' };
    const peer = this.directory.peerByKey(rawKey);
    if (!peer || peer.id === this.localPeerId) return { refused: 'unknown-peer' };
    if (this.isDialerFor(peer.id)) return { refused: 'not-dialer' };
    return { peerId: peer.id };
  }

  /** Whether the key a dialed peer authenticated with is the one the directory holds for it now. */
  protected authorizeOutbound(peerId: string, rawKey: Buffer): FaultReason | undefined {
    const peer = this.directory.peer(peerId);
    if (!peer) return 'unknown-peer';
    return peer.publicKey.equals(rawKey) ? undefined : 'wrong-key';
  }

  /** Takes an authenticated inbound link: it becomes the peer's connection, replacing any older one. */
  protected adopt(peerId: string, link: Link): void {
    if (this.closed) {
      link.close();
      return;
    }
    let entry = this.entries.get(peerId);
    if (!entry) {
      entry = new KeptTunnel(peerId, new Backoff(this.backoffOptions, this.random));
      this.entries.set(peerId, entry);
    }
    this.attach(entry, link);
  }

  private attach(entry: KeptTunnel, link: Link): void {
    const old = entry.link;
    entry.link = link;
    entry.counters.connects++;
    entry.backoff.reset();
    if (old) {
      this.logger?.info(
        { transport: this.kind, peer: entry.peerId },
        'tunnel connection replaced by a newer one',
      );
      old.close();
      // Everything in flight on the old connection is lost: listeners that keep state across
      // messages (the data plane's streams) must see the break, so it shows as a state change.
      this.setState(entry, 'connecting');
    } else {
      this.logger?.info({ transport: this.kind, peer: entry.peerId }, 'tunnel up');
    }
    this.setState(entry, 'up');
    // Whatever the old connection had queued is gone; the new one starts empty.
    if (old && entry.wantDrain) {
      entry.wantDrain = false;
      this.events.emit('drain', entry.peerId);
    }
    // Last: a link that finished already reports it from open(), and detach() undoes the above.
    if (entry.link !== link) return;
    link.open({
      message: (message) => {
        if (entry.link !== link) return;
        entry.counters.messagesReceived++;
        entry.counters.bytesReceived += message.length;
        this.events.emit('message', entry.peerId, message);
      },
      drain: () => {
        if (entry.link !== link || !entry.wantDrain) return;
        entry.wantDrain = false;
        this.events.emit('drain', entry.peerId);
      },
      rtt: (ms) => {
        if (entry.link === link) entry.counters.lastRttMs = ms;
      },
      closed: (reason, detail) => this.detach(entry, link, reason, detail),
    });
  }

  /** The link is finished (reported by it, or closed by us): the bookkeeping, once per link. */
  private detach(entry: KeptTunnel, link: Link, reason?: FaultReason, detail?: string): void {
    if (reason) this.fault(reason, { peer: entry.peerId, ...(detail ? { detail } : {}) });
    if (entry.link !== link) return;
    entry.link = undefined;
    const current = this.entries.get(entry.peerId) === entry;
    if (current && !entry.ensured) this.entries.delete(entry.peerId);
    this.logger?.info(
      { transport: this.kind, peer: entry.peerId, ...(reason ? { reason } : {}) },
      'tunnel down',
    );
    this.setState(entry, 'down');
    if (entry.wantDrain) {
      entry.wantDrain = false;
      this.events.emit('drain', entry.peerId);
    }
    if (current && entry.ensured && this.isDialerFor(entry.peerId)) this.scheduleDial(entry);
  }

  private dial(entry: KeptTunnel): void {
    if (this.closed || !entry.ensured || entry.link || entry.dialing || entry.redialTimer) return;
    const abort = new AbortController();
    entry.dialing = abort;
    this.setState(entry, 'connecting');
    this.connect(entry.peerId, abort.signal).then(
      (link) => {
        if (entry.dialing !== abort) {
          link.close();
          return;
        }
        entry.dialing = undefined;
        this.attach(entry, link);
      },
      (error: unknown) => {
        if (entry.dialing !== abort) return;
        entry.dialing = undefined;
        this.logger?.debug(
          { transport: this.kind, peer: entry.peerId, error: (error as Error)?.message ?? String(error) },
          'tunnel dial failed',
        );
        this.setState(entry, 'down');
        this.scheduleDial(entry);
      },
    );
  }

  private scheduleDial(entry: KeptTunnel): void {
    if (this.closed || entry.redialTimer) return;
    const delay = entry.backoff.next();
    entry.redialTimer = setTimeout(() => {
      entry.redialTimer = undefined;
      if (this.entries.get(entry.peerId) === entry) this.dial(entry);
    }, delay);
    // The transport alone does not keep the process alive; the agent's server does.
    entry.redialTimer.unref();
  }

  private stopDialing(entry: KeptTunnel): void {
    if (entry.redialTimer) clearTimeout(entry.redialTimer);
    entry.redialTimer = undefined;
    const dialing = entry.dialing;
    entry.dialing = undefined;
    dialing?.abort();
  }

  private setState(entry: KeptTunnel, state: TunnelState): void {
    if (entry.state === state) return;
    entry.state = state;
    this.events.emit('state', entry.peerId, state);
  }

  private faultLogOf(): FaultLog {
    // Made on first use: `kind` is a subclass field, not yet set while this constructor runs.
    this.faultLog ??= new FaultLog(this.logger, this.kind);
    return this.faultLog;
  }
}

/** One peer's tunnel: the public face (Tunnel) and the keeper's bookkeeping for it. */
class KeptTunnel implements Tunnel {
  state: TunnelState = 'down';
  ensured = false;
  link: Link | undefined;
  dialing: AbortController | undefined;
  redialTimer: NodeJS.Timeout | undefined;
  /** send() returned false and no drain has been emitted since. */
  wantDrain = false;
  readonly counters: TunnelStats = {
    bytesSent: 0,
    bytesReceived: 0,
    messagesSent: 0,
    messagesReceived: 0,
    dropped: 0,
    connects: 0,
    lastRttMs: null,
  };

  constructor(
    readonly peerId: string,
    readonly backoff: Backoff,
  ) {}

  send(messages: readonly TunnelMessage[]): boolean {
    const link = this.link;
    if (!link) {
      this.counters.dropped += messages.length;
      return true;
    }
    let batch = messages;
    let bytes = 0;
    for (let i = 0; i < messages.length; i++) {
      const m = messages[i]!;
      if (m.length > MAX_MESSAGE_BYTES) {
        batch = messages.filter((x) => x.length <= MAX_MESSAGE_BYTES);
        this.counters.dropped += messages.length - batch.length;
        bytes = 0;
        for (const x of batch) bytes += x.length;
        break;
      }
      bytes += m.length;
    }
    if (batch.length === 0) return !this.wantDrain;
    const below = link.send(batch);
    this.counters.messagesSent += batch.length;
    this.counters.bytesSent += bytes;
    if (!below) this.wantDrain = true;
    return below;
  }

  stats(): TunnelStats {
    return { ...this.counters };
  }

  silentMs(): number | null {
    return this.link && this.state === 'up' ? this.link.silentMs() : null;
  }
}
