/**
 * bench/transports/tcp-throughput: MB/s of 1400-byte messages in batches of 64 through one `tcp`
 * tunnel over loopback, against a plain TCP socket pipe in the same run (`node
 * dist/bench/transports/tcp-throughput.js`; not part of the tests).
 *
 * Every figure moves BENCH_MB (256) MB of payload one way, sender and receiver in this one process
 * (so one event loop and one core do both ends, for every variant alike), the sender pausing on
 * back-pressure (send() false / write() false) until drain:
 * - plain TCP: the same 64 x 1400 bytes per write, no framing, no TLS: the ceiling;
 * - plain TLS 1.3 (AES-128-GCM): TLS alone, no framing, one write per batch;
 * - tunnel: TcpTransport to TcpTransport through the HTTP upgrade, as the agent runs it, with
 *   AES-128-GCM (the default) and with ChaCha20-Poly1305 alone, inside an HTTPS API port, and
 *   with high-water marks of 1 and 4 MiB instead of the default 256 KiB;
 * - send path: framed messages over plain TLS written as one buffer per batch (what the tunnel
 *   does) vs cork + a header and a payload write per message + uncork.
 * Each figure is the median of BENCH_ROUNDS (3) rounds, with this process's CPU time per MB.
 * Output: a table on stdout and JSON in bench/results/transports-<timestamp>.json (git-ignored).
 */
import { generateKeyPairSync } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net, { type AddressInfo } from 'node:net';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { FrameDecoder } from '../../src/transports/frames.js';
import { StaticPeerDirectory } from '../../src/transports/static-directory.js';
import { TcpTransport } from '../../src/transports/tcp.js';
import { selfSignedCertificate } from '../../src/transports/tunnel-certificate.js';
import { encodeDataFrames } from '../../test/helpers/frame-builders.js';
import { newPeerIdentity as identity } from '../../test/helpers/peer-identity.js';

const MB = Number(process.env['BENCH_MB'] ?? 256);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 3);
const MESSAGE = 1400;
const BATCH = 64;
const BATCHES = Math.ceil((MB * 1e6) / (MESSAGE * BATCH));
const TOTAL = BATCHES * BATCH * MESSAGE;

interface Figure {
  mbPerSecond: number;
  cpuMsPerMb: number;
}

/** Runs one transfer: `send` pushes everything, `done` resolves when the receiver has it all. */
async function measure(run: () => Promise<void>): Promise<Figure> {
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  await run();
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  return { mbPerSecond: TOTAL / 1e6 / seconds, cpuMsPerMb: (cpu.user + cpu.system) / 1000 / (TOTAL / 1e6) };
}

const batch = Array.from({ length: BATCH }, (_, i) => Buffer.alloc(MESSAGE, i));
const joined = Buffer.concat(batch);

/** Writes BATCHES batches through `write` (false = wait for `drain`). */
async function pump(write: () => boolean, waitDrain: () => Promise<void>): Promise<void> {
  for (let i = 0; i < BATCHES; i++) if (!write()) await waitDrain();
}

async function listen(server: net.Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  return (server.address() as AddressInfo).port;
}

async function close(server: net.Server): Promise<void> {
  if (server instanceof http.Server || server instanceof https.Server) server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
}

/** A byte pipe (plain TCP or TLS), `framed` with the tunnel's frames sent one way or the other. */
async function pipe(kind: 'tcp' | 'tls', sendMode: 'raw' | 'one-buffer' | 'cork' = 'raw'): Promise<Figure> {
  const key = generateKeyPairSync('ed25519').privateKey;
  const context = {
    key: key.export({ type: 'pkcs8', format: 'pem' }),
    cert: selfSignedCertificate(key, 'bench'),
    minVersion: 'TLSv1.3' as const,
    ciphers: 'TLS_AES_128_GCM_SHA256',
  };
  let received = 0;
  let done!: () => void;
  const all = new Promise<void>((resolve) => {
    done = resolve;
  });
  const decoder = new FrameDecoder({
    frame: (_t, payload) => {
      received += payload.length;
      if (received >= TOTAL) done();
    },
  });
  const onData = (chunk: Buffer) => {
    if (sendMode === 'raw') {
      received += chunk.length;
      if (received >= TOTAL) done();
    } else decoder.push(chunk);
  };
  const server =
    kind === 'tcp'
      ? net.createServer((s) => s.on('data', onData))
      : tls.createServer(context, (s) => s.on('data', onData));
  const port = await listen(server);
  const socket: net.Socket =
    kind === 'tcp'
      ? net.connect({ host: '127.0.0.1', port })
      : tls.connect({ host: '127.0.0.1', port, rejectUnauthorized: false, ciphers: context.ciphers });
  await new Promise((resolve) => socket.once(kind === 'tcp' ? 'connect' : 'secureConnect', resolve));
  socket.setNoDelay(true);
  const header = Buffer.alloc(4);
  const write = (): boolean => {
    if (sendMode === 'raw') return socket.write(joined);
    if (sendMode === 'one-buffer') return socket.write(encodeDataFrames(batch));
    socket.cork();
    for (const m of batch) {
      const h = Buffer.from(header);
      h.writeUInt32BE((1 << 24) | m.length);
      socket.write(h);
      socket.write(m);
    }
    socket.uncork();
    return socket.writableLength < socket.writableHighWaterMark;
  };
  const figure = await measure(async () => {
    await pump(write, () => new Promise((resolve) => socket.once('drain', resolve)));
    await all;
  });
  socket.destroy();
  await close(server);
  return figure;
}

/** One tunnel, TcpTransport to TcpTransport, as the agent runs it. */
async function tunnel(
  scheme: 'http' | 'https',
  ciphersuites?: string,
  highWaterMark?: number,
): Promise<Figure> {
  const directory = new StaticPeerDirectory();
  const [a, b] = [identity(), identity()].sort((x, y) => (x.id < y.id ? -1 : 1)) as [
    ReturnType<typeof identity>,
    ReturnType<typeof identity>,
  ];
  const apiKey = generateKeyPairSync('ed25519').privateKey;
  const apiTls = {
    key: apiKey.export({ type: 'pkcs8', format: 'pem' }),
    cert: selfSignedCertificate(apiKey, 'api'),
  };
  const ends = [];
  for (const who of [a, b]) {
    const transport = new TcpTransport({
      localPeerId: who.id,
      identityKey: who.key,
      directory,
      scheme,
      ...(ciphersuites ? { ciphersuites } : {}),
      ...(highWaterMark ? { highWaterMark } : {}),
    });
    const handler = (_q: http.IncomingMessage, res: http.ServerResponse) => res.writeHead(404).end();
    const server = scheme === 'https' ? https.createServer(apiTls, handler) : http.createServer(handler);
    server.on('upgrade', (req, socket, head) => {
      if (!transport.acceptUpgrade(req, socket, head)) socket.destroy();
    });
    directory.set(who.id, who.raw, `127.0.0.1:${await listen(server)}`);
    ends.push({ transport, server });
  }
  const [sender, receiver] = ends as [(typeof ends)[0], (typeof ends)[0]];
  const t = sender.transport.ensure(b.id);
  await new Promise<void>((resolve) => {
    const check = (peer: string, state: string) => {
      if (peer === b.id && state === 'up') resolve();
    };
    sender.transport.on('state', check);
  });
  let received = 0;
  let done!: () => void;
  const all = new Promise<void>((resolve) => {
    done = resolve;
  });
  receiver.transport.on('message', (_p, m) => {
    received += m.length;
    if (received >= TOTAL) done();
  });
  const figure = await measure(async () => {
    await pump(
      () => t.send(batch),
      () => drained(sender.transport),
    );
    await all;
  });
  for (const end of ends) {
    await end.transport.close();
    await close(end.server);
  }
  return figure;
}

/** The transport's next drain event. */
function drained(transport: TcpTransport): Promise<void> {
  return new Promise((resolve) => {
    const onDrain = () => {
      transport.off('drain', onDrain);
      resolve();
    };
    transport.on('drain', onDrain);
  });
}

function median(figures: Figure[]): Figure {
  const by = <K extends keyof Figure>(k: K) =>
    figures.map((f) => f[k]).sort((x, y) => x - y)[figures.length >> 1]!;
  return { mbPerSecond: by('mbPerSecond'), cpuMsPerMb: by('cpuMsPerMb') };
}

async function main(): Promise<void> {
  const variants: [string, () => Promise<Figure>][] = [
    ['plain TCP', () => pipe('tcp')],
    ['plain TLS 1.3 AES-128-GCM', () => pipe('tls')],
    ['framed over TLS, one buffer per batch', () => pipe('tls', 'one-buffer')],
    ['framed over TLS, cork + 2 writes per message', () => pipe('tls', 'cork')],
    ['tunnel (http port, AES-128-GCM, 256 KiB mark)', () => tunnel('http')],
    ['tunnel (http port, ChaCha20-Poly1305)', () => tunnel('http', 'TLS_CHACHA20_POLY1305_SHA256')],
    ['tunnel (https port, TLS in TLS)', () => tunnel('https')],
    ['tunnel (http port, high-water mark 1 MiB)', () => tunnel('http', undefined, 1024 * 1024)],
    ['tunnel (http port, high-water mark 4 MiB)', () => tunnel('http', undefined, 4 * 1024 * 1024)],
  ];
  const results: Record<string, Figure> = {};
  console.log(
    `${MB} MB one way per figure, ${MESSAGE}-byte messages in batches of ${BATCH}, median of ${ROUNDS}`,
  );
  for (const [name, run] of variants) {
    const figures: Figure[] = [];
    for (let r = 0; r < ROUNDS; r++) figures.push(await run());
    results[name] = median(figures);
  }
  const base = results['plain TCP']!.mbPerSecond;
  for (const [name, f] of Object.entries(results))
    console.log(
      `${name.padEnd(48)} ${f.mbPerSecond.toFixed(0).padStart(6)} MB/s  ${(f.mbPerSecond / base).toFixed(2)} x TCP  ` +
        `${f.cpuMsPerMb.toFixed(2)} CPU ms/MB  ${((f.mbPerSecond * 1e6) / MESSAGE / 1000).toFixed(0)} k msg/s`,
    );
  const dir = fileURLToPath(new URL('../../../bench/results/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  const stamp = new Date().toISOString().replace(/[-:]/g, '').replace(/\.\d+/, '');
  writeFileSync(
    `${dir}transports-${stamp}.json`,
    JSON.stringify({ MB, ROUNDS, MESSAGE, BATCH, results }, null, 2),
  );
}

await main();
