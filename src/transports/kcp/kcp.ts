/**
 * KCP, the ARQ protocol of skywind3000's ikcp, as a pure engine: no sockets, no timers, no clock.
 * The caller hands it datagrams it received (input), the time in ms (every call that needs it), and
 * an output callback for the datagrams it must send. The `kcp` transport (encryption, handshake,
 * UDP socket, mux) is built on it; nothing else in the agent should need it directly. Written from
 * the protocol (wire format and state machine of ikcp.c); no code is taken from any implementation.
 *
 * Wire format (little-endian, as ikcp, so a capture decodes with any KCP dissector): each segment is
 * a 24-byte header `conv u32 | cmd u8 | frg u8 | wnd u16 | ts u32 | sn u32 | una u32 | len u32`
 * followed by `len` bytes of data; cmd is PUSH 81 (data), ACK 82, WASK 83 (window probe), WINS 84
 * (window tell). One datagram packs several segments up to `mtu` bytes. `wnd` is the sender's free
 * receive window (every segment carries it), `una` its next expected sn (a cumulative ack), `ts` the
 * send time (echoed in the ACK for the RTT), `frg` the number of fragments still to come in this
 * message (0 = last; always 0 in stream mode).
 *
 * API:
 * - `new KcpSession(conv, output, params?)`: both ends use the same conv and compatible params.
 * - `checkKcpParams(params)`: the constructor's check of params, alone (RangeError when bad).
 * - `send(data)`: queues data. Message mode: one message, at most 255 fragments of `mtu - 24`
 *   bytes (RangeError above). Stream mode: bytes appended to the stream (small writes are merged).
 *   The Buffer is NOT copied (kept as views until acknowledged): do not modify it after send().
 * - `recv()`: message mode: the next whole message, or null; stream mode: the next in-order piece
 *   of the stream (one segment's bytes), or null. `peekSize()`: its length, -1 if none.
 * - `input(datagram, nowMs)`: 'ok' | 'bad_conv' | 'malformed'. The whole datagram is checked before
 *   anything is applied: a rejected datagram changes no state and never throws. Accepted datagrams
 *   are kept as views (zero copy): do not modify a datagram after input().
 * - `update(nowMs)`: call at `check(nowMs)` (or every `interval` ms); flushes on the interval grid.
 *   `flush(nowMs)`: sends pending acks, probes, new data in the window and due retransmissions now
 *   (e.g. after a burst of input, for lower latency than the interval grid).
 * - `check(nowMs)`: the time (in the caller's clock) at which update() next has work.
 * - `waitSnd()`: segments queued + in flight (back-pressure). `dead()`: a segment was transmitted
 *   `deadLink` times without an ack. `stats`: counters (see KcpStats).
 * - The datagram passed to `output` is a view of one reused buffer, valid only during the call:
 *   encrypt or copy it there. `output` must not call back into the same session synchronously.
 *
 * Time is u32 ms wrapping: nowMs may be any non-negative number (Date.now(), performance.now(), a
 * fake clock); only its low 32 bits are used and all comparisons are wrap-safe differences. check()
 * answers in the caller's units (nowMs + delay).
 *
 * Deliberate differences from ikcp (none changes the wire format): the whole datagram is validated
 * before being applied, and a non-PUSH segment with data or trailing bytes shorter than a header is
 * malformed (ikcp ignores them); a segment's RTO backoff is capped at 60 s (ikcp lets it grow until
 * u32 time comparisons break); the congestion window starts at 1 instead of 0 (ikcp's first flush
 * sends nothing); check() answers the flush schedule only (ikcp may answer "now" for a retransmit
 * that update() will not do before the next interval, which makes a timer spin); send() does not
 * copy; `initialSn` exists for wraparound tests (ikcp always starts at 0); rcvWnd is at least 256
 * (ikcp: 128) because a message may have 255 fragments (ikcp: 127) and must fit the receive queue.
 *
 * Data structures (the hot path): segments in flight sit in a ring indexed by `sn & mask` (the
 * range snd_una..snd_nxt never exceeds the send window), so an ACK is O(1); received segments out of
 * order sit in a ring indexed the same way over rcv_nxt..rcv_nxt+rcv_wnd, so insertion and duplicate
 * detection are O(1); the queues are rings too (no Array.shift). flush() walks the in-flight ring
 * only when a retransmission may be due (earliest resend time reached or a fast-ack threshold hit).
 * Packing writes headers byte by byte into one reused buffer and copies payloads with
 * TypedArray.set (memcpy): no per-byte loops in JS over payload.
 */

/** Bytes of one segment header. */
export const KCP_OVERHEAD = 24;
export const KCP_CMD_PUSH = 81;
export const KCP_CMD_ACK = 82;
export const KCP_CMD_WASK = 83;
export const KCP_CMD_WINS = 84;
/** At most this many fragments per message: frg is a byte, and the receive window must hold them. */
export const KCP_MAX_FRAGMENTS = 255;

const ASK_SEND = 1; // a WASK is due
const ASK_TELL = 2; // a WINS is due
const RTO_NODELAY_MIN = 30;
const RTO_NORMAL_MIN = 100;
const RTO_DEFAULT = 200;
const RTO_MAX = 60_000;
const THRESH_INIT = 2;
const THRESH_MIN = 2;
const PROBE_INIT = 7_000; // first window probe after 7 s of a zero remote window
const PROBE_LIMIT = 120_000;
const INITIAL_REMOTE_WINDOW = 128; // ikcp's assumption until the peer's first segment says otherwise
const MIN_RCV_WND = KCP_MAX_FRAGMENTS + 1; // the receive queue must hold a whole message
const MAX_WND = 65_535; // wnd is a u16 on the wire
const SLAP_RESET = 10_000; // a clock jump beyond this re-bases the flush schedule (as ikcp)

export interface KcpParams {
  /** Largest datagram output() is given, headers included (50..65535). Payload per segment: mtu - 24. */
  mtu: number;
  /** Flush granularity of update(), ms; clamped to 10..5000 as ikcp. */
  interval: number;
  /** Minimum RTO 30 ms instead of 100 ms, RTO backoff x1.5 instead of x2, no extra rto/8 on first send. */
  nodelay: boolean;
  /** Fast retransmit after this many later ACKs skipped a segment; 0 = off. */
  resend: number;
  /** true: only the send window and the remote window limit sending (no slow start/cwnd). */
  noCongestionControl: boolean;
  /** Segments in flight at most (1..65535). */
  sndWnd: number;
  /** Segments the receiver buffers (clamped to 256..65535 so a 255-fragment message fits). */
  rcvWnd: number;
  /** Stream mode (ikcp's `stream`): no message boundaries, small sends merged into full segments. */
  stream: boolean;
  /** Lower bound of the RTO, ms. Default: 30 with nodelay, 100 without. */
  minRtoMs?: number;
  /** A segment transmitted this many times without an ack makes the session dead. Default 20. */
  deadLink?: number;
  /** A segment is fast-retransmitted only while its transmissions are <= this; 0: no limit. Default 5. */
  fastLimit?: number;
  /** First sn of both directions; both ends must agree. Default 0 (as ikcp). For wraparound tests. */
  initialSn?: number;
}

/**
 * Defaults: kcptun's "fast3"-style profile (nodelay, 10 ms interval, fast resend after 2 skips, no
 * congestion window) because the transport trades bandwidth for latency under loss and does its
 * own pacing (kcp-transport.ts, docs/kcp.md "Pacing") above this engine; windows of 1024 segments as the kcptun we are
 * measured against (1024 x 1326 B per RTT: ~27 MB/s at 50 ms); mtu 1350 as kcptun, which leaves room
 * in a 1500-byte path for IP/UDP headers and the encryption layer's nonce and tag.
 */
export const DEFAULT_KCP_PARAMS: Readonly<KcpParams> = Object.freeze({
  mtu: 1350,
  interval: 10,
  nodelay: true,
  resend: 2,
  noCongestionControl: true,
  sndWnd: 1024,
  rcvWnd: 1024,
  stream: false,
  deadLink: 20,
  fastLimit: 5,
  initialSn: 0,
});

/** Counters of one session; read them from `session.stats` (updated in place). */
export interface KcpStats {
  /** PUSH segments put on the wire, first transmissions and retransmissions. */
  segmentsSent: number;
  /** PUSH segments accepted from the wire (duplicates and out-of-window ones included). */
  segmentsReceived: number;
  /** Retransmissions of any cause (RTO expiries + fast retransmissions). */
  retransmissions: number;
  /** Retransmissions caused by `resend` later acks (fast retransmit). */
  fastRetransmissions: number;
  /** RTO expiries (each retransmits one segment). */
  lostSegments: number;
  /** ACK segments sent. */
  acksSent: number;
  /** WASK (window probe) segments sent. */
  windowProbesSent: number;
  /** WINS (window tell) segments sent. */
  windowTellsSent: number;
  /** Bytes of datagrams given to output (headers included). */
  bytesSent: number;
  /** Bytes of accepted datagrams (headers included). */
  bytesReceived: number;
  datagramsSent: number;
  datagramsReceived: number;
  /** PUSH segments received again (already buffered or already delivered). */
  duplicateSegments: number;
  /** Smoothed RTT, ms (0 until the first ACK). */
  rttMs: number;
  /** Current retransmission timeout, ms. */
  rtoMs: number;
}

export type KcpInputResult = 'ok' | 'bad_conv' | 'malformed';

/** One outgoing segment; pooled (see KcpSession.takeSegment). */
interface Segment {
  sn: number;
  frg: number;
  ts: number;
  resendts: number;
  rto: number;
  fastack: number;
  xmit: number;
  data: Buffer;
  /** Stream mode: an mss-sized buffer this segment owns, so later small sends append in place. */
  own: Buffer | null;
}

const EMPTY = Buffer.alloc(0);
const SEGMENT_POOL_LIMIT = 4096;

/** A growable ring of segments (the send queue): O(1) push and shift. */
class SegmentQueue {
  private items: (Segment | undefined)[] = new Array(64);
  private mask = 63;
  private head = 0;
  length = 0;

  push(seg: Segment): void {
    if (this.length > this.mask) this.grow();
    this.items[(this.head + this.length) & this.mask] = seg;
    this.length++;
  }

  shift(): Segment {
    const seg = this.items[this.head]!;
    this.items[this.head] = undefined;
    this.head = (this.head + 1) & this.mask;
    this.length--;
    return seg;
  }

  last(): Segment | undefined {
    return this.length === 0 ? undefined : this.items[(this.head + this.length - 1) & this.mask];
  }

  private grow(): void {
    const size = this.items.length * 2;
    const items: (Segment | undefined)[] = new Array(size);
    for (let i = 0; i < this.length; i++) items[i] = this.items[(this.head + i) & this.mask];
    this.items = items;
    this.mask = size - 1;
    this.head = 0;
  }
}

function ceilPow2(n: number): number {
  let p = 1;
  while (p < n) p *= 2;
  return p;
}

/** Signed difference of two u32 times or sequence numbers: > 0 when `later` is after `earlier`. */
function diff(later: number, earlier: number): number {
  return (later - earlier) | 0;
}

function readU32(b: Buffer, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}

function integerParam(name: string, value: number, min: number, max: number): number {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw new RangeError(`KCP ${name} must be an integer in ${min}..${max}, got ${value}`);
  }
  return value;
}

/**
 * Checks KCP parameters as KcpSession's constructor does (it calls this): a RangeError naming
 * the first bad one, else every parameter with its default and the clamps applied (interval to
 * 10..5000, rcvWnd to at least 256). Pure; callers use it to refuse bad parameters before any
 * session exists.
 */
export function checkKcpParams(params: Partial<KcpParams> = {}): Readonly<Required<KcpParams>> {
  const p: KcpParams = { ...DEFAULT_KCP_PARAMS, ...params };
  const mtu = integerParam('mtu', p.mtu, 50, 65_535);
  if (!Number.isFinite(p.interval)) throw new RangeError(`KCP interval must be a number, got ${p.interval}`);
  return {
    mtu,
    interval: Math.min(5000, Math.max(10, Math.floor(p.interval))),
    nodelay: p.nodelay,
    resend: integerParam('resend', p.resend, 0, 0xffff),
    noCongestionControl: p.noCongestionControl,
    sndWnd: integerParam('sndWnd', p.sndWnd, 1, MAX_WND),
    rcvWnd: Math.max(MIN_RCV_WND, integerParam('rcvWnd', p.rcvWnd, 1, MAX_WND)),
    stream: p.stream,
    minRtoMs: integerParam(
      'minRtoMs',
      p.minRtoMs ?? (p.nodelay ? RTO_NODELAY_MIN : RTO_NORMAL_MIN),
      1,
      RTO_MAX,
    ),
    deadLink: integerParam('deadLink', p.deadLink ?? 20, 1, 0xffff),
    fastLimit: integerParam('fastLimit', p.fastLimit ?? 5, 0, 0xffff),
    initialSn: integerParam('initialSn', p.initialSn ?? 0, 0, 0xffff_ffff),
  };
}

export class KcpSession {
  readonly conv: number;
  /** Payload bytes per segment (mtu - 24). */
  readonly mss: number;
  readonly stats: KcpStats = {
    segmentsSent: 0,
    segmentsReceived: 0,
    retransmissions: 0,
    fastRetransmissions: 0,
    lostSegments: 0,
    acksSent: 0,
    windowProbesSent: 0,
    windowTellsSent: 0,
    bytesSent: 0,
    bytesReceived: 0,
    datagramsSent: 0,
    datagramsReceived: 0,
    duplicateSegments: 0,
    rttMs: 0,
    rtoMs: RTO_DEFAULT,
  };

  private readonly output: (datagram: Buffer) => void;
  private readonly mtu: number;
  private readonly interval: number;
  private readonly nodelay: boolean;
  private readonly resend: number;
  private readonly nocwnd: boolean;
  private readonly sndWnd: number;
  private readonly rcvWnd: number;
  private readonly stream: boolean;
  private readonly minRto: number;
  private readonly deadLink: number;
  private readonly fastLimit: number;

  // Sequence state (u32).
  private sndUna: number;
  private sndNxt: number;
  private rcvNxt: number;

  // Clock and flush schedule (u32 ms).
  private current = 0;
  private updated = false;
  private tsFlush = 0;

  // RTT estimation and congestion control, as ikcp.
  private rxSrtt = 0;
  private rxRttval = 0;
  private rxRto = RTO_DEFAULT;
  private ssthresh = THRESH_INIT;
  private cwnd = 1;
  private incr: number;

  // Remote window and probing.
  private rmtWnd = INITIAL_REMOTE_WINDOW;
  private probe = 0;
  private tsProbe = 0;
  private probeWait = 0;

  private isDead = false;

  // Send side: queue (not yet numbered) and in-flight ring indexed by sn & sndMask.
  private readonly sndQueue = new SegmentQueue();
  private readonly sndRing: (Segment | undefined)[];
  private readonly sndMask: number;
  private nsndBuf = 0;
  /** Lower bound of the in-flight segments' resend times (valid while nsndBuf > 0). */
  private earliestResend = 0;
  /** A segment reached the fast-retransmit threshold since the last scan. */
  private fastPending = false;
  private readonly pool: Segment[] = [];

  // Receive side: out-of-order ring (sn & rcvMask) and the in-order queue, both rings of rcvWnd.
  private readonly rcvBufData: (Buffer | undefined)[];
  private readonly rcvBufFrg: Uint8Array;
  private readonly rcvMask: number;
  private readonly rcvQueData: (Buffer | undefined)[];
  private readonly rcvQueFrg: Uint8Array;
  private rcvQueHead = 0;
  private nrcvQue = 0;

  // Pending acks: (sn, ts) pairs.
  private ackList = new Uint32Array(256);
  private ackCount = 0;

  // Output packing.
  private readonly out: Buffer;
  private pos = 0;

  constructor(conv: number, output: (datagram: Buffer) => void, params: Partial<KcpParams> = {}) {
    this.conv = integerParam('conv', conv, 0, 0xffff_ffff);
    const p = checkKcpParams(params);
    this.output = output;
    this.mtu = p.mtu;
    this.mss = this.mtu - KCP_OVERHEAD;
    this.interval = p.interval;
    this.nodelay = p.nodelay;
    this.resend = p.resend;
    this.nocwnd = p.noCongestionControl;
    this.sndWnd = p.sndWnd;
    this.rcvWnd = p.rcvWnd;
    this.stream = p.stream;
    this.minRto = p.minRtoMs;
    this.deadLink = p.deadLink;
    this.fastLimit = p.fastLimit;
    const isn = p.initialSn;
    this.sndUna = isn;
    this.sndNxt = isn;
    this.rcvNxt = isn;
    this.incr = this.mss;

    const sndSize = ceilPow2(this.sndWnd);
    this.sndRing = new Array(sndSize);
    this.sndMask = sndSize - 1;
    const rcvSize = ceilPow2(this.rcvWnd);
    this.rcvBufData = new Array(rcvSize);
    this.rcvBufFrg = new Uint8Array(rcvSize);
    this.rcvMask = rcvSize - 1;
    this.rcvQueData = new Array(rcvSize);
    this.rcvQueFrg = new Uint8Array(rcvSize);
    this.out = Buffer.allocUnsafe(this.mtu);
  }

  // ---------------------------------------------------------------- user side

  /** Queues data (see the header for modes and ownership). Throws RangeError above 255 fragments. */
  send(data: Buffer): void {
    const mss = this.mss;
    let len = data.length;
    let off = 0;
    if (this.stream) {
      if (len === 0) return;
      const last = this.sndQueue.last();
      if (last !== undefined && last.data.length < mss) {
        const old = last.data.length;
        const extend = Math.min(mss - old, len);
        let own = last.own;
        if (own === null) {
          own = Buffer.allocUnsafe(mss);
          own.set(last.data, 0);
          last.own = own;
        }
        own.set(extend === len ? data : data.subarray(0, extend), old);
        last.data = own.subarray(0, old + extend);
        off = extend;
        len -= extend;
        if (len === 0) return;
      }
    }
    const count = len <= mss ? 1 : Math.ceil(len / mss);
    if (!this.stream && count > KCP_MAX_FRAGMENTS) {
      throw new RangeError(
        `KCP message of ${len} bytes needs ${count} fragments; at most ${KCP_MAX_FRAGMENTS} of ${mss} bytes`,
      );
    }
    for (let i = 0; i < count; i++) {
      const size = Math.min(mss, len);
      const seg = this.takeSegment();
      seg.data = off === 0 && size === data.length ? data : data.subarray(off, off + size);
      seg.frg = this.stream ? 0 : count - i - 1;
      this.sndQueue.push(seg);
      off += size;
      len -= size;
    }
  }

  /** The next whole message (stream mode: the next piece of the stream), or null. */
  recv(): Buffer | null {
    const n = this.nrcvQue;
    if (n === 0) return null;
    const mask = this.rcvMask;
    const head = this.rcvQueHead;
    const parts = this.stream ? 1 : this.rcvQueFrg[head]! + 1;
    if (parts > n) return null;
    const recover = n >= this.rcvWnd;
    let result: Buffer;
    if (parts === 1) {
      result = this.rcvQueData[head]!;
      this.rcvQueData[head] = undefined;
    } else {
      const list: Buffer[] = new Array(parts);
      let total = 0;
      for (let i = 0; i < parts; i++) {
        const at = (head + i) & mask;
        const piece = this.rcvQueData[at]!;
        this.rcvQueData[at] = undefined;
        list[i] = piece;
        total += piece.length;
      }
      result = Buffer.concat(list, total);
    }
    this.rcvQueHead = (head + parts) & mask;
    this.nrcvQue = n - parts;
    this.moveToQueue();
    // The remote saw a zero (or full) window: tell it at once that there is room again.
    if (recover && this.nrcvQue < this.rcvWnd) this.probe |= ASK_TELL;
    return result;
  }

  /** Size of what recv() would return next, -1 if nothing is ready. */
  peekSize(): number {
    const n = this.nrcvQue;
    if (n === 0) return -1;
    const head = this.rcvQueHead;
    const parts = this.stream ? 1 : this.rcvQueFrg[head]! + 1;
    if (parts > n) return -1;
    let total = 0;
    for (let i = 0; i < parts; i++) total += this.rcvQueData[(head + i) & this.rcvMask]!.length;
    return total;
  }

  /** Segments queued + in flight, for back-pressure. */
  waitSnd(): number {
    return this.nsndBuf + this.sndQueue.length;
  }

  /** true once a segment was transmitted `deadLink` times without being acknowledged. */
  dead(): boolean {
    return this.isDead;
  }

  // ---------------------------------------------------------------- wire side

  /** Applies one received datagram; a rejected one (bad_conv, malformed) changes nothing. */
  input(input: Uint8Array, nowMs: number): KcpInputResult {
    // Anything but bytes (an untyped caller) is garbage too; a plain Uint8Array is viewed as a
    // Buffer because recv() hands out Buffers.
    if (!((input as unknown) instanceof Uint8Array)) return 'malformed';
    const datagram = Buffer.isBuffer(input)
      ? input
      : Buffer.from(input.buffer, input.byteOffset, input.byteLength);
    const size = datagram.length;
    if (size < KCP_OVERHEAD) return 'malformed';
    // Pass 1: validate every segment before touching any state.
    const conv = this.conv;
    for (let off = 0; off < size; ) {
      if (size - off < KCP_OVERHEAD) return 'malformed';
      if (readU32(datagram, off) !== conv) return 'bad_conv';
      const cmd = datagram[off + 4]!;
      if (cmd < KCP_CMD_PUSH || cmd > KCP_CMD_WINS) return 'malformed';
      const len = readU32(datagram, off + 20);
      if (len > size - off - KCP_OVERHEAD) return 'malformed';
      if (len !== 0 && cmd !== KCP_CMD_PUSH) return 'malformed';
      off += KCP_OVERHEAD + len;
    }
    // Pass 2: apply.
    this.current = nowMs >>> 0;
    const prevUna = this.sndUna;
    let sawAck = false;
    let maxAck = 0;
    let latestTs = 0;
    for (let off = 0; off < size; ) {
      const cmd = datagram[off + 4]!;
      const frg = datagram[off + 5]!;
      const wnd = datagram[off + 6]! | (datagram[off + 7]! << 8);
      const ts = readU32(datagram, off + 8);
      const sn = readU32(datagram, off + 12);
      const una = readU32(datagram, off + 16);
      const len = readU32(datagram, off + 20);
      const dataAt = off + KCP_OVERHEAD;
      off = dataAt + len;

      this.rmtWnd = wnd;
      this.parseUna(una);
      if (cmd === KCP_CMD_ACK) {
        const rtt = diff(this.current, ts);
        if (rtt >= 0) this.updateRtt(rtt);
        this.parseAck(sn);
        if (!sawAck) {
          sawAck = true;
          maxAck = sn;
          latestTs = ts;
        } else if (diff(sn, maxAck) > 0 && diff(ts, latestTs) > 0) {
          // Conservative (as ikcp's IKCP_FASTACK_CONSERVE): only a later-sent segment's ack counts.
          maxAck = sn;
          latestTs = ts;
        }
      } else if (cmd === KCP_CMD_PUSH) {
        this.stats.segmentsReceived++;
        if (diff(sn, (this.rcvNxt + this.rcvWnd) >>> 0) < 0) {
          this.pushAck(sn, ts);
          if (diff(sn, this.rcvNxt) >= 0) {
            this.parseData(sn, frg, datagram.subarray(dataAt, dataAt + len));
          } else {
            this.stats.duplicateSegments++;
          }
        }
      } else if (cmd === KCP_CMD_WASK) {
        this.probe |= ASK_TELL;
      }
      // WINS: its wnd was taken above, nothing else to do.
    }
    this.stats.datagramsReceived++;
    this.stats.bytesReceived += size;
    if (sawAck) this.parseFastack(maxAck, latestTs);
    if (diff(this.sndUna, prevUna) > 0) this.growCwnd();
    return 'ok';
  }

  /** Flushes if the interval grid says so; call it at check()'s time or every `interval` ms. */
  update(nowMs: number): void {
    this.current = nowMs >>> 0;
    if (!this.updated) {
      this.updated = true;
      this.tsFlush = this.current;
    }
    let slap = diff(this.current, this.tsFlush);
    if (slap >= SLAP_RESET || slap < -SLAP_RESET) {
      this.tsFlush = this.current;
      slap = 0;
    }
    if (slap >= 0) {
      this.tsFlush = (this.tsFlush + this.interval) >>> 0;
      if (diff(this.current, this.tsFlush) >= 0) this.tsFlush = (this.current + this.interval) >>> 0;
      this.flushNow();
    }
  }

  /** The time (caller's clock) when update() next has work: nowMs itself if it has some now. */
  check(nowMs: number): number {
    if (!this.updated) return nowMs;
    const now = nowMs >>> 0;
    const wait = diff(this.tsFlush, now);
    if (wait <= 0 || wait > SLAP_RESET) return nowMs;
    return nowMs + Math.min(wait, this.interval);
  }

  /**
   * Sends pending acks, window probes, new data within the window and due retransmissions now,
   * and counts as this interval's flush: check() then answers `interval` ms later, not "now".
   * (ikcp's flush leaves the schedule alone; a caller that flushes after every input, as the
   * kcp transport does, then re-armed its timer at its 1 ms floor while data was in flight.)
   */
  flush(nowMs: number): void {
    this.current = nowMs >>> 0;
    this.updated = true;
    this.tsFlush = (this.current + this.interval) >>> 0;
    this.flushNow();
  }

  // ---------------------------------------------------------------- internals

  private takeSegment(): Segment {
    const seg = this.pool.pop();
    if (seg !== undefined) return seg;
    return { sn: 0, frg: 0, ts: 0, resendts: 0, rto: 0, fastack: 0, xmit: 0, data: EMPTY, own: null };
  }

  private releaseSegment(seg: Segment): void {
    seg.data = EMPTY;
    seg.own = null;
    if (this.pool.length < SEGMENT_POOL_LIMIT) this.pool.push(seg);
  }

  private updateRtt(rtt: number): void {
    if (this.rxSrtt === 0) {
      this.rxSrtt = rtt;
      this.rxRttval = rtt >> 1;
    } else {
      const delta = Math.abs(rtt - this.rxSrtt);
      this.rxRttval = Math.floor((3 * this.rxRttval + delta) / 4);
      this.rxSrtt = Math.max(1, Math.floor((7 * this.rxSrtt + rtt) / 8));
    }
    const rto = this.rxSrtt + Math.max(this.interval, 4 * this.rxRttval);
    this.rxRto = Math.min(RTO_MAX, Math.max(this.minRto, rto));
    this.stats.rttMs = this.rxSrtt;
    this.stats.rtoMs = this.rxRto;
  }

  /** snd_una moves to the oldest segment still in flight (or snd_nxt). */
  private shrinkBuf(): void {
    const ring = this.sndRing;
    const mask = this.sndMask;
    let una = this.sndUna;
    const nxt = this.sndNxt;
    while (una !== nxt && ring[una & mask] === undefined) una = (una + 1) >>> 0;
    this.sndUna = una;
  }

  /** Everything before `una` is acknowledged (cumulative ack). */
  private parseUna(una: number): void {
    if (diff(una, this.sndUna) <= 0) return;
    // Never past snd_nxt, whatever the peer claims.
    const stop = diff(una, this.sndNxt) > 0 ? this.sndNxt : una;
    const ring = this.sndRing;
    const mask = this.sndMask;
    for (let sn = this.sndUna; sn !== stop; sn = (sn + 1) >>> 0) {
      const seg = ring[sn & mask];
      if (seg !== undefined) {
        ring[sn & mask] = undefined;
        this.nsndBuf--;
        this.releaseSegment(seg);
      }
    }
    this.sndUna = stop;
    this.shrinkBuf();
  }

  private parseAck(sn: number): void {
    if (diff(sn, this.sndUna) < 0 || diff(sn, this.sndNxt) >= 0) return;
    const at = sn & this.sndMask;
    const seg = this.sndRing[at];
    if (seg === undefined) return;
    this.sndRing[at] = undefined;
    this.nsndBuf--;
    this.releaseSegment(seg);
    if (sn === this.sndUna) this.shrinkBuf();
  }

  /** Segments before the newest acked one were skipped once more (the fast-retransmit count). */
  private parseFastack(maxAck: number, latestTs: number): void {
    if (this.resend === 0) return;
    if (diff(maxAck, this.sndUna) < 0 || diff(maxAck, this.sndNxt) >= 0) return;
    const ring = this.sndRing;
    const mask = this.sndMask;
    const threshold = this.resend;
    for (let sn = this.sndUna; sn !== maxAck; sn = (sn + 1) >>> 0) {
      const seg = ring[sn & mask];
      if (seg !== undefined && diff(latestTs, seg.ts) >= 0) {
        if (++seg.fastack >= threshold) this.fastPending = true;
      }
    }
  }

  private growCwnd(): void {
    if (this.cwnd >= this.rmtWnd) return;
    const mss = this.mss;
    if (this.cwnd < this.ssthresh) {
      this.cwnd++;
      this.incr += mss;
    } else {
      if (this.incr < mss) this.incr = mss;
      this.incr += Math.floor((mss * mss) / this.incr) + Math.floor(mss / 16);
      if ((this.cwnd + 1) * mss <= this.incr) this.cwnd = Math.ceil(this.incr / mss);
    }
    if (this.cwnd > this.rmtWnd) {
      this.cwnd = this.rmtWnd;
      this.incr = this.rmtWnd * mss;
    }
  }

  private pushAck(sn: number, ts: number): void {
    const at = this.ackCount * 2;
    if (at + 2 > this.ackList.length) {
      const bigger = new Uint32Array(this.ackList.length * 2);
      bigger.set(this.ackList);
      this.ackList = bigger;
    }
    this.ackList[at] = sn;
    this.ackList[at + 1] = ts;
    this.ackCount++;
  }

  private parseData(sn: number, frg: number, data: Buffer): void {
    // The caller checked rcv_nxt <= sn < rcv_nxt + rcv_wnd.
    const at = sn & this.rcvMask;
    if (this.rcvBufData[at] !== undefined) {
      this.stats.duplicateSegments++;
      return;
    }
    this.rcvBufData[at] = data;
    this.rcvBufFrg[at] = frg;
    if (sn === this.rcvNxt) this.moveToQueue();
  }

  /** In-order segments go from the out-of-order ring to the receive queue while it has room. */
  private moveToQueue(): void {
    const mask = this.rcvMask;
    while (this.nrcvQue < this.rcvWnd) {
      const at = this.rcvNxt & mask;
      const data = this.rcvBufData[at];
      if (data === undefined) return;
      this.rcvBufData[at] = undefined;
      const q = (this.rcvQueHead + this.nrcvQue) & mask;
      this.rcvQueData[q] = data;
      this.rcvQueFrg[q] = this.rcvBufFrg[at]!;
      this.nrcvQue++;
      this.rcvNxt = (this.rcvNxt + 1) >>> 0;
    }
  }

  private wndUnused(): number {
    return this.nrcvQue < this.rcvWnd ? this.rcvWnd - this.nrcvQue : 0;
  }

  /** Writes one segment header at the packing position (room checked by the caller). */
  private putHeader(cmd: number, frg: number, wnd: number, ts: number, sn: number, una: number, len: number) {
    const b = this.out;
    const p = this.pos;
    const c = this.conv;
    b[p] = c;
    b[p + 1] = c >>> 8;
    b[p + 2] = c >>> 16;
    b[p + 3] = c >>> 24;
    b[p + 4] = cmd;
    b[p + 5] = frg;
    b[p + 6] = wnd;
    b[p + 7] = wnd >>> 8;
    b[p + 8] = ts;
    b[p + 9] = ts >>> 8;
    b[p + 10] = ts >>> 16;
    b[p + 11] = ts >>> 24;
    b[p + 12] = sn;
    b[p + 13] = sn >>> 8;
    b[p + 14] = sn >>> 16;
    b[p + 15] = sn >>> 24;
    b[p + 16] = una;
    b[p + 17] = una >>> 8;
    b[p + 18] = una >>> 16;
    b[p + 19] = una >>> 24;
    b[p + 20] = len;
    b[p + 21] = len >>> 8;
    b[p + 22] = len >>> 16;
    b[p + 23] = len >>> 24;
    this.pos = p + KCP_OVERHEAD;
  }

  /** Makes room for `need` bytes, sending what is packed when the datagram would exceed mtu. */
  private reserve(need: number): void {
    if (this.pos + need > this.mtu) this.emit();
  }

  private emit(): void {
    const size = this.pos;
    if (size === 0) return;
    this.pos = 0;
    this.stats.datagramsSent++;
    this.stats.bytesSent += size;
    this.output(this.out.subarray(0, size));
  }

  private putSegment(seg: Segment, wnd: number): void {
    const len = seg.data.length;
    this.reserve(KCP_OVERHEAD + len);
    seg.ts = this.current;
    this.putHeader(KCP_CMD_PUSH, seg.frg, wnd, seg.ts, seg.sn, this.rcvNxt, len);
    if (len > 0) {
      this.out.set(seg.data, this.pos);
      this.pos += len;
    }
    this.stats.segmentsSent++;
    if (seg.xmit >= this.deadLink) this.isDead = true;
  }

  private flushNow(): void {
    const current = this.current;
    const wnd = this.wndUnused();
    const una = this.rcvNxt;

    // Acknowledgements.
    const acks = this.ackCount;
    for (let i = 0; i < acks; i++) {
      this.reserve(KCP_OVERHEAD);
      this.putHeader(KCP_CMD_ACK, 0, wnd, this.ackList[i * 2 + 1]!, this.ackList[i * 2]!, una, 0);
    }
    this.ackCount = 0;
    this.stats.acksSent += acks;

    // Window probing while the remote window is zero: first after 7 s, then backing off x1.5.
    if (this.rmtWnd === 0) {
      if (this.probeWait === 0) {
        this.probeWait = PROBE_INIT;
        this.tsProbe = (current + this.probeWait) >>> 0;
      } else if (diff(current, this.tsProbe) >= 0) {
        if (this.probeWait < PROBE_INIT) this.probeWait = PROBE_INIT;
        this.probeWait = Math.min(PROBE_LIMIT, this.probeWait + Math.floor(this.probeWait / 2));
        this.tsProbe = (current + this.probeWait) >>> 0;
        this.probe |= ASK_SEND;
      }
    } else {
      this.tsProbe = 0;
      this.probeWait = 0;
    }
    if (this.probe & ASK_SEND) {
      this.reserve(KCP_OVERHEAD);
      this.putHeader(KCP_CMD_WASK, 0, wnd, 0, 0, una, 0);
      this.stats.windowProbesSent++;
    }
    if (this.probe & ASK_TELL) {
      this.reserve(KCP_OVERHEAD);
      this.putHeader(KCP_CMD_WINS, 0, wnd, 0, 0, una, 0);
      this.stats.windowTellsSent++;
    }
    this.probe = 0;

    // The window this flush may use.
    let cwnd = Math.min(this.sndWnd, this.rmtWnd);
    if (!this.nocwnd) cwnd = Math.min(this.cwnd, cwnd);

    // Retransmissions (RTO expiry or fast retransmit) of segments already in flight, oldest first.
    let change = false;
    let lost = false;
    if (this.nsndBuf > 0 && (this.fastPending || diff(current, this.earliestResend) >= 0)) {
      this.fastPending = false;
      const threshold = this.resend > 0 ? this.resend : 0xffff_ffff;
      const ring = this.sndRing;
      const mask = this.sndMask;
      const nxt = this.sndNxt;
      let earliest = 0x7fff_ffff; // as a difference from current
      for (let sn = this.sndUna; sn !== nxt; sn = (sn + 1) >>> 0) {
        const seg = ring[sn & mask];
        if (seg === undefined) continue;
        if (diff(current, seg.resendts) >= 0) {
          seg.xmit++;
          if (this.nodelay) seg.rto += seg.rto >> 1;
          else seg.rto += Math.max(seg.rto, this.rxRto);
          if (seg.rto > RTO_MAX) seg.rto = RTO_MAX;
          seg.resendts = (current + seg.rto) >>> 0;
          lost = true;
          this.stats.lostSegments++;
          this.stats.retransmissions++;
          this.putSegment(seg, wnd);
        } else if (seg.fastack >= threshold && (this.fastLimit <= 0 || seg.xmit <= this.fastLimit)) {
          seg.xmit++;
          seg.fastack = 0;
          seg.resendts = (current + seg.rto) >>> 0;
          change = true;
          this.stats.fastRetransmissions++;
          this.stats.retransmissions++;
          this.putSegment(seg, wnd);
        }
        const wait = diff(seg.resendts, current);
        if (wait < earliest) earliest = wait;
      }
      this.earliestResend = (current + earliest) >>> 0;
    }

    // New segments, as far as the window allows.
    if (this.sndQueue.length > 0) {
      const limit = (this.sndUna + cwnd) >>> 0;
      // Every new segment gets the same first resend time: current + rto (+ rto/8 without nodelay).
      const resendts = (current + this.rxRto + (this.nodelay ? 0 : this.rxRto >> 3)) >>> 0;
      const wasEmpty = this.nsndBuf === 0;
      let sent = false;
      while (this.sndQueue.length > 0 && diff(this.sndNxt, limit) < 0) {
        const seg = this.sndQueue.shift();
        seg.sn = this.sndNxt;
        this.sndNxt = (this.sndNxt + 1) >>> 0;
        this.sndRing[seg.sn & this.sndMask] = seg;
        this.nsndBuf++;
        seg.xmit = 1;
        seg.fastack = 0;
        seg.rto = this.rxRto;
        seg.resendts = resendts;
        this.putSegment(seg, wnd);
        sent = true;
      }
      if (sent && (wasEmpty || diff(resendts, this.earliestResend) < 0)) this.earliestResend = resendts;
    }

    this.emit();

    // Congestion control after losses, as ikcp (kept up to date even with noCongestionControl).
    if (change) {
      const inflight = (this.sndNxt - this.sndUna) >>> 0;
      this.ssthresh = Math.max(THRESH_MIN, inflight >>> 1);
      this.cwnd = this.ssthresh + this.resend;
      this.incr = this.cwnd * this.mss;
    }
    if (lost) {
      this.ssthresh = Math.max(THRESH_MIN, cwnd >>> 1);
      this.cwnd = 1;
      this.incr = this.mss;
    }
    if (this.cwnd < 1) {
      this.cwnd = 1;
      this.incr = this.mss;
    }
  }
}
