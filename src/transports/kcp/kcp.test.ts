import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import { prng, SEED } from '../../../test/helpers/seeded-random.js';
import {
  checkKcpParams,
  DEFAULT_KCP_PARAMS,
  KCP_CMD_ACK,
  KCP_CMD_PUSH,
  KCP_CMD_WASK,
  KCP_CMD_WINS,
  KCP_MAX_FRAGMENTS,
  KCP_OVERHEAD,
  type KcpParams,
  KcpSession,
} from './kcp.js';

// ---------------------------------------------------------------- an in-memory link with a fake clock

type Side = 'a' | 'b';

interface Link {
  /** Probability that a datagram is dropped. */
  loss: number;
  /** Probability that a datagram is delivered twice. */
  dup: number;
  /** Probability that a datagram gets an extra random delay of up to jitterMs (so it is reordered). */
  reorder: number;
  delayMs: number;
  jitterMs: number;
}

const CLEAN: Link = { loss: 0, dup: 0, reorder: 0, delayMs: 5, jitterMs: 0 };

/** One segment as the test decodes it from the wire, independently of the engine. */
interface WireSegment {
  conv: number;
  cmd: number;
  frg: number;
  wnd: number;
  ts: number;
  sn: number;
  una: number;
  len: number;
}

function decode(dg: Buffer): WireSegment[] {
  const out: WireSegment[] = [];
  for (let off = 0; off + KCP_OVERHEAD <= dg.length; ) {
    const seg = {
      conv: dg.readUInt32LE(off),
      cmd: dg[off + 4]!,
      frg: dg[off + 5]!,
      wnd: dg.readUInt16LE(off + 6),
      ts: dg.readUInt32LE(off + 8),
      sn: dg.readUInt32LE(off + 12),
      una: dg.readUInt32LE(off + 16),
      len: dg.readUInt32LE(off + 20),
    };
    out.push(seg);
    off += KCP_OVERHEAD + seg.len;
  }
  return out;
}

/**
 * Two sessions a and b and the datagrams between them, delivered in whole simulated milliseconds.
 * step() advances the clock by 1 ms, delivers what is due, then calls update() on both (as a 1 ms
 * timer would). Every datagram is copied when output (the engine reuses its buffer), then shown to
 * `tap`, then `filter` may drop it, then the link's loss, duplication and delay apply.
 */
class Sim {
  now: number;
  readonly a: KcpSession;
  readonly b: KcpSession;
  tap: ((from: Side, dg: Buffer, now: number) => void) | undefined;
  filter: ((from: Side, dg: Buffer, now: number) => boolean) | undefined;
  private readonly due = new Map<number, { to: Side; data: Buffer }[]>();

  constructor(
    readonly link: Link,
    private readonly rand: () => number,
    params: Partial<KcpParams>,
    options: { paramsB?: Partial<KcpParams>; startMs?: number; conv?: number } = {},
  ) {
    this.now = options.startMs ?? 1_000;
    const conv = options.conv ?? 0x1234_5678;
    this.a = new KcpSession(conv, (dg) => this.transmit('a', dg), params);
    this.b = new KcpSession(conv, (dg) => this.transmit('b', dg), options.paramsB ?? params);
  }

  private transmit(from: Side, view: Buffer): void {
    assert.ok(view.length > 0);
    const dg = Buffer.from(view);
    this.tap?.(from, dg, this.now);
    if (this.filter?.(from, dg, this.now)) return;
    const to: Side = from === 'a' ? 'b' : 'a';
    if (this.rand() < this.link.loss) return;
    this.schedule(to, dg);
    if (this.rand() < this.link.dup) this.schedule(to, dg);
  }

  private schedule(to: Side, data: Buffer): void {
    let delay = this.link.delayMs;
    if (this.rand() < this.link.reorder) delay += Math.floor(this.rand() * this.link.jitterMs);
    const at = this.now + Math.max(1, delay);
    let bucket = this.due.get(at);
    if (bucket === undefined) {
      bucket = [];
      this.due.set(at, bucket);
    }
    bucket.push({ to, data });
  }

  /** Datagrams still on the wire. */
  inFlight(): number {
    let n = 0;
    for (const bucket of this.due.values()) n += bucket.length;
    return n;
  }

  /** When the next datagram arrives, or undefined. */
  nextArrival(): number | undefined {
    let next: number | undefined;
    for (const at of this.due.keys()) if (next === undefined || at < next) next = at;
    return next;
  }

  deliverDue(): void {
    const bucket = this.due.get(this.now);
    if (bucket === undefined) return;
    this.due.delete(this.now);
    for (const { to, data } of bucket) {
      const result = (to === 'a' ? this.a : this.b).input(data, this.now);
      assert.equal(result, 'ok');
    }
  }

  step(): void {
    this.now += 1;
    this.deliverDue();
    this.a.update(this.now);
    this.b.update(this.now);
  }

  run(ms: number): void {
    for (let i = 0; i < ms; i++) this.step();
  }
}

const sha256 = (parts: Buffer[]) => {
  const h = createHash('sha256');
  for (const p of parts) h.update(p);
  return h.digest('hex');
};

/** Sends `messages` from a to b (a keeps at most `cap` segments waiting) and collects what b receives. */
function transferMessages(sim: Sim, messages: Buffer[], limitMs = 600_000, cap = 2048) {
  const start = sim.now;
  const received: Buffer[] = [];
  let next = 0;
  while (received.length < messages.length) {
    while (next < messages.length && sim.a.waitSnd() < cap) sim.a.send(messages[next++]!);
    sim.step();
    for (let m = sim.b.recv(); m !== null; m = sim.b.recv()) received.push(m);
    if (sim.now - start > limitMs) {
      assert.fail(`transfer incomplete after ${limitMs} ms: ${received.length}/${messages.length} messages`);
    }
  }
  return { received, ms: sim.now - start };
}

/** Writes `chunks` into a stream-mode a and collects b's stream until `total` bytes arrived. */
function transferStream(sim: Sim, chunks: Buffer[], limitMs = 600_000) {
  const total = chunks.reduce((n, c) => n + c.length, 0);
  const start = sim.now;
  const received: Buffer[] = [];
  let got = 0;
  let next = 0;
  while (got < total) {
    while (next < chunks.length && sim.a.waitSnd() < 2048) sim.a.send(chunks[next++]!);
    sim.step();
    for (let m = sim.b.recv(); m !== null; m = sim.b.recv()) {
      received.push(m);
      got += m.length;
    }
    if (sim.now - start > limitMs)
      assert.fail(`stream incomplete after ${limitMs} ms: ${got}/${total} bytes`);
  }
  assert.equal(got, total);
  return { received, ms: sim.now - start };
}

/** Message sizes from 0 bytes to 255 fragments: the edges, then random ones. */
function messageSizes(rand: () => number, mss: number, count: number): number[] {
  const sizes = [
    0,
    1,
    2,
    mss - 1,
    mss,
    mss + 1,
    2 * mss,
    KCP_MAX_FRAGMENTS * mss,
    (KCP_MAX_FRAGMENTS - 1) * mss + 1,
  ];
  for (let i = 0; i < count; i++) {
    const max = rand() < 0.05 ? KCP_MAX_FRAGMENTS * mss : 4 * mss;
    sizes.push(1 + Math.floor(rand() * max));
  }
  return sizes;
}

function assertSameMessages(received: Buffer[], sent: Buffer[]): void {
  assert.deepEqual(
    received.map((m) => m.length),
    sent.map((m) => m.length),
  );
  assert.equal(sha256(received), sha256(sent));
}

const FAST: Partial<KcpParams> = { nodelay: true, interval: 10, resend: 2, noCongestionControl: true };
/** ikcp's defaults: no nodelay, 100 ms interval, no fast resend, congestion control on. */
const NORMAL: Partial<KcpParams> = { nodelay: false, interval: 100, resend: 0, noCongestionControl: false };

describe(`KcpSession (seed ${SEED})`, { timeout: 120_000 }, () => {
  describe('round trips over a lossy, duplicating, reordering link', () => {
    const cases: { name: string; link: Link }[] = [
      { name: '0 % loss, 5 % duplicates, 5 ms delay', link: { ...CLEAN, dup: 0.05 } },
      {
        name: '5 % loss, duplicates, reordering, 5..25 ms delay',
        link: { loss: 0.05, dup: 0.02, reorder: 0.2, delayMs: 5, jitterMs: 20 },
      },
      {
        name: '20 % loss, duplicates, reordering, 10..40 ms delay',
        link: { loss: 0.2, dup: 0.05, reorder: 0.3, delayMs: 10, jitterMs: 30 },
      },
    ];
    for (const [i, { name, link }] of cases.entries()) {
      it(`message mode, 0 bytes .. 255 fragments, byte-exact: ${name}`, () => {
        const rand = prng(SEED + i);
        const sim = new Sim(link, rand, FAST);
        const messages = messageSizes(rand, sim.a.mss, 150).map((n) => randomBytes(n));
        const { received } = transferMessages(sim, messages);
        assertSameMessages(received, messages);
        assert.equal(sim.b.recv(), null);
        if (link.loss === 0) {
          assert.equal(sim.a.stats.retransmissions, 0);
          assert.equal(sim.a.stats.lostSegments, 0);
          assert.ok(sim.b.stats.duplicateSegments > 0, 'duplicated datagrams reached the receiver');
        } else {
          assert.ok(sim.a.stats.retransmissions > 0, 'the loss hit the transfer');
          assert.equal(
            sim.a.stats.retransmissions,
            sim.a.stats.lostSegments + sim.a.stats.fastRetransmissions,
            'retransmissions are RTO expiries plus fast retransmissions',
          );
        }
        assert.ok(sim.a.stats.rttMs >= 2 * link.delayMs, `srtt ${sim.a.stats.rttMs} ms`);
        assert.equal(sim.a.dead(), false);
      });

      it(`stream mode, random writes of 1..600 bytes, byte-exact: ${name}`, () => {
        const rand = prng(SEED + 100 + i);
        const sim = new Sim(link, rand, { ...FAST, stream: true });
        const chunks: Buffer[] = [];
        for (let total = 0; total < 1_500_000; ) {
          const chunk = randomBytes(1 + Math.floor(rand() * 600));
          chunks.push(chunk);
          total += chunk.length;
        }
        const { received } = transferStream(sim, chunks);
        assert.equal(sha256(received), sha256(chunks));
        // Small writes were merged into full segments rather than sent one segment each.
        const total = chunks.reduce((n, c) => n + c.length, 0);
        const firstSends = sim.a.stats.segmentsSent - sim.a.stats.retransmissions;
        assert.ok(firstSends < chunks.length / 2, `${firstSends} segments for ${chunks.length} writes`);
        assert.ok(firstSends >= Math.ceil(total / sim.a.mss));
        if (link.loss === 0) assert.equal(sim.a.stats.retransmissions, 0);
        else assert.ok(sim.a.stats.retransmissions > 0);
      });
    }

    it('both directions at once at 5 % loss, messages one way and back', () => {
      const rand = prng(SEED + 7);
      const sim = new Sim({ loss: 0.05, dup: 0.01, reorder: 0.1, delayMs: 3, jitterMs: 10 }, rand, FAST);
      const toB = messageSizes(rand, sim.a.mss, 60).map((n) => randomBytes(n));
      const toA = messageSizes(rand, sim.a.mss, 60).map((n) => randomBytes(n));
      const gotB: Buffer[] = [];
      const gotA: Buffer[] = [];
      let nb = 0;
      let na = 0;
      while (gotB.length < toB.length || gotA.length < toA.length) {
        while (nb < toB.length && sim.a.waitSnd() < 2048) sim.a.send(toB[nb++]!);
        while (na < toA.length && sim.b.waitSnd() < 2048) sim.b.send(toA[na++]!);
        sim.step();
        for (let m = sim.b.recv(); m !== null; m = sim.b.recv()) gotB.push(m);
        for (let m = sim.a.recv(); m !== null; m = sim.a.recv()) gotA.push(m);
        assert.ok(sim.now < 600_000, 'bidirectional transfer incomplete');
      }
      assertSameMessages(gotB, toB);
      assertSameMessages(gotA, toA);
      assert.ok(sim.a.stats.retransmissions > 0 && sim.b.stats.retransmissions > 0);
    });

    it('driven only by check() (an event timer) instead of a 1 ms tick', () => {
      const rand = prng(SEED + 8);
      const sim = new Sim({ loss: 0.05, dup: 0, reorder: 0, delayMs: 7, jitterMs: 0 }, rand, FAST);
      const messages = messageSizes(rand, sim.a.mss, 80).map((n) => randomBytes(n));
      const received: Buffer[] = [];
      let next = 0;
      let wakeups = 0;
      sim.a.update(sim.now);
      sim.b.update(sim.now);
      while (received.length < messages.length) {
        while (next < messages.length && sim.a.waitSnd() < 2048) sim.a.send(messages[next++]!);
        const checkA = sim.a.check(sim.now);
        const checkB = sim.b.check(sim.now);
        assert.ok(checkA > sim.now && checkA <= sim.now + 10, `check ${checkA - sim.now} ms ahead`);
        const at = Math.min(checkA, checkB, sim.nextArrival() ?? Number.POSITIVE_INFINITY);
        sim.now = at;
        sim.deliverDue();
        if (at >= checkA) sim.a.update(at);
        if (at >= checkB) sim.b.update(at);
        for (let m = sim.b.recv(); m !== null; m = sim.b.recv()) received.push(m);
        wakeups++;
        assert.ok(sim.now < 600_000);
      }
      assertSameMessages(received, messages);
      assert.ok(wakeups > 0);
    });

    it('empty messages are messages; peekSize reports the next whole message only', () => {
      const sim = new Sim(CLEAN, prng(SEED), FAST);
      const big = randomBytes(3 * sim.a.mss + 5);
      sim.a.send(Buffer.alloc(0));
      sim.a.send(big);
      assert.equal(sim.b.peekSize(), -1);
      sim.run(30);
      assert.equal(sim.b.peekSize(), 0);
      assert.deepEqual(sim.b.recv(), Buffer.alloc(0));
      assert.equal(sim.b.peekSize(), big.length);
      assert.deepEqual(sim.b.recv(), big);
      assert.equal(sim.b.peekSize(), -1);
      assert.equal(sim.b.recv(), null);
    });

    it('send(): 255 fragments fit, 256 throw RangeError; stream mode takes any size', () => {
      const s = new KcpSession(1, () => {}, FAST);
      s.send(Buffer.alloc(KCP_MAX_FRAGMENTS * s.mss));
      assert.equal(s.waitSnd(), KCP_MAX_FRAGMENTS);
      assert.throws(() => s.send(Buffer.alloc(KCP_MAX_FRAGMENTS * s.mss + 1)), RangeError);
      assert.equal(s.waitSnd(), KCP_MAX_FRAGMENTS, 'a refused message queues nothing');
      const st = new KcpSession(1, () => {}, { ...FAST, stream: true });
      st.send(Buffer.alloc(1000 * st.mss));
      assert.equal(st.waitSnd(), 1000);
      assert.throws(() => new KcpSession(1, () => {}, { mtu: 40 }), RangeError);
      assert.throws(() => new KcpSession(2 ** 32, () => {}), RangeError);
    });

    it('checkKcpParams refuses what the constructor refuses, with its message, and fills the defaults', () => {
      const bad: Partial<KcpParams>[] = [
        { mtu: 40 },
        { mtu: 1350.5 },
        { interval: Number.NaN },
        { resend: -1 },
        { sndWnd: 0 },
        { rcvWnd: 65_536 },
        { minRtoMs: 0 },
        { deadLink: 0 },
        { fastLimit: 1.5 },
        { initialSn: 2 ** 32 },
      ];
      for (const params of bad) {
        const refusal = (check: () => unknown): string => {
          try {
            check();
          } catch (err) {
            assert.ok(err instanceof RangeError, JSON.stringify(params));
            return err.message;
          }
          assert.fail(`${JSON.stringify(params)} was taken`);
        };
        assert.equal(
          refusal(() => checkKcpParams(params)),
          refusal(() => new KcpSession(1, () => {}, params)),
        );
      }
      assert.deepEqual(checkKcpParams(), { ...DEFAULT_KCP_PARAMS, minRtoMs: 30 });
      assert.deepEqual(checkKcpParams({ interval: 1, rcvWnd: 1, nodelay: false }), {
        ...DEFAULT_KCP_PARAMS,
        interval: 10,
        rcvWnd: KCP_MAX_FRAGMENTS + 1,
        nodelay: false,
        minRtoMs: 100,
      });
    });
  });

  describe('fast retransmit', () => {
    /** a sends one segment every 2 ms; the first transmission of sn 3 is dropped. */
    function oneLoss(resend: number) {
      const sim = new Sim(CLEAN, prng(SEED), { ...FAST, resend });
      let dropped = 0;
      sim.filter = (from, dg) => {
        if (from !== 'a' || dropped > 0) return false;
        if (!decode(dg).some((s) => s.cmd === KCP_CMD_PUSH && s.sn === 3)) return false;
        dropped++;
        return true;
      };
      const messages = Array.from({ length: 60 }, () => randomBytes(500));
      const received: Buffer[] = [];
      for (let i = 0; received.length < messages.length; i++) {
        if (i % 2 === 0 && i / 2 < messages.length) sim.a.send(messages[i / 2]!);
        sim.step();
        for (let m = sim.b.recv(); m !== null; m = sim.b.recv()) received.push(m);
        assert.ok(i < 10_000);
      }
      assert.equal(dropped, 1);
      assertSameMessages(received, messages);
      return sim.a.stats;
    }

    it('fires when one segment is lost and later ones arrive, before any RTO', () => {
      const stats = oneLoss(2);
      assert.ok(stats.fastRetransmissions >= 1, `${stats.fastRetransmissions} fast retransmissions`);
      assert.equal(stats.lostSegments, 0, 'recovered before the RTO');
    });

    it('resend 0 turns it off: the RTO recovers instead', () => {
      const stats = oneLoss(0);
      assert.equal(stats.fastRetransmissions, 0);
      assert.ok(stats.lostSegments >= 1);
    });
  });

  describe('window control', () => {
    it('a receiver that does not read stops the sender at rcv_wnd; WASK/WINS probing recovers', () => {
      const rcvWnd = 256;
      const sim = new Sim(CLEAN, prng(SEED), { ...FAST, sndWnd: 1024, rcvWnd });
      const pushSns = new Set<number>();
      let resumedAt = -1; // when a first sent a segment beyond the first rcv_wnd
      const cmds: { from: Side; cmd: number; wnd: number; at: number }[] = [];
      sim.tap = (from, dg, now) => {
        for (const s of decode(dg)) {
          if (from === 'a' && s.cmd === KCP_CMD_PUSH) {
            pushSns.add(s.sn);
            if (s.sn >= rcvWnd && resumedAt < 0) resumedAt = now;
          }
          if (s.cmd === KCP_CMD_WASK || s.cmd === KCP_CMD_WINS)
            cmds.push({ from, cmd: s.cmd, wnd: s.wnd, at: now });
        }
      };
      const messages = Array.from({ length: 2000 }, () => randomBytes(100));
      for (const m of messages) sim.a.send(m);
      const t0 = sim.now;

      // Nobody reads b: a puts exactly rcv_wnd segments on the wire, then waits.
      sim.run(1_000);
      assert.equal(pushSns.size, rcvWnd);
      assert.equal(sim.a.waitSnd(), messages.length - rcvWnd, 'all sent segments were acked, the rest wait');
      assert.equal(cmds.length, 0);
      sim.run(5_000);
      assert.equal(pushSns.size, rcvWnd, 'the zero window holds the sender');
      assert.equal(sim.a.stats.retransmissions, 0);

      // After 7 s of a zero window a asks (WASK); b tells (WINS) that it is still full.
      sim.run(2_500);
      const firstAsk = cmds.find((c) => c.cmd === KCP_CMD_WASK);
      assert.ok(firstAsk !== undefined && firstAsk.from === 'a', 'a probed the window');
      assert.ok(firstAsk.at - t0 >= 7_000 && firstAsk.at - t0 < 7_100, `probe at ${firstAsk.at - t0} ms`);
      const tell = cmds.find((c) => c.cmd === KCP_CMD_WINS);
      assert.ok(tell !== undefined && tell.from === 'b' && tell.wnd === 0, 'b answered: still full');
      assert.equal(pushSns.size, rcvWnd);

      // b reads everything; its "room again" WINS is lost, so only the next probe can unblock a.
      let dropTells = 1;
      sim.filter = (from, dg) => {
        if (from === 'b' && dropTells > 0 && decode(dg).some((s) => s.cmd === KCP_CMD_WINS)) {
          dropTells--;
          return true;
        }
        return false;
      };
      const received: Buffer[] = [];
      for (let m = sim.b.recv(); m !== null; m = sim.b.recv()) received.push(m);
      assert.equal(received.length, rcvWnd);
      const readAt = sim.now;
      while (received.length < messages.length) {
        sim.step();
        for (let m = sim.b.recv(); m !== null; m = sim.b.recv()) received.push(m);
        assert.ok(sim.now - readAt < 30_000, 'the window probe did not recover the session');
      }
      assert.equal(dropTells, 0, 'the recovering WINS was sent (and dropped)');
      // Only the second probe, 7 s x 1.5 after the first, got the flow going again.
      const secondAsk = cmds.filter((c) => c.cmd === KCP_CMD_WASK)[1];
      assert.ok(secondAsk !== undefined && secondAsk.from === 'a', 'a second probe followed');
      const gap = secondAsk.at - firstAsk.at;
      assert.ok(Math.abs(gap - 10_500) <= 10, `second probe ${gap} ms after the first`);
      assert.ok(
        resumedAt > secondAsk.at && resumedAt - secondAsk.at < 50,
        'the answer to it resumed the flow',
      );
      const tells = cmds.filter(
        (c) => c.cmd === KCP_CMD_WINS && c.from === 'b' && c.wnd > 0 && c.at > readAt,
      );
      assert.ok(tells.length >= 2, 'b told its window on read (lost) and in answer to the probe');
      assertSameMessages(received, messages);
      assert.ok(sim.a.stats.windowProbesSent >= 2);
      assert.ok(sim.b.stats.windowTellsSent >= 3);
    });

    it('the send window limits segments in flight when the receiver has room', () => {
      const sim = new Sim({ ...CLEAN, delayMs: 50 }, prng(SEED), { ...FAST, sndWnd: 32, rcvWnd: 1024 });
      let maxInFlight = 0;
      sim.tap = (from, dg) => {
        for (const s of decode(dg)) {
          if (from === 'a' && s.cmd === KCP_CMD_PUSH) maxInFlight = Math.max(maxInFlight, sim.inFlight() + 1);
        }
      };
      const messages = Array.from({ length: 300 }, () => randomBytes(1000));
      const { received } = transferMessages(sim, messages);
      assertSameMessages(received, messages);
      assert.ok(maxInFlight <= 32 + 32, `${maxInFlight} datagrams on the wire`); // data + its acks
    });
  });

  describe('parameters change behaviour measurably', () => {
    /** Times (relative to the first) at which a puts sn 0 on a link that drops everything. */
    function retransmitTimes(params: Partial<KcpParams>, count: number): number[] {
      const sim = new Sim(CLEAN, prng(SEED), { ...params, deadLink: 100 });
      const times: number[] = [];
      sim.tap = (from, dg, now) => {
        if (from === 'a' && decode(dg).some((s) => s.cmd === KCP_CMD_PUSH && s.sn === 0)) times.push(now);
      };
      sim.filter = () => true;
      sim.a.send(Buffer.from('x'));
      while (times.length < count) sim.step();
      return times.map((t) => t - times[0]!);
    }

    it('nodelay: RTO backoff x1.5 instead of x2 (and no rto/8 on the first send)', () => {
      const fast = retransmitTimes({ ...FAST }, 6);
      const slow = retransmitTimes({ ...FAST, nodelay: false }, 6);
      // 200 ms initial RTO, flushes on a 10 ms grid.
      assert.deepEqual(fast.slice(0, 4), [0, 200, 500, 950]);
      assert.deepEqual(slow.slice(0, 4), [0, 230, 630, 1430]);
      // Ratios of successive gaps from the second gap on (the first one of `slow` includes rto/8).
      const ratios = (t: number[]) => t.slice(3).map((x, i) => (x - t[i + 2]!) / (t[i + 2]! - t[i + 1]!));
      for (const r of ratios(fast)) assert.ok(Math.abs(r - 1.5) < 0.05, `nodelay ratio ${r}`);
      for (const r of ratios(slow)) assert.ok(Math.abs(r - 2) < 0.05, `normal ratio ${r}`);
    });

    it('nodelay: minimum RTO 30 ms instead of 100 ms (minRtoMs overrides)', () => {
      const rto = (params: Partial<KcpParams>) => {
        const sim = new Sim({ ...CLEAN, delayMs: 1 }, prng(SEED), params);
        transferMessages(
          sim,
          Array.from({ length: 50 }, () => randomBytes(2000)),
        );
        sim.run(200); // the last acks
        return sim.a.stats.rtoMs;
      };
      const fast = rto(FAST);
      assert.ok(fast >= 30 && fast < 100, `nodelay rto ${fast}`);
      assert.equal(rto({ ...FAST, nodelay: false }), 100);
      assert.equal(rto({ ...FAST, minRtoMs: 70 }), 70);
    });

    it('interval: a 10 ms grid delivers small messages sooner than a 100 ms grid', () => {
      const latency = (interval: number) => {
        const rand = prng(SEED + 3);
        const sim = new Sim(CLEAN, rand, { ...FAST, interval });
        let total = 0;
        for (let i = 0; i < 40; i++) {
          sim.run(Math.floor(rand() * 200));
          const sentAt = sim.now;
          sim.a.send(Buffer.from(`message ${i}`));
          while (sim.b.recv() === null) sim.step();
          total += sim.now - sentAt;
        }
        return total / 40;
      };
      const fine = latency(10);
      const coarse = latency(100);
      assert.ok(fine < 20, `mean latency ${fine} ms at 10 ms interval`);
      assert.ok(coarse > 2.5 * fine, `mean latency ${coarse} ms at 100 ms interval vs ${fine}`);
    });

    it('noCongestionControl: the first flush sends the whole remote window instead of cwnd = 1', () => {
      const firstFlush = (noCongestionControl: boolean) => {
        let pushes = 0;
        const s = new KcpSession(
          9,
          (dg) => {
            pushes += decode(dg).filter((x) => x.cmd === KCP_CMD_PUSH).length;
          },
          { ...FAST, noCongestionControl },
        );
        for (let i = 0; i < 500; i++) s.send(Buffer.alloc(100));
        s.update(0);
        return pushes;
      };
      assert.equal(firstFlush(true), 128, "ikcp's initial remote window");
      assert.equal(firstFlush(false), 1);
    });

    it('time to deliver 2 MB at 5 % loss: nodelay + resend 2 + no cwnd beats ikcp defaults, nodelay and no cwnd each help', () => {
      // A 128-segment window makes the transfer span many round trips, so many losses count.
      const time = (params: Partial<KcpParams>) => {
        const rand = prng(SEED + 5);
        const sim = new Sim({ loss: 0.05, dup: 0, reorder: 0, delayMs: 20, jitterMs: 0 }, rand, {
          sndWnd: 128,
          rcvWnd: 256,
          ...params,
        });
        const messages = Array.from({ length: 1600 }, () => randomBytes(1300));
        const { received, ms } = transferMessages(sim, messages);
        assertSameMessages(received, messages);
        return ms;
      };
      const fast = time(FAST);
      const normal = time(NORMAL);
      const withCwnd = time({ ...FAST, noCongestionControl: false });
      const noNodelay = time({ ...FAST, nodelay: false });
      assert.ok(fast * 3 < normal, `fast ${fast} ms vs ikcp defaults ${normal} ms`);
      assert.ok(fast * 3 < withCwnd, `no cwnd ${fast} ms vs cwnd ${withCwnd} ms`);
      assert.ok(fast < noNodelay, `nodelay ${fast} ms vs not ${noNodelay} ms`);
    });

    it('resend 2 vs 0 at 5 % loss: fast retransmit recovers a steady flow sooner than the RTO', () => {
      // nodelay off: the RTO is at least 100 ms against a 40 ms RTT, so the fast path has room to act.
      // (With nodelay on, rto = srtt + interval fires at the same flush as the second skip would.)
      const latency = (resend: number) => {
        const rand = prng(SEED + 6);
        const sim = new Sim({ loss: 0.05, dup: 0, reorder: 0, delayMs: 20, jitterMs: 0 }, rand, {
          ...FAST,
          nodelay: false,
          resend,
        });
        const sentAt: number[] = [];
        let got = 0;
        let sum = 0;
        while (got < 2000) {
          if (sentAt.length < 2000) {
            sim.a.send(Buffer.alloc(1000, sentAt.length));
            sentAt.push(sim.now);
          }
          sim.step();
          for (let m = sim.b.recv(); m !== null; m = sim.b.recv()) {
            assert.equal(m[0], got & 0xff);
            sum += sim.now - sentAt[got++]!;
          }
        }
        return { mean: sum / 2000, fast: sim.a.stats.fastRetransmissions, rto: sim.a.stats.lostSegments };
      };
      const on = latency(2);
      const off = latency(0);
      assert.ok(on.fast > on.rto, `resend 2: ${on.fast} fast retransmissions, ${on.rto} RTO expiries`);
      assert.ok(off.fast === 0 && off.rto > 0);
      assert.ok(
        on.mean < 0.75 * off.mean,
        `mean latency ${on.mean} ms with resend 2 vs ${off.mean} ms without`,
      );
    });
  });

  describe('hostile input', () => {
    /** One datagram a sent to b (PUSH with data), to mangle. */
    function sample(): Buffer {
      let captured: Buffer | undefined;
      const s = new KcpSession(
        0x1234_5678,
        (dg) => {
          captured ??= Buffer.from(dg);
        },
        FAST,
      );
      s.send(Buffer.from('hello, hostile world'));
      s.flush(5);
      return captured!;
    }

    function garbage(valid: Buffer, rand: () => number): { name: string; data: unknown; expect: string }[] {
      const wrongConv = Buffer.from(valid);
      wrongConv.writeUInt32LE(0x1234_5679, 0);
      const longLen = Buffer.from(valid);
      longLen.writeUInt32LE(valid.length - KCP_OVERHEAD + 1, 20);
      const hugeLen = Buffer.from(valid);
      hugeLen.writeUInt32LE(0xffff_ffff, 20);
      const badCmd = Buffer.from(valid);
      badCmd[4] = 85;
      const zeroCmd = Buffer.from(valid);
      zeroCmd[4] = 0;
      const ackWithData = Buffer.from(valid);
      ackWithData[4] = KCP_CMD_ACK;
      const out = [
        { name: 'empty', data: Buffer.alloc(0), expect: 'malformed' },
        { name: 'truncated header', data: valid.subarray(0, 10), expect: 'malformed' },
        { name: 'header only, data cut', data: valid.subarray(0, valid.length - 1), expect: 'malformed' },
        { name: 'len beyond the datagram', data: longLen, expect: 'malformed' },
        { name: 'len 2^32-1', data: hugeLen, expect: 'malformed' },
        { name: 'wrong conv', data: wrongConv, expect: 'bad_conv' },
        { name: 'unknown cmd 85', data: badCmd, expect: 'malformed' },
        { name: 'cmd 0', data: zeroCmd, expect: 'malformed' },
        { name: 'ACK carrying data', data: ackWithData, expect: 'malformed' },
        {
          name: 'valid segment + 10 stray bytes',
          data: Buffer.concat([valid, randomBytes(10)]),
          expect: 'malformed',
        },
        { name: 'valid segment + foreign conv', data: Buffer.concat([valid, wrongConv]), expect: 'bad_conv' },
        { name: 'valid segment + truncated one', data: Buffer.concat([valid, longLen]), expect: 'malformed' },
        { name: 'a string', data: 'not a buffer', expect: 'malformed' },
        { name: 'null', data: null, expect: 'malformed' },
      ];
      for (let i = 0; i < 50; i++) {
        const junk = Buffer.alloc(Math.floor(rand() * 1500));
        for (let j = 0; j < junk.length; j++) junk[j] = Math.floor(rand() * 256);
        out.push({
          name: `random ${junk.length} bytes`,
          data: junk,
          expect: junk.length < 24 ? 'malformed' : 'any',
        });
      }
      return out;
    }

    /** A deterministic conversation; with `inject`, b is also fed garbage along the way. */
    function conversation(inject: boolean) {
      const rand = prng(SEED + 11);
      const junkRand = prng(SEED + 12);
      const sim = new Sim({ loss: 0.05, dup: 0.02, reorder: 0.1, delayMs: 4, jitterMs: 8 }, rand, FAST);
      const wire: string[] = [];
      sim.tap = (from, dg, now) => wire.push(`${now} ${from} ${dg.toString('hex')}`);
      const valid = sample();
      const cases = garbage(valid, junkRand);
      const messages = Array.from({ length: 40 }, (_, i) => Buffer.alloc(300 + i * 97, i));
      const received: Buffer[] = [];
      let next = 0;
      for (let step = 0; step < 3_000; step++) {
        if (step % 5 === 0 && next < messages.length) sim.a.send(messages[next++]!);
        if (inject && step % 50 === 25) {
          for (const c of cases) {
            const before = JSON.stringify(sim.b.stats);
            let result: string | undefined;
            assert.doesNotThrow(() => {
              result = sim.b.input(c.data as Buffer, sim.now);
            }, c.name);
            if (c.expect === 'any') assert.notEqual(result, 'ok', c.name);
            else assert.equal(result, c.expect, c.name);
            assert.equal(JSON.stringify(sim.b.stats), before, `${c.name}: stats unchanged`);
            assert.equal(sim.b.recv(), null, `${c.name}: nothing delivered`);
          }
        }
        sim.step();
        for (let m = sim.b.recv(); m !== null; m = sim.b.recv()) received.push(m);
      }
      return { wire, received, stats: sim.b.stats, messages };
    }

    it('garbage, truncated headers, len beyond the datagram, wrong conv: a code, no throw, no effect', () => {
      const clean = conversation(false);
      const attacked = conversation(true);
      assertSameMessages(clean.received, clean.messages);
      // The attacked session behaved exactly as the clean one: same datagrams, same deliveries.
      assert.deepEqual(attacked.wire, clean.wire);
      assert.deepEqual(attacked.stats, clean.stats);
      assertSameMessages(attacked.received, clean.messages);
    });

    it('never throws on 20,000 mutations of real datagrams', () => {
      const rand = prng(SEED + 13);
      const sim = new Sim(CLEAN, rand, FAST);
      const captured: Buffer[] = [];
      sim.tap = (_from, dg) => captured.push(dg);
      transferMessages(
        sim,
        Array.from({ length: 30 }, () => randomBytes(Math.floor(rand() * 4000))),
      );
      const victim = new KcpSession(0x1234_5678, () => {}, FAST);
      const counts = { ok: 0, bad_conv: 0, malformed: 0 };
      for (let i = 0; i < 20_000; i++) {
        const dg = Buffer.from(captured[Math.floor(rand() * captured.length)]!);
        const flips = 1 + Math.floor(rand() * 4);
        for (let f = 0; f < flips; f++) {
          const at = Math.floor(rand() * dg.length);
          dg[at] = dg[at]! ^ (1 << Math.floor(rand() * 8));
        }
        const cut = rand() < 0.2 ? dg.subarray(0, Math.floor(rand() * dg.length)) : dg;
        counts[victim.input(cut, i)]++;
        victim.update(i);
        for (let m = victim.recv(); m !== null; m = victim.recv());
      }
      assert.ok(counts.malformed > 0 && counts.bad_conv > 0 && counts.ok > 0, JSON.stringify(counts));
    });
  });

  describe('u32 wraparound', () => {
    it('sn and ts wrap past 2^32 during a lossy transfer', () => {
      const rand = prng(SEED + 21);
      const start = 2 ** 32 - 40;
      const sim = new Sim(
        { loss: 0.05, dup: 0.02, reorder: 0.1, delayMs: 5, jitterMs: 10 },
        rand,
        { ...FAST, initialSn: 2 ** 32 - 300 },
        { startMs: start },
      );
      const sns: number[] = [];
      const tss: number[] = [];
      sim.tap = (from, dg) => {
        for (const s of decode(dg)) {
          if (from === 'a' && s.cmd === KCP_CMD_PUSH) {
            sns.push(s.sn);
            tss.push(s.ts);
          }
        }
      };
      const messages = Array.from({ length: 600 }, () => randomBytes(1 + Math.floor(rand() * 3000)));
      const { received } = transferMessages(sim, messages);
      assertSameMessages(received, messages);
      assert.ok(sim.now > 2 ** 32, 'the clock passed 2^32');
      assert.ok(sns.some((sn) => sn >= 2 ** 32 - 300) && sns.some((sn) => sn < 300), 'sn wrapped');
      assert.ok(tss.some((ts) => ts >= start) && tss.some((ts) => ts < 1_000), 'ts wrapped');
      assert.ok(sim.a.stats.retransmissions > 0);
      assert.ok(
        sim.a.stats.rttMs >= 10 && sim.a.stats.rttMs < 100,
        `srtt ${sim.a.stats.rttMs} across the wrap`,
      );
      const at = sim.a.check(sim.now);
      assert.ok(at > sim.now && at <= sim.now + 10, 'check() answers in the caller clock after the wrap');
    });
  });

  describe('dead link', () => {
    it('a link that drops everything makes dead() true after deadLink transmissions', () => {
      const sim = new Sim(CLEAN, prng(SEED), { ...FAST, deadLink: 5 });
      let transmissions = 0;
      let deadAfter = -1;
      sim.tap = (from, dg) => {
        if (from === 'a' && decode(dg).some((s) => s.cmd === KCP_CMD_PUSH && s.sn === 0)) transmissions++;
      };
      sim.filter = () => true;
      sim.a.send(Buffer.from('anyone?'));
      for (let i = 0; i < 10_000 && deadAfter < 0; i++) {
        const before = transmissions;
        sim.step();
        if (sim.a.dead()) deadAfter = transmissions;
        else assert.ok(transmissions < 5, `still alive after ${transmissions}`);
        if (deadAfter >= 0) assert.equal(before, 4, 'it died on the transmission that made 5');
      }
      assert.equal(deadAfter, 5);
      assert.equal(sim.a.stats.lostSegments, 4);
      assert.equal(sim.b.dead(), false);
    });
  });
});
