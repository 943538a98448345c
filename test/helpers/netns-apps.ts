/**
 * Small programs the data-plane tests run inside their namespaces (`ip netns exec NS node
 * dist/test/helpers/netns-apps.js CMD ...`):
 * - `serve PORT_HTTP PORT_UDP`: the destination. HTTP on [::] (dual stack): `/` answers the
 *   client address it saw and prints `remote <addr> <path>` to stdout (its own log);
 *   `/bytes?n=N` sends N bytes of the test stream (see streamBlock), with `&mbps=R` at R Mbit/s
 *   (never more than one 64 KiB block behind, so a stall brings no burst); `/stall` sends its headers and one line, then
 *   nothing more until the client goes (a connection on which the client only waits); a POST
 *   to `/sink` answers the number of body bytes it read. A UDP echo on PORT_UDP. Two raw TCP
 *   servers: on PORT_HTTP+1 one that reads to the client's FIN and then answers `got <n>` and
 *   closes (half-close), on PORT_HTTP+2 one that resets every connection at its first byte.
 *   Each UDP datagram's sender is printed as `udp-remote <addr>`.
 * - `tcp HOST PORT halfclose|reset|connect`: a raw TCP client; prints JSON {connected, data,
 *   error} (halfclose: sends `hello` and shuts its side; reset: sends a byte and waits; connect:
 *   connects and waits up to 3 s for anything).
 * - `udp HOST PORT TEXT`: sends TEXT, prints the echo, exits 1 after 3 s without one.
 * - `udp-send HOST PORT HEX...`: sends each hex string as one datagram from one ephemeral socket
 *   (forged and replayed datagrams), then exits.
 * - `udp-flow HOST PORT INTERVAL_MS`: one UDP flow (one socket, one source port) sending `n`
 *   every INTERVAL_MS until killed; prints `echo n` for each answer.
 * - `flood HOST PORT SECONDS`: writes to the half-closing server (PORT_HTTP+1) as fast as its
 *   socket takes bytes for SECONDS, then shuts its side; prints JSON {written, answeredMs}: the
 *   bytes written and how long after the shutdown the server's `got n` arrived (n = written).
 * - `burst URL N`: N concurrent GETs, each a new connection; prints a JSON array of statuses
 *   (or error codes).
 */
import { createCipheriv, createHash } from 'node:crypto';
import dgram from 'node:dgram';
import http from 'node:http';
import net from 'node:net';
import { networkInterfaces } from 'node:os';

/** Every 64 KiB block of the test stream starts with this marker (looked for in captures). */
export const MARKER = 'MESH-MARKER-7d1e';
const BLOCK = 64 * 1024;

/** Block i of the test stream: the marker, then AES-128-CTR keystream (fast, incompressible). */
export function streamBlock(i: number): Buffer {
  const iv = Buffer.alloc(16);
  iv.writeUInt32BE(i, 12);
  const out = createCipheriv('aes-128-ctr', Buffer.alloc(16, 7), iv).update(Buffer.alloc(BLOCK));
  out.write(MARKER, 0, 'latin1');
  return out;
}

/** SHA-256 (hex) of the first n bytes of the test stream. */
export function streamSha256(n: number): string {
  const h = createHash('sha256');
  for (let i = 0, left = n; left > 0; i++, left -= BLOCK) {
    const b = streamBlock(i);
    h.update(left >= BLOCK ? b : b.subarray(0, left));
  }
  return h.digest('hex');
}

function serve(httpPort: number, udpPort: number): void {
  const server = http.createServer((req, res) => {
    const remote = (req.socket.remoteAddress ?? '').replace(/^::ffff:/, '');
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname === '/bytes') {
      const n = Number(url.searchParams.get('n') ?? '0');
      const bytesPerMs = (Number(url.searchParams.get('mbps') ?? '0') * 1e6) / 8 / 1000;
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(n) });
      // Paced: what was sent stays within R x the time since `start`, plus one block. `start`
      // moves up after a stall, so a late timer never lets out more than that at once.
      let start = performance.now();
      let timer: NodeJS.Timeout | undefined;
      res.once('close', () => clearTimeout(timer));
      let i = 0;
      let left = n;
      const pump = () => {
        while (left > 0) {
          if (bytesPerMs > 0) {
            const now = performance.now();
            start = Math.max(start, now - (n - left + BLOCK) / bytesPerMs);
            const aheadMs = (n - left) / bytesPerMs - (now - start);
            if (aheadMs >= 1) {
              timer = setTimeout(pump, aheadMs);
              return;
            }
          }
          const b = streamBlock(i++);
          const chunk = left >= BLOCK ? b : b.subarray(0, left);
          left -= chunk.length;
          if (!res.write(chunk)) {
            res.once('drain', pump);
            return;
          }
        }
        res.end();
      };
      pump();
      return;
    }
    if (url.pathname === '/stall') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('stalled\n');
      return;
    }
    if (url.pathname === '/sink') {
      let bytes = 0;
      req.on('data', (c: Buffer) => {
        bytes += c.length;
      });
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ bytes }));
      });
      return;
    }
    process.stdout.write(`remote ${remote} ${req.url ?? '/'}\n`);
    res.writeHead(200, { 'content-type': 'application/json', connection: 'close' });
    res.end(JSON.stringify({ remote }));
  });
  server.listen(httpPort, '::');
  net
    .createServer({ allowHalfOpen: true }, (s) => {
      let n = 0;
      s.on('data', (c: Buffer) => {
        n += c.length;
      });
      s.on('end', () => s.end(`got ${n}\n`));
      s.on('error', () => {});
    })
    .listen(httpPort + 1, '::');
  net
    .createServer((s) => {
      s.once('data', () => s.resetAndDestroy());
      s.on('error', () => {});
    })
    .listen(httpPort + 2, '::');
  // One echo socket per address the destination has (and the wildcard for the rest): an answer
  // leaves from the address it was sent to, as NAT on its way back needs. From a wildcard socket
  // the kernel picks the source by route, which on a host with two legs may be the other leg's.
  const echo = (udp: dgram.Socket) =>
    udp.on('message', (msg, rinfo) => {
      process.stdout.write(`udp-remote ${rinfo.address.replace(/^::ffff:/, '')}\n`);
      udp.send(msg, rinfo.port, rinfo.address);
    });
  echo(dgram.createSocket({ type: 'udp6', ipv6Only: false, reuseAddr: true })).bind(udpPort, '::');
  for (const a of Object.values(networkInterfaces()).flat()) {
    if (!a || a.internal || (a.family === 'IPv6' && a.address.startsWith('fe80'))) continue;
    echo(dgram.createSocket({ type: a.family === 'IPv6' ? 'udp6' : 'udp4', reuseAddr: true })).bind(
      udpPort,
      a.address,
    );
  }
  server.on('listening', () => process.stdout.write('listening\n'));
}

function udpEcho(host: string, port: number, text: string): void {
  const sock = dgram.createSocket(host.includes(':') ? 'udp6' : 'udp4');
  const timer = setTimeout(() => {
    process.stderr.write('no echo within 3 s\n');
    process.exit(1);
  }, 3000);
  sock.on('message', (msg) => {
    clearTimeout(timer);
    process.stdout.write(msg.toString());
    sock.close();
  });
  sock.send(text, port, host);
}

function burst(url: string, n: number): void {
  const results: (number | string)[] = [];
  let done = 0;
  for (let i = 0; i < n; i++) {
    const req = http.get(url, { agent: false, timeout: 10_000 }, (res) => {
      res.resume();
      res.on('end', () => finish(i, res.statusCode ?? 0));
    });
    req.on('timeout', () => req.destroy(new Error('ETIMEDOUT')));
    req.on('error', (err) => finish(i, (err as NodeJS.ErrnoException).code ?? err.message));
  }
  function finish(i: number, r: number | string) {
    if (results[i] !== undefined) return;
    results[i] = r;
    if (++done === n) process.stdout.write(JSON.stringify(results));
  }
}

function tcpClient(host: string, port: number, mode: string): void {
  const out = { connected: false, data: '', error: null as string | null };
  const done = () => {
    process.stdout.write(JSON.stringify(out));
    process.exit(0);
  };
  const s = net.connect({ host, port, allowHalfOpen: true });
  const timer = setTimeout(
    () => {
      out.error = 'TIMEOUT';
      done();
    },
    mode === 'connect' ? 3000 : 10_000,
  );
  s.on('connect', () => {
    out.connected = true;
    if (mode === 'halfclose') s.end('hello');
    if (mode === 'reset') s.write('x');
  });
  s.on('data', (c: Buffer) => {
    out.data += c.toString();
  });
  s.on('end', () => {
    clearTimeout(timer);
    done();
  });
  s.on('error', (err: NodeJS.ErrnoException) => {
    clearTimeout(timer);
    out.error = err.code ?? err.message;
    done();
  });
}

function udpSend(host: string, port: number, hex: string[]): void {
  const sock = dgram.createSocket(host.includes(':') ? 'udp6' : 'udp4');
  let left = hex.length;
  if (left === 0) sock.close();
  for (const h of hex) {
    sock.send(Buffer.from(h, 'hex'), port, host, (err) => {
      if (err) process.stderr.write(`${err.message}\n`);
      if (--left === 0) sock.close();
    });
  }
}

function udpFlow(host: string, port: number, intervalMs: number): void {
  const sock = dgram.createSocket(host.includes(':') ? 'udp6' : 'udp4');
  sock.on('message', (msg) => process.stdout.write(`echo ${msg.toString()}\n`));
  let n = 0;
  setInterval(() => sock.send(String(n++), port, host), intervalMs);
}

function flood(host: string, port: number, seconds: number): void {
  const block = Buffer.alloc(64 * 1024);
  let written = 0;
  let endedAt = 0;
  let answer = '';
  const s = net.connect({ host, port, allowHalfOpen: true }, () => {
    const until = performance.now() + seconds * 1000;
    const write = () => {
      while (performance.now() < until) {
        written += block.length;
        if (!s.write(block)) return void s.once('drain', write);
      }
      s.end();
      endedAt = performance.now();
    };
    write();
  });
  s.on('data', (c: Buffer) => {
    answer += c.toString();
  });
  s.on('end', () => {
    const answeredMs = performance.now() - endedAt;
    if (answer.trim() !== `got ${written}`)
      process.stderr.write(`answer ${answer.trim()}, wrote ${written}\n`);
    process.stdout.write(`${JSON.stringify({ written, answeredMs })}\n`);
    s.destroy();
  });
  s.on('error', (err) => {
    process.stderr.write(`${err.message}\n`);
    process.exit(1);
  });
}

if (process.argv[1]?.endsWith('netns-apps.js')) {
  const [cmd, ...args] = process.argv.slice(2);
  if (cmd === 'serve') serve(Number(args[0]), Number(args[1]));
  else if (cmd === 'udp') udpEcho(args[0]!, Number(args[1]), args[2]!);
  else if (cmd === 'burst') burst(args[0]!, Number(args[1]));
  else if (cmd === 'tcp') tcpClient(args[0]!, Number(args[1]), args[2]!);
  else if (cmd === 'udp-send') udpSend(args[0]!, Number(args[1]), args.slice(2));
  else if (cmd === 'udp-flow') udpFlow(args[0]!, Number(args[1]), Number(args[2]));
  else if (cmd === 'flood') flood(args[0]!, Number(args[1]), Number(args[2]));
  else {
    process.stderr.write(`unknown command ${cmd}\n`);
    process.exit(2);
  }
}
