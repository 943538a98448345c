/**
 * bench/dataplane/shaper-cost: what the bandwidth shaper (src/dataplane/shaper.ts) costs on the hot
 * path, in ns per request/packet (`node dist/bench/dataplane/shaper-cost.js`).
 *
 * - unlimited: request() with a no-op `go`, and offer(): the price of a service without a limit.
 * - limited, never waiting: a limit far above what is asked (real clock, so performance.now() is
 *   in it): the bucket, the flow record and its tags per call.
 * - limited, contended: 4 flows always waiting at 100 Mbit/s on a hand-driven clock: each packet is
 *   offered, queued, and later granted from the heap by the timer; each stream chunk is asked for
 *   again from inside its `go`. The figure is per packet/chunk, both halves included.
 * Each figure is the median of BENCH_ROUNDS (5) rounds of BENCH_OPS (1e6) operations.
 */
import { type Clock, FairShaper, realClock } from '../../src/dataplane/shaper.js';

const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 5);
const OPS = Number(process.env['BENCH_OPS'] ?? 1_000_000);

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

/** ns per op of `body(ops)` (which performs `ops` operations), median of the rounds after a warm-up. */
function measure(body: (ops: number) => void): number {
  body(Math.min(OPS, 100_000));
  const out: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = process.hrtime.bigint();
    body(OPS);
    out.push(Number(process.hrtime.bigint() - t0) / OPS);
  }
  return median(out);
}

/** A clock the bench moves by hand; the shaper's one timer is kept to be fired. */
class HandClock implements Clock {
  t = 0;
  due = Infinity;
  fn: (() => void) | null = null;
  now = () => this.t;
  setTimer(ms: number, fn: () => void) {
    this.due = this.t + ms;
    this.fn = fn;
    return {
      cancel: () => {
        if (this.fn === fn) this.fn = null;
      },
    };
  }
  /** Moves to the timer's time and fires it. */
  fire(): void {
    const fn = this.fn;
    if (fn === null) return;
    this.t = Math.max(this.t, this.due);
    this.fn = null;
    fn();
  }
}

const noop = () => {};
let sink = 0;
const count = () => {
  sink++;
};

const rows: Array<[string, number]> = [];

rows.push([
  'unlimited request()',
  measure((ops) => {
    const s = new FairShaper({ mbps: 0 });
    for (let i = 0; i < ops; i++) s.request(i & 3, 1500, noop);
  }),
]);
rows.push([
  'unlimited offer()',
  measure((ops) => {
    const s = new FairShaper({ mbps: 0 });
    for (let i = 0; i < ops; i++) if (s.offer(i & 3, 1500, noop, 65536) === true) sink++;
  }),
]);
rows.push([
  'limited, never waiting: request()',
  measure((ops) => {
    const s = new FairShaper({ mbps: 1e9, clock: realClock });
    for (let i = 0; i < ops; i++) s.request(i & 3, 1500, noop);
  }),
]);
rows.push([
  'limited, never waiting: offer()',
  measure((ops) => {
    const s = new FairShaper({ mbps: 1e9, clock: realClock });
    for (let i = 0; i < ops; i++) if (s.offer(i & 3, 1500, noop, 65536) === true) sink++;
  }),
]);
rows.push([
  'limited, contended (4 flows, 100 Mbit/s): packet offered + granted',
  measure((ops) => {
    const clock = new HandClock();
    const s = new FairShaper({ mbps: 100, clock });
    let offered = 0;
    while (offered < ops) {
      // 8 packets in (what 1 ms of the rate lets out), then time moves to the shaper's timer, which grants what the bucket allows.
      for (let k = 0; k < 8 && offered < ops; k++, offered++) s.offer(offered & 3, 1500, count, 1 << 30);
      clock.fire();
    }
    while (s.stats().queuedBytes > 0) clock.fire();
  }),
]);
rows.push([
  'limited, contended (4 flows, 100 Mbit/s): stream chunk asked from go + granted',
  measure((ops) => {
    const clock = new HandClock();
    const s = new FairShaper({ mbps: 100, clock });
    let left = ops;
    for (let flow = 0; flow < 4; flow++) {
      const ask = () => {
        if (left-- > 0) s.request(flow, 1500, ask);
      };
      ask();
    }
    while (left > 0) clock.fire();
    s.clear();
  }),
]);

for (const [what, ns] of rows) console.log(`${what.padEnd(80)} ${ns.toFixed(1).padStart(8)} ns`);
if (sink < 0) console.log(sink);
