/**
 * bench/transports/kcp-throughput: MB/s of 1400-byte messages in batches of 64 through one `kcp`
 * tunnel over loopback UDP, direct and through a UDP relay dropping 0 % and 5 % of the datagrams
 * each way, beside the `tcp` tunnel (TLS over TCP through the HTTP upgrade) in the same run
 * (`node dist/bench/transports/kcp-throughput.js`; not part of the tests).
 *
 * Every figure moves BENCH_MB (64) MB one way, sender and receiver in this one process (one event
 * loop and one core do both ends, for every variant alike), pausing on back-pressure until drain.
 * Each figure is the median of BENCH_ROUNDS (3) rounds, with this process's CPU ms per MB and, for
 * kcp, the retransmissions per 1000 segments. Output: a table and the kcp/tcp ratios on stdout,
 * JSON in bench/results/kcp-transport-<timestamp>.json (git-ignored).
 */
import type { KeyObject } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { KcpTransport } from '../../src/transports/kcp-transport.js';
import { StaticPeerDirectory } from '../../src/transports/static-directory.js';
import { TcpTransport } from '../../src/transports/tcp.js';
import type { TunnelTransport } from '../../src/transports/tunnel.js';
import { newPeerIdentity as identity } from '../../test/helpers/peer-identity.js';
import { UdpRelay } from '../../test/transports/udp-relay.js';

const MB = Number(process.env['BENCH_MB'] ?? 64);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 3);
const MESSAGE = 1400;
const BATCH = 64;
const BATCHES = Math.ceil((MB * 1e6) / (MESSAGE * BATCH));
const TOTAL = BATCHES * BATCH * MESSAGE;

interface Figure {
  mbPerSecond: number;
  cpuMsPerMb: number;
  retransmitsPerK?: number;
}

interface Identity {
  key: KeyObject;
  raw: Buffer;
  id: string;
}

function pairOfIds(): [Identity, Identity] {
  return [identity(), identity()].sort((x, y) => (x.id < y.id ? -1 : 1)) as [Identity, Identity];
}

const batch = Array.from({ length: BATCH }, (_, i) => Buffer.alloc(MESSAGE, i));

/** Moves TOTAL bytes from `from` to `to` over their tunnel to `peer`. */
async function run(from: TunnelTransport, to: TunnelTransport, peer: string): Promise<Figure> {
  const tunnel = from.tunnel(peer)!;
  let got = 0;
  const done = new Promise<void>((resolve) => {
    const onMessage = (_p: string, m: { length: number }) => {
      got += m.length;
      if (got >= TOTAL) {
        to.off('message', onMessage);
        resolve();
      }
    };
    to.on('message', onMessage);
  });
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  for (let i = 0; i < BATCHES; i++) {
    if (!tunnel.send(batch))
      await new Promise<void>((resolve) => {
        const onDrain = () => {
          from.off('drain', onDrain);
          resolve();
        };
        from.on('drain', onDrain);
      });
  }
  await done;
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  return { mbPerSecond: TOTAL / 1e6 / seconds, cpuMsPerMb: (cpu.user + cpu.system) / 1000 / (TOTAL / 1e6) };
}

async function up(a: TunnelTransport, b: TunnelTransport, ia: Identity, ib: Identity): Promise<void> {
  a.ensure(ib.id);
  b.ensure(ia.id);
  const start = performance.now();
  while (a.tunnel(ib.id)?.state !== 'up' || b.tunnel(ia.id)?.state !== 'up') {
    if (performance.now() - start > 10_000) throw new Error('tunnel not up within 10 s');
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

async function kcp(lossPct: number | null): Promise<Figure> {
  const [ia, ib] = pairOfIds();
  const directory = new StaticPeerDirectory();
  const options = (i: Identity) => ({
    localPeerId: i.id,
    identityKey: i.key,
    directory,
    bind: { address: '127.0.0.1', port: 0 },
  });
  const a = await KcpTransport.start(options(ia));
  const b = await KcpTransport.start(options(ib));
  const relay = lossPct === null ? undefined : await UdpRelay.start(b.address().port, 42);
  relay?.setLoss(lossPct ?? 0);
  directory.set(ia.id, ia.raw, `127.0.0.1:${a.address().port}`);
  directory.set(ib.id, ib.raw, relay ? relay.address : `127.0.0.1:${b.address().port}`);
  try {
    await up(a, b, ia, ib);
    const figure = await run(a, b, ib.id);
    const s = a.kcpStats(ib.id)!;
    return { ...figure, retransmitsPerK: (s.retransmissions * 1000) / Math.max(1, s.segmentsSent) };
  } finally {
    await a.close();
    await b.close();
    await relay?.close();
  }
}

async function tcp(): Promise<Figure> {
  const [ia, ib] = pairOfIds();
  const directory = new StaticPeerDirectory();
  const server = http.createServer((_req, res) => res.writeHead(404).end());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const options = (i: Identity) => ({
    localPeerId: i.id,
    identityKey: i.key,
    directory,
    scheme: 'http' as const,
  });
  const a = new TcpTransport(options(ia));
  const b = new TcpTransport(options(ib));
  server.on('upgrade', (req, socket, head) => {
    if (!b.acceptUpgrade(req, socket, head)) socket.destroy();
  });
  directory.set(ia.id, ia.raw, '127.0.0.1:1');
  directory.set(ib.id, ib.raw, `127.0.0.1:${(server.address() as AddressInfo).port}`);
  try {
    await up(a, b, ia, ib);
    return await run(a, b, ib.id);
  } finally {
    await a.close();
    await b.close();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

function median(figures: Figure[]): Figure {
  const sorted = [...figures].sort((x, y) => x.mbPerSecond - y.mbPerSecond);
  return sorted[Math.floor(sorted.length / 2)]!;
}

async function main(): Promise<void> {
  const variants: [string, () => Promise<Figure>][] = [
    ['tcp tunnel', tcp],
    ['kcp direct', () => kcp(null)],
    ['kcp relay 0 % loss', () => kcp(0)],
    ['kcp relay 5 % loss', () => kcp(5)],
  ];
  const rounds = new Map<string, Figure[]>(variants.map(([name]) => [name, []]));
  // Variants alternate within each round, so a machine's load changes hit them alike.
  for (let r = 0; r < ROUNDS; r++) for (const [name, fn] of variants) rounds.get(name)!.push(await fn());
  const results: Record<string, Figure> = {};
  console.log(`${MB} MB of ${MESSAGE}-byte messages, ${ROUNDS} rounds (median)`);
  for (const [name] of variants) {
    const f = median(rounds.get(name)!);
    results[name] = f;
    console.log(
      `${name.padEnd(22)} ${f.mbPerSecond.toFixed(1).padStart(7)} MB/s  ${f.cpuMsPerMb.toFixed(1).padStart(6)} CPU ms/MB` +
        (f.retransmitsPerK === undefined
          ? ''
          : `  ${f.retransmitsPerK.toFixed(0)} retransmissions per 1000 segments`),
    );
  }
  const base = results['tcp tunnel']!.mbPerSecond;
  for (const name of ['kcp relay 0 % loss', 'kcp relay 5 % loss'])
    console.log(`ratio ${name} / tcp tunnel: ${(results[name]!.mbPerSecond / base).toFixed(2)}`);
  const dir = fileURLToPath(new URL('../../../bench/results/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  const file = `${dir}kcp-transport-${new Date().toISOString().replace(/[:.]/g, '-')}.json`;
  writeFileSync(
    file,
    JSON.stringify({ mb: MB, rounds: ROUNDS, results, all: Object.fromEntries(rounds) }, null, 1),
  );
  console.log(`written ${file}`);
}

await main();
