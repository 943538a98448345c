/**
 * TCP connections carried as streams over the peer tunnels (the stream path, docs/dataplane.md).
 * The ingress accepts a client's connection (TPROXY listener, wired by dataplane.ts) and hands it
 * to carry(); the mux opens a stream to the service's exit, whose mux connects to the original
 * destination (options.connect) and pipes bytes both ways. Many streams share one tunnel per peer pair; the
 * wire format is stream-frames.ts (tunnel message kinds 2..8). Used by the data plane only.
 *
 * Why credit flow control per stream (as yamux / HTTP/2): the tunnel is one ordered pipe, so a
 * stream whose destination stops reading must not be able to fill it. Each receiver grants a
 * window of bytes; it grants more (WINDOW) only as its local socket accepts what it received
 * (write() returned true, or 'drain'). A sender out of credit stops reading its socket, which
 * stops its client through TCP. So a slow destination stalls only its own stream, end to end,
 * and the bytes one stream holds in the agents stay near one window per direction. When the
 * tunnel itself is above its high-water mark (link.send() false), every socket reading toward
 * that peer pauses until onDrain(). A stream moves at most a window per round trip, so the
 * window of a stream whose socket takes its bytes fast grows (autoTune, when the link reports an
 * RTT), up to maxWindow, within a budget shared by all streams of the mux (what stalled streams
 * can make the agent hold is bounded: initialWindow each plus the budget).
 *
 * Lifecycle: OPEN -> OPEN_OK | OPEN_FAIL; then DATA/WINDOW both ways; FIN per direction (a
 * half-close: the other direction keeps flowing); the stream is freed once FIN went both ways.
 * A socket error or close (a client's RST) becomes RST, and an RST received resets the local
 * socket (resetAndDestroy: the client sees ECONNRESET). A dead tunnel (peerDown), a removed
 * service (closeService) or close() reset every stream concerned: a client gets an error, never
 * a hang. The ingress also gives up (RST) if neither OPEN_OK nor OPEN_FAIL comes within the open
 * timeout plus a margin, in case the exit is silent.
 *
 * Stream ids (u32): the peer with the lower peer id uses odd ids, the other even ones, so both
 * sides can open streams without colliding. Ids are not reused until they wrap, so a late frame
 * of a finished stream cannot land in a new one; frames for unknown streams change nothing (a
 * DATA is answered with RST so that a sender that missed the end stops), and are counted. When
 * the tunnel goes down (peerDown) the peer's state goes and ids start again: the transport
 * reports every connection's end before messages flow on a new one, so no frame of the old
 * connection reaches the new ids.
 */
import type { Socket } from 'node:net';
import { type TunnelMessage, writeMessage } from '../transports/tunnel.js';
import {
  decodeStreamFrame,
  encodeDataParts,
  encodeFin,
  encodeOpen,
  encodeOpenFail,
  encodeOpenOk,
  encodeRst,
  encodeWindow,
  MAX_DATA_PAYLOAD,
  MAX_STREAM_ID,
  MAX_WINDOW,
  type OpenFailReason,
  type StreamEnds,
  type StreamFrame,
} from './stream-frames.js';

export type { OpenFailReason, StreamEnds } from './stream-frames.js';

/** How the mux reaches a peer: the data plane passes the tunnel transport. */
export interface StreamLink {
  /**
   * Queues the messages in order; false: above the high-water mark, wait for onDrain(peerId).
   * Keeps the messages, not the array: the mux empties and reuses it once send returns.
   */
  send(peerId: string, messages: readonly TunnelMessage[]): boolean;
  /**
   * The tunnel's round-trip time to the peer (Tunnel.stats().lastRttMs), for growing the
   * windows of fast streams; without it (or null/0) every stream keeps initialWindow.
   */
  rttMs?(peerId: string): number | null;
}

/**
 * Shaping hook (implemented elsewhere, e.g. a token bucket per service and direction): the mux
 * asks before sending `bytes` of payload of flow `flowId` and sends them when `go` is called.
 * At most one request per flow is outstanding. forget(): the flow is gone; its `go` may still
 * be called and is then ignored.
 */
export interface Pacer {
  request(flowId: number, bytes: number, go: () => void): void;
  forget(flowId: number): void;
  /** What the pacer lets through in `ms` milliseconds now; 0 when it does not limit. */
  bytesIn?(ms: number): number;
}

/**
 * A limited stream's socket queues at most about this much of its rate in the kernel before the
 * pacer (docs/dataplane.md "Where a limited service's bytes wait"), instead of the megabytes
 * receive autotuning grows to, so that a client's close is not stuck behind seconds of backlog.
 * As deep as the shaper's bucket: a loaded event loop that stalls for less loses no rate.
 */
export const STANDING_QUEUE_MS = 50;
/** The least receive buffer a limited socket gets: a few segments, so that a slow limit still flows. */
const MIN_RECEIVE_BUFFER = 8 * 1024;

/**
 * A limited stream asks its pacer for at most this much of the rate at a time, so that another
 * flow of the service (a small request beside a download) waits behind one such quantum, not
 * behind a 64 KiB frame (52 ms at 10 Mbit/s): fair queuing serves flows between grants.
 */
export const PACED_QUANTUM_MS = 5;
/**
 * What the streams of one peer may add to its outbox in one turn of the event loop. The link's
 * high-water mark is checked only when the outbox is flushed, after the turn; within one, a
 * socket with data waiting delivers up to 32 reads of 64 KiB, and a stream with credit sent them
 * all: 2 MB written at once to a tunnel, in front of every other stream and packet (168 ms at
 * 100 Mbit/s, measured with tbf on the underlay). Past this the streams wait for the flush.
 */
const OUTBOX_LIMIT = 256 * 1024;
/** The least quantum: a few segments, so that a slow limit is not cut into tiny frames. */
const MIN_PACED_QUANTUM = 4 * 1024;

export interface StreamMuxOptions {
  link: StreamLink;
  localPeerId: string;
  /**
   * Exit side: opens the outbound connection for a stream; resolves when connected, rejects with
   * a Node errno error (ECONNREFUSED -> 'refused', EHOSTUNREACH/ENETUNREACH -> 'unreachable',
   * ETIMEDOUT -> 'timeout', anything else -> 'other'). `transparent`: the ingress flagged the
   * stream (fully_transparent): connect from ends.srcAddr if the service allows it.
   */
  connect(serviceId: string, ends: StreamEnds, fromPeerId: string, transparent: boolean): Promise<Socket>;
  /** Exit side: may this peer open streams of this service (it is the service's other end)? */
  authorize(peerId: string, serviceId: string): boolean;
  /** Per-stream receive window in bytes, announced to the peer. Default 256 KiB. */
  initialWindow?: number;
  /**
   * The most a stream's receive window grows to (window auto-tuning, needs link.rttMs). A
   * stream moves at most one window per round trip: 256 KiB at 30 ms is 70 Mbit/s. Default 4 MiB.
   */
  maxWindow?: number;
  /** What all streams' windows together may grow beyond initialWindow. Default 32 MiB. */
  windowBudget?: number;
  /** Exit: connect timeout, then OPEN_FAIL 'timeout'. Default 10 s. */
  openTimeoutMs?: number;
  /**
   * Streams at once with one peer, both directions together; beyond it a new one is refused (the
   * client reset, an OPEN answered OPEN_FAIL). Default 8192.
   */
  maxStreamsPerPeer?: number;
  /** Optional shaping: asked once per stream; 'up' is ingress -> exit, 'down' exit -> ingress. */
  limiter?(serviceId: string, direction: 'up' | 'down'): Pacer | null;
  /**
   * Bounds what the kernel buffers on `socket`'s receiving side (SO_RCVBUF) to about `bytes`:
   * for the local socket of a stream whose pacer limits it (STANDING_QUEUE_MS of its rate).
   */
  boundReceiveBuffer?(socket: Socket, bytes: number): void;
}

/**
 * Per service, as this agent sees it. `open`: streams now tracked (opening or open); `opened`:
 * streams ever created here (carried, or accepted from an authorized peer); bytes: payload,
 * `up` = ingress -> exit, counted when sent (ingress) or received (exit); `resets`: streams
 * ended by a reset (either side's socket, a protocol violation, peerDown, closeService, close);
 * `refused`: opens that failed (OPEN_FAIL either way, open timeout).
 */
export interface StreamStats {
  open: number;
  opened: number;
  bytesUp: number;
  bytesDown: number;
  resets: number;
  refused: number;
}

/** How many entries the mux keeps, structure by structure (docs/memory.md bounds each). */
export interface StreamFootprint {
  /** Peers with mux state: those with a tunnel that has carried a stream since it came up. */
  peers: number;
  streams: number;
  /** Services with counters: those that had a stream here and were not forgotten. */
  services: number;
  /** Frames waiting for the end of the turn. */
  queuedFrames: number;
  /** Bytes of window the open streams were granted beyond the initial one (auto-tuning). */
  windowGrowth: number;
}

/**
 * Frames dropped by the mux: `malformed` (undecodable), `unauthorized` (OPEN for a service the
 * peer may not open), `unknown_stream` (a frame for a stream this side does not have: normal in
 * small numbers right after a reset, as the two sides' frames cross), `protocol` (an OPEN with
 * the wrong id parity or a duplicate id, DATA beyond the granted window or after FIN, a frame
 * in the wrong state; the stream concerned, if any, is reset).
 */
export type StreamDropCause = 'malformed' | 'unauthorized' | 'unknown_stream' | 'protocol';

const DEFAULT_WINDOW = 256 * 1024;
const DEFAULT_MAX_WINDOW = 4 * 1024 * 1024;
const DEFAULT_WINDOW_BUDGET = 32 * 1024 * 1024;
const DEFAULT_MAX_STREAMS_PER_PEER = 8192;
const DEFAULT_OPEN_TIMEOUT_MS = 10_000;
/** The ingress waits this much longer than the exit's open timeout before giving up itself. */
const INGRESS_GUARD_EXTRA_MS = 5_000;

interface PeerState {
  readonly id: string;
  readonly streams: Map<number, Stream>;
  /** Our parity: 1 (odd) if our peer id is the lower, else 2. */
  readonly firstId: number;
  nextId: number;
  /** link.send() returned false; reading sockets stay paused until onDrain. */
  blocked: boolean;
  outbox: TunnelMessage[];
  /** Bytes in the outbox; at OUTBOX_LIMIT the streams wait for the flush as they wait for onDrain. */
  outboxBytes: number;
  /** The array the previous flush sent, emptied: the next outbox (two arrays in turn, not one per turn). */
  spare: TunnelMessage[];
  flushScheduled: boolean;
  /** flush() for this peer, made once rather than a closure per turn. */
  readonly flushLater: () => void;
}

class Stream {
  /** Ingress: the connection's addresses and ports (closeService asks about them). */
  ends: StreamEnds | null = null;
  phase: 'opening' | 'open' | 'done' = 'opening';
  socket: Socket | undefined;
  timer: NodeJS.Timeout | undefined;
  // Local socket -> peer.
  pending: Buffer[] = [];
  pendingBytes = 0;
  /** Bytes the peer still lets us send. */
  credit = 0;
  localEnded = false;
  finSent = false;
  /** A pacer request is outstanding. */
  pacing = false;
  // Peer -> local socket.
  /** Our receive window now: initialWindow, doubled while the stream consumes it fast enough. */
  window: number;
  /** Bytes the peer may still send before we grant more. */
  allowance: number;
  /** Auto-tuning: when the current measuring epoch began, and what was consumed since. */
  epochStart = performance.now();
  epochBytes = 0;
  /** Written while the socket's buffer was over its mark: granted at 'drain'. */
  unacked = 0;
  /** Accepted by the socket, not yet granted (grants are batched). */
  toGrant = 0;
  finReceived = false;

  constructor(
    readonly id: number,
    readonly peer: PeerState,
    readonly serviceId: string,
    readonly role: 'ingress' | 'exit',
    readonly flowId: number,
    readonly counters: StreamStats,
    readonly pacer: Pacer | null,
    window: number,
  ) {
    this.window = window;
    this.allowance = window;
  }
}

/** A service's stream counters before its first stream. */
export const emptyStats = (): StreamStats => ({
  open: 0,
  opened: 0,
  bytesUp: 0,
  bytesDown: 0,
  resets: 0,
  refused: 0,
});

/** Streams of this peer wait: for the link to drain, or for the outbox to be flushed. */
const isFull = (peer: PeerState): boolean => peer.blocked || peer.outboxBytes >= OUTBOX_LIMIT;

/** What a limited stream asks its pacer for at a time (PACED_QUANTUM_MS of the rate). */
function pacedQuantum(pacer: Pacer): number {
  const rate = pacer.bytesIn?.(PACED_QUANTUM_MS) ?? 0;
  if (rate <= 0) return MAX_DATA_PAYLOAD;
  return Math.min(MAX_DATA_PAYLOAD, Math.max(MIN_PACED_QUANTUM, Math.round(rate)));
}

function failReason(err: unknown): OpenFailReason {
  const code = (err as { code?: unknown } | null)?.code;
  if (code === 'ECONNREFUSED') return 'refused';
  if (code === 'EHOSTUNREACH' || code === 'ENETUNREACH') return 'unreachable';
  if (code === 'ETIMEDOUT') return 'timeout';
  return 'other';
}

/** Resets a TCP socket (the other end sees ECONNRESET); anything else is just destroyed. */
function resetSocket(socket: Socket | undefined): void {
  if (!socket || socket.destroyed) return;
  try {
    socket.resetAndDestroy();
  } catch {
    socket.destroy();
  }
}

export class StreamMux {
  private readonly link: StreamLink;
  private readonly localPeerId: string;
  private readonly window: number;
  private readonly maxWindow: number;
  private readonly windowBudget: number;
  /** Sum over the streams of (window - initialWindow). */
  private windowGrowth = 0;
  private readonly openTimeoutMs: number;
  private readonly peers = new Map<string, PeerState>();
  private readonly services = new Map<string, StreamStats>();
  private readonly dropCounts: Record<StreamDropCause, number> = {
    malformed: 0,
    unauthorized: 0,
    unknown_stream: 0,
    protocol: 0,
  };
  private nextFlowId = 1;
  private closed = false;
  private readonly maxStreamsPerPeer: number;

  constructor(private readonly options: StreamMuxOptions) {
    this.link = options.link;
    this.localPeerId = options.localPeerId;
    this.window = options.initialWindow ?? DEFAULT_WINDOW;
    if (!Number.isInteger(this.window) || this.window < 1024 || this.window > MAX_WINDOW)
      throw new Error(`initialWindow must be an integer from 1024 to ${MAX_WINDOW}`);
    this.maxWindow = Math.max(this.window, options.maxWindow ?? DEFAULT_MAX_WINDOW);
    if (!Number.isInteger(this.maxWindow) || this.maxWindow > MAX_WINDOW)
      throw new Error(`maxWindow must be an integer up to ${MAX_WINDOW}`);
    this.windowBudget = options.windowBudget ?? DEFAULT_WINDOW_BUDGET;
    this.openTimeoutMs = options.openTimeoutMs ?? DEFAULT_OPEN_TIMEOUT_MS;
    this.maxStreamsPerPeer = options.maxStreamsPerPeer ?? DEFAULT_MAX_STREAMS_PER_PEER;
  }

  /**
   * Ingress: carries an accepted client socket to the service's exit. The mux owns the socket
   * from now on (it sets allowHalfOpen so that a client's FIN only ends one direction); call it
   * in the 'connection' handler, before anything reads from the socket. `transparent`: flag the
   * stream so that the exit connects from the client's address (fully_transparent).
   */
  carry(peerId: string, serviceId: string, client: Socket, ends: StreamEnds, transparent = false): void {
    if (client.destroyed) return;
    if (this.closed || peerId === this.localPeerId) {
      resetSocket(client);
      return;
    }
    const peer = this.peerOf(peerId);
    if (peer.streams.size >= this.maxStreamsPerPeer) {
      this.countersOf(serviceId).refused++;
      resetSocket(client);
      return;
    }
    const id = this.allocateId(peer);
    let open: Buffer;
    try {
      open = encodeOpen(id, serviceId, this.window, ends, transparent);
    } catch {
      // Not a UUID or not an address: a caller's bug, but the client must not hang on it.
      resetSocket(client);
      return;
    }
    const counters = this.countersOf(serviceId);
    const s = new Stream(
      id,
      peer,
      serviceId,
      'ingress',
      this.nextFlowId++,
      counters,
      this.pacerOf(serviceId, 'up'),
      this.window,
    );
    s.ends = ends;
    peer.streams.set(id, s);
    counters.open++;
    counters.opened++;
    this.enqueue(peer, open);
    s.timer = setTimeout(() => this.ingressGaveUp(s), this.openTimeoutMs + INGRESS_GUARD_EXTRA_MS);
    s.timer.unref();
    this.attach(s, client);
  }

  /** A tunnel message of kinds 2..8 from the peer. Never throws on what the peer sent. */
  onMessage(peerId: string, message: TunnelMessage): void {
    if (this.closed || peerId === this.localPeerId) return;
    const frame = decodeStreamFrame(message);
    if (frame.kind === 'malformed') {
      this.dropCounts.malformed++;
      return;
    }
    const peer = this.peerOf(peerId);
    if (frame.kind === 'open') {
      this.remoteOpen(peer, frame);
      return;
    }
    const s = peer.streams.get(frame.id);
    if (!s) {
      this.dropCounts.unknown_stream++;
      if (frame.kind === 'data') this.enqueue(peer, encodeRst(frame.id));
      return;
    }
    switch (frame.kind) {
      case 'open_ok':
        if (s.role !== 'ingress' || s.phase !== 'opening') {
          this.violation(s);
          return;
        }
        clearTimeout(s.timer);
        s.phase = 'open';
        s.credit = frame.window;
        this.pump(s);
        return;
      case 'open_fail':
        if (s.role !== 'ingress' || s.phase !== 'opening') {
          this.violation(s);
          return;
        }
        s.counters.refused++;
        this.free(s);
        resetSocket(s.socket);
        return;
      case 'data':
        this.remoteData(s, frame.payload);
        return;
      case 'window':
        if (s.phase !== 'open' || s.credit + frame.credit > MAX_WINDOW) {
          this.violation(s);
          return;
        }
        s.credit += frame.credit;
        this.pump(s);
        return;
      case 'fin':
        if (s.phase !== 'open' || s.finReceived) {
          this.violation(s);
          return;
        }
        s.finReceived = true;
        s.socket?.end();
        if (s.finSent) this.free(s);
        return;
      case 'rst':
        s.counters.resets++;
        this.free(s);
        resetSocket(s.socket);
        return;
    }
  }

  /** The tunnel to this peer is below its high-water mark again. */
  onDrain(peerId: string): void {
    const peer = this.peers.get(peerId);
    if (!peer?.blocked) return;
    peer.blocked = false;
    this.pumpAll(peer);
  }

  /** Every stream of the peer sends what it may, each in its turn (a copy: pump may free one). */
  private pumpAll(peer: PeerState): void {
    for (const s of [...peer.streams.values()]) this.pump(s);
  }

  /** The tunnel to this peer died: every stream with it is reset (clients get ECONNRESET). */
  peerDown(peerId: string): void {
    const peer = this.peers.get(peerId);
    if (!peer) return;
    // Nothing reaches the peer any more; it resets its side when it sees the tunnel down.
    peer.outbox.length = 0;
    peer.outboxBytes = 0;
    peer.blocked = false;
    for (const s of [...peer.streams.values()]) this.reset(s, false);
    // With no stream left its state goes too (a removed peer's would stay for good). Stream ids
    // start again from the first: nothing of the old connection's frames can reach a new one.
    this.peers.delete(peerId);
  }

  /**
   * A service left this agent: its streams are reset (RST to the peer). With `keep`, only the
   * ingress streams it does not keep (a service standing aside keeps those no other route takes).
   */
  closeService(serviceId: string, keep?: (ends: StreamEnds) => boolean): void {
    for (const peer of this.peers.values())
      for (const s of [...peer.streams.values()])
        if (s.serviceId === serviceId && !(keep && s.ends && keep(s.ends))) this.reset(s, true);
    // The counters stay while the service exists: they feed Prometheus counters, which must
    // never go back. forgetService drops them once it is deleted.
  }

  /** A service deleted from the cluster: its counters go (closeService has reset its streams). */
  forgetService(serviceId: string): void {
    this.services.delete(serviceId);
  }

  stats(serviceId: string): StreamStats {
    return { ...(this.services.get(serviceId) ?? emptyStats()) };
  }

  footprint(): StreamFootprint {
    let streams = 0;
    let queuedFrames = 0;
    for (const peer of this.peers.values()) {
      streams += peer.streams.size;
      queuedFrames += peer.outbox.length;
    }
    return {
      peers: this.peers.size,
      streams,
      services: this.services.size,
      queuedFrames,
      windowGrowth: this.windowGrowth,
    };
  }

  drops(): Readonly<Record<StreamDropCause, number>> {
    return { ...this.dropCounts };
  }

  /** Resets every stream (RST sent to the peers, at once) and refuses new ones. */
  close(): void {
    if (this.closed) return;
    for (const peer of this.peers.values()) {
      for (const s of [...peer.streams.values()]) this.reset(s, true);
      this.flush(peer);
    }
    this.closed = true;
  }

  // --- Opening -------------------------------------------------------------------------------

  private remoteOpen(peer: PeerState, f: Extract<StreamFrame, { kind: 'open' }>): void {
    // The opener's parity is the other one: an id of ours would hijack one of our streams.
    if (f.id === 0 || f.id % 2 === peer.firstId % 2) {
      this.dropCounts.protocol++;
      return;
    }
    // An OPEN for an id still in use here: the peer no longer has that stream (over one ordered
    // tunnel a peer reuses an id only after both sides freed it), so it restarted or the frames
    // that ended the old stream were lost with a replaced connection. The old stream is stale:
    // reset it here only (an RST would reach the peer's new stream).
    const stale = peer.streams.get(f.id);
    if (stale) this.reset(stale, false);
    if (!this.options.authorize(peer.id, f.serviceId)) {
      this.dropCounts.unauthorized++;
      this.enqueue(peer, encodeOpenFail(f.id, 'unauthorized'));
      return;
    }
    // Each stream costs a socket and buffers: a peer gets a bounded number at once.
    if (peer.streams.size >= this.maxStreamsPerPeer) {
      this.countersOf(f.serviceId).refused++;
      this.enqueue(peer, encodeOpenFail(f.id, 'other'));
      return;
    }
    const counters = this.countersOf(f.serviceId);
    const s = new Stream(
      f.id,
      peer,
      f.serviceId,
      'exit',
      this.nextFlowId++,
      counters,
      this.pacerOf(f.serviceId, 'down'),
      this.window,
    );
    s.credit = f.window;
    peer.streams.set(f.id, s);
    counters.open++;
    counters.opened++;
    s.timer = setTimeout(() => this.exitOpenFailed(s, 'timeout'), this.openTimeoutMs);
    s.timer.unref();
    let connecting: Promise<Socket>;
    try {
      connecting = Promise.resolve(this.options.connect(f.serviceId, f.ends, peer.id, f.transparent));
    } catch (err) {
      connecting = Promise.reject(err);
    }
    connecting.then(
      (socket) => this.exitConnected(s, socket),
      (err: unknown) => this.exitOpenFailed(s, failReason(err)),
    );
  }

  private exitConnected(s: Stream, socket: Socket): void {
    if (s.phase !== 'opening' || socket.destroyed) {
      // Too late (timeout, RST, peer down, service closed), or dead already.
      socket.destroy();
      this.exitOpenFailed(s, 'other');
      return;
    }
    clearTimeout(s.timer);
    s.phase = 'open';
    this.enqueue(s.peer, encodeOpenOk(s.id, this.window));
    this.attach(s, socket);
  }

  private exitOpenFailed(s: Stream, reason: OpenFailReason): void {
    if (s.phase !== 'opening') return;
    s.counters.refused++;
    this.enqueue(s.peer, encodeOpenFail(s.id, reason));
    this.free(s);
  }

  private ingressGaveUp(s: Stream): void {
    if (s.phase !== 'opening') return;
    s.counters.refused++;
    this.enqueue(s.peer, encodeRst(s.id));
    this.free(s);
    resetSocket(s.socket);
  }

  // --- Local socket -> peer ------------------------------------------------------------------

  private attach(s: Stream, socket: Socket): void {
    s.socket = socket;
    const limited = s.pacer?.bytesIn?.(STANDING_QUEUE_MS) ?? 0;
    if (limited > 0 && this.options.boundReceiveBuffer) {
      this.options.boundReceiveBuffer(socket, Math.max(MIN_RECEIVE_BUFFER, Math.round(limited)));
    }
    // A FIN from the local end must end only its direction: the answer may still come.
    socket.allowHalfOpen = true;
    socket.on('data', (chunk: Buffer) => {
      if (s.phase === 'done') return;
      s.pending.push(chunk);
      s.pendingBytes += chunk.length;
      this.pump(s);
    });
    socket.on('end', () => {
      if (s.phase === 'done') return;
      s.localEnded = true;
      this.pump(s);
    });
    socket.on('drain', () => {
      if (s.phase === 'done' || s.unacked === 0) return;
      s.toGrant += s.unacked;
      s.unacked = 0;
      this.grant(s);
    });
    // An error (the local end's RST, EPIPE...) resets the stream, and so does a close before
    // both directions ended (destroyed by someone): it can neither send nor take bytes any more.
    // Closed after both FINs, it may still have bytes to send the peer (waiting for credit).
    socket.on('error', () => this.localFailed(s));
    socket.on('close', () => {
      if (!(s.localEnded && s.finReceived)) this.localFailed(s);
    });
  }

  private localFailed(s: Stream): void {
    if (s.phase === 'done') return;
    this.reset(s, true);
  }

  /** Sends what credit, the pacer and the link allow; FIN once the local end ended and all is sent. */
  private pump(s: Stream): void {
    if (s.phase === 'open') {
      while (!s.pacing && s.pendingBytes > 0 && s.credit > 0 && !isFull(s.peer)) {
        const n = Math.min(s.pendingBytes, s.credit, s.pacer ? pacedQuantum(s.pacer) : MAX_DATA_PAYLOAD);
        if (s.pacer) {
          s.pacing = true;
          // `go` may run at once (inside request); it sends and pumps on by itself either way.
          s.pacer.request(s.flowId, n, () => {
            if (s.phase === 'done' || !s.pacing) return;
            s.pacing = false;
            this.sendData(s, n);
            this.pump(s);
          });
          return;
        }
        this.sendData(s, n);
      }
      if (s.localEnded && !s.finSent && s.pendingBytes === 0 && !s.pacing) {
        s.finSent = true;
        this.enqueue(s.peer, encodeFin(s.id));
        if (s.finReceived) {
          this.free(s);
          return;
        }
      }
    }
    this.updateFlow(s);
  }

  private sendData(s: Stream, n: number): void {
    this.enqueue(s.peer, encodeDataParts(s.id, s.pending, n));
    let left = n;
    while (left > 0) {
      const head = s.pending[0]!;
      if (head.length <= left) {
        s.pending.shift();
        left -= head.length;
      } else {
        s.pending[0] = head.subarray(left);
        left = 0;
      }
    }
    s.pendingBytes -= n;
    s.credit -= n;
    if (s.role === 'ingress') s.counters.bytesUp += n;
    else s.counters.bytesDown += n;
  }

  /** Reads from the local socket only while there is room: a window before OPEN_OK, a frame after. */
  private updateFlow(s: Stream): void {
    const socket = s.socket;
    if (!socket || s.phase === 'done' || s.localEnded || socket.destroyed) return;
    // Before the exit has answered, only one frame's worth: an open to a blackholed destination
    // must not cost a whole window of the client's bytes (thousands of them would add up).
    const limit = MAX_DATA_PAYLOAD;
    const read = !isFull(s.peer) && s.pendingBytes < limit;
    if (read) {
      if (socket.isPaused()) socket.resume();
    } else if (!socket.isPaused()) socket.pause();
  }

  // --- Peer -> local socket ------------------------------------------------------------------

  private remoteData(s: Stream, payload: TunnelMessage): void {
    if (s.phase !== 'open' || s.finReceived || payload.length > s.allowance) {
      this.violation(s);
      return;
    }
    const socket = s.socket!;
    if (socket.destroyed) {
      this.reset(s, true);
      return;
    }
    s.allowance -= payload.length;
    if (s.role === 'ingress') s.counters.bytesDown += payload.length;
    else s.counters.bytesUp += payload.length;
    if (writeMessage(socket, payload)) {
      s.toGrant += payload.length;
      this.grant(s);
    } else s.unacked += payload.length;
  }

  /** Grants what the socket accepted, in quarter windows (few WINDOW frames). */
  private grant(s: Stream): void {
    // After the peer's FIN nothing more comes: credit would be wasted.
    if (s.finReceived || s.toGrant < s.window / 4) return;
    this.autoTune(s);
    this.enqueue(s.peer, encodeWindow(s.id, s.toGrant));
    s.allowance += s.toGrant;
    s.toGrant = 0;
  }

  /**
   * Window auto-tuning (as QUIC implementations do it): a stream that consumed its window in
   * less than about two round trips was held back by the window, not by its destination (the
   * bytes counted here are only those its socket accepted), so the window doubles, up to
   * maxWindow and within the mux's budget. A socket's kernel buffers count as accepting: a
   * destination that stalls may first have let its stream grow, and then holds up to that window.
   */
  private autoTune(s: Stream): void {
    s.epochBytes += s.toGrant;
    if (s.epochBytes <= s.window / 2) return;
    const now = performance.now();
    const rtt = this.link.rttMs?.(s.peer.id) ?? 0;
    const fraction = s.epochBytes / s.window;
    if (rtt && rtt > 0 && s.window < this.maxWindow && now - s.epochStart < 4 * fraction * rtt) {
      const growth = Math.min(s.window, this.maxWindow - s.window, this.windowBudget - this.windowGrowth);
      if (growth > 0) {
        s.toGrant += growth;
        s.window += growth;
        this.windowGrowth += growth;
      }
    }
    s.epochStart = now;
    s.epochBytes = 0;
  }

  // --- Ending --------------------------------------------------------------------------------

  /** The peer broke the protocol on this stream: count it, reset both sides. */
  private violation(s: Stream): void {
    this.dropCounts.protocol++;
    this.reset(s, true);
  }

  private reset(s: Stream, tellPeer: boolean): void {
    if (s.phase === 'done') return;
    if (tellPeer) this.enqueue(s.peer, encodeRst(s.id));
    s.counters.resets++;
    this.free(s);
    resetSocket(s.socket);
  }

  private free(s: Stream): void {
    if (s.phase === 'done') return;
    s.phase = 'done';
    clearTimeout(s.timer);
    if (s.peer.streams.get(s.id) === s) s.peer.streams.delete(s.id);
    s.counters.open--;
    this.windowGrowth -= s.window - this.window;
    s.pending = [];
    s.pendingBytes = 0;
    s.pacing = false;
    s.pacer?.forget(s.flowId);
  }

  // --- Peers and the link --------------------------------------------------------------------

  private peerOf(peerId: string): PeerState {
    let peer = this.peers.get(peerId);
    if (!peer) {
      const firstId = this.localPeerId < peerId ? 1 : 2;
      const created: PeerState = {
        id: peerId,
        streams: new Map(),
        firstId,
        nextId: firstId,
        blocked: false,
        outbox: [],
        outboxBytes: 0,
        spare: [],
        flushScheduled: false,
        flushLater: () => this.flush(created),
      };
      peer = created;
      this.peers.set(peerId, peer);
    }
    return peer;
  }

  private allocateId(peer: PeerState): number {
    for (;;) {
      const id = peer.nextId;
      peer.nextId = id + 2 > MAX_STREAM_ID ? peer.firstId : id + 2;
      if (!peer.streams.has(id)) return id;
    }
  }

  private countersOf(serviceId: string): StreamStats {
    let counters = this.services.get(serviceId);
    if (!counters) {
      counters = emptyStats();
      this.services.set(serviceId, counters);
    }
    return counters;
  }

  private pacerOf(serviceId: string, direction: 'up' | 'down'): Pacer | null {
    return this.options.limiter?.(serviceId, direction) ?? null;
  }

  /**
   * Frames produced in one turn of the event loop (every socket read, accept and tunnel message
   * its poll phase delivered) go in one send, after them (setImmediate): one TLS write and one
   * socket write for all of them. Flushing after each callback instead (a microtask) cost a TLS
   * write per connection event: at thousands of new connections a second that was the ingress's
   * largest single cost. The outbox stays bounded by the streams' credit, as before.
   */
  private enqueue(peer: PeerState, frame: TunnelMessage): void {
    peer.outbox.push(frame);
    peer.outboxBytes += frame.length;
    if (peer.flushScheduled) return;
    peer.flushScheduled = true;
    setImmediate(peer.flushLater);
  }

  private flush(peer: PeerState): void {
    peer.flushScheduled = false;
    if (peer.outbox.length === 0) return;
    const batch = peer.outbox;
    peer.outbox = peer.spare;
    const wasFull = peer.outboxBytes >= OUTBOX_LIMIT;
    peer.outboxBytes = 0;
    // send() keeps the messages, not the array (TunnelTransport.send).
    const below = this.link.send(peer.id, batch);
    batch.length = 0;
    peer.spare = batch;
    if (below) {
      // Streams that stopped at OUTBOX_LIMIT go on, each in its turn, as after onDrain.
      if (wasFull && !peer.blocked) this.pumpAll(peer);
      return;
    }
    if (peer.blocked) return;
    peer.blocked = true;
    for (const s of peer.streams.values()) this.updateFlow(s);
  }
}
