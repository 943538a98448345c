/**
 * The socket addon against the real kernel (root). Loopback cases run in this process; TPROXY, SO_MARK,
 * transparent binds, a blackhole and ICMP errors run in three namespaces of this file's own, with the
 * node process inside them (test/helpers/sockets-child.ts), since socket options and nftables act in the
 * namespace of the process that opens the socket:
 *
 *   client 10.78.1.2 --c0/a0-- 10.78.1.1 agent 10.78.2.1 --a1/s0-- 10.78.2.2 server
 *   IPv6: fd78:1::/64 and fd78:2::/64, same host numbers.
 *
 * The client routes everything to the agent. The agent TPROXYs TCP to 198.51.100.0/24 and
 * 2001:db8:100::/64 to its transparent listener (mark 1, `ip rule fwmark 1 lookup 100`, local default in
 * table 100), and marks packets of its own transparent sockets (`socket transparent 1`) so that the
 * server's replies to the client's address are delivered to them instead of being forwarded. The server
 * routes everything back through the agent.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { closeSync, readdirSync, readFileSync } from 'node:fs';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { Netns, requireCommand } from '../../test/helpers/tun-netns.js';
import { selfSignedCertificate } from '../transports/tunnel-certificate.js';
import {
  type ConnectOptions,
  connectNetSocket,
  connectSocket,
  openTransparentListener,
  setNotSentLowat,
  setReceiveBuffer,
  socketFromFd,
} from './sockets.js';

const CHILD = fileURLToPath(new URL('../../test/helpers/sockets-child.js', import.meta.url));
const TPROXY_PORT = 5080;
const SERVER_PORT = 5090;
const MARK = 0x2a;

/** The flags of this process's open file for `fd`, from /proc/self/fdinfo (octal). */
function openFlags(fd: number): number {
  const line = readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith('flags:'));
  return Number.parseInt(line!.split(/\s+/)[1]!, 8);
}

function fdCount(): number {
  return readdirSync('/proc/self/fd').length;
}

function isOpen(fd: number): boolean {
  try {
    readFileSync(`/proc/self/fdinfo/${fd}`);
    return true;
  } catch {
    return false;
  }
}

/** Resolves once `check` holds, polling every 10 ms; rejects with `what` after timeoutMs. */
async function until(check: () => boolean, timeoutMs: number, what: () => string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`not after ${timeoutMs} ms: ${what()}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A loopback echo-ish server in this process: answers 'pong:<data>' at the client's FIN. */
interface LoopServer {
  server: net.Server;
  port: number;
  /** Server-side sockets not yet closed. */
  open: Set<net.Socket>;
  seen: { remoteAddress?: string; remotePort?: number; data: string }[];
  close(): Promise<void>;
}

async function loopServer(host: string): Promise<LoopServer> {
  const open = new Set<net.Socket>();
  const seen: LoopServer['seen'] = [];
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    open.add(s);
    s.on('close', () => open.delete(s));
    s.on('error', () => {});
    const entry = { remoteAddress: s.remoteAddress, remotePort: s.remotePort, data: '' };
    seen.push(entry);
    s.setEncoding('utf8');
    s.on('data', (d: string) => {
      entry.data += d;
    });
    s.on('end', () => s.end(`pong:${entry.data}`));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host, port: 0 }, resolve);
  });
  return {
    server,
    port: (server.address() as net.AddressInfo).port,
    open,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of open) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** Rejections of connectSocket, with their code, in one place. */
async function connectError(
  opts: ConnectOptions,
): Promise<NodeJS.ErrnoException & { address?: string; port?: number }> {
  try {
    const fd = await connectSocket(opts);
    closeSync(fd);
  } catch (e) {
    return e as NodeJS.ErrnoException;
  }
  throw new Error(`connect to ${opts.address}:${opts.port} succeeded`);
}

/** Waits for the first stdout line for which `match` holds; kills nothing (the namespace does). */
function waitLine(child: ChildProcess, match: (line: string) => boolean, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    const timer = setTimeout(
      () => reject(new Error(`no expected line after ${timeoutMs} ms; stdout: ${out}; stderr: ${err}`)),
      timeoutMs,
    );
    child.stderr?.on('data', (d: Buffer) => {
      err += d.toString();
    });
    child.stdout?.on('data', (d: Buffer) => {
      out += d.toString();
      const line = out.split('\n').find((l) => l && match(l));
      if (line) {
        clearTimeout(timer);
        resolve(line);
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`child exited (${code}) before the expected line; stdout: ${out}; stderr: ${err}`));
    });
  });
}

describe('native sockets addon: loopback in this process (root)', { timeout: 120_000 }, () => {
  let v4: LoopServer;
  let v6: LoopServer;

  before(async () => {
    if (process.getuid?.() !== 0)
      throw new Error('the socket addon tests need root (IP_TRANSPARENT, SO_MARK)');
    v4 = await loopServer('127.0.0.1');
    v6 = await loopServer('::1');
  });

  after(async () => {
    await v4?.close();
    await v6?.close();
  });

  it("setReceiveBuffer bounds a connected socket's receive buffer; a closed socket has none", async () => {
    const server = net.createServer(() => {});
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as net.AddressInfo;
    const socket = net.connect(port, '127.0.0.1');
    await new Promise((resolve) => socket.once('connect', resolve));
    try {
      // The kernel doubles what it is given, for its own bookkeeping (socket(7)).
      assert.equal(setReceiveBuffer(socket, 25_000), 50_000);
      assert.equal(setReceiveBuffer(socket, 100_000), 200_000);
      assert.throws(() => setReceiveBuffer(socket, 0), /bytes must be an integer/);
    } finally {
      socket.destroy();
      server.close();
    }
    assert.equal(setReceiveBuffer(socket, 25_000), null);
  });

  it('setNotSentLowat: the kernel takes it on plain and TLS sockets and holds less unsent; a closed socket has none', async () => {
    // A peer that never reads: what the kernel takes beyond its window waits unsent.
    const server = net.createServer((s) => s.pause());
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as net.AddressInfo;
    const taken = async (bound: number | undefined): Promise<number> => {
      const socket = net.connect(port, '127.0.0.1');
      await new Promise((resolve) => socket.once('connect', resolve));
      try {
        if (bound !== undefined) assert.equal(setNotSentLowat(socket, bound), bound);
        // In 64 KiB writes: Node counts a write as pending until the kernel took all of it.
        const block = Buffer.alloc(65_536);
        for (let i = 0; i < 256; i++) socket.write(block);
        await new Promise((resolve) => setTimeout(resolve, 300));
        return 256 * block.length - socket.writableLength;
      } finally {
        socket.destroy();
      }
    };
    try {
      const unbounded = await taken(undefined);
      const bounded = await taken(16 * 1024);
      console.log(`# the kernel took ${unbounded} bytes unbounded, ${bounded} with a 16 KiB bound`);
      assert.ok(unbounded - bounded > 512 * 1024, `${unbounded} against ${bounded}`);
      const tlsKey = generateKeyPairSync('ed25519').privateKey;
      const tlsServer = tls.createServer({
        key: tlsKey.export({ type: 'pkcs8', format: 'pem' }),
        cert: selfSignedCertificate(tlsKey, 'lowat'),
      });
      await new Promise<void>((resolve) => tlsServer.listen(0, '127.0.0.1', resolve));
      const secure = tls.connect({
        port: (tlsServer.address() as net.AddressInfo).port,
        host: '127.0.0.1',
        rejectUnauthorized: false,
      });
      await new Promise((resolve) => secure.once('secureConnect', resolve));
      assert.equal(setNotSentLowat(secure, 65_536), 65_536, 'through the TLS socket, its TCP socket');
      assert.throws(() => setNotSentLowat(secure, 0), /bytes must be an integer/);
      secure.destroy();
      tlsServer.close();
      assert.equal(setNotSentLowat(secure, 65_536), null);
    } finally {
      server.close();
    }
  });

  it('a transparent listener fd is non-blocking, close-on-exec, and net.Server listens on it', async () => {
    for (const [family, address] of [
      [4, '127.0.0.1'],
      [6, '::1'],
    ] as const) {
      const fd = openTransparentListener({ family, address, port: 0 });
      const flags = openFlags(fd);
      assert.ok(flags & 0o4000, 'O_NONBLOCK');
      assert.ok(flags & 0o2000000, 'O_CLOEXEC');
      const server = net.createServer((s) => s.end('hi'));
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen({ fd }, resolve);
      });
      const { port, address: bound } = server.address() as net.AddressInfo;
      assert.equal(bound, address);
      assert.ok(port > 0);
      // A second listener on the same address and port is refused (SO_REUSEADDR does not share a
      // listening port), and the failed fd is closed (see the fd count test).
      assert.throws(() => openTransparentListener({ family, address, port }), { code: 'EADDRINUSE' });
      const got = await new Promise<string>((resolve, reject) => {
        const c = net.connect({ host: address, port });
        let data = '';
        c.setEncoding('utf8');
        c.on('data', (d: string) => {
          data += d;
        });
        c.on('end', () => resolve(data));
        c.on('error', reject);
      });
      assert.equal(got, 'hi');
      await new Promise<void>((resolve) => server.close(() => resolve()));
      assert.equal(isOpen(fd), false, 'server.close() closed the fd');
    }
  });

  it('openTransparentListener refuses bad options with a TypeError', () => {
    assert.throws(() => openTransparentListener({ family: 5 as 4, port: 1 }), TypeError);
    assert.throws(() => openTransparentListener({ family: 4, address: '::1', port: 1 }), TypeError);
    assert.throws(() => openTransparentListener({ family: 6, address: '127.0.0.1', port: 1 }), TypeError);
    assert.throws(() => openTransparentListener({ family: 4, port: 65536 }), TypeError);
    assert.throws(() => openTransparentListener({ family: 4, port: 1.5 }), TypeError);
  });

  for (const family of [4, 6] as const) {
    it(`connectSocket (IPv${family}): a connected fd that net.Socket wraps; data both ways, half-close both ways, destroy`, async () => {
      const srv = family === 4 ? v4 : v6;
      const address = family === 4 ? '127.0.0.1' : '::1';
      const fd = await connectSocket({ family, address, port: srv.port });
      assert.ok(openFlags(fd) & 0o4000, 'O_NONBLOCK');
      assert.ok(openFlags(fd) & 0o2000000, 'O_CLOEXEC');
      const socket = socketFromFd(fd);
      assert.equal(socket.remoteAddress, address);
      assert.equal(socket.remotePort, srv.port);
      assert.equal(socket.localAddress, address);
      const localPort = socket.localPort!;
      assert.ok(localPort > 0);
      let reply = '';
      let ended = false;
      socket.setEncoding('utf8');
      socket.on('data', (d: string) => {
        reply += d;
      });
      socket.on('end', () => {
        ended = true;
      });
      socket.write('ping-1 ');
      // Half-close from our side: the server sees end, yet its answer still reaches us (allowHalfOpen).
      socket.end('ping-2');
      await until(
        () => ended,
        5000,
        () => `reply so far '${reply}'`,
      );
      assert.equal(reply, 'pong:ping-1 ping-2');
      const entry = srv.seen.find((e) => e.remotePort === localPort);
      assert.equal(entry?.remoteAddress, address);
      await until(
        () => srv.open.size === 0,
        5000,
        () => `${srv.open.size} server sockets open`,
      );
      socket.destroy();
      await until(
        () => socket.closed,
        5000,
        () => 'socket not closed',
      );
      assert.equal(isOpen(fd), false, 'destroy() closed the fd');
    });
  }

  it('half-close from the server: our readable side ends while we still write', async () => {
    // A server that ends first, then reports what it got after our FIN.
    let got = '';
    const server = net.createServer({ allowHalfOpen: true }, (s) => {
      s.setEncoding('utf8');
      s.end('server-done');
      s.on('data', (d: string) => {
        got += d;
      });
      s.on('end', () => s.destroy());
    });
    await new Promise<void>((resolve) => server.listen({ host: '127.0.0.1', port: 0 }, resolve));
    try {
      const socket = await connectNetSocket({
        family: 4,
        address: '127.0.0.1',
        port: (server.address() as net.AddressInfo).port,
      });
      let reply = '';
      socket.setEncoding('utf8');
      socket.on('data', (d: string) => {
        reply += d;
      });
      await until(
        () => socket.readableEnded,
        5000,
        () => `no end; reply '${reply}'`,
      );
      assert.equal(reply, 'server-done');
      assert.equal(socket.writable, true, 'still writable after the peer FIN');
      socket.end('late words');
      await until(
        () => socket.closed,
        5000,
        () => 'socket not closed',
      );
      await until(
        () => got === 'late words',
        5000,
        () => `server got '${got}'`,
      );
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  it('destroy() with unread data resets the connection (the server sees ECONNRESET)', async () => {
    let serverError: string | undefined;
    let serverClosed = false;
    const server = net.createServer((s) => {
      s.on('error', (e) => {
        serverError = (e as NodeJS.ErrnoException).code;
      });
      s.on('close', () => {
        serverClosed = true;
      });
      s.write(Buffer.alloc(64 * 1024));
      // Keep writing so that the reset hits a write or a read in flight.
      const t = setInterval(() => s.writable && s.write(Buffer.alloc(1024)), 5);
      s.on('close', () => clearInterval(t));
    });
    await new Promise<void>((resolve) => server.listen({ host: '127.0.0.1', port: 0 }, resolve));
    try {
      const fd = await connectSocket({
        family: 4,
        address: '127.0.0.1',
        port: (server.address() as net.AddressInfo).port,
      });
      // Paused before any read: the server's bytes stay unread in the kernel, so close() sends RST.
      const socket = new net.Socket({ fd, readable: true, writable: true });
      socket.pause();
      await new Promise((r) => setTimeout(r, 50));
      socket.destroy();
      await until(
        () => serverClosed,
        5000,
        () => `server error ${serverError}`,
      );
      assert.equal(serverError, 'ECONNRESET');
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  it('binds localAddress and localPort before connecting', async () => {
    const probe = net.createServer();
    await new Promise<void>((resolve) => probe.listen({ host: '127.0.0.2', port: 0 }, resolve));
    const localPort = (probe.address() as net.AddressInfo).port;
    await new Promise((r) => probe.close(r)); // a port that was free a moment ago
    const socket = await connectNetSocket({
      family: 4,
      address: '127.0.0.1',
      port: v4.port,
      localAddress: '127.0.0.2',
      localPort,
    });
    assert.equal(socket.localAddress, '127.0.0.2');
    assert.equal(socket.localPort, localPort);
    socket.resume(); // flowing, so that 'end' comes
    socket.end('x');
    await until(
      () => socket.readableEnded,
      5000,
      () => 'no end',
    );
    const entry = v4.seen.find((e) => e.remotePort === localPort);
    assert.equal(entry?.remoteAddress, '127.0.0.2');
    socket.destroy();
    // Address without port: the kernel picks the port at connect (IP_BIND_ADDRESS_NO_PORT).
    const s2 = await connectNetSocket({
      family: 4,
      address: '127.0.0.1',
      port: v4.port,
      localAddress: '127.0.0.3',
    });
    assert.equal(s2.localAddress, '127.0.0.3');
    assert.ok(s2.localPort! > 0);
    s2.destroy();
  });

  it('rejects with errno codes: ECONNREFUSED, EADDRNOTAVAIL, EADDRINUSE; TypeError for bad options', async () => {
    const probe = net.createServer();
    await new Promise<void>((resolve) => probe.listen({ host: '127.0.0.1', port: 0 }, resolve));
    const closedPort = (probe.address() as net.AddressInfo).port;
    await new Promise((r) => probe.close(r));

    for (const [family, address] of [
      [4, '127.0.0.1'],
      [6, '::1'],
    ] as const) {
      const refused = await connectError({ family, address, port: closedPort });
      assert.equal(refused.code, 'ECONNREFUSED');
      assert.equal(refused.syscall, 'connect');
      assert.equal(refused.errno, -111);
      assert.equal(refused.address, address);
      assert.equal(refused.port, closedPort);
      assert.match(refused.message, /ECONNREFUSED/);
    }
    // A non-local source address without `transparent`.
    const notLocal = await connectError({
      family: 4,
      address: '127.0.0.1',
      port: v4.port,
      localAddress: '192.0.2.1',
    });
    assert.equal(notLocal.code, 'EADDRNOTAVAIL');
    assert.equal(notLocal.syscall, 'bind');
    // The server's own port as source port on its own address: in use.
    const inUse = await connectError({
      family: 4,
      address: '127.0.0.1',
      port: v4.port,
      localAddress: '127.0.0.1',
      localPort: v4.port,
    });
    assert.equal(inUse.code, 'EADDRINUSE');

    const bad: [string, ConnectOptions][] = [
      ['family', { family: 5 as 4, address: '127.0.0.1', port: 1 }],
      ['address family', { family: 6, address: '127.0.0.1', port: 1 }],
      ['host name', { family: 4, address: 'localhost', port: 1 }],
      ['port 0', { family: 4, address: '127.0.0.1', port: 0 }],
      ['localAddress family', { family: 4, address: '127.0.0.1', port: 1, localAddress: '::1' }],
      ['mark', { family: 4, address: '127.0.0.1', port: 1, mark: -1 }],
      ['timeout', { family: 4, address: '127.0.0.1', port: 1, timeoutMs: Number.NaN }],
    ];
    for (const [what, opts] of bad) await assert.rejects(connectSocket(opts), TypeError, what);
  });

  it('an AbortSignal cancels: already aborted, and aborted while the connect is pending', async () => {
    const pre = new AbortController();
    pre.abort(new Error('reason'));
    await assert.rejects(
      connectSocket({ family: 4, address: '127.0.0.1', port: v4.port, signal: pre.signal }),
      {
        name: 'AbortError',
        code: 'ABORT_ERR',
      },
    );
    const before = fdCount();
    const ctl = new AbortController();
    const p = connectSocket({ family: 4, address: '127.0.0.1', port: v4.port, signal: ctl.signal });
    ctl.abort(); // before the loop ran: the connect is still pending
    await assert.rejects(p, { name: 'AbortError', code: 'ABORT_ERR' });
    assert.equal(fdCount(), before, 'the pending socket is closed');
    // Aborting after it settled changes nothing.
    const ctl2 = new AbortController();
    const fd = await connectSocket({ family: 4, address: '127.0.0.1', port: v4.port, signal: ctl2.signal });
    ctl2.abort();
    assert.equal(isOpen(fd), true);
    closeSync(fd);
  });

  it('no fd leaks: 1000 listeners, 1000 connects, 300 refused, 200 aborted, 100 bind failures', async () => {
    const cycle = async () => {
      const l = openTransparentListener({ family: 4, address: '127.0.0.1', port: 0 });
      closeSync(l);
      const s = await connectNetSocket({ family: 4, address: '127.0.0.1', port: v4.port });
      s.destroy();
    };
    for (let i = 0; i < 10; i++) await cycle(); // warm-up: whatever Node opens lazily
    await until(
      () => v4.open.size === 0,
      10_000,
      () => `${v4.open.size} server sockets open`,
    );
    const baseline = fdCount();
    for (let i = 0; i < 1000; i++) await cycle();
    for (let i = 0; i < 100; i++) {
      assert.throws(() => openTransparentListener({ family: 4, address: '127.0.0.1', port: v4.port }), {
        code: 'EADDRINUSE',
      });
    }
    const probe = net.createServer();
    await new Promise<void>((resolve) => probe.listen({ host: '127.0.0.1', port: 0 }, resolve));
    const closedPort = (probe.address() as net.AddressInfo).port;
    await new Promise((r) => probe.close(r));
    for (let i = 0; i < 300; i++) {
      const e = await connectError({ family: 4, address: '127.0.0.1', port: closedPort });
      assert.equal(e.code, 'ECONNREFUSED');
    }
    for (let i = 0; i < 200; i++) {
      const ctl = new AbortController();
      const p = connectSocket({ family: 4, address: '127.0.0.1', port: v4.port, signal: ctl.signal });
      ctl.abort();
      await assert.rejects(p, { code: 'ABORT_ERR' });
    }
    for (let i = 0; i < 100; i++) {
      const e = await connectError({
        family: 4,
        address: '127.0.0.1',
        port: v4.port,
        localAddress: '192.0.2.1',
      });
      assert.equal(e.code, 'EADDRNOTAVAIL');
    }
    await until(
      () => v4.open.size === 0,
      10_000,
      () => `${v4.open.size} server sockets open`,
    );
    assert.equal(fdCount(), baseline);
  });
});

describe('native sockets addon: TPROXY, SO_MARK, transparent bind in namespaces (root)', {
  timeout: 120_000,
}, () => {
  let client: Netns;
  let agent: Netns;
  let server: Netns;

  const nft = (ns: Netns, args: string[], input?: string): string => {
    try {
      return execFileSync('ip', ['netns', 'exec', ns.name, 'nft', ...args], {
        encoding: 'utf8',
        input,
        timeout: 10_000,
        stdio: 'pipe',
      });
    } catch (e) {
      const err = e as { stderr?: string; message: string };
      throw new Error(`nft ${args.join(' ')} in ${ns.name}: ${err.stderr?.trim() || err.message}`);
    }
  };
  const child = async (ns: Netns, op: string, args: unknown, timeoutMs = 20_000) => {
    const r = await ns.run(
      process.execPath,
      ['--enable-source-maps', CHILD, op, JSON.stringify(args)],
      timeoutMs,
    );
    assert.equal(r.code, 0, `${op} in ${ns.name}: ${r.stdout}${r.stderr}`);
    const line = r.stdout.trim().split('\n').pop()!;
    return JSON.parse(line) as Record<string, unknown>;
  };
  const markCounter = () => {
    const out = nft(agent, ['-j', 'list', 'counter', 'inet', 'msock', 'marksyn']);
    const items = (JSON.parse(out) as { nftables: { counter?: { packets: number } }[] }).nftables;
    return items.find((i) => i.counter)!.counter!.packets;
  };

  before(async () => {
    if (process.getuid?.() !== 0) throw new Error('the socket addon tests need root (namespaces, nftables)');
    requireCommand('nft', ['--version']);
    client = Netns.create('msock');
    agent = Netns.create('msock');
    server = Netns.create('msock');
    client.ip('link', 'add', 'c0', 'type', 'veth', 'peer', 'name', 'a0', 'netns', agent.name);
    agent.ip('link', 'add', 'a1', 'type', 'veth', 'peer', 'name', 's0', 'netns', server.name);
    const addr = (ns: Netns, dev: string, v4: string, v6: string) => {
      ns.ip('addr', 'add', v4, 'dev', dev);
      ns.ip('addr', 'add', v6, 'dev', dev, 'nodad');
      ns.ip('link', 'set', dev, 'up');
    };
    addr(client, 'c0', '10.78.1.2/24', 'fd78:1::2/64');
    addr(agent, 'a0', '10.78.1.1/24', 'fd78:1::1/64');
    addr(agent, 'a1', '10.78.2.1/24', 'fd78:2::1/64');
    addr(server, 's0', '10.78.2.2/24', 'fd78:2::2/64');
    client.ip('route', 'add', 'default', 'via', '10.78.1.1');
    client.ip('-6', 'route', 'add', 'default', 'via', 'fd78:1::1');
    server.ip('route', 'add', 'default', 'via', '10.78.2.1');
    server.ip('-6', 'route', 'add', 'default', 'via', 'fd78:2::1');
    agent.ip('rule', 'add', 'fwmark', '1', 'lookup', '100');
    agent.ip('route', 'add', 'local', '0.0.0.0/0', 'dev', 'lo', 'table', '100');
    agent.ip('-6', 'rule', 'add', 'fwmark', '1', 'lookup', '100');
    agent.ip('-6', 'route', 'add', 'local', '::/0', 'dev', 'lo', 'table', '100');
    // Refused at once by the route (connect() fails before waiting).
    agent.ip('route', 'add', 'unreachable', '203.0.113.0/24');
    nft(
      agent,
      ['-f', '-'],
      `table inet msock {
        counter marksyn {}
        chain pre {
          type filter hook prerouting priority mangle; policy accept;
          meta l4proto tcp ip daddr 198.51.100.0/24 tproxy ip to :${TPROXY_PORT} meta mark set 1 accept
          meta l4proto tcp ip6 daddr 2001:db8:100::/64 tproxy ip6 to :${TPROXY_PORT} meta mark set 1 accept
          meta l4proto tcp socket transparent 1 meta mark set 1 accept
        }
        chain out {
          type filter hook output priority mangle; policy accept;
          meta mark ${MARK} tcp flags & (syn | ack) == syn counter name marksyn
        }
      }`,
    );
    nft(
      server,
      ['-f', '-'],
      `table inet msock {
        chain in {
          type filter hook input priority filter; policy accept;
          tcp dport 7 drop
          tcp dport 8 reject with icmpx type host-unreachable
        }
      }`,
    );
    const serve = server.spawn(process.execPath, [
      '--enable-source-maps',
      CHILD,
      'serve',
      JSON.stringify({ port: SERVER_PORT, families: [4, 6], transparent: false }),
    ]);
    await waitLine(serve, (l) => l.includes('"ready"'), 10_000);
  });

  after(() => {
    client?.delete();
    agent?.delete();
    server?.delete();
  });

  it('TPROXY delivers to the transparent listener with the original destination as local address (v4, v6)', async () => {
    // Both families on one port: only possible because the IPv6 listener is IPV6_V6ONLY.
    const listener = agent.spawn(process.execPath, [
      '--enable-source-maps',
      CHILD,
      'serve',
      JSON.stringify({ port: TPROXY_PORT, families: [4, 6], transparent: true }),
    ]);
    await waitLine(listener, (l) => l.includes('"ready"'), 10_000);
    const cases = [
      { host: '198.51.100.7', port: 80, remote: '10.78.1.2' },
      { host: '198.51.100.200', port: 443, remote: '10.78.1.2' },
      { host: '2001:db8:100::7', port: 80, remote: 'fd78:1::2' },
    ];
    try {
      for (const c of cases) {
        const send = `hello ${c.host}`;
        const r = await child(client, 'client', { host: c.host, port: c.port, send });
        assert.equal(r['ok'], true, JSON.stringify(r));
        const seen = JSON.parse(r['reply'] as string) as Record<string, unknown>;
        assert.equal(seen['localAddress'], c.host);
        assert.equal(seen['localPort'], c.port);
        assert.equal(seen['remoteAddress'], c.remote);
        assert.equal(seen['data'], send);
      }
    } finally {
      listener.kill('SIGKILL');
    }
  });

  it('SO_MARK: the SYN carries the mark (nft counter), an unmarked connect does not count', async () => {
    const before = markCounter();
    const marked = await child(agent, 'connect', {
      family: 4,
      address: '10.78.2.2',
      port: SERVER_PORT,
      mark: MARK,
      send: 'marked',
    });
    assert.equal(marked['ok'], true, JSON.stringify(marked));
    assert.equal(JSON.parse(marked['reply'] as string)['data'], 'marked');
    assert.equal(markCounter(), before + 1);
    const plain = await child(agent, 'connect', {
      family: 4,
      address: '10.78.2.2',
      port: SERVER_PORT,
      send: 'p',
    });
    assert.equal(plain['ok'], true, JSON.stringify(plain));
    assert.equal(markCounter(), before + 1);
    const marked6 = await child(agent, 'connect', {
      family: 6,
      address: 'fd78:2::2',
      port: SERVER_PORT,
      mark: MARK,
      send: 'm6',
    });
    assert.equal(marked6['ok'], true, JSON.stringify(marked6));
    assert.equal(markCounter(), before + 2);
  });

  it("transparent: binds the client's (non-local) address; the server sees it, replies come back (v4, v6)", async () => {
    const cases = [
      { family: 4, address: '10.78.2.2', localAddress: '10.78.1.2', localPort: 40_123 },
      { family: 4, address: '10.78.2.2', localAddress: '10.78.1.2' },
      { family: 6, address: 'fd78:2::2', localAddress: 'fd78:1::2', localPort: 40_124 },
    ];
    for (const c of cases) {
      const r = await child(agent, 'connect', {
        ...c,
        port: SERVER_PORT,
        transparent: true,
        send: 'from client',
      });
      assert.equal(r['ok'], true, JSON.stringify(r));
      assert.equal(r['localAddress'], c.localAddress);
      const seen = JSON.parse(r['reply'] as string) as Record<string, unknown>;
      assert.equal(seen['remoteAddress'], c.localAddress);
      if (c.localPort) assert.equal(seen['remotePort'], c.localPort);
      assert.equal(seen['data'], 'from client');
    }
    // The same bind without `transparent` is refused.
    const refused = await child(agent, 'connect', {
      family: 4,
      address: '10.78.2.2',
      port: SERVER_PORT,
      localAddress: '10.78.1.2',
    });
    assert.equal(refused['code'], 'EADDRNOTAVAIL', JSON.stringify(refused));
  });

  it('timeoutMs against a blackhole rejects ETIMEDOUT on time; an abort rejects AbortError', async () => {
    const t = await child(agent, 'connect', { family: 4, address: '10.78.2.2', port: 7, timeoutMs: 400 });
    assert.equal(t['ok'], false);
    assert.equal(t['code'], 'ETIMEDOUT', JSON.stringify(t));
    assert.match(t['message'] as string, /timed out after 400 ms/);
    // On time: not before the deadline (timer rounding aside), and far from the kernel's own
    // two minutes; the upper bound is loose because a loaded machine runs timers late.
    assert.ok((t['elapsedMs'] as number) >= 390 && (t['elapsedMs'] as number) < 5000, `${t['elapsedMs']} ms`);
    const a = await child(agent, 'connect', { family: 6, address: 'fd78:2::2', port: 7, abortAfterMs: 300 });
    assert.equal(a['code'], 'ABORT_ERR', JSON.stringify(a));
    assert.equal(a['name'], 'AbortError');
    assert.ok((a['elapsedMs'] as number) >= 290 && (a['elapsedMs'] as number) < 5000, `${a['elapsedMs']} ms`);
  });

  it('a worker terminated with connects pending or just settled: no crash, no fd left open', async () => {
    const connects = [
      ...Array.from({ length: 4 }, () => ({ family: 4, address: '10.78.2.2', port: 7 })), // blackhole
      ...Array.from({ length: 4 }, () => ({ family: 4, address: '10.78.2.2', port: SERVER_PORT })),
      { family: 6, address: 'fd78:2::2', port: 7, timeoutMs: 40 }, // times out around the terminate
    ];
    const r = await child(agent, 'workers', { rounds: 30, connects }, 60_000);
    assert.equal(r['ok'], true, JSON.stringify(r));
    assert.equal(r['fdsAfter'], r['fdsBefore']);
  });

  it('EHOSTUNREACH: from an ICMP error while connecting, and at once from an unreachable route', async () => {
    const icmp = await child(agent, 'connect', { family: 4, address: '10.78.2.2', port: 8, timeoutMs: 5000 });
    assert.equal(icmp['code'], 'EHOSTUNREACH', JSON.stringify(icmp));
    const icmp6 = await child(agent, 'connect', {
      family: 6,
      address: 'fd78:2::2',
      port: 8,
      timeoutMs: 5000,
    });
    assert.equal(icmp6['code'], 'EHOSTUNREACH', JSON.stringify(icmp6));
    const route = await child(agent, 'connect', {
      family: 4,
      address: '203.0.113.9',
      port: 80,
      timeoutMs: 5000,
    });
    assert.equal(route['code'], 'EHOSTUNREACH', JSON.stringify(route));
  });
});
