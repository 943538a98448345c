import assert from 'node:assert/strict';
import { createHash, type KeyObject, randomBytes } from 'node:crypto';
import { createSocket } from 'node:dgram';
import { after, describe, it } from 'node:test';
import { newPeerIdentity as peer } from '../../test/helpers/peer-identity.js';
import { waitUntil } from '../../test/helpers/wait-until.js';
import { UdpRelay } from '../../test/transports/udp-relay.js';
import { INIT_BYTES, TYPE_DATA, verifyEd25519 } from './kcp/secure-datagram.js';
import { KcpTransport, type KcpTransportOptions } from './kcp-transport.js';
import { StaticPeerDirectory } from './static-directory.js';
import { type TunnelMessage, wholeOf } from './tunnel.js';

interface Peer {
  key: KeyObject;
  raw: Buffer;
  id: string;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const eventually = waitUntil;

interface Pair {
  a: KcpTransport;
  b: KcpTransport;
  pa: Peer;
  pb: Peer;
  relay: UdpRelay;
  directory: StaticPeerDirectory;
  /** Messages B received from A, whole. */
  atB: Buffer[];
  close(): Promise<void>;
}

const open: Pair[] = [];
after(async () => {
  for (const p of open) await p.close();
});

/** A (the dialer) reaches B through a relay; both up. */
async function makePair(
  extra: Partial<KcpTransportOptions> = {},
  extraB: Partial<KcpTransportOptions> = {},
): Promise<Pair> {
  const [pa, pb] = [peer(), peer()].sort((x, y) => (x.id < y.id ? -1 : 1)) as [Peer, Peer];
  const directory = new StaticPeerDirectory();
  const base = (p: Peer): KcpTransportOptions => ({
    localPeerId: p.id,
    identityKey: p.key,
    directory,
    bind: { address: '127.0.0.1', port: 0 },
    backoff: { minMs: 50, maxMs: 500 },
    handshakeRetryMs: 250,
    ...extra,
  });
  const a = await KcpTransport.start(base(pa));
  const b = await KcpTransport.start({ ...base(pb), ...extraB });
  const relay = await UdpRelay.start(b.address().port, 7);
  directory.set(pa.id, pa.raw, `127.0.0.1:${a.address().port}`);
  directory.set(pb.id, pb.raw, relay.address);
  const atB: Buffer[] = [];
  b.on('message', (_p, m: TunnelMessage) => atB.push(wholeOf(m)));
  a.ensure(pb.id);
  b.ensure(pa.id);
  await eventually('up', () => a.tunnel(pb.id)?.state === 'up' && b.tunnel(pa.id)?.state === 'up', 5000);
  let closed = false;
  const pair: Pair = {
    a,
    b,
    pa,
    pb,
    relay,
    directory,
    atB,
    close: async () => {
      if (closed) return;
      closed = true;
      await a.close();
      await b.close();
      await relay.close();
    },
  };
  open.push(pair);
  return pair;
}

/** Sends `total` bytes of seeded random data A -> B in messages of 1..16 KiB; SHA-256 both ends. */
async function transfer(p: Pair, total: number, timeoutMs: number): Promise<{ ms: number }> {
  const tunnel = p.a.tunnel(p.pb.id)!;
  const sent = createHash('sha256');
  const received = createHash('sha256');
  let receivedBytes = 0;
  const onMessage = (_peer: string, m: TunnelMessage) => {
    const whole = wholeOf(m);
    received.update(whole);
    receivedBytes += whole.length;
  };
  p.b.on('message', onMessage);
  const start = performance.now();
  const seed = randomBytes(65_536);
  let offset = 0;
  let i = 0;
  while (offset < total) {
    const size = Math.min(total - offset, 1 + ((i * 7919) % 16_384));
    const at = (offset * 31) % 32_768;
    const m = Buffer.from(seed.subarray(at, at + size));
    sent.update(m);
    offset += size;
    i++;
    if (!tunnel.send([m])) {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('no drain in 20 s')), 20_000);
        const onDrain = () => {
          clearTimeout(timer);
          p.a.off('drain', onDrain);
          resolve();
        };
        p.a.on('drain', onDrain);
      });
    }
  }
  await eventually(
    'all bytes received',
    () => receivedBytes >= total,
    timeoutMs,
    () => ({
      receivedBytes,
      a: p.a.kcpStats(p.pb.id),
    }),
  );
  p.b.off('message', onMessage);
  assert.equal(receivedBytes, total);
  assert.equal(received.digest('hex'), sent.digest('hex'), 'SHA-256 of what arrived');
  return { ms: performance.now() - start };
}

describe('kcp transport', { timeout: 180_000 }, () => {
  for (const loss of [0, 5, 20]) {
    it(`20 MB byte-exact (SHA-256) at ${loss} % loss each way, retransmitting under loss`, async () => {
      const p = await makePair();
      p.relay.setLoss(loss);
      const { ms } = await transfer(p, 20 * 1024 * 1024, 120_000);
      const stats = p.a.kcpStats(p.pb.id)!;
      console.log(
        `# ${loss} % loss: 20 MiB in ${ms.toFixed(0)} ms (${((20 * 1.048576) / (ms / 1000)).toFixed(1)} MB/s), ` +
          `${stats.retransmissions} retransmissions (${stats.fastRetransmissions} fast) of ${stats.segmentsSent} segments, ` +
          `relay dropped ${p.relay.counters.up.dropped} up / ${p.relay.counters.down.dropped} down`,
      );
      if (loss > 0) {
        assert.ok(p.relay.counters.up.dropped > 0, 'the relay dropped datagrams');
        assert.ok(stats.retransmissions > 0, 'the session retransmitted');
      }
      assert.equal(p.a.tunnel(p.pb.id)!.stats().connects, 1, 'the same connection throughout');
      await p.close();
    });
  }

  it('tampered and replayed datagrams are dropped and counted; the session survives and carries on', async () => {
    const p = await makePair();
    let n = 0;
    p.relay.hook = (direction, d) => {
      if (direction !== 'up' || d[0] !== TYPE_DATA) return d;
      n++;
      if (n % 37 === 0) {
        const bad = Buffer.from(d);
        bad[bad.length - 20]! ^= 0x40; // in the ciphertext (or tag): authentication fails
        return bad;
      }
      if (n % 41 === 0) return [d, Buffer.from(d)]; // a duplicate: the second is a replay
      return d;
    };
    await transfer(p, 2 * 1024 * 1024, 30_000);
    const dropped = p.b.datagramStats().dropped;
    assert.ok(dropped.auth > 0, `auth failures counted (${dropped.auth})`);
    assert.ok(dropped.replay > 0, `replays counted (${dropped.replay})`);
    assert.equal(p.b.faults().corrupt, dropped.auth, 'each counted as the fault corrupt');
    assert.equal(p.a.tunnel(p.pb.id)!.stats().connects, 1);
    assert.equal(p.b.tunnel(p.pa.id)!.state, 'up');
    await p.close();
  });

  it('foreign datagrams (replayed from elsewhere, spoofed index or counter, plain KCP with the conv) change nothing', async () => {
    const p = await makePair();
    const recorded: Buffer[] = [];
    p.relay.hook = (direction, d) => {
      if (direction === 'up' && d[0] === TYPE_DATA) recorded.push(Buffer.from(d));
      return d;
    };
    await transfer(p, 256 * 1024, 10_000);
    const linkBefore = p.b.kcpStats(p.pa.id)!;
    const before = p.b.datagramStats();
    const foreign = createSocket('udp4');
    await new Promise<void>((resolve) => foreign.bind(0, '127.0.0.1', () => resolve()));
    const port = p.b.address().port;
    const send = (d: Buffer) =>
      new Promise<void>((resolve) => foreign.send(d, port, '127.0.0.1', () => resolve()));
    const genuine = recorded[recorded.length - 1]!;
    // 1. A genuine DATA again, from a foreign address: a replay.
    await send(genuine);
    // 2. The same with a counter far ahead (not a replay): the header is authenticated.
    const ahead = Buffer.from(genuine);
    ahead.writeUInt32BE(ahead.readUInt32BE(9) + 1_000_000, 9);
    await send(ahead);
    // 3. A receiver index that names no session.
    const noIndex = Buffer.from(genuine);
    noIndex.writeUInt32BE((noIndex.readUInt32BE(1) + 1) >>> 0, 1);
    await send(noIndex);
    // 4. A plain (unencrypted) KCP PUSH with the link's conv: not even a DATA datagram.
    const kcp = Buffer.alloc(24 + 5);
    kcp.writeUInt32LE(linkBefore.conv, 0);
    kcp[4] = 81;
    kcp.writeUInt32LE(5, 20);
    await send(kcp);
    // 5. Garbage of every size class.
    for (const size of [0, 1, 13, 29, 142, 106, 1400]) await send(randomBytes(size));
    await eventually('all seen', () => p.b.datagramStats().datagramsIn >= before.datagramsIn + 11, 2000);
    await foreign.close();
    const d = p.b.datagramStats().dropped;
    assert.equal(d.replay - before.dropped.replay, 1, 'the replay');
    assert.ok(d.auth - before.dropped.auth >= 1, 'the counter change failed authentication');
    assert.ok(d.noSession - before.dropped.noSession >= 1, 'the unknown index');
    assert.ok(d.malformed + d.handshake + d.noSession + d.auth > before.dropped.malformed, 'garbage counted');
    const linkAfter = p.b.kcpStats(p.pa.id)!;
    assert.equal(linkAfter.conv, linkBefore.conv);
    assert.equal(linkAfter.remote, linkBefore.remote, 'no roaming to the foreign address');
    assert.equal(linkAfter.segmentsReceived, linkBefore.segmentsReceived, 'the engine saw none of it');
    // Still carrying.
    p.atB.length = 0;
    p.a.tunnel(p.pb.id)!.send([Buffer.from('still here')]);
    await eventually('delivered', () => p.atB.some((m) => m.toString() === 'still here'), 2000);
    assert.equal(p.b.tunnel(p.pa.id)!.stats().connects, 1);
    await p.close();
  });

  it('revalidate drops the secure sessions of a peer no longer active: its datagrams no longer even decrypt', async () => {
    const p = await makePair();
    const directory = (p.b as unknown as { directory: StaticPeerDirectory }).directory;
    directory.delete(p.pa.id);
    const before = p.b.datagramStats();
    p.b.revalidate();
    assert.equal(p.b.tunnel(p.pa.id)?.state === 'up', false);
    // A still sends (its keepalives, a message) on the session B has forgotten.
    p.a.tunnel(p.pb.id)?.send([Buffer.from('after revocation')]);
    // A's datagrams name the forgotten session (noSession), or, when what B sent as it dropped
    // the session reached A before A's flush (a UDP read comes before setImmediate in a loop
    // turn), they are INITs of a new handshake B refuses: either way B drops them.
    const refused = (d: ReturnType<typeof p.b.datagramStats>['dropped']) => d.noSession + d.handshake;
    await eventually(
      'datagrams of the revoked peer dropped',
      () => refused(p.b.datagramStats().dropped) > refused(before.dropped),
      5000,
      () => p.b.datagramStats().dropped,
    );
    assert.equal(p.b.datagramStats().secure.opened, before.secure.opened, 'nothing more decrypted');
    assert.deepEqual(p.atB, []);
    await p.close();
  });

  it('an INIT flood is rate-limited before any signature check', async () => {
    let verifications = 0;
    const verify: typeof verifyEd25519 = (data, key, sig) => {
      verifications++;
      return verifyEd25519(data, key, sig);
    };
    const p = await makePair({}, { verify });
    const verifiedBefore = verifications;
    const foreign = createSocket('udp4');
    await new Promise<void>((resolve) => foreign.bind(0, '127.0.0.1', () => resolve()));
    const port = p.b.address().port;
    const start = performance.now();
    const FLOOD = 2000;
    for (let i = 0; i < FLOOD; i++) {
      // Passes every cheap check (an active dialing peer's key, a fresh timestamp); bad signature.
      const init = randomBytes(INIT_BYTES);
      init[0] = 1;
      init[1] = 1;
      p.pa.raw.copy(init, 38);
      init.writeUInt32BE(Math.floor((Date.now() + i) / 2 ** 32), 70);
      init.writeUInt32BE((Date.now() + i) % 2 ** 32, 74);
      foreign.send(init, port, '127.0.0.1');
      if (i % 100 === 99) await sleep(1);
    }
    await eventually('flood received', () => p.b.datagramStats().datagramsIn >= FLOOD, 5000);
    const seconds = (performance.now() - start) / 1000;
    await foreign.close();
    const refused = p.b.datagramStats().secure.handshakesRefused;
    const checked = verifications - verifiedBefore;
    console.log(
      `# INIT flood: ${FLOOD} in ${seconds.toFixed(2)} s, ${checked} signature checks, ${refused['rate-limited']} rate-limited`,
    );
    // The per-address bucket: 20 at once, then 20/s.
    assert.ok(checked <= 20 + Math.ceil(seconds * 20) + 1, `${checked} signature checks`);
    assert.equal(refused['bad-signature'], checked);
    assert.ok(refused['rate-limited'] >= FLOOD - checked - 5);
    // The session is untouched.
    p.a.tunnel(p.pb.id)!.send([Buffer.from('after the flood')]);
    await eventually('delivered', () => p.atB.some((m) => m.toString() === 'after the flood'), 2000);
    assert.equal(p.b.tunnel(p.pa.id)!.stats().connects, 1);
    await p.close();
  });

  it('rekeys under a live link: new sessions every rekeyAfterMs, the same KCP connection carries on', async () => {
    const p = await makePair({ rekeyAfterMs: 300, keepaliveIntervalMs: 100 });
    const start = performance.now();
    let rounds = 0;
    while (performance.now() - start < 1500) {
      await transfer(p, 256 * 1024, 10_000);
      rounds++;
    }
    const a = p.a.datagramStats().secure.handshakes;
    const b = p.b.datagramStats().secure.handshakes;
    console.log(
      `# rekeys: ${a.completed} handshakes completed by the dialer, ${b.confirmed} confirmed by the responder, ${rounds} transfers`,
    );
    assert.ok(a.completed >= 3, `handshakes completed: ${a.completed}`);
    assert.ok(b.confirmed >= 2, `responder sessions confirmed: ${b.confirmed}`);
    assert.equal(p.a.tunnel(p.pb.id)!.stats().connects, 1);
    assert.equal(p.b.tunnel(p.pa.id)!.stats().connects, 1);
    assert.equal(p.b.datagramStats().dropped.auth, 0);
    await p.close();
  });

  for (const rekeyDue of [false, true]) {
    it(`the acceptor restarts unheard (kill -9)${rekeyDue ? ' while a rekey is due' : ''}: the dialer redials well within deadAfterMs`, async () => {
      // deadAfterMs is out of reach: only the restarted side's answer can end the old link.
      const timing = {
        keepaliveIntervalMs: 200,
        deadAfterMs: 60_000,
        ...(rekeyDue ? { rekeyAfterMs: 300 } : {}),
      };
      const p = await makePair(timing);
      const tunnel = p.a.tunnel(p.pb.id)!;
      tunnel.send([Buffer.from('before')]);
      await eventually('before', () => p.atB.length === 1, 5000);
      const port = p.b.address().port;
      // The old B's CLOSEs are lost on the way: to A it just went quiet, as a killed process does.
      p.relay.blackholed = true;
      await p.b.close();
      await sleep(rekeyDue ? 600 : 100);
      const b2 = await KcpTransport.start({
        localPeerId: p.pb.id,
        identityKey: p.pb.key,
        directory: p.directory,
        bind: { address: '127.0.0.1', port },
        backoff: { minMs: 50, maxMs: 500 },
        handshakeRetryMs: 250,
        ...timing,
      });
      const atB2: string[] = [];
      b2.on('message', (_p, m: TunnelMessage) => atB2.push(wholeOf(m).toString()));
      b2.ensure(p.pa.id);
      p.relay.blackholed = false;
      const restartedAt = performance.now();
      try {
        const took = await eventually(
          'a message reaches the restarted B',
          () => {
            if (tunnel.state === 'up') tunnel.send([Buffer.from('after')]);
            return atB2.includes('after');
          },
          15_000,
          () => ({ a: p.a.kcpStats(p.pb.id), state: tunnel.state, b2: b2.datagramStats().dropped }),
        );
        console.log(
          `# acceptor restarted${rekeyDue ? ' (rekey due)' : ''}: carrying again after ${took.toFixed(0)} ms`,
        );
        assert.ok(performance.now() - restartedAt < 15_000);
        assert.equal(tunnel.stats().connects, 2, 'the old link ended and a new one was dialed');
        assert.equal(b2.tunnel(p.pa.id)?.state, 'up');
      } finally {
        await b2.close();
        await p.close();
      }
    });
  }

  it('silentMs: low while keepalives are answered, growing through an outage, low again after', async () => {
    const p = await makePair({ keepaliveIntervalMs: 100, deadAfterMs: 15_000 });
    const tunnel = p.a.tunnel(p.pb.id)!;
    const highest = async (ms: number) => {
      let max = 0;
      for (const end = performance.now() + ms; performance.now() < end; await sleep(20))
        max = Math.max(max, tunnel.silentMs()!);
      return max;
    };
    // Idle but answered: never silent for long (the bound is loose: a loaded machine is slow).
    assert.ok((await highest(800)) < 1000, 'silent while connected');
    p.relay.blackholed = true;
    await sleep(1500);
    const silent = tunnel.silentMs()!;
    assert.ok(silent >= 1000, `silent ${silent} ms into a 1.5 s outage`);
    assert.equal(tunnel.state, 'up', 'an outage shorter than deadAfterMs keeps the link');
    p.relay.blackholed = false;
    await eventually('heard again', () => tunnel.silentMs()! < 500, 5000);
    await p.close();
    assert.equal(tunnel.silentMs(), null, 'null once the tunnel is not up');
  });

  it('a 5 s outage: messages sent during it arrive after, the link is not declared dead (deadAfterMs 15 s)', async () => {
    const p = await makePair({ keepaliveIntervalMs: 1000, deadAfterMs: 15_000 });
    const tunnel = p.a.tunnel(p.pb.id)!;
    const states: string[] = [];
    p.a.on('state', (_peer, s) => states.push(`a:${s}`));
    p.b.on('state', (_peer, s) => states.push(`b:${s}`));
    tunnel.send([Buffer.from('before')]);
    await eventually('before', () => p.atB.length === 1, 2000);
    p.relay.blackholed = true;
    const cutAt = performance.now();
    for (let i = 0; i < 50; i++) {
      tunnel.send([Buffer.from(`during ${i}`), Buffer.alloc(3000, i)]);
      await sleep(100);
    }
    const outage = performance.now() - cutAt;
    p.relay.blackholed = false;
    const took = await eventually(
      'all arrived',
      () => p.atB.length === 101,
      30_000,
      () => ({
        got: p.atB.length,
        a: p.a.kcpStats(p.pb.id),
      }),
    );
    console.log(
      `# outage of ${outage.toFixed(0)} ms: everything arrived ${took.toFixed(0)} ms after it ended`,
    );
    assert.deepEqual(states, [], 'no state change on either side');
    for (let i = 0; i < 50; i++) {
      assert.equal(p.atB[1 + 2 * i]!.toString(), `during ${i}`);
      assert.ok(p.atB[2 + 2 * i]!.equals(Buffer.alloc(3000, i)));
    }
    assert.equal(p.a.faults().dead + p.b.faults().dead, 0);
    await p.close();
  });

  it('pacing: a fixed cap holds a 6 MB burst to the rate, measured at the socket', async () => {
    const RATE = 2_000_000;
    // Pacing holds new data; retransmissions are not paced (kcp-transport.ts): an RTO that fires
    // spuriously while loaded cores stall the receiver resends its segments at once. A run that
    // resent over a tenth of the burst measured the stall, not the pacer (a CI run saw 558
    // retransmissions): it is measured again, up to three times, and every bound below is checked
    // on the first undisturbed run. Three disturbed runs fail.
    const disturbed: number[] = [];
    for (;;) {
      const p = await makePair({ pacing: { maxRateBytesPerSec: RATE, burstBytes: 64 * 1024 } });
      const arrivals: [number, number][] = [];
      p.relay.hook = (direction, d) => {
        if (direction === 'up') arrivals.push([performance.now(), d.length]);
        return d;
      };
      const { ms } = await transfer(p, 6_000_000, 20_000);
      const stats = p.a.kcpStats(p.pb.id)!;
      const largest = Math.max(...arrivals.map(([, n]) => n));
      const resent = stats.retransmissions * largest;
      let bytes = 0;
      for (const [, n] of arrivals) bytes += n;
      const rate = bytes / (ms / 1000);
      // A starved sender (descheduled on the loaded cores) is the other disturbance: a low rate
      // with nothing resent. Only the lower bound can fail then, so it is measured again too.
      if (resent >= 6_000_000 * 0.1 || rate < RATE * 0.7) {
        await p.close();
        disturbed.push(stats.retransmissions);
        console.log(
          `# disturbed run: ${stats.retransmissions} retransmissions, ${(rate / 1e6).toFixed(2)} MB/s; measuring again`,
        );
        assert.ok(
          disturbed.length < 3,
          `three runs in a row resent over 10 % or ran under 0.7x the cap: ${disturbed.join(', ')} retransmissions, last ${rate} B/s`,
        );
        continue;
      }
      // The worst 500 ms window. Arrivals are timed in the relay, a process on the same loaded
      // cores: a stall there bunches what the sender spread out (a CI run saw 250 ms windows 5 %
      // over the bound), so the window is long enough for such a stall to be a small share.
      let worst = 0;
      for (let i = 0, j = 0, inWindow = 0; i < arrivals.length; i++) {
        inWindow += arrivals[i]![1];
        while (arrivals[i]![0] - arrivals[j]![0] > 500) inWindow -= arrivals[j++]![1];
        worst = Math.max(worst, inWindow);
      }
      console.log(
        `# paced at ${RATE / 1e6} MB/s: ${(rate / 1e6).toFixed(2)} MB/s of datagrams on average, worst 500 ms ${(worst / 0.5 / 1e6).toFixed(2)} MB/s, ${stats.pacingWaits} waits, ${stats.retransmissions} retransmissions`,
      );
      // Datagram bytes include 24 B KCP + 29 B seal + 1 B type per ~1326 B: ~4 %; plus acks' share.
      // What was retransmitted is allowed beside the paced bytes (a CI run saw a window 135 kB over).
      assert.ok(rate <= RATE * 1.1 + resent / (ms / 1000), `average ${rate} B/s`);
      assert.ok(rate >= RATE * 0.7, `not far below the cap either (${rate} B/s)`);
      assert.ok(
        worst <= RATE * 0.5 * 1.2 + 64 * 1024 + resent,
        `worst 500 ms window ${worst} B (${stats.retransmissions} retransmissions)`,
      );
      assert.ok(stats.pacingWaits > 0);
      assert.equal(stats.pacingRateBytesPerSec, RATE);
      await p.close();
      return;
    }
  });

  it('pacing follows the delivery rate: gain x the measured rate, within the floor and cap', async () => {
    const p = await makePair({ pacing: { gain: 2, minRateBytesPerSec: 1_000_000 } });
    await transfer(p, 8 * 1024 * 1024, 30_000);
    const s = p.a.kcpStats(p.pb.id)!;
    console.log(
      `# delivery ${(s.deliveryRateBytesPerSec / 1e6).toFixed(1)} MB/s, pacing ${(s.pacingRateBytesPerSec / 1e6).toFixed(1)} MB/s`,
    );
    assert.ok(s.deliveryRateBytesPerSec > 1_000_000, 'a delivery rate was measured');
    assert.equal(s.pacingRateBytesPerSec, Math.max(1_000_000, 2 * s.deliveryRateBytesPerSec));
    await p.close();
  });
});
