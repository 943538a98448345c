/**
 * The program src/native/sockets.root.test.ts runs inside its network namespaces
 * (`ip netns exec NS node dist/test/helpers/sockets-child.js OP JSON`): socket options and TPROXY act in
 * the namespace of the process that opens the socket, so the node process itself must be there.
 * Every result is one JSON line on stdout.
 * - `serve {"port":P,"families":[4,6],"transparent":bool}`: a server on the wildcard of each family
 *   (with openTransparentListener when transparent, else plain net). Prints `{"ready":true}` once all
 *   listen; for each connection reads until the client's FIN, then answers (and prints) what it saw:
 *   `{"localAddress","localPort","remoteAddress","remotePort","data"}` and ends its side.
 * - `client {"host","port","send"}`: plain net.connect, writes `send`, ends, prints what came back
 *   (`{"ok":true,"reply"}` or `{"ok":false,"code"}`).
 * - `connect {...ConnectOptions, "send", "abortAfterMs"}`: connectNetSocket with those options, then as
 *   `client`; prints `{"ok":true,"reply","localAddress","localPort","elapsedMs"}` or
 *   `{"ok":false,"code","name","message","elapsedMs"}`.
 * - `workers {"rounds","connects":[ConnectOptions...]}`: per round (after one without), a worker thread starts those connects
 *   (op `pending`, connections that succeed are destroyed at once) and is terminated 50 ms later, pending
 *   connects and all. Prints `{"ok":true,"fdsBefore","fdsAfter"}`; a crash at teardown kills the process.
 */
import { readdirSync } from 'node:fs';
import net from 'node:net';
import { isMainThread, parentPort, Worker } from 'node:worker_threads';
import {
  type ConnectOptions,
  connectNetSocket,
  connectSocket,
  openTransparentListener,
  socketFromFd,
} from '../../src/native/sockets.js';

function print(value: unknown): void {
  process.stdout.write(JSON.stringify(value) + '\n');
}

/** Reads until the peer's FIN, then answers with what this end saw and ends its side. */
function answerOnEnd(socket: net.Socket): void {
  let data = '';
  socket.setEncoding('utf8');
  socket.on('data', (d: string) => {
    data += d;
  });
  socket.on('end', () => {
    const seen = {
      localAddress: socket.localAddress,
      localPort: socket.localPort,
      remoteAddress: socket.remoteAddress,
      remotePort: socket.remotePort,
      data,
    };
    print(seen);
    socket.end(JSON.stringify(seen));
  });
  socket.on('error', (e) => print({ serverSocketError: (e as NodeJS.ErrnoException).code }));
}

async function serve(opts: { port: number; families: (4 | 6)[]; transparent: boolean }): Promise<void> {
  for (const family of opts.families) {
    const server = net.createServer({ allowHalfOpen: true }, answerOnEnd);
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      if (opts.transparent)
        server.listen({ fd: openTransparentListener({ family, port: opts.port }) }, resolve);
      else server.listen({ host: family === 4 ? '0.0.0.0' : '::', port: opts.port, ipv6Only: true }, resolve);
    });
  }
  print({ ready: true });
}

/** Writes `send`, ends, and resolves with everything the other end sent before its FIN. */
function exchange(socket: net.Socket, send: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let reply = '';
    socket.setEncoding('utf8');
    socket.on('data', (d: string) => {
      reply += d;
    });
    socket.on('end', () => resolve(reply));
    socket.on('error', reject);
    socket.end(send);
  });
}

async function client(opts: { host: string; port: number; send: string }): Promise<void> {
  try {
    const socket = net.connect({ host: opts.host, port: opts.port, allowHalfOpen: true });
    socket.setTimeout(10_000, () => socket.destroy(new Error('client timed out')));
    print({ ok: true, reply: await exchange(socket, opts.send) });
  } catch (e) {
    print({ ok: false, code: (e as NodeJS.ErrnoException).code, message: (e as Error).message });
  }
}

async function connect(opts: ConnectOptions & { send?: string; abortAfterMs?: number }): Promise<void> {
  const started = performance.now();
  const ms = () => Math.round(performance.now() - started);
  let signal: AbortSignal | undefined;
  if (opts.abortAfterMs !== undefined) signal = AbortSignal.timeout(opts.abortAfterMs);
  try {
    const socket = await connectNetSocket({ ...opts, signal });
    const connectedMs = ms();
    socket.setTimeout(10_000, () => socket.destroy(new Error('connect child timed out')));
    const local = { localAddress: socket.localAddress, localPort: socket.localPort };
    const reply = await exchange(socket, opts.send ?? '');
    socket.destroy();
    print({ ok: true, reply, ...local, elapsedMs: connectedMs });
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    print({ ok: false, code: err.code, name: err.name, message: err.message, elapsedMs: ms() });
  }
}

async function workers(opts: { rounds: number; connects: ConnectOptions[] }): Promise<void> {
  const fds = () => readdirSync('/proc/self/fd').length;
  let fdsBefore = fds();
  // Round 0 starts no connect: whatever the first worker opens for good is not counted.
  for (let i = 0; i <= opts.rounds; i++) {
    if (i === 1) fdsBefore = fds();
    const connects = i === 0 ? [] : opts.connects;
    const worker = new Worker(new URL(import.meta.url), { argv: ['pending', JSON.stringify(connects)] });
    await new Promise<void>((resolve, reject) => {
      worker.once('message', () => resolve());
      worker.once('error', reject);
    });
    await new Promise((r) => setTimeout(r, 50));
    await worker.terminate();
  }
  print({ ok: true, fdsBefore, fdsAfter: fds() });
}

/** In a worker: starts the connects and tells the parent; never settles by itself for a blackhole. */
function pending(connects: ConnectOptions[]): void {
  for (const c of connects)
    connectSocket(c).then(
      (fd) => socketFromFd(fd).destroy(),
      () => {},
    );
  setInterval(() => {}, 60_000); // stays until terminated
  parentPort!.postMessage('started');
}

const [op, json] = process.argv.slice(2);
const args = JSON.parse(json ?? '{}');
if (op === 'serve') await serve(args);
else if (op === 'client') await client(args);
else if (op === 'connect') await connect(args);
else if (op === 'workers' && isMainThread) await workers(args);
else if (op === 'pending' && !isMainThread) pending(args);
else {
  print({ error: `unknown op ${op}` });
  process.exitCode = 2;
}
