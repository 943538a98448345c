/**
 * bench/native/tun-batch: packets per second through a TUN device of the native addon (src/native/tun.ts)
 * with batch size 1 vs 64, printed as a ratio (`node dist/bench/native/tun-batch.js`, root).
 *
 * - Read: the device sits in a namespace of its own (openTun's netnsPath) and is paused while a UDP sender
 *   in that namespace queues BENCH_PACKETS datagrams (64-byte payload, 92-byte packets) to a route through
 *   it (txqueuelen is raised so that the kernel keeps them all). Then resume() and the time until the
 *   listener has seen them all: the drain rate of the read path (uv_poll callback, read() loop, one
 *   buffer per batch, Buffer[] views, listener) with batchPackets 1 and 64.
 * - Write: the same number of packets written with write() in calls of 1 and of 64 prebuilt packets, and,
 *   for packets that arrive laid end to end in one buffer (a tunnel message), 64 per call as Buffer views
 *   cut for write() vs the buffer and its lengths handed to writeBatch(). The namespace forwards them into
 *   a blackhole route, so the kernel drops each one silently after routing.
 * Each figure is the median of BENCH_ROUNDS (5) rounds; CPU time of this process per packet beside it (the
 * steadier figure on a shared machine: wall-clock rates move with whatever else runs on the two cores).
 */
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { openTun, type TunDevice } from '../../src/native/tun.js';
import { seqPayload, udpV4 } from '../../test/helpers/ip-packets.js';
import { Netns } from '../../test/helpers/tun-netns.js';

const PACKETS = Number(process.env['BENCH_PACKETS'] ?? 50_000);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 5);
const UDP_TOOL = fileURLToPath(new URL('../../test/helpers/udp-tool.js', import.meta.url));

interface Figure {
  pps: number;
  cpuNsPerPacket: number;
  calls: number;
}

function median(figures: Figure[]): Figure {
  const sorted = [...figures].sort((a, b) => a.pps - b.pps);
  return sorted[Math.floor(sorted.length / 2)]!;
}

async function measureRead(ns: Netns, name: string, subnet: number, batch: number): Promise<Figure> {
  const dev = openTun(name, { netnsPath: ns.path, batchPackets: batch });
  try {
    ns.ip('netns', 'exec', ns.name, 'sysctl', '-qw', `net.ipv6.conf.${name}.disable_ipv6=1`);
    ns.ip('link', 'set', 'dev', name, 'txqueuelen', String(PACKETS + 1000));
    ns.ip('addr', 'add', `10.78.${subnet}.1/24`, 'dev', name);
    ns.ip('link', 'set', 'dev', name, 'up');
    const figures: Figure[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      let seen = 0;
      let calls = 0;
      let finish!: () => void;
      const all = new Promise<void>((resolve) => {
        finish = resolve;
      });
      dev.pause();
      dev.onPackets((packets) => {
        calls++;
        seen += packets.length;
        if (seen >= PACKETS) finish();
      });
      const r = await ns.run(
        process.execPath,
        [UDP_TOOL, 'send', `10.78.${subnet}.2`, '9', String(PACKETS), '64', '64'],
        120_000,
      );
      const sent = JSON.parse(r.stdout) as { sent: number };
      if (sent.sent !== PACKETS) throw new Error(`sender sent ${r.stdout} ${r.stderr}`);
      const cpu0 = process.cpuUsage();
      const t0 = performance.now();
      dev.resume();
      const timeout = setTimeout(() => {
        throw new Error(`read batch ${batch}: ${seen} of ${PACKETS} after 60 s`);
      }, 60_000);
      await all;
      clearTimeout(timeout);
      const seconds = (performance.now() - t0) / 1000;
      const cpu = process.cpuUsage(cpu0);
      figures.push({
        pps: PACKETS / seconds,
        cpuNsPerPacket: ((cpu.user + cpu.system) * 1000) / PACKETS,
        calls,
      });
    }
    return median(figures);
  } finally {
    dev.close();
  }
}

type WriteMode = 'array' | 'views' | 'buffer';

/**
 * `array`: prebuilt packets, write() of `batch` of them per call. `views`: the packets arrive as one buffer
 * (as from a tunnel message), Buffer views are cut per call and handed to write(). `buffer`: the same buffer
 * and its lengths handed to writeBatch() without views.
 */
function measureWrite(dev: TunDevice, packets: Buffer[], batch: number, mode: WriteMode): Figure {
  const big = Buffer.concat(packets);
  const lengths = Uint32Array.from(packets, (p) => p.length);
  const figures: Figure[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    const before = dev.stats().packetsWritten;
    let calls = 0;
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    let offset = 0;
    for (let i = 0; i < packets.length; i += batch) {
      const n = Math.min(batch, packets.length - i);
      if (mode === 'array') {
        dev.write(n === 1 ? [packets[i]!] : packets.slice(i, i + n));
      } else if (mode === 'views') {
        const views = new Array<Buffer>(n);
        for (let j = 0; j < n; j++) {
          const end = offset + lengths[i + j]!;
          views[j] = big.subarray(offset, end);
          offset = end;
        }
        dev.write(views);
      } else {
        const chunk = lengths.subarray(i, i + n);
        let bytes = 0;
        for (let j = 0; j < n; j++) bytes += chunk[j]!;
        dev.writeBatch(big.subarray(offset, offset + bytes), chunk, n);
        offset += bytes;
      }
      calls++;
    }
    const seconds = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    const written = dev.stats().packetsWritten - before;
    if (written !== packets.length)
      throw new Error(`wrote ${written} of ${packets.length} (${JSON.stringify(dev.stats())})`);
    figures.push({
      pps: packets.length / seconds,
      cpuNsPerPacket: ((cpu.user + cpu.system) * 1000) / packets.length,
      calls,
    });
  }
  return median(figures);
}

const fmt = (f: Figure) =>
  `${Math.round(f.pps).toLocaleString('en-US').padStart(10)} pkt/s  ${f.cpuNsPerPacket.toFixed(0).padStart(6)} ns CPU/pkt  ${String(f.calls).padStart(6)} calls`;

async function main(): Promise<void> {
  const ns = Netns.create('mtbench');
  try {
    console.log(`TUN batch bench: ${PACKETS} packets of 92 bytes per round, median of ${ROUNDS} rounds`);
    const read1 = await measureRead(ns, 'mtbr1', 1, 1);
    const read64 = await measureRead(ns, 'mtbr64', 2, 64);
    console.log(`read   batch  1: ${fmt(read1)}`);
    console.log(`read   batch 64: ${fmt(read64)}`);
    console.log(
      `read   ratio 64/1: ${(read64.pps / read1.pps).toFixed(2)}x packets/s, ` +
        `${(read1.cpuNsPerPacket / read64.cpuNsPerPacket).toFixed(2)}x less CPU per packet`,
    );

    const dev = openTun('mtbw', { netnsPath: ns.path });
    try {
      ns.ip(
        'netns',
        'exec',
        ns.name,
        'sysctl',
        '-qw',
        `net.ipv6.conf.mtbw.disable_ipv6=1`,
        'net.ipv4.ip_forward=1',
      );
      ns.ip('addr', 'add', '10.78.3.1/24', 'dev', 'mtbw');
      ns.ip('link', 'set', 'dev', 'mtbw', 'up');
      ns.ip('route', 'add', 'blackhole', '10.78.99.0/24');
      const packets = Array.from({ length: PACKETS }, (_, i) =>
        udpV4('10.78.3.2', `10.78.99.${1 + (i % 250)}`, 40_000, 9, seqPayload(i, 64), i),
      );
      const write1 = measureWrite(dev, packets, 1, 'array');
      const write64 = measureWrite(dev, packets, 64, 'array');
      const views64 = measureWrite(dev, packets, 64, 'views');
      const buffer64 = measureWrite(dev, packets, 64, 'buffer');
      console.log(`write  batch  1, write([p]):                  ${fmt(write1)}`);
      console.log(`write  batch 64, write(packets):              ${fmt(write64)}`);
      console.log(`write  batch 64, one buffer -> views, write(): ${fmt(views64)}`);
      console.log(`write  batch 64, one buffer -> writeBatch():   ${fmt(buffer64)}`);
      console.log(
        `write  ratio 64/1: ${(write64.pps / write1.pps).toFixed(2)}x packets/s, ` +
          `${(write1.cpuNsPerPacket / write64.cpuNsPerPacket).toFixed(2)}x less CPU per packet`,
      );
      console.log(`write  one buffer: writeBatch / views+write: ${(buffer64.pps / views64.pps).toFixed(2)}x`);
      if (dev.stats().writeDrops !== 0) throw new Error(`write drops: ${JSON.stringify(dev.stats())}`);
    } finally {
      dev.close();
    }
  } finally {
    ns.delete();
  }
}

await main();
