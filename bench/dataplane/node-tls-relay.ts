/**
 * bench/dataplane/node-tls-relay: a bare Node TLS relay, the `nodetls` path of
 * bench/dataplane/run.ts (the stream path's target: the Node ceiling for an encrypted TCP relay on
 * this machine).
 * Not part of the agent or the tests; run.ts starts one process per side, placed as paths.sh
 * places stunnel:
 *
 *   node dist/bench/dataplane/node-tls-relay.js ingress LISTEN=CONNECT [LISTEN=CONNECT...]
 *   node dist/bench/dataplane/node-tls-relay.js exit --cert C.pem --key K.pem LISTEN=CONNECT [...]
 *
 * (LISTEN and CONNECT are host:port.) ingress: a plain TCP listener; each accepted connection is
 * piped into a new TLS connection to CONNECT. exit: a TLS server; each connection is piped into a
 * plain TCP connection to CONNECT. Nothing else: pipe() both ways, Node's default socket options
 * (no setNoDelay, default buffer sizes and highWaterMark), TLS defaults (TLS 1.3, the cipher suite
 * the two sides negotiate: AES-GCM), no session resumption. The ingress does not verify the exit's
 * certificate, as stunnel's `client = yes` without `verify` does not either. Prints `ready` on
 * stdout once every listener listens, and the first connection's protocol and cipher on stderr.
 */
import { readFileSync } from 'node:fs';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';

interface Route {
  listen: { host: string; port: number };
  connect: { host: string; port: number };
}

function hostPort(text: string): { host: string; port: number } {
  const m = /^\[?([^\]]+?)\]?:(\d+)$/.exec(text);
  if (!m) throw new Error(`not host:port: ${text}`);
  return { host: m[1]!, port: Number(m[2]) };
}

/** Pipes a and b both ways; an error or close on either side ends both (no half-dead relays). */
function splice(a: Duplex, b: Duplex): void {
  a.pipe(b);
  b.pipe(a);
  const kill = () => {
    a.destroy();
    b.destroy();
  };
  a.on('error', kill);
  b.on('error', kill);
  a.on('close', kill);
  b.on('close', kill);
}

let reported = false;
function reportCipher(s: tls.TLSSocket): void {
  if (reported) return;
  reported = true;
  process.stderr.write(`first TLS connection: ${s.getProtocol()} ${s.getCipher().standardName}\n`);
}

function listen(server: net.Server, r: Route): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(r.listen.port, r.listen.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const role = args.shift();
  let cert: Buffer | undefined;
  let key: Buffer | undefined;
  const routes: Route[] = [];
  while (args.length > 0) {
    const a = args.shift()!;
    if (a === '--cert') cert = readFileSync(args.shift()!);
    else if (a === '--key') key = readFileSync(args.shift()!);
    else {
      const [l, c] = a.split('=');
      if (!l || !c) throw new Error(`not LISTEN=CONNECT: ${a}`);
      routes.push({ listen: hostPort(l), connect: hostPort(c) });
    }
  }
  if ((role !== 'ingress' && role !== 'exit') || routes.length === 0)
    throw new Error('usage: node-tls-relay ingress|exit [--cert C --key K] LISTEN=CONNECT...');
  if (role === 'exit' && (!cert || !key)) throw new Error('exit needs --cert and --key');

  const servers: net.Server[] = [];
  for (const r of routes) {
    const server =
      role === 'ingress'
        ? net.createServer((client) => {
            const upstream = tls.connect({
              host: r.connect.host,
              port: r.connect.port,
              rejectUnauthorized: false,
            });
            upstream.once('secureConnect', () => reportCipher(upstream));
            splice(client, upstream);
          })
        : tls.createServer({ cert: cert!, key: key! }, (client) => {
            reportCipher(client);
            splice(client, net.connect(r.connect.port, r.connect.host));
          });
    // A failed TLS handshake (a port scan, a client gone early) is the connection's business.
    server.on('tlsClientError', (_e: Error, socket: Duplex) => socket.destroy());
    await listen(server, r);
    servers.push(server);
  }
  process.stdout.write('ready\n');
  const stop = () => {
    for (const s of servers) s.close();
    process.exit(0);
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

main().catch((err: Error) => {
  process.stderr.write(`node-tls-relay: ${err.stack ?? err.message}\n`);
  process.exit(1);
});
