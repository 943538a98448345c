/**
 * The tunnel transport compliance suite: what every TunnelTransport (tcp, memory, later kcp) must
 * do, run against a "world" of 2-3 transports sharing a directory, with fault controls the world
 * implements its own way (tcp: proxies that go silent, memory: the network hub's kill/partition).
 * tunnel-tcp.test.ts and tunnel-memory.test.ts run it.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type TunnelState, type TunnelTransport, wholeOf } from '../../src/transports/tunnel.js';

export interface WorldTiming {
  keepaliveIntervalMs: number;
  deadAfterMs: number;
  backoffMaxMs: number;
  /** The transports' high-water mark in bytes. */
  highWaterMark: number;
  /**
   * A transport that sizes its queue by its send rate (tcp: src/transports/tcp.ts FOLLOW_MS) may
   * say stop below the high-water mark, never below this; without it, the high-water mark.
   */
  leastQueueBound?: number;
  /** Slack for scheduling, handshakes and the keepalive tick on top of the deadlines above. */
  marginMs: number;
}

export interface TunnelWorld {
  /** Peer ids in ascending order: a lower index is the dialer of a pair. */
  readonly ids: readonly string[];
  readonly timing: WorldTiming;
  /** Peer i's transport (a new one after restart). */
  transport(i: number): TunnelTransport;
  /** Peer i vanishes without a goodbye: nothing it had open is closed as far as the others see. */
  kill(i: number): Promise<void>;
  /** Peer i comes back with the same identity and a new transport. */
  restart(i: number): Promise<void>;
  /** Traffic between peers i and j silently stops (open connections hang, new ones cannot form). */
  cut(i: number, j: number): void;
  heal(i: number, j: number): void;
  /** Peer i is no longer an active peer in the directory every transport reads (they are not told). */
  deactivate(i: number): void;
  reactivate(i: number): void;
  close(): Promise<void>;
}

export type MakeWorld = (peers: number) => Promise<TunnelWorld>;

/** Messages and state changes a transport reported, with helpers to wait for them. */
class Probe {
  readonly messages = new Map<string, Buffer[]>();
  readonly states: { peer: string; state: TunnelState; at: number }[] = [];
  drains = 0;

  constructor(readonly transport: TunnelTransport) {
    transport.on('message', (peer, m) => {
      let list = this.messages.get(peer);
      if (!list) {
        list = [];
        this.messages.set(peer, list);
      }
      list.push(wholeOf(m));
    });
    transport.on('state', (peer, state) => this.states.push({ peer, state, at: performance.now() }));
    transport.on('drain', () => this.drains++);
  }

  from(peer: string): Buffer[] {
    return this.messages.get(peer) ?? [];
  }

  stateOf(peer: string): TunnelState | undefined {
    return this.transport.tunnel(peer)?.state;
  }
}

/** Polls `check` until it returns true; fails with `what` (and `explain()`) after timeoutMs. */
async function eventually(
  what: string,
  check: () => boolean,
  timeoutMs: number,
  explain?: () => unknown,
): Promise<number> {
  const start = performance.now();
  for (;;) {
    if (check()) return performance.now() - start;
    if (performance.now() - start > timeoutMs) {
      const details = explain ? `\n${JSON.stringify(explain(), null, 1)}` : '';
      assert.fail(`timed out after ${timeoutMs} ms waiting for: ${what}${details}`);
    }
    await sleep(5);
  }
}

/** Both ends of a pair as a test failure should show them. */
function pairState(world: TunnelWorld, i: number, j: number): Record<string, unknown> {
  const side = (x: number, y: number) => {
    const transport = world.transport(x);
    const tunnel = transport.tunnel(world.ids[y]!);
    const faults = Object.entries(transport.faults()).filter(([, n]) => n > 0);
    return { state: tunnel?.state, stats: tunnel?.stats(), faults: Object.fromEntries(faults) };
  };
  return { [i]: side(i, j), [j]: side(j, i) };
}

/** Asserts `check` stays true for the whole period. */
async function throughout(what: string, check: () => boolean, periodMs: number): Promise<void> {
  const start = performance.now();
  while (performance.now() - start < periodMs) {
    assert.ok(check(), `no longer true: ${what}`);
    await sleep(10);
  }
  assert.ok(check(), `no longer true: ${what}`);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A small seeded PRNG, so every size and byte in these tests is reproducible. */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** n messages with sizes from 1 B to 64 KiB (both ends included), contents unique to (seed, index). */
function makeMessages(n: number, seed: number): Buffer[] {
  const random = mulberry32(seed);
  const out: Buffer[] = [];
  for (let i = 0; i < n; i++) {
    const r = random();
    const size =
      i === 0
        ? 1
        : i === 1
          ? 65_536
          : r < 0.8
            ? 1 + Math.floor(random() * 1500)
            : r < 0.95
              ? 1500 + Math.floor(random() * 14_884)
              : 16_384 + Math.floor(random() * 49_153);
    const m = Buffer.allocUnsafe(size);
    let x = (seed * 1_000_003 + i * 7919) >>> 0;
    for (let j = 0; j < size; j++) {
      x = (Math.imul(x, 1_103_515_245) + 12_345) >>> 0;
      m[j] = x >>> 24;
    }
    out.push(m);
  }
  return out;
}

/** Sends all messages in batches of 1..64, pausing on false until the transport's drain. */
async function sendAll(
  transport: TunnelTransport,
  peer: string,
  messages: Buffer[],
  seed: number,
): Promise<number> {
  const random = mulberry32(seed);
  const tunnel = transport.tunnel(peer);
  assert.ok(tunnel, `a tunnel to ${peer}`);
  let paused = 0;
  for (let i = 0; i < messages.length; ) {
    const n = 1 + Math.floor(random() * 64);
    const batch = messages.slice(i, i + n);
    i += batch.length;
    if (!tunnel.send(batch)) {
      paused++;
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('no drain within 20 s')), 20_000);
        const onDrain = (p: string) => {
          if (p !== peer) return;
          clearTimeout(timer);
          transport.off('drain', onDrain);
          resolve();
        };
        transport.on('drain', onDrain);
      });
    }
  }
  return paused;
}

const bytesOf = (messages: readonly Buffer[]) => messages.reduce((sum, m) => sum + m.length, 0);

export function tunnelCompliance(name: string, makeWorld: MakeWorld): void {
  /** A fresh world for one case, closed whatever happens. */
  async function inWorld(peers: number, body: (world: TunnelWorld) => Promise<void>): Promise<void> {
    const world = await makeWorld(peers);
    try {
      await body(world);
    } finally {
      await world.close();
    }
  }

  /** Both sides ensure, and both are up. */
  async function connected(world: TunnelWorld, a = 0, b = 1): Promise<[Probe, Probe]> {
    const pa = new Probe(world.transport(a));
    const pb = new Probe(world.transport(b));
    world.transport(a).ensure(world.ids[b]!);
    world.transport(b).ensure(world.ids[a]!);
    await eventually(
      `peers ${a} and ${b} up`,
      () => pa.stateOf(world.ids[b]!) === 'up' && pb.stateOf(world.ids[a]!) === 'up',
      world.timing.backoffMaxMs + world.timing.marginMs * 4,
    );
    return [pa, pb];
  }

  describe(`tunnel compliance: ${name}`, { timeout: 180_000 }, () => {
    it('carries 10,000 messages of 1 B to 64 KiB each way, in order and intact, and counts them', async () => {
      await inWorld(2, async (world) => {
        const [pa, pb] = await connected(world);
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const toB = makeMessages(10_000, 1);
        const toA = makeMessages(10_000, 2);
        const sentAt = performance.now();
        await Promise.all([sendAll(world.transport(0), b, toB, 11), sendAll(world.transport(1), a, toA, 12)]);
        await eventually(
          'all messages delivered',
          () => pb.from(a).length >= toB.length && pa.from(b).length >= toA.length,
          30_000,
          () => ({ delivered: [pb.from(a).length, pa.from(b).length], ...pairState(world, 0, 1) }),
        );
        const elapsed = performance.now() - sentAt;
        for (const [got, want, what] of [
          [pb.from(a), toB, 'A to B'],
          [pa.from(b), toA, 'B to A'],
        ] as const) {
          assert.equal(got.length, want.length, `${what}: message count`);
          for (let i = 0; i < want.length; i++) {
            if (!got[i]!.equals(want[i]!))
              assert.fail(
                `${what}: message ${i} (${want[i]!.length} B) arrived as ${got[i]!.length} B, different`,
              );
          }
        }
        const sa = world.transport(0).tunnel(b)!.stats();
        const sb = world.transport(1).tunnel(a)!.stats();
        assert.equal(sa.messagesSent, toB.length);
        assert.equal(sa.bytesSent, bytesOf(toB));
        assert.equal(sb.messagesReceived, toB.length);
        assert.equal(sb.bytesReceived, bytesOf(toB));
        assert.equal(sb.messagesSent, toA.length);
        assert.equal(sb.bytesSent, bytesOf(toA));
        assert.equal(sa.messagesReceived, toA.length);
        assert.equal(sa.bytesReceived, bytesOf(toA));
        assert.equal(sa.dropped, 0);
        assert.equal(sb.dropped, 0);
        assert.equal(sa.connects, 1);
        assert.equal(sb.connects, 1);
        const mb = (bytesOf(toA) + bytesOf(toB)) / 1e6;
        console.log(
          `# ${name}: ${mb.toFixed(1)} MB in 20,000 messages, both ways, in ${elapsed.toFixed(0)} ms`,
        );
      });
    });

    it('drops and counts a message over 64 KiB, delivering the rest of its batch', async () => {
      await inWorld(2, async (world) => {
        const [, pb] = await connected(world);
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const tunnel = world.transport(0).tunnel(b)!;
        assert.equal(tunnel.send([Buffer.from('first'), Buffer.alloc(65_537, 1), Buffer.from('last')]), true);
        await eventually('two messages delivered', () => pb.from(a).length === 2, 5000);
        assert.deepEqual(
          pb.from(a).map((m) => m.toString()),
          ['first', 'last'],
        );
        assert.equal(tunnel.stats().dropped, 1);
        assert.equal(tunnel.stats().messagesSent, 2);
      });
    });

    it('copies on send: the caller may reuse its buffers as soon as send returns', async () => {
      await inWorld(2, async (world) => {
        const [, pb] = await connected(world);
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const buffer = Buffer.from('original');
        world.transport(0).tunnel(b)!.send([buffer]);
        buffer.write('REUSED!!');
        await eventually('delivered', () => pb.from(a).length === 1, 5000);
        assert.equal(pb.from(a)[0]!.toString(), 'original');
      });
    });

    it('the lower id dials and the higher waits: one connection when both ensure at once', async () => {
      await inWorld(2, async (world) => {
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const pa = new Probe(world.transport(0));
        // Only the higher side keeps the tunnel: it waits, down, and never dials.
        const waiting = world.transport(1).ensure(a);
        assert.equal(waiting.state, 'down');
        await throughout(
          'the higher side waits, down',
          () => waiting.state === 'down',
          world.timing.backoffMaxMs * 2,
        );
        assert.equal(waiting.stats().connects, 0);
        assert.equal(world.transport(0).tunnel(b), undefined, 'no inbound tunnel appeared on the lower side');
        // Now both: the lower side dials (connecting, then up) and there is exactly one connection.
        const dialing = world.transport(0).ensure(b);
        assert.equal(world.transport(0).ensure(b), dialing, 'ensure is idempotent');
        await eventually('both up', () => dialing.state === 'up' && waiting.state === 'up', 10_000);
        assert.ok(
          pa.states.some((s) => s.peer === b && s.state === 'connecting'),
          'the dialer went through connecting',
        );
        await sleep(world.timing.backoffMaxMs * 2);
        assert.equal(dialing.stats().connects, 1);
        assert.equal(waiting.stats().connects, 1);
        assert.equal(world.transport(0).faults()['not-dialer'], 0);
        assert.equal(world.transport(1).faults()['not-dialer'], 0);
        assert.throws(() => world.transport(0).ensure(a), /itself/);
      });
    });

    it('three peers: one tunnel per pair, each message to the right peer', async () => {
      await inWorld(3, async (world) => {
        const probes = [0, 1, 2].map((i) => new Probe(world.transport(i)));
        for (let i = 0; i < 3; i++)
          for (let j = 0; j < 3; j++) if (i !== j) world.transport(i).ensure(world.ids[j]!);
        await eventually(
          'all six tunnel ends up',
          () =>
            [0, 1, 2].every((i) =>
              [0, 1, 2].every((j) => i === j || probes[i]!.stateOf(world.ids[j]!) === 'up'),
            ),
          10_000,
        );
        for (let i = 0; i < 3; i++)
          for (let j = 0; j < 3; j++)
            if (i !== j)
              world
                .transport(i)
                .tunnel(world.ids[j]!)!
                .send([Buffer.from(`${i}->${j}`)]);
        await eventually(
          'six messages delivered',
          () => probes.every((p) => [...p.messages.values()].flat().length === 2),
          5000,
        );
        for (let j = 0; j < 3; j++)
          for (let i = 0; i < 3; i++)
            if (i !== j)
              assert.deepEqual(
                probes[j]!.from(world.ids[i]!).map((m) => m.toString()),
                [`${i}->${j}`],
              );
        for (let i = 0; i < 3; i++)
          for (let j = 0; j < 3; j++)
            if (i !== j) assert.equal(world.transport(i).tunnel(world.ids[j]!)!.stats().connects, 1);
      });
    });

    it('an inbound connection is a tunnel before it is ensured, and goes when the dialer releases it', async () => {
      await inWorld(2, async (world) => {
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const pb = new Probe(world.transport(1));
        const dialer = world.transport(0).ensure(b);
        await eventually('the acceptor sees an up tunnel', () => pb.stateOf(a) === 'up', 10_000);
        await eventually('the dialer is up', () => dialer.state === 'up', 5000);
        dialer.send([Buffer.from('unasked')]);
        await eventually('delivered', () => pb.from(a).length === 1, 5000);
        world.transport(0).release(b);
        assert.equal(world.transport(0).tunnel(b), undefined);
        // Told by the close itself, well before a dead timer could have said it.
        await eventually(
          'the acceptor forgets it',
          () => world.transport(1).tunnel(a) === undefined,
          world.timing.deadAfterMs / 2,
        );
        assert.equal(world.transport(1).faults().dead, 0);
        assert.equal(pb.states.at(-1)?.state, 'down');
        // The released tunnel object drops what it is still given.
        assert.equal(dialer.send([Buffer.from('late')]), true);
        assert.equal(dialer.stats().dropped, 1);
      });
    });

    it('release closes the connection and stops redialing', async () => {
      await inWorld(2, async (world) => {
        const [, pb] = await connected(world);
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const waiting = world.transport(1).tunnel(a)!;
        world.transport(0).release(b);
        await eventually(
          'the acceptor sees it down',
          () => waiting.state === 'down',
          world.timing.deadAfterMs / 2,
        );
        assert.equal(world.transport(1).faults().dead, 0, 'seen closed, not found dead');
        await throughout(
          'no redial',
          () => waiting.state === 'down' && world.transport(0).tunnel(b) === undefined,
          world.timing.backoffMaxMs * 3,
        );
        assert.equal(waiting.stats().connects, 1);
        assert.ok(pb.states.some((s) => s.state === 'down'));
        // The acceptor's release closes its end; the dialer, keeping it again, reconnects.
        world.transport(0).ensure(b);
        await eventually('up again', () => waiting.state === 'up', 10_000);
        world.transport(1).release(a);
        await eventually(
          'the dialer redials and the acceptor takes it as an inbound tunnel',
          () => world.transport(1).tunnel(a)?.state === 'up' && world.transport(0).tunnel(b)?.state === 'up',
          world.timing.backoffMaxMs + world.timing.marginMs * 4,
        );
      });
    });

    it('drops and counts messages while down, and counts connects', async () => {
      await inWorld(2, async (world) => {
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const waiting = world.transport(1).ensure(a);
        assert.equal(waiting.send([Buffer.from('x'), Buffer.from('y')]), true);
        assert.equal(waiting.stats().dropped, 2);
        assert.equal(waiting.stats().messagesSent, 0);
        assert.equal(waiting.stats().lastRttMs, null);
        const dialer = world.transport(0).ensure(b);
        await eventually('up', () => dialer.state === 'up' && waiting.state === 'up', 10_000);
        await eventually(
          'a round trip measured on both sides',
          () => dialer.stats().lastRttMs !== null && waiting.stats().lastRttMs !== null,
          world.timing.keepaliveIntervalMs * 3 + world.timing.marginMs,
        );
        assert.ok(dialer.stats().lastRttMs! >= 0 && dialer.stats().lastRttMs! < 1000);
        assert.equal(dialer.stats().connects, 1);
      });
    });

    it('only active peers: an inactive dialer is refused, an inactive acceptor is not dialed', async () => {
      await inWorld(2, async (world) => {
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const pb = new Probe(world.transport(1));
        // The dialer is not active: it still dials (it sees the acceptor), the acceptor refuses it.
        world.deactivate(0);
        const dialer = world.transport(0).ensure(b);
        const waiting = world.transport(1).ensure(a);
        await eventually(
          'the acceptor refused an unknown key',
          () => world.transport(1).faults()['unknown-peer'] >= 1,
          world.timing.backoffMaxMs + world.timing.marginMs * 4,
        );
        await throughout(
          'nobody up',
          () => dialer.state !== 'up' && waiting.state !== 'up',
          world.timing.backoffMaxMs * 2,
        );
        assert.equal(waiting.stats().connects, 0);
        assert.equal(dialer.stats().connects, 0);
        assert.equal(pb.from(a).length, 0);
        // Active again: the dialer's next attempt gets through.
        world.reactivate(0);
        await eventually(
          'up once active',
          () => dialer.state === 'up' && waiting.state === 'up',
          world.timing.backoffMaxMs * 2 + world.timing.marginMs * 4,
        );
        // The acceptor is not active: the dialer does not even try.
        world.transport(0).release(b);
        world.deactivate(1);
        const faultsBefore = world.transport(1).faults()['unknown-peer'];
        const again = world.transport(0).ensure(b);
        await throughout('not up', () => again.state !== 'up', world.timing.backoffMaxMs * 2);
        assert.equal(world.transport(1).faults()['unknown-peer'], faultsBefore);
      });
    });

    it('revalidate closes the tunnel of a peer that is no longer active', async () => {
      await inWorld(2, async (world) => {
        const [pa, pb] = await connected(world);
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const dialer = world.transport(0).tunnel(b)!;
        const waiting = world.transport(1).tunnel(a)!;
        // Removing the dialer changes nothing until someone revalidates.
        world.deactivate(0);
        await sleep(world.timing.keepaliveIntervalMs);
        assert.equal(waiting.state, 'up');
        world.transport(1).revalidate();
        assert.equal(waiting.state, 'down');
        assert.equal(world.transport(1).faults().revoked, 1);
        await eventually('the dialer sees it down', () => dialer.state !== 'up', world.timing.marginMs * 4);
        // Its redials are refused now.
        await eventually(
          'a redial refused',
          () => world.transport(1).faults()['unknown-peer'] >= 1,
          world.timing.backoffMaxMs + world.timing.marginMs * 4,
        );
        dialer.send([Buffer.from('from a removed peer')]);
        await sleep(50);
        assert.equal(pb.from(a).length, 0);
        world.reactivate(0);
        await eventually('back up', () => dialer.state === 'up' && waiting.state === 'up', 10_000);
        // The dialer side revalidating after the acceptor's removal: closed, and not redialed.
        world.deactivate(1);
        world.transport(0).revalidate();
        assert.equal(dialer.state, 'down');
        await throughout('stays down', () => dialer.state !== 'up', world.timing.backoffMaxMs * 2);
        assert.equal(pa.from(b).length, 0);
      });
    });

    it('detects a silent link within deadAfterMs and reconnects after it heals', async () => {
      await inWorld(2, async (world) => {
        const [pa, pb] = await connected(world);
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const { deadAfterMs, keepaliveIntervalMs, backoffMaxMs, marginMs } = world.timing;
        const dialer = world.transport(0).tunnel(b)!;
        const waiting = world.transport(1).tunnel(a)!;
        // Some traffic first, so the cut falls in the middle of a live connection.
        dialer.send([Buffer.from('before')]);
        await eventually('delivered', () => pb.from(a).length === 1, 5000);
        const cutAt = performance.now();
        world.cut(0, 1);
        await eventually(
          'both sides down',
          () => dialer.state !== 'up' && waiting.state !== 'up',
          deadAfterMs + marginMs,
        );
        const downA = pa.states.find((s) => s.peer === b && s.state === 'down' && s.at > cutAt)!.at - cutAt;
        const downB = pb.states.find((s) => s.peer === a && s.state === 'down' && s.at > cutAt)!.at - cutAt;
        // Not before the deadline either (the last sign of life came at most a keepalive before the cut).
        for (const ms of [downA, downB])
          assert.ok(
            ms >= deadAfterMs - keepaliveIntervalMs - 20,
            `declared dead after ${ms.toFixed(0)} ms only`,
          );
        assert.ok(world.transport(0).faults().dead >= 1 && world.transport(1).faults().dead >= 1);
        // Sent into the cut: dropped (down) or lost; either way never delivered late.
        dialer.send([Buffer.from('during')]);
        const healedAt = performance.now();
        world.heal(0, 1);
        const took = await eventually(
          'up again after the heal',
          () => dialer.state === 'up' && waiting.state === 'up',
          backoffMaxMs + marginMs * 4,
        );
        console.log(
          `# ${name}: dead after ${downA.toFixed(0)}/${downB.toFixed(0)} ms (deadAfterMs ${deadAfterMs}), up ${took.toFixed(0)} ms after the heal`,
        );
        assert.ok(performance.now() - healedAt >= 0);
        dialer.send([Buffer.from('after')]);
        await eventually('delivered after', () => pb.from(a).length === 2, 5000);
        assert.deepEqual(
          pb.from(a).map((m) => m.toString()),
          ['before', 'after'],
        );
        assert.equal(dialer.stats().connects, 2);
      });
    });

    it('detects a vanished peer and reconnects to it after its restart, within the backoff bounds', async () => {
      await inWorld(2, async (world) => {
        const [pa] = await connected(world);
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const { deadAfterMs, backoffMaxMs, marginMs } = world.timing;
        const dialer = world.transport(0).tunnel(b)!;
        await world.kill(1);
        const noticed = await eventually(
          'the dialer notices',
          () => dialer.state !== 'up',
          deadAfterMs + marginMs,
        );
        await world.restart(1);
        const pb = new Probe(world.transport(1));
        world.transport(1).ensure(a);
        const took = await eventually(
          'up with the restarted peer',
          () => dialer.state === 'up' && pb.stateOf(a) === 'up',
          backoffMaxMs + marginMs * 4,
        );
        console.log(
          `# ${name}: vanished peer noticed in ${noticed.toFixed(0)} ms, reconnected ${took.toFixed(0)} ms after restart`,
        );
        world
          .transport(1)
          .tunnel(a)!
          .send([Buffer.from('new life')]);
        await eventually('delivered', () => pa.from(b).length === 1, 5000);
        assert.equal(pa.from(b)[0]!.toString(), 'new life');
      });
    });

    it('a restarted dialer replaces its old connection at once, without waiting for it to die', async () => {
      await inWorld(2, async (world) => {
        const [, pb] = await connected(world);
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const waiting = world.transport(1).tunnel(a)!;
        await world.kill(0);
        await world.restart(0);
        const startedAt = performance.now();
        const pa = new Probe(world.transport(0));
        const dialer = world.transport(0).ensure(b);
        await eventually('replaced', () => waiting.stats().connects === 2 && dialer.state === 'up', 10_000);
        const took = performance.now() - startedAt;
        assert.ok(took < world.timing.deadAfterMs, `replacement took ${took.toFixed(0)} ms`);
        assert.ok(!pb.states.some((s) => s.state === 'down'), 'the acceptor never went down');
        // ...but it saw the break: what was in flight on the old connection is gone, and stateful
        // listeners (the data plane's streams) must know.
        const after = pb.states.filter((s) => s.peer === a).map((s) => s.state);
        assert.deepEqual(after.slice(-2), ['connecting', 'up'], `the acceptor's states: ${after.join(', ')}`);
        dialer.send([Buffer.from('to b')]);
        waiting.send([Buffer.from('to a')]);
        await eventually('both delivered', () => pb.from(a).length === 1 && pa.from(b).length === 1, 5000);
      });
    });

    it('back-pressure: send returns false above the high-water mark, drain follows, nothing is lost', async () => {
      await inWorld(2, async (world) => {
        const [pa, pb] = await connected(world);
        const [a, b] = [world.ids[0]!, world.ids[1]!];
        const tunnel = world.transport(0).tunnel(b)!;
        const hwm = world.timing.highWaterMark;
        // A synchronous burst: the receiver cannot read until it ends, so the backlog must grow.
        const batch = Array.from({ length: 64 }, () => Buffer.alloc(1400, 7));
        let sentBytes = 0;
        let firstFalseAt = -1;
        let batches = 0;
        while (sentBytes < hwm * 4 + 32 * 1024 * 1024) {
          const ok = tunnel.send(batch);
          sentBytes += 64 * 1400;
          batches++;
          if (!ok && firstFalseAt < 0) firstFalseAt = sentBytes;
          if (!ok && sentBytes > hwm * 4) break;
        }
        assert.ok(firstFalseAt > 0, 'send returned false at some point');
        const least = world.timing.leastQueueBound ?? hwm;
        assert.ok(firstFalseAt > least, `false only above ${least} B (first at ${firstFalseAt} B)`);
        const drainsBefore = pa.drains;
        await eventually('drain', () => pa.drains > drainsBefore, 20_000);
        assert.equal(tunnel.send([Buffer.from('after drain')]), true);
        await eventually('everything delivered', () => pb.from(a).length === batches * 64 + 1, 30_000);
        assert.equal(pb.from(a).at(-1)!.toString(), 'after drain');
      });
    });

    it('close brings every tunnel down and stops dialing', async () => {
      await inWorld(3, async (world) => {
        const pa = new Probe(world.transport(0));
        world.transport(0).ensure(world.ids[1]!);
        world.transport(0).ensure(world.ids[2]!);
        await eventually(
          'two tunnels up',
          () => pa.stateOf(world.ids[1]!) === 'up' && pa.stateOf(world.ids[2]!) === 'up',
          10_000,
        );
        await world.transport(0).close();
        assert.equal(world.transport(0).tunnel(world.ids[1]!), undefined);
        assert.deepEqual(
          pa.states
            .slice(-2)
            .map((s) => s.state)
            .sort(),
          ['down', 'down'],
        );
        await eventually(
          'the others see it down',
          () =>
            world.transport(1).tunnel(world.ids[0]!) === undefined &&
            world.transport(2).tunnel(world.ids[0]!) === undefined,
          world.timing.deadAfterMs / 2,
        );
        assert.equal(world.transport(1).faults().dead + world.transport(2).faults().dead, 0);
        assert.throws(() => world.transport(0).ensure(world.ids[1]!), /closed/);
      });
    });
  });
}
