import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { type Clock, FairShaper, realClock } from './shaper.js';

/** Bytes per millisecond at `mbps`. */
const perMs = (mbps: number) => (mbps * 1e6) / 8 / 1000;

interface Timer {
  at: number;
  seq: number;
  fn: () => void;
  live: boolean;
  shaper: boolean;
}

/**
 * Deterministic time: timers run in (time, creation) order when the test advances the clock. The
 * shaper's timers are told apart from the test's own, to check it never has more than one pending.
 */
class FakeClock {
  t = 0;
  private readonly heap: Timer[] = [];
  private seq = 0;
  shaperPending = 0;
  shaperMaxPending = 0;
  shaperArmed = 0;

  readonly clock: Clock = {
    now: () => this.t,
    setTimer: (ms, fn) => {
      assert.ok(ms >= 1 && Number.isFinite(ms), `timer of ${ms} ms`);
      this.shaperArmed++;
      this.shaperPending++;
      this.shaperMaxPending = Math.max(this.shaperMaxPending, this.shaperPending);
      const timer = this.push(ms, fn, true);
      return {
        cancel: () => {
          if (timer.live) {
            timer.live = false;
            this.shaperPending--;
          }
        },
      };
    },
  };

  /** A test's own event, `ms` from now. */
  later(ms: number, fn: () => void): void {
    this.push(ms, fn, false);
  }

  runUntil(end: number): void {
    for (;;) {
      const top = this.heap[0];
      if (top === undefined || top.at > end) break;
      this.pop();
      if (!top.live) continue;
      top.live = false;
      if (top.shaper) this.shaperPending--;
      this.t = top.at;
      top.fn();
    }
    this.t = end;
  }

  private push(ms: number, fn: () => void, shaper: boolean): Timer {
    const timer = { at: this.t + ms, seq: ++this.seq, fn, live: true, shaper };
    const h = this.heap;
    let i = h.length;
    h.push(timer);
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!FakeClock.before(timer, h[p]!)) break;
      h[i] = h[p]!;
      i = p;
    }
    h[i] = timer;
    return timer;
  }

  private pop(): void {
    const h = this.heap;
    const last = h.pop()!;
    if (h.length === 0) return;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= h.length) break;
      const r = l + 1;
      const c = r < h.length && FakeClock.before(h[r]!, h[l]!) ? r : l;
      if (!FakeClock.before(h[c]!, last)) break;
      h[i] = h[c]!;
      i = c;
    }
    h[i] = last;
  }

  private static before(a: Timer, b: Timer): boolean {
    return a.at < b.at || (a.at === b.at && a.seq < b.seq);
  }
}

interface Grant {
  t: number;
  flow: number;
  bytes: number;
}

/** A flow that always has a chunk waiting, as a TCP socket behind a slow shaper: asks again after each grant. */
function streamFlow(
  s: FairShaper,
  fake: FakeClock,
  log: Grant[],
  flow: number,
  chunk: number,
  end: number,
  /** Delay between a grant and the next request (a socket read), or undefined to ask from inside `go`. */
  readMs?: number,
): void {
  const ask = () => {
    if (fake.t >= end) return;
    s.request(flow, chunk, () => {
      log.push({ t: fake.t, flow, bytes: chunk });
      if (readMs === undefined) ask();
      else fake.later(readMs, ask);
    });
  };
  ask();
}

/** A flow offering `packet`-byte packets at `mbps` (every ms), queueing up to `cap` bytes. */
function packetFlow(
  s: FairShaper,
  fake: FakeClock,
  log: Grant[],
  flow: number,
  packet: number,
  mbps: number,
  end: number,
  cap = 64 * 1024,
): void {
  let owed = 0;
  const tick = () => {
    if (fake.t >= end) return;
    owed += perMs(mbps);
    while (owed >= packet) {
      owed -= packet;
      const r = s.offer(flow, packet, () => log.push({ t: fake.t, flow, bytes: packet }), cap);
      if (r === true) log.push({ t: fake.t, flow, bytes: packet });
    }
    fake.later(1, tick);
  };
  tick();
}

function bytesIn(log: Grant[], from: number, to: number, flow?: number): number {
  let n = 0;
  for (const g of log) if (g.t >= from && g.t < to && (flow === undefined || g.flow === flow)) n += g.bytes;
  return n;
}

/** The most any window of `w` ms carries (grants are logged in time order). */
function maxWindow(log: Grant[], w: number): number {
  let best = 0;
  let sum = 0;
  let j = 0;
  for (let i = 0; i < log.length; i++) {
    sum += log[i]!.bytes;
    while (log[j]!.t <= log[i]!.t - w) sum -= log[j++]!.bytes;
    if (sum > best) best = sum;
  }
  return best;
}

function within(actual: number, expected: number, tolerance: number, what: string): void {
  const err = actual / expected - 1;
  assert.ok(
    Math.abs(err) <= tolerance,
    `${what}: ${actual.toFixed(0)} vs ${expected.toFixed(0)} (${(err * 100).toFixed(2)} %, allowed ±${tolerance * 100} %)`,
  );
}

/** The pacing bound the shaper promises for a window of `w` ms (see shaper.ts). */
function paceBound(mbps: number, w: number, largest: number, burstMs = 10): number {
  const depth = perMs(mbps) * burstMs;
  return perMs(mbps) * w + depth + Math.max(0, largest - depth / 2);
}

describe('FairShaper', { timeout: 120_000 }, () => {
  for (const mbps of [10, 100]) {
    it(`holds ${mbps} Mbit/s within ±2 % over 10 simulated seconds, stream path (64 KiB chunks), paced`, () => {
      const fake = new FakeClock();
      const s = new FairShaper({ mbps, clock: fake.clock });
      const log: Grant[] = [];
      streamFlow(s, fake, log, 1, 65536, 10_000);
      fake.runUntil(10_000);
      within(bytesIn(log, 0, 10_000), perMs(mbps) * 10_000, 0.02, 'bytes in 10 s');
      within(bytesIn(log, 5_000, 10_000), perMs(mbps) * 5_000, 0.02, 'bytes in the last 5 s');
      for (const w of [100, 20]) {
        const most = maxWindow(log, w);
        assert.ok(most <= paceBound(mbps, w, 65536), `${most} bytes in a ${w} ms window`);
      }
      assert.equal(fake.shaperMaxPending, 1);
      assert.equal(s.stats().grantedBytes, bytesIn(log, 0, Infinity));
    });

    it(`holds ${mbps} Mbit/s within ±2 % over 10 simulated seconds, packet path (1500 B at twice the rate), paced`, () => {
      const fake = new FakeClock();
      const s = new FairShaper({ mbps, clock: fake.clock });
      const log: Grant[] = [];
      packetFlow(s, fake, log, 7, 1500, 2 * mbps, 10_000);
      fake.runUntil(10_000);
      within(bytesIn(log, 0, 10_000), perMs(mbps) * 10_000, 0.02, 'bytes in 10 s');
      // Packets fit the bucket: no debt, so a window carries at most rate·w + depth.
      const depth = perMs(mbps) * 10;
      for (const w of [100, 10, 2]) {
        const most = maxWindow(log, w);
        assert.ok(most <= perMs(mbps) * w + depth, `${most} bytes in a ${w} ms window`);
      }
      // Paced, not in bursts: after the first burst, no 2 ms window carries more than 3 ms of rate.
      const steady = log.filter((g) => g.t >= 100);
      assert.ok(maxWindow(steady, 2) <= perMs(mbps) * 3, `${maxWindow(steady, 2)} bytes in 2 ms`);
      const st = s.stats();
      assert.ok(st.dropped > 0, 'offered at twice the rate, so the cap drops some');
      assert.ok(st.queuedBytes <= 64 * 1024);
      assert.equal(fake.shaperMaxPending, 1);
      // One timer per grant batch, not per packet: at most one per ms.
      assert.ok(fake.shaperArmed <= 10_000 + 1, `${fake.shaperArmed} timers`);
    });
  }

  for (const mbps of [10, 100]) {
    it(`shares ${mbps} Mbit/s between 4 stream flows by bytes (±5 %), whatever their chunk sizes`, () => {
      const fake = new FakeClock();
      const s = new FairShaper({ mbps, clock: fake.clock });
      const log: Grant[] = [];
      // Under contention a flow with one chunk outstanding gets at most a chunk per (read delay +
      // timer tick of 1 ms): it is limited by its own demand, not by unfairness. So the smallest
      // chunk is one its fair share can be made of (at 100 Mbit/s a quarter is 3.1 kB/ms; 4 KiB
      // chunks get −8 %). A real socket's chunk grows when it is held back: a read takes all that is
      // buffered, up to 64 KiB.
      const chunks = [mbps === 10 ? 1500 : 8192, 9000, 30000, 65536];
      // Each flow asks again 0.2 ms after its grant, like a socket read: between grants a flow has
      // nothing waiting, the case where per-chunk round robin would give the 64 KiB flow 40 times more.
      chunks.forEach((chunk, i) => {
        streamFlow(s, fake, log, i, chunk, 10_000, 0.2);
      });
      fake.runUntil(10_000);
      const total = bytesIn(log, 0, 10_000);
      within(total, perMs(mbps) * 10_000, 0.02, 'total');
      const off = chunks.map((_, i) => bytesIn(log, 0, 10_000, i) / (total / 4) - 1);
      console.log(
        `${mbps} Mbit/s, stream flows off their share: ${off.map((x) => (x * 100).toFixed(2)).join(' ')} %`,
      );
      chunks.forEach((chunk, i) => {
        within(bytesIn(log, 0, 10_000, i), total / 4, 0.05, `flow ${i} (${chunk} B chunks)`);
      });
      assert.equal(fake.shaperMaxPending, 1);
    });
  }

  it('shares 10 Mbit/s between 4 packet flows by bytes (±5 %), whatever their packet sizes', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 10, clock: fake.clock });
    const log: Grant[] = [];
    // Up to the TUN's MTU (1500): an unresponsive flow of jumbo packets at a quarter of 10 Mbit/s
    // waits 29 ms a packet, over CoDel's target whenever two are queued, and loses its share.
    const sizes = [100, 576, 1000, 1500];
    sizes.forEach((size, i) => {
      packetFlow(s, fake, log, 100 + i, size, 10, 10_000);
    });
    fake.runUntil(10_000);
    const total = bytesIn(log, 0, 10_000);
    within(total, perMs(10) * 10_000, 0.02, 'total');
    const off = sizes.map((_, i) => bytesIn(log, 0, 10_000, 100 + i) / (total / 4) - 1);
    console.log(
      `10 Mbit/s, packet flows off their share: ${off.map((x) => (x * 100).toFixed(2)).join(' ')} %`,
    );
    sizes.forEach((size, i) => {
      within(bytesIn(log, 0, 10_000, 100 + i), total / 4, 0.05, `flow of ${size} B packets`);
    });
  });

  it('gives a flow that asks rarely what it asks, soon, and the greedy flow the rest', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 10, clock: fake.clock });
    const log: Grant[] = [];
    streamFlow(s, fake, log, 1, 65536, 10_000);
    const waits: number[] = [];
    const rare = () => {
      if (fake.t >= 10_000) return;
      const asked = fake.t;
      s.request(2, 1000, () => {
        waits.push(fake.t - asked);
        log.push({ t: fake.t, flow: 2, bytes: 1000 });
      });
      fake.later(100, rare);
    };
    fake.later(50, rare);
    fake.runUntil(10_100);
    assert.equal(waits.length, 100);
    // Served next: at worst it waits for the greedy flow's debt (64 KiB − half the bucket) plus its own 1000 B.
    const bound = Math.ceil((65536 - perMs(10) * 5 + 1000) / perMs(10)) + 1;
    assert.ok(
      Math.max(...waits) <= bound,
      `rare flow waited up to ${Math.max(...waits)} ms (bound ${bound})`,
    );
    within(bytesIn(log, 0, 10_000, 1), perMs(10) * 10_000 - 100 * 1000, 0.02, 'greedy flow');
  });

  it('changes rate live: 10 → 100 Mbit/s, each held within ±2 %', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 10, clock: fake.clock });
    const log: Grant[] = [];
    streamFlow(s, fake, log, 1, 16384, 10_000);
    fake.later(5_000, () => s.setRate(100));
    fake.runUntil(10_000);
    within(bytesIn(log, 100, 5_000), perMs(10) * 4_900, 0.02, '10 Mbit/s part');
    within(bytesIn(log, 5_100, 10_000), perMs(100) * 4_900, 0.02, '100 Mbit/s part');
  });

  it('changes rate live: 100 → 10 Mbit/s, and 0 lets everything waiting go at once', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 100, clock: fake.clock });
    const log: Grant[] = [];
    packetFlow(s, fake, log, 1, 1500, 200, 3_000);
    fake.later(1_000, () => s.setRate(10));
    fake.runUntil(2_000);
    within(bytesIn(log, 1_100, 2_000), perMs(10) * 900, 0.02, '10 Mbit/s part');
    const waiting = s.stats().queuedBytes;
    assert.ok(waiting > 30_000, `queue full before unlimiting: ${waiting}`);
    const before = bytesIn(log, 0, Infinity);
    s.setRate(0);
    assert.equal(bytesIn(log, 0, Infinity) - before, waiting, 'everything waiting went inside setRate(0)');
    assert.equal(s.stats().queuedBytes, 0);
    fake.runUntil(2_500);
    within(bytesIn(log, 2_000, 2_500), perMs(200) * 500, 0.01, 'unlimited: all offered');
    s.setRate(10);
    fake.runUntil(3_000);
    within(bytesIn(log, 2_510, 3_000), perMs(10) * 490, 0.03, 'limited again');
  });

  it('0 = unlimited: request runs go at once, offer says send, no timer, nothing queued', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 0, clock: fake.clock });
    let ran = 0;
    for (let i = 0; i < 10_000; i++) {
      s.request(i % 7, 65536, () => ran++);
      assert.equal(ran, i + 1);
      assert.equal(
        s.offer(i % 5, 1500, () => assert.fail('offer must not call go when it says send'), 0),
        true,
      );
    }
    assert.equal(fake.shaperArmed, 0);
    assert.deepEqual(s.stats(), {
      queuedBytes: 0,
      flows: 0,
      grantedBytes: 10_000 * (65536 + 1500),
      dropped: 0,
      droppedBytes: 0,
      lateDropped: 0,
      lateDroppedBytes: 0,
    });
  });

  it('lets a request larger than the bucket through, then makes the next wait out its debt', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 1, clock: fake.clock }); // 125 B/ms, bucket 1250 B
    const at: number[] = [];
    s.request(1, 1_000_000, () => at.push(fake.t));
    s.request(1, 100, () => at.push(fake.t));
    assert.deepEqual(at, [0], 'the first goes at once (full bucket)');
    fake.runUntil(20_000);
    // The second waits until the bucket is back at 100 B: (1e6 − 1250 + 100) / 125 ms.
    assert.equal(at.length, 2);
    assert.ok(Math.abs(at[1]! - (1_000_000 - 1250 + 100) / 125) <= 1, `second at ${at[1]} ms`);
  });

  it('runs the requests of one flow in order, and asks made inside go neither recurse nor jump the queue', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 10, clock: fake.clock });
    const order: string[] = [];
    let depth = 0;
    let deepest = 0;
    for (let i = 0; i < 50; i++) {
      s.request(1, 1500, () => {
        depth++;
        deepest = Math.max(deepest, depth);
        order.push(`a${i}`);
        if (i % 10 === 0) s.request(2, 100, () => order.push(`b${i}`));
        depth--;
      });
    }
    fake.runUntil(1_000);
    assert.equal(deepest, 1);
    const a = order.filter((x) => x.startsWith('a'));
    assert.deepEqual(
      a,
      Array.from({ length: 50 }, (_, i) => `a${i}`),
    );
    assert.equal(order.filter((x) => x.startsWith('b')).length, 5);
    // A flow's first ask is served next, before the rest of flow 1's backlog.
    assert.equal(order[order.indexOf('a10') + 1], 'b10');
  });

  it('forget drops what a flow has waiting; the other flows go on', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 10, clock: fake.clock });
    const ran: string[] = [];
    for (let i = 0; i < 20; i++) {
      s.request(1, 1500, () => ran.push(`a${i}`));
      const r = s.offer(2, 1500, () => ran.push(`b${i}`), 1e9);
      assert.notEqual(r, 'drop');
      if (r === true) ran.push(`b${i}`);
    }
    const before = s.stats();
    assert.equal(before.flows, 2);
    s.forget(1);
    const after = s.stats();
    assert.equal(after.flows, 1);
    const aWaiting = 20 - ran.filter((x) => x.startsWith('a')).length;
    assert.equal(before.queuedBytes - after.queuedBytes, aWaiting * 1500);
    s.forget(1); // twice is harmless
    s.forget(99); // unknown too
    fake.runUntil(1_000);
    assert.equal(ran.filter((x) => x.startsWith('a')).length, 20 - aWaiting);
    assert.deepEqual(
      ran.filter((x) => x.startsWith('b')),
      Array.from({ length: 20 }, (_, i) => `b${i}`),
    );
    assert.equal(s.stats().queuedBytes, 0);
    // Forgetting the last waiting flow cancels the timer.
    s.request(3, 100_000, () => {});
    s.request(3, 100, () => assert.fail('forgotten'));
    assert.equal(fake.shaperPending, 1);
    s.forget(3);
    assert.equal(fake.shaperPending, 0);
    s.clear();
  });

  it('CoDel: a loss-responsive packet flow keeps its queue far below the cap and the link busy', () => {
    // An AIMD sender (as TCP inside the tunnel): one 1500 B packet per round trip more each round
    // trip (20 ms plus what its last packet queued), halved at most once per round trip when one
    // of its packets is dropped (at the cap or by CoDel).
    // Measured in this model with the late drop taken out (drop-tail at the 64 KiB cap alone):
    // 1 Mbit/s p50 228 / p99 505 ms, 10 Mbit/s 15 / 51 ms; with CoDel 67 / 126 and 1 / 37 ms.
    // At 100 Mbit/s the cap drains in 5 ms, at the target: it binds first, CoDel has nothing to do.
    for (const mbps of [1, 10]) {
      const fake = new FakeClock();
      let lastSojourn = 0;
      const rtt = () => 20 + lastSojourn;
      let lastCut = -Infinity;
      let lastRaise = 0;
      let rate = perMs(mbps) / 2; // bytes per ms
      const cut = () => {
        if (fake.t - lastCut < rtt()) return;
        lastCut = fake.t;
        rate /= 2;
      };
      const s = new FairShaper({ mbps, clock: fake.clock, onLateDrop: () => cut() });
      const sojourns: number[] = [];
      let delivered = 0;
      let owed = 0;
      const tick = () => {
        if (fake.t >= 10_000) return;
        if (fake.t - lastRaise >= rtt()) {
          lastRaise = fake.t;
          rate += 1500 / rtt();
        }
        owed += rate;
        while (owed >= 1500) {
          owed -= 1500;
          const at = fake.t;
          const done = () => {
            lastSojourn = fake.t - at;
            if (at >= 2_000) sojourns.push(fake.t - at);
            if (fake.t >= 2_000) delivered += 1500;
          };
          const r = s.offer(1, 1500, done, 64 * 1024);
          if (r === true) done();
          else if (r === 'drop') cut();
        }
        fake.later(1, tick);
      };
      tick();
      fake.runUntil(10_000);
      sojourns.sort((a, b) => a - b);
      const p50 = sojourns[Math.floor(sojourns.length * 0.5)]!;
      const p99 = sojourns[Math.floor(sojourns.length * 0.99)]!;
      const target = Math.max(5, (1.5 * 1500) / perMs(mbps));
      const capDrain = (64 * 1024) / perMs(mbps);
      const st = s.stats();
      console.log(
        `${mbps} Mbit/s, AIMD packet flow: sojourn p50 ${p50} / p99 ${p99} ms (target ${target.toFixed(1)}, ` +
          `the cap drains in ${capDrain.toFixed(0)}), ` +
          `${((delivered / (perMs(mbps) * 8_000)) * 100).toFixed(1)} % of the limit, ` +
          `${st.lateDropped} CoDel drops, ${st.dropped} at the cap`,
      );
      assert.ok(st.lateDropped > 0, 'CoDel dropped');
      assert.equal(st.dropped, 0, 'the cap never had to');
      assert.ok(p50 <= 0.3 * capDrain, `sojourn p50 ${p50} ms`);
      assert.ok(p99 <= 0.8 * capDrain, `sojourn p99 ${p99} ms`);
      assert.ok(delivered >= 0.85 * perMs(mbps) * 8_000, `delivered ${delivered} B in 8 s`);
    }
  });

  it('CoDel: a burst shorter than the interval passes whole, however long it queues', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 10, clock: fake.clock });
    let got = 0;
    // 40 packets at once: 60 kB, 48 ms to drain at 10 Mbit/s, under the 100 ms interval.
    for (let i = 0; i < 40; i++) if (s.offer(1, 1500, () => got++, 64 * 1024) === true) got++;
    fake.runUntil(200);
    assert.equal(got, 40);
    assert.equal(s.stats().lateDropped, 0);
    // The same burst every 150 ms: the queue empties in between, so CoDel never enters its state.
    for (let round = 0; round < 10; round++) {
      for (let i = 0; i < 40; i++) if (s.offer(1, 1500, () => got++, 64 * 1024) === true) got++;
      fake.runUntil(fake.t + 150);
    }
    assert.equal(got, 440);
    assert.equal(s.stats().lateDropped, 0);
  });

  it('offer drops beyond a flow’s own cap, counts it, and takes it again once the queue drains', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 10, clock: fake.clock });
    assert.equal(
      s.offer(1, 12_000, () => {}, 5000),
      true,
      'the full bucket sends at once',
    );
    const got: number[] = [];
    assert.equal(
      s.offer(1, 1500, () => got.push(1), 4000),
      false,
    );
    assert.equal(
      s.offer(1, 1500, () => got.push(2), 4000),
      false,
    );
    assert.equal(
      s.offer(1, 1500, () => got.push(3), 4000),
      'drop',
    );
    assert.equal(
      s.offer(2, 1500, () => got.push(20), 4000),
      false,
      'another flow has its own cap',
    );
    assert.equal(
      s.offer(1, 1000, () => got.push(4), 4000),
      false,
      'exactly at the cap is taken',
    );
    assert.equal(
      s.offer(1, 1, () => got.push(5), 4000),
      'drop',
    );
    assert.deepEqual(s.stats(), {
      queuedBytes: 5500,
      flows: 2,
      grantedBytes: 12_000,
      dropped: 2,
      droppedBytes: 1501,
      lateDropped: 0,
      lateDroppedBytes: 0,
    });
    fake.runUntil(100);
    // Flow 2 first: flow 1 has just had 12 000 B.
    assert.deepEqual(got, [20, 1, 2, 4]);
    assert.equal(
      s.offer(1, 1500, () => got.push(6), 4000),
      true,
    );
  });

  it('keeps serving after a go throws', () => {
    const fake = new FakeClock();
    const s = new FairShaper({ mbps: 10, clock: fake.clock });
    const ran: string[] = [];
    assert.throws(
      () =>
        s.request(1, 100, () => {
          s.request(2, 100, () => ran.push('queued inside the throwing go'));
          throw new Error('boom');
        }),
      /boom/,
    );
    fake.runUntil(10);
    assert.deepEqual(ran, ['queued inside the throwing go']);
    s.request(3, 20_000, () => {}); // into debt
    s.request(3, 100, () => {
      throw new Error('late boom');
    });
    s.request(4, 100, () => ran.push('after the late throw'));
    assert.throws(() => fake.runUntil(100), /late boom/);
    fake.runUntil(200);
    assert.deepEqual(ran, ['queued inside the throwing go', 'after the late throw']);
  });

  it('refuses nonsense', () => {
    assert.throws(() => new FairShaper({ mbps: -1 }), RangeError);
    assert.throws(() => new FairShaper({ mbps: Number.NaN }), RangeError);
    assert.throws(() => new FairShaper({ mbps: 1, burstMs: 0 }), RangeError);
    const s = new FairShaper({ mbps: 0 });
    assert.throws(() => s.request(1, -1, () => {}), RangeError);
    assert.throws(() => s.offer(1, Number.NaN, () => {}, 10), RangeError);
    assert.throws(() => s.setRate(Infinity), RangeError);
  });

  it('property: every request not forgotten or late-dropped runs exactly once, in flow order, within the pacing bound', () => {
    const op = fc.oneof(
      fc.record({
        kind: fc.constant('request' as const),
        flow: fc.integer({ min: 0, max: 5 }),
        bytes: fc.integer({ min: 0, max: 70_000 }),
      }),
      fc.record({
        kind: fc.constant('offer' as const),
        flow: fc.integer({ min: 0, max: 5 }),
        bytes: fc.integer({ min: 1, max: 9000 }),
        cap: fc.integer({ min: 0, max: 50_000 }),
      }),
      // Packets into deep queues: what lasts long enough for CoDel to act.
      fc.record({
        kind: fc.constant('offer' as const),
        flow: fc.integer({ min: 0, max: 5 }),
        bytes: fc.integer({ min: 1, max: 1500 }),
        cap: fc.integer({ min: 100_000, max: 400_000 }),
      }),
      fc.record({ kind: fc.constant('forget' as const), flow: fc.integer({ min: 0, max: 5 }) }),
      fc.record({ kind: fc.constant('wait' as const), ms: fc.integer({ min: 0, max: 50 }) }),
      fc.record({ kind: fc.constant('rate' as const), mbps: fc.constantFrom(0, 1, 10, 100) }),
    );
    let lateDrops = 0;
    fc.assert(
      fc.property(fc.constantFrom(1, 10, 100), fc.array(op, { maxLength: 300, size: 'max' }), (mbps, ops) => {
        const fake = new FakeClock();
        const ran = new Map<number, number>(); // request id → times run
        const expected = new Map<number, number[]>(); // flow → ids that must run, in order
        const seen = new Map<number, number[]>();
        const offers = new Set<number>();
        // CoDel drops a flow's head: the first of its queue that has neither run nor been dropped.
        const lateDrop = (flow: number) => {
          const list = expected.get(flow)!;
          const [dropped] = list.splice((seen.get(flow) ?? []).length, 1);
          assert.ok(dropped !== undefined && offers.has(dropped), 'only a queued packet is dropped late');
          lateDrops++;
        };
        const s = new FairShaper({ mbps, clock: fake.clock, onLateDrop: lateDrop });
        const log: Grant[] = [];
        let id = 0;
        let largest = 0;
        let rateChanged = false;
        for (const o of ops) {
          if (o.kind === 'rate') {
            s.setRate(o.mbps);
            rateChanged = true;
            continue;
          }
          if (o.kind === 'wait') {
            fake.runUntil(fake.t + o.ms);
            continue;
          }
          if (o.kind === 'forget') {
            s.forget(o.flow);
            // What already ran stays; what waited is dropped.
            expected.set(o.flow, [...(seen.get(o.flow) ?? [])]);
            continue;
          }
          const rid = ++id;
          const flow = o.flow;
          largest = Math.max(largest, o.bytes);
          const go = () => {
            ran.set(rid, (ran.get(rid) ?? 0) + 1);
            seen.set(flow, [...(seen.get(flow) ?? []), rid]);
            log.push({ t: fake.t, flow, bytes: o.bytes });
          };
          const list = expected.get(flow) ?? [];
          if (o.kind === 'request') {
            s.request(flow, o.bytes, go);
            list.push(rid);
          } else {
            offers.add(rid);
            const r = s.offer(flow, o.bytes, go, o.cap);
            if (r === true) {
              go();
              list.push(rid);
            } else if (r === false) {
              list.push(rid);
            }
          }
          expected.set(flow, list);
        }
        fake.runUntil(fake.t + 100_000);
        for (const [, n] of ran) assert.equal(n, 1);
        for (const [flow, ids] of expected) assert.deepEqual(seen.get(flow) ?? [], ids, `flow ${flow}`);
        assert.equal(s.stats().queuedBytes, 0);
        assert.equal(s.stats().flows, 0);
        assert.ok(fake.shaperMaxPending <= 1);
        // The pacing bound holds for one rate (0 lets everything out at once).
        for (const w of rateChanged ? [] : [10, 100]) {
          assert.ok(maxWindow(log, w) <= paceBound(mbps, w, largest) + 1e-6);
        }
      }),
      { numRuns: 200 },
    );
    // Few runs last long enough for CoDel (1 to 3 drops in 200 runs): the CoDel tests above are
    // what exercise it; here a late drop must only keep every other request's promise.
    console.log(`property: ${lateDrops} packets dropped late in 200 runs`);
  });

  for (const [mbps, chunk] of [
    [10, 16384],
    [100, 65536],
  ] as const) {
    // Real timers on a shared machine run late: a stalled event loop loses the tokens beyond the
    // bucket (the documented trade-off against bursting after a stall), so the output may fall
    // short when the machine is loaded (it did, -31 % at 300 ms beside a benchmark), but must never
    // exceed the rate. 1 s with the data plane's 20 ms bucket; the exact rate is the fake-clock
    // tests' business.
    it(`real time: ${mbps} Mbit/s for 1 s with real timers, 2 flows: never above the rate, at most 40 % below`, async () => {
      const s = new FairShaper({ mbps, clock: realClock, burstMs: 20 });
      const t0 = performance.now();
      let bytes = 0;
      let stop = false;
      // Each flow asks again on the next turn of the event loop after its grant, as a socket would.
      for (const flow of [1, 2]) {
        const ask = () => {
          if (stop) return;
          s.request(flow, chunk, () => {
            bytes += chunk;
            setImmediate(ask);
          });
        };
        ask();
      }
      await new Promise((resolve) => setTimeout(resolve, 1000));
      stop = true;
      const elapsed = performance.now() - t0;
      // The bucket starts full (20 ms of rate); a chunk may go into debt by its own size.
      const expected = perMs(mbps) * (elapsed + 20);
      const err = bytes / expected - 1;
      console.log(
        `real time ${mbps} Mbit/s: ${bytes} B in ${elapsed.toFixed(1)} ms, ${(err * 100).toFixed(1)} % off`,
      );
      const msg = `${bytes} B in ${elapsed.toFixed(1)} ms (${(err * 100).toFixed(1)} %)`;
      assert.ok(bytes <= expected + chunk, `above the rate: ${msg}`);
      assert.ok(err >= -0.4, `far below the rate: ${msg}`);
      s.clear();
    });
  }
});
