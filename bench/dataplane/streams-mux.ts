/**
 * bench/dataplane/streams-mux: MB/s of TCP carried as streams by two StreamMuxes, against a
 * plain in-process socket relay in the same run (`node dist/bench/dataplane/streams-mux.js`;
 * not part of the tests).
 *
 * Every figure moves BENCH_MB (128) MB one way, client -> destination, split over 1 and over
 * BENCH_STREAMS (4) connections, with every socket on loopback and both agents in this one
 * process (one event loop, one core for everything, for every variant alike):
 * - relay: client -> relay socket -> pipe() -> socket -> destination: the same socket hops as
 *   the mux path without the mux: the ceiling for this process;
 * - mux/memory: client -> ingress carry() -> StreamMux -> MemoryTransport -> StreamMux ->
 *   connect() -> destination: the mux's own cost (framing, credit, one copy per DATA frame);
 * - mux/tcp: the same over TcpTransport (HTTP upgrade, TLS 1.3 AES-128-GCM), as the agent runs.
 * Each figure is the median of BENCH_ROUNDS (3) rounds, with this process's CPU time per MB.
 * BENCH_VARIANTS picks the figures ("relay mux/memory mux/tcp"); without relay there is no ratio.
 * Output: a table on stdout and JSON in bench/results/streams-mux-<timestamp>.json.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { StreamMux } from '../../src/dataplane/streams.js';
import { MemoryNetwork, memoryPublicKey } from '../../src/transports/memory.js';
import { StaticPeerDirectory } from '../../src/transports/static-directory.js';
import { TcpTransport } from '../../src/transports/tcp.js';
import type { TunnelTransport } from '../../src/transports/tunnel.js';
import { newPeerIdentity as identity } from '../../test/helpers/peer-identity.js';

const MB = Number(process.env['BENCH_MB'] ?? 128);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 3);
const STREAMS = Number(process.env['BENCH_STREAMS'] ?? 4);
/** The muxes' initialWindow (default: the mux's own, 256 KiB; it grows with the RTT the tunnel reports). */
const WINDOW = process.env['BENCH_WINDOW'] ? Number(process.env['BENCH_WINDOW']) : undefined;
/** Which figures to take (default all three; e.g. "mux/tcp" alone under a heap profiler). */
const VARIANTS = (process.env['BENCH_VARIANTS'] || 'relay mux/memory mux/tcp')
  .split(/\s+/)
  .filter(Boolean) as Variant[];
const TOTAL = MB * 1_000_000;
const SERVICE = '5e5e5e5e-0000-4000-8000-0000000000be';
const CHUNK = Buffer.alloc(64 * 1024, 0x5a);

interface Figure {
  mbPerSecond: number;
  cpuMsPerMb: number;
}

type Variant = 'relay' | 'mux/memory' | 'mux/tcp';

interface Path {
  /** The port a client connects to. */
  port: number;
  close(): Promise<void>;
}

async function listen(server: net.Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as AddressInfo).port;
}

const closeServer = (server: net.Server): Promise<unknown> => new Promise((resolve) => server.close(resolve));

function dial(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ port, host: '127.0.0.1' });
    socket.once('connect', () => {
      socket.off('error', reject);
      resolve(socket);
    });
    socket.once('error', reject);
  });
}

function relay(destinationPort: number): Promise<Path> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.pause();
    void dial(destinationPort).then((out) => {
      sockets.add(out);
      socket.pipe(out);
      out.pipe(socket);
      socket.resume();
    });
  });
  return listen(server).then((port) => ({
    port,
    close: async () => {
      for (const s of sockets) s.destroy();
      await closeServer(server);
    },
  }));
}

/** Two transports of the kind, their tunnel up; the ingress side first. */
async function transports(kind: 'memory' | 'tcp'): Promise<{
  ends: [{ id: string; transport: TunnelTransport }, { id: string; transport: TunnelTransport }];
  close(): Promise<void>;
}> {
  const directory = new StaticPeerDirectory();
  const servers: http.Server[] = [];
  let ends: { id: string; transport: TunnelTransport }[];
  if (kind === 'memory') {
    const network = new MemoryNetwork();
    const ids = ['a'.repeat(32), 'b'.repeat(32)];
    for (const id of ids) directory.set(id, memoryPublicKey(id), `${id}:1`);
    ends = ids.map((id) => ({ id, transport: network.transport({ localPeerId: id, directory }) }));
  } else {
    ends = [];
    for (const who of [identity(), identity()]) {
      const transport = new TcpTransport({
        localPeerId: who.id,
        identityKey: who.key,
        directory,
        scheme: 'http',
      });
      const server = http.createServer((_q, res) => res.writeHead(404).end());
      server.on('upgrade', (req, socket, head) => {
        if (!transport.acceptUpgrade(req, socket, head)) socket.destroy();
      });
      servers.push(server);
      directory.set(who.id, who.raw, `127.0.0.1:${await listen(server)}`);
      ends.push({ id: who.id, transport });
    }
  }
  const [a, b] = ends as [(typeof ends)[0], (typeof ends)[0]];
  const up = (t: TunnelTransport, peer: string): Promise<void> =>
    new Promise((resolve) => {
      if (t.tunnel(peer)?.state === 'up') return resolve();
      const check = (p: string, state: string): void => {
        if (p === peer && state === 'up') {
          t.off('state', check);
          resolve();
        }
      };
      t.on('state', check);
    });
  a.transport.ensure(b.id);
  b.transport.ensure(a.id);
  await Promise.all([up(a.transport, b.id), up(b.transport, a.id)]);
  return {
    ends: [a, b],
    close: async () => {
      for (const e of ends) await e.transport.close();
      for (const s of servers) {
        s.closeAllConnections();
        await closeServer(s);
      }
    },
  };
}

async function mux(kind: 'memory' | 'tcp', destinationPort: number): Promise<Path> {
  const t = await transports(kind);
  const sockets = new Set<net.Socket>();
  const muxes = t.ends.map(({ id, transport }) => {
    const m = new StreamMux({
      link: {
        send: (peer, messages) => transport.tunnel(peer)?.send(messages) ?? true,
        // As the data plane wires it: window auto-tuning follows the tunnel's measured RTT.
        rttMs: (peer) => transport.tunnel(peer)?.stats().lastRttMs ?? null,
      },
      localPeerId: id,
      connect: async (_service, ends) => {
        const socket = await dial(ends.dstPort);
        sockets.add(socket);
        return socket;
      },
      authorize: () => true,
      ...(WINDOW ? { initialWindow: WINDOW } : {}),
    });
    transport.on('message', (peer, message) => m.onMessage(peer, message));
    transport.on('drain', (peer) => m.onDrain(peer));
    return m;
  });
  const [ingress] = muxes as [StreamMux, StreamMux];
  const exitId = t.ends[1].id;
  const server = net.createServer((socket) => {
    sockets.add(socket);
    ingress.carry(exitId, SERVICE, socket, {
      family: 4,
      srcAddr: '127.0.0.1',
      srcPort: socket.remotePort!,
      dstAddr: '127.0.0.1',
      dstPort: destinationPort,
    });
  });
  const port = await listen(server);
  return {
    port,
    close: async () => {
      for (const m of muxes) m.close();
      for (const s of sockets) s.destroy();
      await closeServer(server);
      await t.close();
    },
  };
}

/** Moves TOTAL bytes over `streams` connections through the path; resolves when all arrived. */
async function transfer(
  path: Path,
  destination: { received: number; target: number; done?: () => void },
  streams: number,
) {
  destination.received = 0;
  destination.target = TOTAL;
  const arrived = new Promise<void>((resolve) => {
    destination.done = resolve;
  });
  const clients = await Promise.all(Array.from({ length: streams }, () => dial(path.port)));
  const share = Math.floor(TOTAL / streams);
  const sends = clients.map(async (client, i) => {
    let left = i === streams - 1 ? TOTAL - share * (streams - 1) : share;
    while (left > 0) {
      const n = Math.min(left, CHUNK.length);
      left -= n;
      if (!client.write(n === CHUNK.length ? CHUNK : CHUNK.subarray(0, n)))
        await new Promise((resolve) => client.once('drain', resolve));
    }
    client.end();
  });
  await Promise.all(sends);
  await arrived;
  for (const c of clients) c.destroy();
}

async function figure(variant: Variant, streams: number): Promise<Figure> {
  const destination: { received: number; target: number; done?: () => void } = { received: 0, target: TOTAL };
  const dsockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    dsockets.add(socket);
    socket.on('data', (c: Buffer) => {
      destination.received += c.length;
      if (destination.received >= destination.target) destination.done?.();
    });
    socket.on('error', () => {});
  });
  const destinationPort = await listen(server);
  const path =
    variant === 'relay'
      ? await relay(destinationPort)
      : await mux(variant === 'mux/memory' ? 'memory' : 'tcp', destinationPort);
  const rounds: Figure[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    await transfer(path, destination, streams);
    const seconds = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    rounds.push({ mbPerSecond: MB / seconds, cpuMsPerMb: (cpu.user + cpu.system) / 1000 / MB });
  }
  await path.close();
  for (const s of dsockets) s.destroy();
  await closeServer(server);
  rounds.sort((x, y) => x.mbPerSecond - y.mbPerSecond);
  return rounds[Math.floor(rounds.length / 2)]!;
}

async function main(): Promise<void> {
  const results: Record<string, Figure & { ratio: number }> = {};
  for (const streams of [1, STREAMS]) {
    const base = VARIANTS.includes('relay') ? await figure('relay', streams) : undefined;
    for (const variant of VARIANTS) {
      const f = variant === 'relay' ? base! : await figure(variant, streams);
      const ratio = base ? f.mbPerSecond / base.mbPerSecond : Number.NaN;
      results[`${variant} x${streams}`] = { ...f, ratio };
      console.log(
        `${`${variant} x${streams}`.padEnd(16)} ${f.mbPerSecond.toFixed(0).padStart(6)} MB/s  ` +
          `${f.cpuMsPerMb.toFixed(2).padStart(6)} CPU ms/MB  ${(ratio * 100).toFixed(0).padStart(4)} % of relay`,
      );
    }
  }
  const dir = fileURLToPath(new URL('../../../bench/results/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[-:]/g, '').replace(/\.\d+/, '');
  const file = `${dir}streams-mux-${stamp}.json`;
  writeFileSync(
    file,
    JSON.stringify(
      { mb: MB, rounds: ROUNDS, window: WINDOW ?? null, node: process.version, results },
      null,
      2,
    ),
  );
  console.log(`results: ${file}`);
}

await main();
