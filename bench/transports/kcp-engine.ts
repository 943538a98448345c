/**
 * bench/transports/kcp-engine: MB/s of the pure KCP engine (src/transports/kcp/kcp.ts), two
 * sessions wired back to back in this process, against baselines measured in the same run
 * (`node dist/bench/transports/kcp-engine.js`; not part of the tests).
 *
 * Every figure moves BENCH_MB (128) MB of payload one way with DEFAULT_KCP_PARAMS (mtu 1350,
 * windows of 1024, nodelay, resend 2, no cwnd), the clock being performance.now():
 * - engine, message mode: one 1326-byte message (one full segment) per send();
 * - engine, stream mode: 64 KiB writes (the engine keeps views, no copy on send);
 * each at 0 % and 5 % seeded random loss of datagrams in both directions (acks too).
 * The link between the engines copies every datagram once (as the encryption layer would produce a
 * fresh buffer) into a FIFO; after each delivery burst the receiving side calls flush(), as the
 * transport will after a burst of input. No sockets, no crypto: this is the engine's own cost.
 * Baselines, same bytes, same run:
 * - memcpy: the payload copied in 1326-byte pieces into one buffer (Buffer.copy): the floor;
 * - link only: the payload as 1350-byte datagrams through the same FIFO with one copy each, no KCP.
 * Each figure is the median of BENCH_ROUNDS (3) rounds after one warm-up round, with this process's
 * CPU time per MB.
 * Output: a table on stdout and JSON in bench/results/kcp-engine-<timestamp>.json (git-ignored).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { DEFAULT_KCP_PARAMS, KCP_OVERHEAD, KcpSession } from '../../src/transports/kcp/kcp.js';
import { prng } from '../../test/helpers/seeded-random.js';

const MB = Number(process.env['BENCH_MB'] ?? 128);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 3);
const TOTAL = Math.round(MB * 1e6);
const MSS = DEFAULT_KCP_PARAMS.mtu - KCP_OVERHEAD;
const STREAM_WRITE = 64 * 1024;

interface Figure {
  mbPerSecond: number;
  cpuMsPerMb: number;
  retransmissions?: number;
  fastRetransmissions?: number;
  lostSegments?: number;
}

function measure(run: () => Partial<Figure> | undefined): Figure {
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const extra = run();
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  return {
    mbPerSecond: TOTAL / 1e6 / seconds,
    cpuMsPerMb: (cpu.user + cpu.system) / 1000 / (TOTAL / 1e6),
    ...extra,
  };
}

/** A FIFO of datagrams without Array.shift (a head index, compacted now and then). */
class Fifo {
  private items: (Buffer | undefined)[] = [];
  private head = 0;
  push(b: Buffer): void {
    this.items.push(b);
  }
  shift(): Buffer | undefined {
    if (this.head === this.items.length) {
      if (this.head > 0) {
        this.items = [];
        this.head = 0;
      }
      return undefined;
    }
    const b = this.items[this.head]!;
    this.items[this.head++] = undefined;
    return b;
  }
}

const payload = Buffer.alloc(Math.max(STREAM_WRITE, MSS), 0x5a);

function memcpyBaseline(): Figure {
  const dest = Buffer.allocUnsafe(16 * 1024 * 1024);
  return measure(() => {
    let at = 0;
    for (let done = 0; done < TOTAL; done += MSS) {
      if (at + MSS > dest.length) at = 0;
      payload.copy(dest, at, 0, MSS);
      at += MSS;
    }
    return undefined;
  });
}

function linkBaseline(): Figure {
  const datagram = Buffer.alloc(DEFAULT_KCP_PARAMS.mtu, 0x5a);
  const fifo = new Fifo();
  return measure(() => {
    let got = 0;
    while (got < TOTAL) {
      for (let i = 0; i < 64; i++) fifo.push(Buffer.from(datagram));
      for (let d = fifo.shift(); d !== undefined; d = fifo.shift()) got += d.length - KCP_OVERHEAD;
    }
    return undefined;
  });
}

function engine(stream: boolean, loss: number, seed: number): Figure {
  const rand = prng(seed);
  const toB = new Fifo();
  const toA = new Fifo();
  const a = new KcpSession(
    1,
    (dg) => {
      if (loss === 0 || rand() >= loss) toB.push(Buffer.from(dg));
    },
    { stream },
  );
  const b = new KcpSession(
    1,
    (dg) => {
      if (loss === 0 || rand() >= loss) toA.push(Buffer.from(dg));
    },
    { stream },
  );
  const message = payload.subarray(0, MSS);
  const write = payload.subarray(0, STREAM_WRITE);
  const limit = 2 * DEFAULT_KCP_PARAMS.sndWnd;
  return measure(() => {
    let sent = 0;
    let got = 0;
    while (got < TOTAL) {
      while (sent < TOTAL && a.waitSnd() < limit) {
        const piece = stream ? write : message;
        const n = Math.min(piece.length, TOTAL - sent);
        a.send(n === piece.length ? piece : piece.subarray(0, n));
        sent += n;
      }
      let now = performance.now();
      a.flush(now);
      for (let d = toB.shift(); d !== undefined; d = toB.shift()) b.input(d, now);
      now = performance.now();
      b.flush(now);
      for (let m = b.recv(); m !== null; m = b.recv()) got += m.length;
      for (let d = toA.shift(); d !== undefined; d = toA.shift()) a.input(d, now);
    }
    if (got !== TOTAL) throw new Error(`received ${got} of ${TOTAL} bytes`);
    const s = a.stats;
    return {
      retransmissions: s.retransmissions,
      fastRetransmissions: s.fastRetransmissions,
      lostSegments: s.lostSegments,
    };
  });
}

function median(figures: Figure[]): Figure {
  const sorted = [...figures].sort((x, y) => x.mbPerSecond - y.mbPerSecond);
  return sorted[sorted.length >> 1]!;
}

function main(): void {
  const variants: [string, (round: number) => Figure][] = [
    ['baseline: memcpy in 1326-byte pieces', () => memcpyBaseline()],
    ['baseline: link only (copy per 1350-byte datagram)', () => linkBaseline()],
    ['engine, message mode (1326 B), 0 % loss', (r) => engine(false, 0, r)],
    ['engine, message mode (1326 B), 5 % loss', (r) => engine(false, 0.05, 0x5eed + r)],
    ['engine, stream mode (64 KiB writes), 0 % loss', (r) => engine(true, 0, r)],
    ['engine, stream mode (64 KiB writes), 5 % loss', (r) => engine(true, 0.05, 0x5eed + r)],
  ];
  console.log(`${MB} MB one way per figure, median of ${ROUNDS}, Node ${process.version}`);
  const results: Record<string, Figure> = {};
  for (const [name, run] of variants) {
    run(-1); // warm-up, not counted: the JIT has settled before the measured rounds
    const figures: Figure[] = [];
    for (let r = 0; r < ROUNDS; r++) figures.push(run(r));
    results[name] = median(figures);
  }
  const memcpy = results['baseline: memcpy in 1326-byte pieces']!.mbPerSecond;
  const link = results['baseline: link only (copy per 1350-byte datagram)']!.mbPerSecond;
  for (const [name, f] of Object.entries(results)) {
    const retx =
      f.retransmissions === undefined
        ? ''
        : `  retx ${f.retransmissions} (fast ${f.fastRetransmissions}, rto ${f.lostSegments})`;
    console.log(
      `${name.padEnd(50)} ${f.mbPerSecond.toFixed(0).padStart(6)} MB/s  ${(f.mbPerSecond / memcpy).toFixed(3)} x memcpy  ` +
        `${(f.mbPerSecond / link).toFixed(2)} x link  ${f.cpuMsPerMb.toFixed(2)} CPU ms/MB${retx}`,
    );
  }
  const dir = fileURLToPath(new URL('../../../bench/results/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[-:]/g, '').replace(/\.\d+/, '');
  writeFileSync(`${dir}kcp-engine-${stamp}.json`, JSON.stringify({ MB, ROUNDS, MSS, results }, null, 2));
}

main();
