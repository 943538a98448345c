/**
 * The UDP impairment proxy (udp-impair.ts) on loopback: seeded loss gives exactly the replayed
 * drops per direction; delay and jitter stay within bounds and do not reorder; duplicates and
 * held-back datagrams are the replayed ones and are observed; an outage drops everything in its
 * window (also what was queued) and nothing after, scheduled, on demand and by SIGUSR1 to the CLI;
 * IPv6; replies reach the right one of two clients; idle clients are forgotten; flags parse.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createSocket, type Socket } from 'node:dgram';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { afterEach, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { prng } from './seeded-random.js';
import {
  type Endpoint,
  formatEndpoint,
  type ImpairCounters,
  impairSeed,
  parseArgs,
  parseEndpoint,
  type UdpImpairOptions,
  UdpImpairProxy,
} from './udp-impair.js';
import { waitUntil } from './wait-until.js';

const CLI = fileURLToPath(new URL('./udp-impair.js', import.meta.url));
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The 95th percentile of a non-empty list of numbers. */
const percentile95 = (values: number[]) =>
  [...values].sort((x, y) => x - y)[Math.floor(values.length * 0.95)]!;

const eventually = (what: string, check: () => boolean, timeoutMs = 5000) =>
  waitUntil(what, check, timeoutMs, undefined, 2);

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** A datagram carrying its sequence number and the time it was sent (performance.now()). */
function datagram(seq: number, size = 64): Buffer {
  const b = Buffer.alloc(size);
  b.writeUInt32BE(seq, 0);
  b.writeDoubleBE(performance.now(), 4);
  return b;
}

interface Arrival {
  seq: number;
  /** One-way time from the sender's stamp, ms. */
  ms: number;
  from: string;
}

/** A bound socket that records what arrives (and, as an echo server, sends it back). */
async function endpoint(
  host: string,
  echo = false,
): Promise<{ socket: Socket; at: Endpoint; got: Arrival[] }> {
  const socket = createSocket({ type: host.includes(':') ? 'udp6' : 'udp4', recvBufferSize: 4 << 20 });
  const got: Arrival[] = [];
  socket.on('message', (msg, rinfo) => {
    got.push({
      seq: msg.readUInt32BE(0),
      ms: performance.now() - msg.readDoubleBE(4),
      from: `${rinfo.port}`,
    });
    if (echo) socket.send(msg, rinfo.port, rinfo.address);
  });
  await new Promise<void>((resolve) => socket.bind(0, host, () => resolve()));
  cleanups.push(() => new Promise<void>((resolve) => socket.close(() => resolve())));
  return { socket, at: { host, port: socket.address().port }, got };
}

async function proxy(opts: UdpImpairOptions): Promise<UdpImpairProxy> {
  const p = await UdpImpairProxy.start(opts);
  cleanups.push(() => p.close());
  return p;
}

/** A client socket connected to the proxy. */
async function client(p: UdpImpairProxy | Endpoint) {
  const at = p instanceof UdpImpairProxy ? p.address : p;
  const c = await endpoint(at.host.includes(':') ? '::1' : '127.0.0.1');
  await new Promise<void>((resolve) => c.socket.connect(at.port, at.host, () => resolve()));
  return c;
}

/** The decisions one stream makes for its first n draws: true where r * 100 < pct. */
function replay(
  seed: number,
  direction: 'up' | 'down',
  kind: 'loss' | 'dup' | 'reorder',
  pct: number,
  n: number,
) {
  const r = prng(impairSeed(seed, direction, kind));
  return Array.from({ length: n }, () => r() * 100 < pct);
}

describe('udp-impair: UDP impairment proxy', { timeout: 60_000 }, () => {
  it('drops exactly the datagrams the seeded loss streams pick, per direction', async () => {
    const seed = 42;
    const server = await endpoint('127.0.0.1', true);
    const p = await proxy({
      listen: '127.0.0.1:0',
      to: server.at,
      seed,
      up: { lossPct: 10 },
      down: { lossPct: 20 },
    });
    const c = await client(p);
    const N = 3000;
    // chunks the kernel cannot overflow, each waited for end to end, so only the proxy drops
    for (let seq = 0; seq < N; ) {
      for (const end = Math.min(N, seq + 100); seq < end; seq++) c.socket.send(datagram(seq));
      await eventually('the chunk went through both ways', () => {
        const k = p.counters;
        return (
          k.up.received === seq &&
          server.got.length === k.up.forwarded &&
          k.down.received === server.got.length &&
          c.got.length === k.down.forwarded
        );
      });
    }
    const upDrop = replay(seed, 'up', 'loss', 10, N);
    const upKept = [...Array(N).keys()].filter((s) => !upDrop[s]);
    const downDrop = replay(seed, 'down', 'loss', 20, upKept.length);
    const back = upKept.filter((_, i) => !downDrop[i]);
    const k = p.counters;
    assert.equal(k.up.droppedLoss, N - upKept.length);
    assert.equal(k.down.droppedLoss, upKept.length - back.length);
    assert.ok(k.up.droppedLoss > 200 && k.up.droppedLoss < 400, `about 10 % of ${N}: ${k.up.droppedLoss}`);
    assert.deepEqual(
      server.got.map((a) => a.seq),
      upKept,
    );
    assert.deepEqual(
      c.got.map((a) => a.seq),
      back,
    );
    assert.deepEqual(k.up, {
      ...zero(),
      received: N,
      forwarded: upKept.length,
      bytesForwarded: 64 * upKept.length,
      dropped: N - upKept.length,
      droppedLoss: N - upKept.length,
    });
    assert.equal(k.clients, 1);
    assert.equal(k.queued, 0);
  });

  it('delays each direction within delay +- jitter without reordering', async () => {
    const server = await endpoint('127.0.0.1', true);
    const p = await proxy({
      listen: '127.0.0.1:0',
      to: server.at,
      up: { delayMs: 30, jitterMs: 10 },
      down: { delayMs: 15 },
    });
    const c = await client(p);
    const N = 200;
    for (let seq = 0; seq < N; seq++) {
      c.socket.send(datagram(seq));
      if (seq % 4 === 3) await sleep(1);
    }
    await eventually('all echoes back', () => c.got.length === N);
    const oneWay = server.got.map((a) => a.ms);
    const min = Math.min(...oneWay);
    const max = Math.max(...oneWay);
    const p95 = percentile95(oneWay);
    // never early (the timer waits for the due time); late only by timer and event-loop slack.
    // Sender, proxy and receiver share this process, so one stall of the loaded machine delays
    // every datagram in flight: the 95th percentile is held to the tight slack, the maximum to a
    // stall's.
    assert.ok(min >= 20, `one-way up delay ${min.toFixed(1)} ms < 30 - 10`);
    assert.ok(p95 <= 40 + 50, `one-way up delay p95 ${p95.toFixed(1)} ms > 30 + 10 + 50 slack`);
    assert.ok(max <= 40 + 500, `one-way up delay ${max.toFixed(1)} ms > 30 + 10 + 500 stall slack`);
    assert.ok(max - min >= 5, `jitter spreads the delays: ${min.toFixed(1)}..${max.toFixed(1)} ms`);
    assert.deepEqual(
      server.got.map((a) => a.seq),
      [...Array(N).keys()],
      'jitter alone keeps the order',
    );
    assert.deepEqual(
      c.got.map((a) => a.seq),
      [...Array(N).keys()],
    );
    // round trip less the one-way up time: the down direction's 15 ms (no jitter there)
    const upBySeq = new Map(server.got.map((a) => [a.seq, a.ms]));
    const down = c.got.map((a) => a.ms - upBySeq.get(a.seq)!);
    assert.ok(Math.min(...down) >= 15 - 1, `down delay ${Math.min(...down).toFixed(1)} ms < 15`);
    const downP95 = percentile95(down);
    assert.ok(downP95 <= 15 + 50, `down delay p95 ${downP95.toFixed(1)} ms > 15 + 50 slack`);
    assert.ok(
      Math.max(...down) <= 15 + 500,
      `down delay ${Math.max(...down).toFixed(1)} ms > 15 + 500 stall slack`,
    );
  });

  it('duplicates and holds back exactly the replayed datagrams, and later ones overtake the held', async () => {
    const seed = 7;
    const sink = await endpoint('127.0.0.1');
    const p = await proxy({
      listen: '127.0.0.1:0',
      to: sink.at,
      seed,
      impairment: { dupPct: 10, reorderPct: 10, reorderMs: 40 },
    });
    const c = await client(p);
    const N = 1000;
    const BURST = 10;
    for (let seq = 0; seq < N; ) {
      for (const end = seq + BURST; seq < end; seq++) c.socket.send(datagram(seq));
      await sleep(2);
    }
    const dup = replay(seed, 'up', 'dup', 10, N);
    const held = replay(seed, 'up', 'reorder', 10, N);
    const dups = dup.filter(Boolean).length;
    await eventually('everything arrived', () => sink.got.length === N + dups);
    const k = p.counters;
    assert.equal(k.up.duplicated, dups);
    assert.equal(k.up.reordered, held.filter(Boolean).length);
    assert.equal(k.up.forwarded, N + dups);
    assert.ok(dups > 50 && k.up.reordered > 50, `some of each: ${dups} dup, ${k.up.reordered} held`);
    const seen = new Map<number, number>();
    for (const a of sink.got) seen.set(a.seq, (seen.get(a.seq) ?? 0) + 1);
    for (let s = 0; s < N; s++) assert.equal(seen.get(s), dup[s] ? 2 : 1, `copies of ${s}`);
    const order = sink.got.map((a) => a.seq);
    const firstAt = new Map<number, number>();
    order.forEach((s, i) => {
      if (!firstAt.has(s)) firstAt.set(s, i);
    });
    let overtaken = 0;
    for (let s = 0; s < N; s++) {
      if (!held[s]) continue;
      // the rest of its burst was sent at once behind it, so it must have been overtaken
      const before = order.slice(0, firstAt.get(s)!);
      if (s % BURST !== BURST - 1)
        assert.ok(
          before.some((x) => x > s),
          `held ${s} was overtaken`,
        );
      if (before.some((x) => x > s)) overtaken++;
    }
    assert.ok(overtaken > 0);
    const normal = order.filter((s) => !held[s]);
    for (let i = 1; i < normal.length; i++)
      assert.ok(
        normal[i]! >= normal[i - 1]!,
        `datagrams not held stay in order (${normal[i - 1]}, ${normal[i]})`,
      );
  });

  it('an outage on demand drops everything sent or queued in it and nothing after', async () => {
    const sink = await endpoint('127.0.0.1');
    const p = await proxy({ listen: '127.0.0.1:0', to: sink.at });
    const c = await client(p);
    const sendAndSettle = async (from: number, n: number) => {
      const target = p.counters.up.received + n;
      for (let s = from; s < from + n; s++) c.socket.send(datagram(s));
      await eventually('the proxy read them', () => p.counters.up.received === target);
    };
    await sendAndSettle(0, 50);
    await eventually('before: all arrive', () => sink.got.length === 50);
    p.setOutage(true);
    assert.equal(p.inOutage, true);
    await sendAndSettle(50, 50);
    p.setOutage(false);
    await sendAndSettle(100, 50);
    await eventually('after: all arrive', () => sink.got.length === 100);
    await sleep(50);
    assert.deepEqual(
      sink.got.map((a) => a.seq),
      [...[...Array(50).keys()], ...[...Array(50).keys()].map((s) => s + 100)],
    );
    assert.equal(p.counters.up.droppedOutage, 50);
    assert.equal(p.counters.up.dropped, 50);

    // queued (delayed) datagrams due during the outage are lost with it
    // (1 s: long enough that a stall of this process cannot let one come due before the cut)
    p.setImpairment('up', { delayMs: 1000 });
    await sendAndSettle(200, 20);
    assert.equal(p.counters.queued, 20);
    p.setOutage(true);
    await eventually('the queued come due in the outage', () => p.counters.queued === 0, 5000);
    p.setOutage(false);
    assert.equal(p.counters.queued, 0);
    assert.equal(p.counters.up.droppedOutage, 70);
    await sendAndSettle(300, 5);
    await eventually('after: the delayed ones arrive', () => sink.got.length === 105);
    assert.deepEqual(
      sink.got.slice(100).map((a) => a.seq),
      [300, 301, 302, 303, 304],
    );
  });

  it('a scheduled outage cuts the link for its window, then nothing more is lost', async () => {
    const sink = await endpoint('127.0.0.1');
    const started = performance.now();
    const p = await proxy({ listen: '127.0.0.1:0', to: sink.at, outage: { atMs: 200, durationMs: 300 } });
    const c = await client(p);
    // one datagram every ~2 ms, each marked with the proxy's state just before it was sent and
    // after the 2 ms in which the proxy read it (same process): where the two differ, the outage
    // began or ended around it and its fate is not asserted
    const sentIn = new Map<number, boolean>();
    let cutAt = 0;
    let backAt = 0;
    let edges = 0;
    let seq = 0;
    while (performance.now() - started < 800) {
      const before = p.inOutage;
      c.socket.send(datagram(seq));
      await sleep(2);
      const after = p.inOutage;
      const now = performance.now() - started;
      if (after && cutAt === 0) cutAt = now;
      if (!after && cutAt !== 0 && backAt === 0) backAt = now;
      if (before === after) sentIn.set(seq, before);
      else edges++;
      seq++;
    }
    await eventually('the proxy read all', () => p.counters.up.received === seq);
    await sleep(50);
    assert.ok(edges <= 2, `${edges} datagrams at the edges`);
    // observed within one 2 ms step (plus timer lateness) of the scheduled times; libuv keeps
    // timer time in whole milliseconds from a cached loop clock, so a timer can fire up to 1 ms
    // before its delay has passed by performance.now() (CI saw the cut at 199.x ms)
    assert.ok(cutAt >= 200 - 1 && cutAt < 200 + 100, `cut at ${cutAt.toFixed(2)} ms`);
    assert.ok(backAt >= 500 - 1 && backAt < 500 + 100, `back at ${backAt.toFixed(2)} ms`);
    const got = new Set(sink.got.map((a) => a.seq));
    const inWindow = [...sentIn].filter(([, cut]) => cut).map(([s]) => s);
    const outside = [...sentIn].filter(([, cut]) => !cut).map(([s]) => s);
    assert.ok(inWindow.length > 20, `sent ${inWindow.length} in the window`);
    assert.deepEqual(
      inWindow.filter((s) => got.has(s)),
      [],
      'nothing in the window passes',
    );
    assert.deepEqual(
      outside.filter((s) => !got.has(s)),
      [],
      'everything outside it passes',
    );
    assert.equal(p.counters.up.droppedOutage, seq - got.size);
    assert.ok(p.counters.up.droppedOutage >= inWindow.length);
    assert.equal(p.inOutage, false);
  });

  it('carries IPv6, and IPv4 clients to an IPv6 server', async () => {
    const server = await endpoint('::1', true);
    for (const listen of ['[::1]:0', '127.0.0.1:0']) {
      const p = await proxy({ listen, to: server.at, seed: 3, impairment: { lossPct: 25 } });
      assert.equal(
        formatEndpoint(p.address).startsWith(listen === '[::1]:0' ? '[::1]:' : '127.0.0.1:'),
        true,
      );
      const c = await client(p);
      const before = server.got.length;
      for (let s = 0; s < 200; s++) c.socket.send(datagram(s));
      const upKept = replay(3, 'up', 'loss', 25, 200).filter((d) => !d).length;
      const back = replay(3, 'down', 'loss', 25, upKept).filter((d) => !d).length;
      await eventually(
        'both ways through',
        () => c.got.length === back && server.got.length - before === upKept,
      );
      assert.equal(p.counters.up.droppedLoss, 200 - upKept);
    }
  });

  it('sends each reply to the client that caused it, with one upstream socket per client', async () => {
    const server = await endpoint('127.0.0.1', true);
    const p = await proxy({ listen: '127.0.0.1:0', to: server.at });
    const a = await client(p);
    const b = await client(p);
    for (let s = 0; s < 100; s++) {
      a.socket.send(datagram(s));
      b.socket.send(datagram(1000 + s));
    }
    await eventually('both echoed', () => a.got.length === 100 && b.got.length === 100);
    assert.ok(a.got.every((x) => x.seq < 1000));
    assert.ok(b.got.every((x) => x.seq >= 1000));
    const sources = new Map<string, Set<boolean>>();
    for (const g of server.got) sources.set(g.from, (sources.get(g.from) ?? new Set()).add(g.seq < 1000));
    assert.equal(sources.size, 2, 'the server sees two peers');
    for (const kinds of sources.values()) assert.equal(kinds.size, 1, 'each peer is one client');
    assert.equal(p.counters.clients, 2);
  });

  it('forgets idle clients and takes them back when they speak again', async () => {
    const server = await endpoint('127.0.0.1', true);
    const p = await proxy({ listen: '127.0.0.1:0', to: server.at, clientIdleMs: 100 });
    const c = await client(p);
    c.socket.send(datagram(1));
    await eventually('echo', () => c.got.length === 1);
    assert.equal(p.counters.clients, 1);
    await eventually('forgotten', () => p.counters.clients === 0, 2000);
    c.socket.send(datagram(2));
    await eventually('echo again', () => c.got.length === 2);
    assert.equal(p.counters.clients, 1);
    assert.equal(new Set(server.got.map((g) => g.from)).size, 2, 'a new upstream socket');
  });

  it('CLI: prints where it listens, SIGUSR1 toggles the outage, SIGTERM prints the counters', async () => {
    const sink = await endpoint('127.0.0.1');
    const child = spawn(
      process.execPath,
      [
        CLI,
        '--listen',
        '127.0.0.1:0',
        '--to',
        formatEndpoint(sink.at),
        '--seed',
        '9',
        '--loss-down',
        '50',
        '--delay-ms',
        '1',
      ],
      {
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    cleanups.push(() => {
      if (child.exitCode === null) child.kill('SIGKILL');
    });
    const out = createInterface({ input: child.stdout });
    const err = createInterface({ input: child.stderr });
    const outLines: string[] = [];
    const errLines: string[] = [];
    out.on('line', (l) => outLines.push(l));
    err.on('line', (l) => errLines.push(l));
    await eventually('the listening line', () => outLines.length === 1, 10_000);
    const ready = JSON.parse(outLines[0]!) as {
      listening: string;
      up: { lossPct: number; delayMs: number };
      down: { lossPct: number };
    };
    assert.equal(ready.up.lossPct, 0);
    assert.equal(ready.up.delayMs, 1);
    assert.equal(ready.down.lossPct, 50);
    const c = await client(parseEndpoint(ready.listening));
    /** SIGUSR2: the counters line, without stopping. */
    const counters = async () => {
      const n = outLines.length;
      child.kill('SIGUSR2');
      await eventually(
        `a counters line (${JSON.stringify({ outLines, errLines, exit: child.exitCode, sig: child.signalCode })})`,
        () => outLines.length > n,
      );
      return JSON.parse(outLines[n]!) as ImpairCounters;
    };
    const burst = async (from: number) => {
      for (let s = from; s < from + 20; s++) c.socket.send(datagram(s));
      const until = performance.now() + 5000;
      while ((await counters()).up.received < from + 20) {
        assert.ok(performance.now() < until, 'the proxy did not read the burst in 5 s');
        await sleep(10);
      }
    };
    await burst(0);
    await eventually('first 20', () => sink.got.length === 20);
    child.kill('SIGUSR1');
    await eventually('outage on', () => errLines.includes('{"outage":true}'));
    await burst(20);
    child.kill('SIGUSR1');
    await eventually('outage off', () => errLines.includes('{"outage":false}'));
    await burst(40);
    await eventually('last 20', () => sink.got.length === 40);
    const linesBefore = outLines.length;
    const exited = once(child, 'exit');
    child.kill('SIGTERM');
    const [code] = await exited;
    assert.equal(code, 0);
    assert.equal(outLines.length, linesBefore + 1, 'one counters line at the end');
    const k = JSON.parse(outLines[linesBefore]!) as ImpairCounters;
    assert.equal(k.up.received, 60);
    assert.equal(k.up.forwarded, 40);
    assert.equal(k.up.droppedOutage, 20);
    assert.equal(k.clients, 1);
    assert.deepEqual(
      sink.got.map((a) => a.seq),
      [...[...Array(20).keys()], ...[...Array(20).keys()].map((s) => s + 40)],
    );
  });

  it('parses endpoints and flags, per direction over the common value, and refuses bad ones', () => {
    assert.deepEqual(parseEndpoint('10.0.0.1:7000'), { host: '10.0.0.1', port: 7000 });
    assert.deepEqual(parseEndpoint('[fd00::1]:7000'), { host: 'fd00::1', port: 7000 });
    assert.deepEqual(parseEndpoint('fd00::1:7000'), { host: 'fd00::1', port: 7000 });
    for (const bad of ['localhost:1', '10.0.0.1', '10.0.0.1:x', '10.0.0.1:70000', '[fd00::1]'])
      assert.throws(() => parseEndpoint(bad), /ADDR:PORT/, bad);
    const o = parseArgs(
      '--listen 0.0.0.0:5000 --to [fd00::2]:6000 --loss 5 --loss-down 7 --delay-ms 20 --jitter-ms 5 --dup 1 --reorder 2 --reorder-ms-up 30 --seed 42 --outage-at-ms 1000 --outage-ms 5000'.split(
        ' ',
      ),
    );
    assert.deepEqual(o, {
      listen: { host: '0.0.0.0', port: 5000 },
      to: { host: 'fd00::2', port: 6000 },
      impairment: { lossPct: 5, delayMs: 20, jitterMs: 5, dupPct: 1, reorderPct: 2 },
      up: { reorderMs: 30 },
      down: { lossPct: 7 },
      seed: 42,
      outage: { atMs: 1000, durationMs: 5000 },
    });
    for (const bad of [
      '--listen 127.0.0.1:1',
      '--listen 127.0.0.1:1 --to 127.0.0.1:2 --los 5',
      '--listen 127.0.0.1:1 --to 127.0.0.1:2 --loss -1',
      '--listen 127.0.0.1:1 --to 127.0.0.1:2 --loss',
      '--listen 127.0.0.1:1 --to 127.0.0.1:2 --outage-ms 5',
    ])
      assert.throws(() => parseArgs(bad.split(' ')), bad);
  });

  it('refuses impossible impairments', async () => {
    await assert.rejects(
      UdpImpairProxy.start({ listen: '127.0.0.1:0', to: '127.0.0.1:9', impairment: { lossPct: 101 } }),
      /percent/,
    );
    await assert.rejects(
      UdpImpairProxy.start({ listen: '127.0.0.1:0', to: '127.0.0.1:9', up: { delayMs: -1 } }),
      />= 0/,
    );
  });
});

function zero(): ImpairCounters['up'] {
  return {
    received: 0,
    forwarded: 0,
    bytesForwarded: 0,
    dropped: 0,
    droppedLoss: 0,
    droppedOutage: 0,
    duplicated: 0,
    reordered: 0,
    errors: 0,
  };
}
