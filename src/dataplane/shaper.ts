/**
 * The bandwidth limit of a service (docs/decisions.md §6): one FairShaper per service per direction holds
 * that direction's payload at `bandwidth_limit_mbps` (10^6 bit/s), paced, and shares it fairly
 * between the service's flows. The same shaper serves the stream path (TCP chunks read from
 * sockets: request(), the socket stays paused until `go` runs) and the packet path (IP packets
 * from a TUN: offer(), which queues up to a cap and then drops, and drops by sojourn time at the
 * head: CoDel per flow, below). Pure logic: time and timers come from an injected Clock, so tests
 * run on a fake clock. Used by the data plane (src/dataplane).
 *
 * How:
 * - Token bucket, rate·burstMs deep (default 10 ms), so the output is paced rather than bursty:
 *   no window of W ms carries more than rate·W + depth + max(0, largest request − depth/2).
 *   A request waits until the bucket holds min(its size, depth/2) and then takes its whole size,
 *   going into debt if it is larger: a 64 KiB chunk must pass even when the bucket is shallower
 *   (10 Mbit/s · 10 ms = 12.5 kB), and the debt keeps the long-run rate exact. Waiting for at
 *   most half the depth means a timer that fires up to burstMs/2 late loses no tokens.
 * - Fairness is start-time fair queuing (SFQ, Goyal et al. 1996) rather than the deficit round
 *   robin one might reach for first: on the stream path a flow has at most one chunk waiting (its
 *   socket is paused), so between a grant and its next read it is not backlogged, and DRR, which
 *   forgets an emptied flow's deficit, would share per chunk instead of per byte (a flow reading
 *   64 KiB chunks would get 40 times one reading 1.5 kB). SFQ remembers each flow's finish tag
 *   while the shaper is busy, so byte fairness holds for such flows too, and a flow that asks
 *   rarely is served next (its start tag is the current virtual time). Cost: a binary heap of
 *   the flows that have something waiting, O(log n) per queued grant. A request that SFQ would
 *   serve before the head goes at once if the bucket allows, not at the next timer tick.
 * - One timer at most, armed for when the head request can go; nothing runs between grants.
 *   Timers tick in whole milliseconds, so under contention a flow with one chunk outstanding gets
 *   at most one chunk per (tick + its read delay): a flow of small chunks is limited by its own
 *   demand (a socket held back reads bigger chunks, up to 64 KiB, so real flows adapt).
 * - CoDel (RFC 8289) on each packet flow, as fq_codel runs it: a packet about to leave that has
 *   waited longer than the target (5 ms, or 1.5 times the largest packet's at low rates) while its flow's queue
 *   has stayed above the target for a whole interval (100 ms, at least twice the target) is
 *   dropped instead, and while that lasts drops follow at interval/sqrt(count). A sender that
 *   reacts to loss (TCP inside the tunnel, a rate-adaptive UDP app) keeps its standing queue
 *   near the target instead of filling the flow's cap; a burst shorter than the interval passes
 *   whole. The cap stays as the hard bound. Stream requests are never dropped.
 * - Unlimited (0 Mbit/s) is a few comparisons on the hot path: request() runs `go` at once,
 *   offer() returns true. Limited, a request that need not wait costs a clock read, a map
 *   lookup and its tags (bench/dataplane/shaper-cost.ts).
 *
 * `go` may run synchronously inside request() (when nothing waits and the bucket allows it), and
 * must not throw: the shaper stays consistent if it does, but the error reaches whoever called
 * request()/setRate() or the timer. Calls made from inside `go` are queued and served by the
 * running loop, so a producer that asks again from `go` does not recurse.
 */

export interface Clock {
  /** Milliseconds, monotonic. */
  now(): number;
  setTimer(ms: number, fn: () => void): { cancel(): void };
}

export const realClock: Clock = {
  now: () => performance.now(),
  setTimer(ms, fn) {
    const t = setTimeout(fn, ms);
    return { cancel: () => clearTimeout(t) };
  },
};

export interface ShaperStats {
  /** Bytes of requests waiting. */
  queuedBytes: number;
  /** Flows with something waiting. */
  flows: number;
  /** Bytes let through since creation (immediately or after waiting). */
  grantedBytes: number;
  /** offer() calls refused because the flow's queue was at its cap, and their bytes. */
  dropped: number;
  droppedBytes: number;
  /** Queued packets CoDel dropped at the head (their `go` never ran), and their bytes. */
  lateDropped: number;
  lateDroppedBytes: number;
}

export interface FairShaperOptions {
  /** 0 = unlimited. */
  mbps: number;
  clock?: Clock;
  /** Bucket depth in milliseconds of rate (default 10). */
  burstMs?: number;
  /** CoDel dropped the flow's oldest queued packet (its `go` will never run). */
  onLateDrop?: (flowId: number, bytes: number) => void;
}

/** RFC 8289's defaults, as fq_codel uses them. */
const CODEL_TARGET_MS = 5;
const CODEL_INTERVAL_MS = 100;
/** The packet size assumed until a larger one is offered (the TUN's default MTU). */
const CODEL_MTU_BYTES = 1500;

/** CoDel's state for one packet flow (RFC 8289 §5). */
class Codel {
  /** When the sojourn time went above target with no dip since, plus the interval; null: below. */
  firstAboveAt: number | null = null;
  dropping = false;
  dropNextAt = 0;
  count = 0;
  lastCount = 0;
}

type Go = () => void;

/** What the shaper keeps of a flow: its waiting requests (FIFO) and its SFQ tags. */
class Flow {
  /** Position in the heap; -1 while nothing waits. */
  hi = -1;
  /** Start tag of the head request (valid while queued). */
  start = 0;
  /** Finish tag of the last request enqueued or granted. */
  finish = 0;
  /** Tie-break among equal start tags: who got its tag first goes first. */
  seq = 0;
  sizes: number[] = [];
  gos: Array<Go | undefined> = [];
  /** When each request was queued, for the packet path's sojourn time; -1 for a stream request. */
  queuedAt: number[] = [];
  head = 0;
  queued = 0;
  /** Made at the flow's first late-drop check (packet flows only). */
  codel: Codel | undefined;
  constructor(
    readonly id: number,
    public epoch: number,
  ) {}
}

const EPS = 1e-6;
/** Virtual time is shifted back to 0 beyond this many bytes, far inside a double's exact range. */
const REBASE_AT = 2 ** 40;

function checkMbps(mbps: number): void {
  if (!Number.isFinite(mbps) || mbps < 0) throw new RangeError(`bandwidth limit must be ≥ 0 Mbit/s: ${mbps}`);
}

export class FairShaper {
  private readonly clock: Clock;
  private readonly burstMs: number;
  private unlimited = true;
  /** Bytes per millisecond. */
  private rate = 0;
  private depth = 0;
  /** Bucket level a request larger than this waits for before going into debt. */
  private half = 0;
  private tokens = 0;
  private last = 0;

  /** Flows with something waiting, ordered by (start tag of the head request, seq). */
  private readonly heap: Flow[] = [];
  /** Every flow the current busy period knows (waiting ones and idle ones with their finish tag). */
  private readonly flows = new Map<number, Flow>();
  private sweepAt = 1024;
  /** Virtual time: start tag of the request granted last. */
  private vtime = 0;
  /** A new epoch begins when the link has been idle long enough to fill the bucket: tags reset. */
  private epoch = 0;
  private seq = 0;

  private timer: { cancel(): void } | null = null;
  /** Inside the serving loop or a synchronous `go`: new requests are queued, the loop serves them. */
  private busy = false;

  private queuedBytes = 0;
  private grantedBytes = 0;
  private dropped = 0;
  private droppedBytes = 0;
  private lateDropped = 0;
  private lateDroppedBytes = 0;
  private readonly onLateDrop: ((flowId: number, bytes: number) => void) | undefined;
  /** CoDel's target and interval at the current rate and largest packet (ms). */
  private codelTarget = CODEL_TARGET_MS;
  private codelInterval = CODEL_INTERVAL_MS;
  /** The largest packet offered: one of them queued is not a standing queue (RFC 8289 MAXPACKET). */
  private maxPacket = CODEL_MTU_BYTES;

  constructor(opts: FairShaperOptions) {
    this.clock = opts.clock ?? realClock;
    this.onLateDrop = opts.onLateDrop;
    this.burstMs = opts.burstMs ?? 10;
    if (!(this.burstMs > 0) || !Number.isFinite(this.burstMs)) {
      throw new RangeError(`burstMs must be > 0: ${this.burstMs}`);
    }
    this.setRate(opts.mbps);
  }

  /** Bytes the limit lets through in `ms` milliseconds; 0 when unlimited. */
  bytesIn(ms: number): number {
    return this.unlimited ? 0 : this.rate * ms;
  }

  /** Flow records kept (waiting or idle with a tag): what docs/memory.md bounds by the sweep. */
  get flowRecords(): number {
    return this.flows.size;
  }

  /** Changes the limit at once; 0 = unlimited, and everything waiting goes now. */
  setRate(mbps: number): void {
    checkMbps(mbps);
    if (!this.unlimited) this.refill();
    this.cancelTimer();
    if (mbps === 0) {
      this.unlimited = true;
      this.rate = this.depth = this.half = 0;
    } else {
      this.rate = (mbps * 1e6) / 8 / 1000;
      this.depth = this.rate * this.burstMs;
      this.half = this.depth / 2;
      this.setCodelTimes();
      if (this.unlimited) {
        this.unlimited = false;
        this.tokens = this.depth;
        this.last = this.clock.now();
        // Tags of flows still waiting (a `go` of the flush set a limit again) stay valid.
        if (this.heap.length === 0) this.newEpoch();
      } else if (this.tokens > this.depth) {
        this.tokens = this.depth;
      }
    }
    if (!this.busy && this.heap.length > 0) this.pump();
  }

  /**
   * Stream path: `go` runs when `bytes` of this flow may be sent (possibly before request returns);
   * requests of one flow run in order. Nothing is ever dropped here: the caller holds its source
   * (a paused socket) until `go`.
   */
  request(flowId: number, bytes: number, go: Go): void {
    if (!(bytes >= 0 && bytes < Infinity)) throw new RangeError(`request size must be ≥ 0: ${bytes}`);
    if (!this.busy) {
      if (this.unlimited) {
        if (this.heap.length === 0) {
          this.grantedBytes += bytes;
          this.run(go);
          return;
        }
      } else if (this.tryNow(flowId, bytes)) {
        this.run(go);
        return;
      }
    }
    this.enqueue(flowId, bytes, go, -1);
  }

  /**
   * Packet path: true = send it now (`go` will not run); false = queued, `go` runs when it may be
   * sent, or never if CoDel drops it then (onLateDrop, stats().lateDropped); 'drop' = this flow
   * already has maxQueuedBytes waiting (counted in stats().dropped). `go` never runs inside
   * offer().
   */
  offer(flowId: number, bytes: number, go: Go, maxQueuedBytes: number): true | false | 'drop' {
    if (!(bytes >= 0 && bytes < Infinity)) throw new RangeError(`packet size must be ≥ 0: ${bytes}`);
    if (!this.busy) {
      if (this.unlimited) {
        if (this.heap.length === 0) {
          this.grantedBytes += bytes;
          return true;
        }
      } else if (this.tryNow(flowId, bytes)) {
        return true;
      }
    }
    const f = this.flows.get(flowId);
    if ((f === undefined ? 0 : f.queued) + bytes > maxQueuedBytes) {
      this.dropped++;
      this.droppedBytes += bytes;
      return 'drop';
    }
    if (bytes > this.maxPacket) {
      this.maxPacket = bytes;
      if (!this.unlimited) this.setCodelTimes();
    }
    this.enqueue(flowId, bytes, go, this.clock.now());
    return false;
  }

  /**
   * Below about 3.6 Mbit/s a 1500-byte packet takes longer than 5 ms to leave: as cake does, the
   * target grows to 1.5 times that, so that the packet being sent is not a standing queue.
   */
  private setCodelTimes(): void {
    this.codelTarget = Math.max(CODEL_TARGET_MS, (1.5 * this.maxPacket) / this.rate);
    this.codelInterval = Math.max(CODEL_INTERVAL_MS, 2 * this.codelTarget);
  }

  /** A flow ended: what it has waiting is dropped (its `go`s never run) and its tags are forgotten. */
  forget(flowId: number): void {
    const f = this.flows.get(flowId);
    if (f === undefined) return;
    this.flows.delete(flowId);
    if (f.hi >= 0) {
      const wasHead = f.hi === 0;
      this.heapRemove(f.hi);
      this.queuedBytes -= f.queued;
      if (this.heap.length === 0) this.cancelTimer();
      else if (wasHead && !this.busy) this.reschedule();
    }
  }

  /** Drops everything waiting and cancels the timer (the service is gone); the shaper stays usable. */
  clear(): void {
    this.cancelTimer();
    for (const f of this.heap) f.hi = -1;
    this.heap.length = 0;
    this.flows.clear();
    this.queuedBytes = 0;
  }

  stats(): ShaperStats {
    return {
      queuedBytes: this.queuedBytes,
      flows: this.heap.length,
      grantedBytes: this.grantedBytes,
      dropped: this.dropped,
      droppedBytes: this.droppedBytes,
      lateDropped: this.lateDropped,
      lateDroppedBytes: this.lateDroppedBytes,
    };
  }

  // ---- internals ----

  private refill(): void {
    const now = this.clock.now();
    const t = this.tokens + (now - this.last) * this.rate;
    this.tokens = Math.min(t, this.depth);
    this.last = now;
  }

  /**
   * Grants at once, with its tags, a request that SFQ would serve next (nothing waits, or the flow
   * has nothing waiting and its start tag is ahead of the head's) if the bucket allows it now.
   * Under contention this lets a flow that is behind (a rare ask, a small chunk read just now)
   * go between timer ticks instead of at the next one.
   */
  private tryNow(flowId: number, bytes: number): boolean {
    this.refill();
    const idle = this.heap.length === 0;
    // A full bucket with nothing waiting: the link has been idle, so earlier usage no longer counts.
    if (idle && this.tokens >= this.depth - EPS) this.newEpoch();
    if (this.tokens + EPS < Math.min(bytes, this.half)) return false;
    const f = this.flow(flowId);
    const start = Math.max(f.finish, this.vtime);
    if (!idle && (f.hi >= 0 || start >= this.heap[0]!.start)) return false;
    this.tokens -= bytes;
    this.grantedBytes += bytes;
    f.finish = start + bytes;
    this.advance(start);
    return true;
  }

  private enqueue(flowId: number, bytes: number, go: Go, queuedAt: number): void {
    const f = this.flow(flowId);
    const wasIdle = this.heap.length === 0;
    f.sizes.push(bytes);
    f.gos.push(go);
    f.queuedAt.push(queuedAt);
    f.queued += bytes;
    this.queuedBytes += bytes;
    if (f.hi < 0) {
      f.start = Math.max(f.finish, this.vtime);
      f.finish = f.start + bytes;
      f.seq = ++this.seq;
      this.heapPush(f);
      // A flow that goes to the front (a first ask, or a rarely asking flow) may need fewer tokens
      // than the head the timer was armed for.
      if (!this.busy && (wasIdle || f.hi === 0)) this.reschedule();
    } else {
      f.finish += bytes;
    }
  }

  /** Arms the timer for the head request (never grants: offer() must not run `go`). */
  private reschedule(): void {
    if (this.unlimited) {
      // Only after a `go` threw during a flush: the next tick flushes the rest.
      if (this.timer === null) this.arm(1);
      return;
    }
    const f = this.heap[0]!;
    const bytes = f.sizes[f.head]!;
    this.refill();
    this.arm((Math.min(bytes, this.half) - this.tokens) / this.rate);
  }

  /** The flow's record, created or renewed (a record from an earlier epoch starts fresh). */
  private flow(id: number): Flow {
    let f = this.flows.get(id);
    if (f === undefined) {
      if (this.flows.size >= this.sweepAt) this.sweep();
      f = new Flow(id, this.epoch);
      this.flows.set(id, f);
    } else if (f.epoch !== this.epoch) {
      f.epoch = this.epoch;
      f.finish = 0;
    }
    return f;
  }

  /** Drops idle records that no longer matter (tag behind virtual time, or an old epoch). */
  private sweep(): void {
    for (const [id, f] of this.flows) {
      if (f.hi < 0 && (f.epoch !== this.epoch || f.finish <= this.vtime)) this.flows.delete(id);
    }
    this.sweepAt = Math.max(1024, this.flows.size * 2);
  }

  private newEpoch(): void {
    this.epoch++;
    this.vtime = 0;
  }

  private advance(start: number): void {
    if (start > this.vtime) this.vtime = start;
    if (this.vtime > REBASE_AT) {
      const base = this.vtime;
      for (const f of this.flows.values()) {
        f.start -= base;
        f.finish -= base;
      }
      this.vtime = 0;
    }
  }

  /** Runs a synchronously granted `go`, then serves whatever it queued. */
  private run(go: Go): void {
    this.busy = true;
    try {
      go();
    } catch (e) {
      this.busy = false;
      this.rescue();
      throw e;
    }
    this.busy = false;
    if (this.heap.length > 0 && this.timer === null) this.pump();
  }

  private pump(): void {
    this.busy = true;
    try {
      this.serve();
    } catch (e) {
      this.busy = false;
      this.rescue();
      throw e;
    }
    this.busy = false;
  }

  /** After a `go` threw: make sure what waits is still served. */
  private rescue(): void {
    if (this.heap.length > 0 && this.timer === null) this.arm(1);
  }

  /** Grants head requests in tag order while the bucket allows; otherwise arms the timer. */
  private serve(): void {
    const heap = this.heap;
    while (heap.length > 0) {
      const f = heap[0]!;
      const bytes = f.sizes[f.head]!;
      if (!this.unlimited) {
        const need = Math.min(bytes, this.half);
        if (this.tokens + EPS < need) {
          this.refill();
          if (this.tokens + EPS < need) {
            this.arm((need - this.tokens) / this.rate);
            return;
          }
        }
        const queuedAt = f.queuedAt[f.head]!;
        if (queuedAt >= 0 && this.lateDrop(f, queuedAt)) {
          // As fq_codel: a dropped packet costs its flow no share (its tags give the bytes back)
          // and the bucket keeps its tokens for the next packet.
          this.popHead(f, bytes, false);
          this.lateDropped++;
          this.lateDroppedBytes += bytes;
          this.onLateDrop?.(f.id, bytes);
          continue;
        }
        this.tokens -= bytes;
      }
      this.grantedBytes += bytes;
      this.popHead(f, bytes, true)();
    }
  }

  /** Takes the head request of the head flow out of the queue; its `go`. `sent`: it used its share. */
  private popHead(f: Flow, bytes: number, sent: boolean): Go {
    const go = f.gos[f.head]!;
    f.gos[f.head] = undefined;
    f.head++;
    f.queued -= bytes;
    this.queuedBytes -= bytes;
    const start = f.start;
    if (!sent) f.finish -= bytes;
    if (f.head === f.sizes.length) {
      f.sizes.length = 0;
      f.gos.length = 0;
      f.queuedAt.length = 0;
      f.head = 0;
      this.heapRemove(0);
    } else {
      if (f.head >= 1024 && f.head * 2 >= f.sizes.length) {
        f.sizes.splice(0, f.head);
        f.gos.splice(0, f.head);
        f.queuedAt.splice(0, f.head);
        f.head = 0;
      }
      if (sent) {
        f.start = start + bytes;
        f.seq = ++this.seq;
        this.down(0);
      }
    }
    if (sent) this.advance(start);
    return go;
  }

  /**
   * CoDel's dequeue (RFC 8289 §5.5) for the flow's head packet, about to leave: whether to drop
   * it instead. Enters the dropping state once the sojourn time has stayed above the target for
   * an interval; in it, drops one packet at each control-law time (interval / sqrt(count)) while
   * the sojourn stays above; a count kept from a dropping state left less than 16 intervals ago
   * starts the next one where it was (the queue came back: drop faster).
   */
  private lateDrop(f: Flow, queuedAt: number): boolean {
    const now = this.clock.now();
    f.codel ??= new Codel();
    const c = f.codel;
    const okToDrop = this.standingQueue(c, now - queuedAt, f.queued, now);
    if (c.dropping) {
      if (!okToDrop) {
        c.dropping = false;
        return false;
      }
      if (now < c.dropNextAt) return false;
      c.count++;
      c.dropNextAt = this.controlLaw(c.dropNextAt, c.count);
      return true;
    }
    if (!okToDrop) return false;
    c.dropping = true;
    const delta = c.count - c.lastCount;
    c.count = delta > 1 && now - c.dropNextAt < 16 * this.codelInterval ? delta : 1;
    c.dropNextAt = this.controlLaw(now, c.count);
    c.lastCount = c.count;
    return true;
  }

  /** RFC 8289's ok_to_drop: above target for at least an interval, with more than a packet queued. */
  private standingQueue(c: Codel, sojournMs: number, queuedBytes: number, now: number): boolean {
    if (sojournMs < this.codelTarget || queuedBytes <= this.maxPacket) {
      c.firstAboveAt = null;
      return false;
    }
    if (c.firstAboveAt === null) {
      c.firstAboveAt = now + this.codelInterval;
      return false;
    }
    return now >= c.firstAboveAt;
  }

  private controlLaw(at: number, count: number): number {
    return at + this.codelInterval / Math.sqrt(count);
  }

  private arm(waitMs: number): void {
    this.cancelTimer();
    const ms = Math.max(1, Math.ceil(waitMs - 1e-9));
    this.timer = this.clock.setTimer(ms, () => {
      this.timer = null;
      if (!this.busy) this.pump();
    });
  }

  private cancelTimer(): void {
    if (this.timer !== null) {
      this.timer.cancel();
      this.timer = null;
    }
  }

  // ---- binary heap of flows by (start, seq) ----

  private static before(a: Flow, b: Flow): boolean {
    return a.start < b.start || (a.start === b.start && a.seq < b.seq);
  }

  private heapPush(f: Flow): void {
    f.hi = this.heap.length;
    this.heap.push(f);
    this.up(f.hi);
  }

  private heapRemove(i: number): void {
    const heap = this.heap;
    const f = heap[i]!;
    const last = heap.pop()!;
    f.hi = -1;
    if (last !== f) {
      heap[i] = last;
      last.hi = i;
      this.down(i);
      this.up(last.hi);
    }
  }

  private up(i: number): void {
    const heap = this.heap;
    const f = heap[i]!;
    while (i > 0) {
      const p = (i - 1) >> 1;
      const pf = heap[p]!;
      if (!FairShaper.before(f, pf)) break;
      heap[i] = pf;
      pf.hi = i;
      i = p;
    }
    heap[i] = f;
    f.hi = i;
  }

  private down(i: number): void {
    const heap = this.heap;
    const n = heap.length;
    const f = heap[i]!;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && FairShaper.before(heap[r]!, heap[l]!) ? r : l;
      const cf = heap[c]!;
      if (!FairShaper.before(cf, f)) break;
      heap[i] = cf;
      cf.hi = i;
      i = c;
    }
    heap[i] = f;
    f.hi = i;
  }
}
