/**
 * bench/transports/udp-impair: how fast the UDP impairment proxy (test/helpers/udp-impair.ts)
 * forwards 1400-byte datagrams on loopback, as a ratio to a plain UDP relay built the same way
 * without any impairment code, in the same run (`node dist/bench/transports/udp-impair.js`; not
 * part of the tests). The proxy must carry at least 300 Mbit/s unimpaired (for the kcp transport's
 * tests).
 *
 * The relay under test runs in a child process of its own (the proxy through its CLI, as tests in
 * namespaces run it); this process is the traffic generator: a sender socket connected to the
 * relay and a sink socket behind it, so on this 2-core machine the relay has one core and the
 * generator the other. Loads, each for BENCH_SECONDS (3) seconds:
 * - max: as fast as the generator sends (bursts of 64, backing off while its socket queue fills);
 * - 300M: paced at 300 Mbit/s (26 786 datagrams/s), where loss shows a relay that cannot keep up;
 * - echo max: the sink sends every datagram back through the relay (both directions loaded), the
 *   rate counted on what returns.
 * Relays: none (generator straight to the sink: the ceiling of the generator itself), the plain
 * relay, the proxy at 0 %, the proxy with 20 ms +- 5 ms delay (its queue and timer at work), and
 * the proxy with everything on (5 % loss, 1 % dup, 2 % reorder, 20 +- 5 ms).
 * Each figure is the median of BENCH_ROUNDS (3) rounds by delivered rate, with the relay's CPU
 * share (utime + stime of its process over the run; 100 % = one core).
 * Output: a table on stdout and JSON in bench/results/udp-impair-<timestamp>.json (git-ignored).
 *
 * `node udp-impair.js relay LISTEN TO` runs the plain relay alone (prints {"listening":...}).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createSocket, type RemoteInfo, type Socket } from 'node:dgram';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { type Endpoint, formatEndpoint, parseEndpoint } from '../../test/helpers/udp-impair.js';

const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 3);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 3);
const SIZE = 1400;
const TARGET_MBIT = 300;
const BUFFER = 4 << 20;
const IMPAIR_JS = fileURLToPath(new URL('../../test/helpers/udp-impair.js', import.meta.url));

/** The plain relay: a socket per client connected to the server, datagrams passed on untouched. */
function plainRelay(listen: Endpoint, to: Endpoint): void {
  const socket = createSocket({ type: 'udp4', recvBufferSize: BUFFER, sendBufferSize: BUFFER });
  const clients = new Map<string, Socket>();
  // the proxy's counter shape, so both relays report alike
  const up = { forwarded: 0 };
  const down = { forwarded: 0 };
  socket.on('message', (data: Buffer, rinfo: RemoteInfo) => {
    const key = `${rinfo.address} ${rinfo.port}`;
    let upstream = clients.get(key);
    if (upstream === undefined) {
      const u = createSocket({ type: 'udp4', recvBufferSize: BUFFER, sendBufferSize: BUFFER });
      u.on('message', (reply: Buffer) => {
        socket.send(reply, rinfo.port, rinfo.address);
        down.forwarded++;
      });
      u.on('error', () => {});
      u.connect(to.port, to.host);
      clients.set(key, u);
      upstream = u;
    }
    // a send before connect() completes throws ERR_SOCKET_DGRAM_NOT_CONNECTED: that one is lost
    try {
      upstream.send(data);
      up.forwarded++;
    } catch {}
  });
  socket.bind(listen.port, listen.host, () => {
    const a = socket.address();
    process.stdout.write(
      `${JSON.stringify({ listening: formatEndpoint({ host: a.address, port: a.port }) })}\n`,
    );
  });
  process.on('SIGUSR2', () => process.stdout.write(`${JSON.stringify({ up, down })}\n`));
  process.once('SIGTERM', () =>
    process.stdout.write(`${JSON.stringify({ up, down })}\n`, () => process.exit(0)),
  );
}

interface Relay {
  child: ChildProcess | undefined;
  address: Endpoint;
  /** Datagrams the relay has sent on so far, both directions (SIGUSR2 makes it print its counters). */
  forwarded(): Promise<number>;
  /** The child's last stdout line after it stopped (its counters). */
  stop(): Promise<string | undefined>;
}

/** Starts a relay child (or none: `to` itself) and waits for its {"listening"} line. */
async function startRelay(kind: 'none' | 'plain' | 'impair', to: Endpoint, flags: string[]): Promise<Relay> {
  if (kind === 'none')
    return { child: undefined, address: to, forwarded: async () => 0, stop: async () => undefined };
  const args =
    kind === 'plain'
      ? [fileURLToPath(import.meta.url), 'relay', '127.0.0.1:0', formatEndpoint(to)]
      : [IMPAIR_JS, '--listen', '127.0.0.1:0', '--to', formatEndpoint(to), '--seed', '42', ...flags];
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout! });
  let last: string | undefined;
  const address = await new Promise<Endpoint>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${kind} relay did not start`)), 10_000);
    child.once('exit', (code) => reject(new Error(`${kind} relay exited with ${code}`)));
    lines.once('line', (line) => {
      clearTimeout(timer);
      resolve(parseEndpoint((JSON.parse(line) as { listening: string }).listening));
    });
  });
  let waiting: ((line: string) => void) | undefined;
  lines.on('line', (line) => {
    last = line;
    waiting?.(line);
    waiting = undefined;
  });
  return {
    child,
    address,
    forwarded: () =>
      new Promise((resolve) => {
        waiting = (line) => resolve(forwarded(line));
        child.kill('SIGUSR2');
      }),
    stop: () =>
      new Promise((resolve) => {
        child.once('exit', () => resolve(last));
        child.kill('SIGTERM');
      }),
  };
}

/** up.forwarded + down.forwarded from a relay's closing line (no relay: 0). */
function forwarded(line: string): number {
  const c = JSON.parse(line) as { up: { forwarded: number }; down: { forwarded: number } };
  return c.up.forwarded + c.down.forwarded;
}

/** utime + stime of a process, in seconds. */
function cpuSeconds(pid: number | undefined): number {
  if (pid === undefined) return 0;
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100; // USER_HZ is 100 on Linux
}

function udpErrors(): Record<string, number> {
  const lines = readFileSync('/proc/net/snmp', 'utf8')
    .split('\n')
    .filter((l) => l.startsWith('Udp:'));
  const keys = lines[0]!.split(/\s+/).slice(1);
  const values = lines[1]!.split(/\s+/).slice(1).map(Number);
  return Object.fromEntries(keys.map((k, i) => [k, values[i]!]));
}

function diff(a: Record<string, number>, b: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.entries(a).map(([k, v]) => [k, v - (b[k] ?? 0)]));
}

interface Figure {
  offeredMbit: number;
  /** What the relay sent on (both directions under echo), from its own counters. */
  relayMbit: number;
  deliveredMbit: number;
  lossPct: number;
  relayCpuPct: number;
  /**
   * The relay's CPU time per datagram it sent on: unlike the rates, it holds up when other work
   * takes the relay's core away; 1e6 / it = datagrams/s one core could relay.
   */
  relayCpuUsPerDatagram: number;
}

/** 'max': as fast as the generator goes; 'NNNM': paced at NNN Mbit/s; 'echo max': both ways. */
type Load = 'max' | '300M' | '500M' | '600M' | 'echo max';

const pacedPps = (load: Load): number | undefined =>
  load.endsWith('M') ? (Number(load.slice(0, -1)) * 1e6) / 8 / SIZE : undefined;

async function bound(socket: Socket, port = 0): Promise<Endpoint> {
  await new Promise<void>((resolve) => socket.bind(port, '127.0.0.1', () => resolve()));
  const a = socket.address();
  return { host: a.address, port: a.port };
}

async function measure(kind: 'none' | 'plain' | 'impair', flags: string[], load: Load): Promise<Figure> {
  const sink = createSocket({ type: 'udp4', recvBufferSize: BUFFER, sendBufferSize: BUFFER });
  const sender = createSocket({ type: 'udp4', recvBufferSize: BUFFER, sendBufferSize: BUFFER });
  const sinkAt = await bound(sink);
  const relay = await startRelay(kind, sinkAt, flags);
  let received = 0;
  const echo = load === 'echo max';
  if (echo) {
    sink.on('message', (data: Buffer, rinfo: RemoteInfo) => sink.send(data, rinfo.port, rinfo.address));
    sender.on('message', () => received++);
  } else sink.on('message', () => received++);
  await new Promise<void>((resolve) =>
    sender.connect(relay.address.port, relay.address.host, () => resolve()),
  );
  // a warm-up datagram creates the relay's upstream socket before the clock starts
  sender.send(Buffer.alloc(SIZE));
  await new Promise((resolve) => setTimeout(resolve, 200));
  received = 0;
  const payload = Buffer.alloc(SIZE, 7);
  const forwarded0 = await relay.forwarded();
  const cpu0 = cpuSeconds(relay.child?.pid);
  const snmp0 = udpErrors();
  const pps = pacedPps(load);
  const t0 = performance.now();
  const end = t0 + SECONDS * 1000;
  let sent = 0;
  await new Promise<void>((resolve) => {
    const tick = () => {
      const now = performance.now();
      if (now >= end) {
        resolve();
        return;
      }
      let budget = pps === undefined ? 64 : Math.min(512, Math.floor(((now - t0) / 1000) * pps) - sent);
      // the kernel's send buffer is full: do not pile datagrams up in libuv's queue
      if (sender.getSendQueueCount() > 16) budget = 0;
      for (let i = 0; i < budget; i++) sender.send(payload);
      sent += Math.max(0, budget);
      // paced and on schedule: sleep ~1 ms rather than spin, leaving the CPU to the relay and to
      // whatever else runs on this machine (flat out, the generator spins on purpose)
      if (pps !== undefined && budget <= 0) setTimeout(tick, 1);
      else setImmediate(tick);
    };
    tick();
  });
  const seconds = (performance.now() - t0) / 1000;
  const relayed = (await relay.forwarded()) - forwarded0;
  const cpu = cpuSeconds(relay.child?.pid) - cpu0;
  // what is in flight (up to the 20 + 5 + 10 ms of the impaired variants) lands
  await new Promise((resolve) => setTimeout(resolve, 300));
  const counters = await relay.stop();
  if (process.env['BENCH_DEBUG']) console.log({ sent, received, counters, snmp: diff(udpErrors(), snmp0) });
  await Promise.all([sink, sender].map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
  const mbit = (n: number) => (n * SIZE * 8) / seconds / 1e6;
  return {
    offeredMbit: mbit(sent),
    deliveredMbit: mbit(received),
    lossPct: sent === 0 ? 0 : (100 * (sent - received)) / sent,
    relayCpuPct: (100 * cpu) / seconds,
    relayMbit: mbit(relayed),
    relayCpuUsPerDatagram: relayed === 0 ? 0 : (cpu * 1e6) / relayed,
  };
}

async function main(): Promise<void> {
  const relays: [string, 'none' | 'plain' | 'impair', string[]][] = [
    ['no relay (generator ceiling)', 'none', []],
    ['plain relay', 'plain', []],
    ['udp-impair 0 %', 'impair', []],
    ['udp-impair 20 +- 5 ms', 'impair', ['--delay-ms', '20', '--jitter-ms', '5']],
    [
      'udp-impair 5 % loss, 1 % dup, 2 % reorder, 20 +- 5 ms',
      'impair',
      ['--loss', '5', '--dup', '1', '--reorder', '2', '--delay-ms', '20', '--jitter-ms', '5'],
    ],
  ];
  const loads = (['max', '300M', '500M', '600M', 'echo max'] as Load[]).filter(
    (l) => !process.env['BENCH_LOADS'] || process.env['BENCH_LOADS'].split(',').includes(l),
  );
  console.log(
    `${SIZE}-byte datagrams on 127.0.0.1, ${SECONDS} s per figure, median of ${ROUNDS}.\n` +
      'relayed: what the relay sent on (its own counters; both directions under echo), the figure under\n' +
      'the max loads; delivered/loss: end to end (under max loads mostly the generator dropping what it\n' +
      'cannot read while it sends flat out); relay CPU 100 % = one core.',
  );
  const results: Partial<Record<Load, Record<string, Figure>>> = {};
  for (const load of loads) {
    // paced: what arrives is the figure; flat out: what the relay manages to pass on
    const key = (f: Figure) => (pacedPps(load) === undefined ? f.relayMbit : f.deliveredMbit);
    const row: Record<string, Figure> = {};
    results[load] = row;
    for (const [name, kind, flags] of relays) {
      if (process.env['BENCH_ONLY'] && !name.includes(process.env['BENCH_ONLY'])) continue;
      const figures: Figure[] = [];
      for (let r = 0; r < ROUNDS; r++) figures.push(await measure(kind, flags, load));
      figures.sort((a, b) => key(a) - key(b));
      const f = figures[Math.floor(figures.length / 2)]!;
      row[name] = f;
      const plain = row['plain relay'];
      const ratio = plain && kind === 'impair' ? `${(key(f) / key(plain)).toFixed(2)} x plain` : '';
      console.log(
        `${load.padEnd(9)} ${name.padEnd(54)} offered ${f.offeredMbit.toFixed(0).padStart(5)}  ` +
          `relayed ${f.relayMbit.toFixed(0).padStart(5)}  delivered ${f.deliveredMbit.toFixed(0).padStart(5)} Mbit/s  ` +
          `loss ${f.lossPct.toFixed(2).padStart(6)} %  relay CPU ${f.relayCpuPct.toFixed(0).padStart(3)} % ` +
          `${f.relayCpuUsPerDatagram.toFixed(1).padStart(5)} us/dgram  ${ratio}`,
      );
    }
  }
  const fig = (load: Load, name: string) => results[load]?.[name];
  const ratio = (load: Load, pick: (f: Figure) => number) => {
    const a = fig(load, 'udp-impair 0 %');
    const b = fig(load, 'plain relay');
    return a && b ? pick(a) / pick(b) : null;
  };
  const paced = fig('300M', 'udp-impair 0 %');
  const max = fig('max', 'udp-impair 0 %');
  const verdict = {
    relayMaxMbit: max?.relayMbit ?? null,
    ratioToPlainMax: ratio('max', (f) => f.relayMbit),
    /** Mbit/s of 1400-byte datagrams one core could relay, from the CPU cost under the max load. */
    oneCoreMbit:
      max && max.relayCpuUsPerDatagram > 0 ? (1e6 / max.relayCpuUsPerDatagram) * SIZE * 8 * 1e-6 : null,
    costRatioToPlainMax: ratio('max', (f) => f.relayCpuUsPerDatagram),
    ratioToPlainEcho: ratio('echo max', (f) => f.relayMbit),
    ratioToPlain300M: ratio('300M', (f) => f.deliveredMbit),
    costRatioToPlain300M: ratio('300M', (f) => f.relayCpuUsPerDatagram),
    ratioToPlain500M: ratio('500M', (f) => f.deliveredMbit),
    paced300DeliveredMbit: paced?.deliveredMbit ?? null,
    paced300LossPct: paced?.lossPct ?? null,
    meets300Mbit: paced !== undefined && paced.deliveredMbit >= TARGET_MBIT * 0.99 && paced.lossPct < 1,
  };
  console.log(JSON.stringify(verdict));
  const dir = fileURLToPath(new URL('../../../bench/results/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[-:]/g, '').replace(/\.\d+/, '');
  writeFileSync(
    `${dir}udp-impair-${stamp}.json`,
    JSON.stringify({ SECONDS, ROUNDS, SIZE, results, verdict }, null, 2),
  );
}

if (process.argv[2] === 'relay') plainRelay(parseEndpoint(process.argv[3]!), parseEndpoint(process.argv[4]!));
else await main();
