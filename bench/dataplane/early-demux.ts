/**
 * bench/dataplane/early-demux: what `net.ipv4.tcp_early_demux=0` costs the services the agent does
 * not pace. While a limited service is paced, the ingress turns early demux off for its whole
 * network namespace (docs/decisions.md §6), so every received TCP packet of every other service
 * takes a route lookup instead of the socket's cached route. Root: network namespaces.
 *
 * The data-plane tests' namespaces (test/helpers/mesh-netns.ts), one unlimited tcp service
 * ingress -> exit, iperf3 in the destination. Per rep, early demux at 0 and at 1 in the ingress's
 * namespace (alternating which goes first), iperf3 up and down for `--seconds`: the receiver's
 * Gbit/s and the machine's busy CPU seconds per GB received (agents, iperf3 and the kernel
 * together). Prints the median per setting and the ratio off / on, measured in the same run.
 *
 *   node dist/bench/dataplane/early-demux.js [--reps 4] [--seconds 5]
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { createService, meshNetnsUp, until, waitUp } from '../../test/helpers/mesh-netns.js';
import { IP, spawnIn } from '../../test/helpers/netns-topology.js';
import { median, range } from '../api/measure.js';

const { values } = parseArgs({
  options: { reps: { type: 'string', default: '4' }, seconds: { type: 'string', default: '5' } },
});
const REPS = Number(values.reps);
const SECONDS = Number(values.seconds);
if (!Number.isInteger(REPS) || REPS < 1) throw new Error('--reps: a positive integer');
if (!Number.isInteger(SECONDS) || SECONDS < 1) throw new Error('--seconds: a positive integer');
if (process.getuid?.() !== 0) throw new Error('early-demux needs root (network namespaces)');

const IPERF = 5299;
/** /proc/stat counts in 1/100 s (USER_HZ) on Linux. */
const USER_HZ = 100;
/** The machine's busy time (user, nice, system, irq, softirq) from /proc/stat, in 1/USER_HZ s. */
function cpuJiffies(): { busy: number } {
  const v = readFileSync('/proc/stat', 'utf8').split('\n')[0]!.trim().split(/\s+/).slice(1).map(Number);
  const [user = 0, nice = 0, system = 0, , , irq = 0, softirq = 0] = v;
  return { busy: user + nice + system + irq + softirq };
}

const mesh = await meshNetnsUp('mbed', 81);
const { ingress, exit, topo } = mesh;
const figures = new Map<string, { gbps: number[]; cpuPerGb: number[] }>();
let iperf: ReturnType<typeof spawnIn> | undefined;
try {
  iperf = spawnIn(topo.ns.dest, 'iperf3', ['-s', '-p', String(IPERF)]);
  await until(
    'iperf3 listening',
    async () => assert.match(await topo.run(topo.ns.dest, 'ss', ['-Htln', `sport = :${IPERF}`]), /LISTEN/),
    10_000,
  );
  const id = await createService(ingress, { target_peer_id: exit.peerId, transport_type: 'tcp' }, [
    { priority: 100, dest_cidr: '10.91.2.0/24' },
  ]);
  await waitUp(id, ingress, exit);
  for (let rep = 0; rep < REPS; rep++) {
    for (const demux of rep % 2 ? [1, 0] : [0, 1]) {
      await topo.run(topo.ns.ingress, 'sysctl', ['-qw', `net.ipv4.tcp_early_demux=${demux}`]);
      for (const direction of ['up', 'down'] as const) {
        const before = cpuJiffies();
        const out = await topo.run(
          topo.ns.client,
          'iperf3',
          [
            '-c',
            IP.dest,
            '-p',
            String(IPERF),
            '-t',
            String(SECONDS),
            '-J',
            ...(direction === 'down' ? ['-R'] : []),
          ],
          (SECONDS + 20) * 1000,
        );
        const after = cpuJiffies();
        const received = (
          JSON.parse(out) as { end: { sum_received: { bits_per_second: number; bytes: number } } }
        ).end.sum_received;
        const key = `${direction} ${demux}`;
        const f = figures.get(key) ?? { gbps: [], cpuPerGb: [] };
        f.gbps.push(received.bits_per_second / 1e9);
        f.cpuPerGb.push((after.busy - before.busy) / USER_HZ / (received.bytes / 1e9));
        figures.set(key, f);
        console.error(
          `rep ${rep + 1}: ${direction}, early demux ${demux}: ${f.gbps.at(-1)!.toFixed(2)} Gbit/s`,
        );
      }
    }
  }
} finally {
  iperf?.kill();
  await mesh.down();
}

console.log(
  '| direction | early demux | Gbit/s median [min-max] | CPU s/GB (machine) median [min-max] | off ÷ on |',
);
console.log('|---|---|---|---|---|');
for (const direction of ['up', 'down']) {
  const on = figures.get(`${direction} 1`)!;
  const off = figures.get(`${direction} 0`)!;
  for (const [label, f] of [
    ['1 (the default)', on],
    ['0 (while pacing)', off],
  ] as const) {
    const ratio = f === off ? `${(median(off.gbps) / median(on.gbps)).toFixed(2)}x` : '';
    console.log(`| ${direction} | ${label} | ${range(f.gbps, 2)} | ${range(f.cpuPerGb, 2)} | ${ratio} |`);
  }
}
