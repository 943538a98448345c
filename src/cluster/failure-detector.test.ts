import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ManualClock } from '../domain/clock.js';
import {
  FailureDetector,
  type FailureDetectorConfig,
  type Liveness,
  type LivenessRumor,
  type ProbeTransport,
} from './failure-detector.js';

/** A small seeded PRNG, so every random choice in these tests is reproducible. */
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

/** Records every call. A peer answers (directly and through relays) unless it is in `silent`. */
class ScriptedTransport implements ProbeTransport {
  readonly pings: { peer: string; timeoutMs: number; suspected: boolean }[] = [];
  readonly pingReqs: { via: string; target: string; timeoutMs: number }[] = [];
  readonly rumors: LivenessRumor[] = [];
  readonly silent = new Set<string>();
  relayReaches: (via: string, target: string) => boolean = (via, target) =>
    !this.silent.has(via) && !this.silent.has(target);

  async ping(peer: string, timeoutMs: number, suspected: boolean): Promise<boolean> {
    this.pings.push({ peer, timeoutMs, suspected });
    return !this.silent.has(peer);
  }
  async pingReq(via: string, target: string, timeoutMs: number): Promise<boolean> {
    this.pingReqs.push({ via, target, timeoutMs });
    return this.relayReaches(via, target);
  }
  disseminate(rumor: LivenessRumor): void {
    this.rumors.push(rumor);
  }
}

function setup(members: string[] = ['a', 'b', 'c', 'd'], config?: Partial<FailureDetectorConfig>, seed = 7) {
  const clock = new ManualClock();
  const transport = new ScriptedTransport();
  const detector = new FailureDetector('self', transport, clock, config, mulberry32(seed));
  detector.setMembers(members);
  const changes: [string, Liveness, Liveness][] = [];
  detector.onChange((peer, from, to) => changes.push([peer, from, to]));
  return { clock, transport, detector, changes };
}

/** Runs protocol periods until one has pinged `peer`, so a test can aim at one member. */
async function probePeer(detector: FailureDetector, transport: ScriptedTransport, peer: string) {
  for (let i = 0; i < 2 * detector.all().size; i++) {
    await detector.probeOnce();
    if (transport.pings.at(-1)?.peer === peer) return;
  }
  assert.fail(`${peer} was never probed`);
}

const state = (detector: FailureDetector, peer: string) => detector.liveness(peer)?.state;

// With self plus four members: min = 4 * 1 * 1000, max = 6 * min, expected confirmations = 3.
const MIN_MS = 4000;
const MAX_MS = 24_000;

describe('FailureDetector probing', () => {
  it('probes every member once per pass before repeating, in a reshuffled order', async () => {
    const members = ['a', 'b', 'c', 'd', 'e'];
    const { detector, transport } = setup(members);
    for (let i = 0; i < 4 * members.length; i++) await detector.probeOnce();
    const passes = [0, 1, 2, 3].map((p) => transport.pings.slice(p * 5, p * 5 + 5).map((x) => x.peer));
    for (const pass of passes) assert.deepEqual([...pass].sort(), members);
    assert.ok(new Set(passes.map((p) => p.join())).size > 1, 'the order is reshuffled between passes');
  });

  it('keeps a peer that acks directly alive, records when, and asks no relay', async () => {
    const { detector, transport, clock, changes } = setup();
    clock.advance(5000);
    await probePeer(detector, transport, 'b');
    assert.deepEqual(detector.liveness('b'), { state: 'alive', incarnation: 0, lastSeenAt: clock.now() });
    assert.equal(transport.pingReqs.length, 0);
    assert.deepEqual(changes, []);
    assert.equal(transport.pings.at(-1)?.timeoutMs, 500);
  });

  it('after a missed ack asks min(indirectChecks, others) distinct other members, in parallel', async () => {
    // [members, indirectChecks, relays expected]
    const cases: [string[], number, number][] = [
      [['a', 'b', 'c', 'd', 'e'], 3, 3],
      [['a', 'b', 'c'], 5, 2],
      [['a', 'b'], 3, 1],
      [['a'], 3, 0],
    ];
    for (const [members, indirectChecks, expected] of cases) {
      const { detector, transport } = setup(members, { indirectChecks });
      transport.silent.add('a');
      await probePeer(detector, transport, 'a');
      const vias = transport.pingReqs.map((r) => r.via);
      assert.equal(vias.length, expected, `members ${members}`);
      assert.equal(new Set(vias).size, expected, 'relays are distinct');
      for (const r of transport.pingReqs) {
        assert.equal(r.target, 'a');
        assert.ok(r.via !== 'a' && r.via !== 'self' && members.includes(r.via));
        assert.equal(r.timeoutMs, 500, 'relays get the rest of the period');
      }
    }
  });

  it('does not suspect a peer that one relay reached', async () => {
    const { detector, transport, changes } = setup();
    transport.silent.add('a');
    let relays = 0;
    transport.relayReaches = () => ++relays === 2;
    await probePeer(detector, transport, 'a');
    assert.equal(transport.pingReqs.length, 3);
    assert.equal(state(detector, 'a'), 'alive');
    assert.deepEqual(changes, []);
    assert.deepEqual(transport.rumors, []);
  });

  it('suspects a peer nobody reached and disseminates that', async () => {
    const { detector, transport, changes } = setup();
    detector.onRumor({ kind: 'alive', peer: 'a', incarnation: 3, from: 'a' });
    transport.silent.add('a');
    await probePeer(detector, transport, 'a');
    assert.equal(state(detector, 'a'), 'suspect');
    assert.deepEqual(changes, [['a', 'alive', 'suspect']]);
    assert.deepEqual(transport.rumors, [{ kind: 'suspect', peer: 'a', incarnation: 3, from: 'self' }]);
  });

  it('counts a transport that rejects as a failed probe and still resolves', async () => {
    const { detector, transport } = setup(['a', 'b']);
    transport.ping = async () => {
      throw new Error('socket closed');
    };
    transport.pingReq = async () => {
      throw new Error('socket closed');
    };
    await detector.probeOnce();
    await detector.probeOnce();
    assert.deepEqual([state(detector, 'a'), state(detector, 'b')], ['suspect', 'suspect']);
  });

  it('sends the buddy hint only when pinging a peer it suspects', async () => {
    const { detector, transport } = setup();
    detector.onRumor({ kind: 'suspect', peer: 'b', incarnation: 0, from: 'c' });
    for (let i = 0; i < 4; i++) await detector.probeOnce();
    assert.equal(transport.pings.length, 4);
    for (const p of transport.pings) assert.equal(p.suspected, p.peer === 'b', p.peer);
  });

  it('keeps a suspect that only relays reached suspect, as memberlist does', async () => {
    const { detector, transport } = setup();
    detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from: 'b' });
    transport.silent.add('a');
    transport.relayReaches = () => true;
    await probePeer(detector, transport, 'a');
    assert.equal(state(detector, 'a'), 'suspect');
  });
});

describe('FailureDetector suspicion timeout', () => {
  async function suspectA(members = ['a', 'b', 'c', 'd'], config?: Partial<FailureDetectorConfig>) {
    const s = setup(members, config);
    s.transport.silent.add('a');
    await probePeer(s.detector, s.transport, 'a');
    assert.equal(state(s.detector, 'a'), 'suspect');
    s.transport.rumors.length = 0;
    return { ...s, startedAt: s.clock.now() };
  }

  function assertExpiresAfter(s: Awaited<ReturnType<typeof suspectA>>, timeoutMs: number) {
    s.clock.set(s.startedAt + timeoutMs - 1);
    s.detector.expireSuspicions();
    assert.equal(state(s.detector, 'a'), 'suspect', `still suspect 1 ms before ${timeoutMs}`);
    s.clock.set(s.startedAt + timeoutMs);
    s.detector.expireSuspicions();
    assert.equal(state(s.detector, 'a'), 'dead', `dead at ${timeoutMs}`);
  }

  it('without confirmations, declares the suspect dead at the maximum timeout, not before', async () => {
    const s = await suspectA();
    assertExpiresAfter(s, MAX_MS);
    assert.deepEqual(s.transport.rumors, [{ kind: 'dead', peer: 'a', incarnation: 0, from: 'self' }]);
    assert.deepEqual(s.changes.at(-1), ['a', 'suspect', 'dead']);
  });

  it('expires in probeOnce as well', async () => {
    const s = await suspectA();
    s.clock.set(s.startedAt + MAX_MS);
    await s.detector.probeOnce();
    assert.equal(state(s.detector, 'a'), 'dead');
  });

  it('one independent confirmation shortens the timeout; a repeat from the same peer does not', async () => {
    const s = await suspectA();
    assert.equal(s.detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from: 'b' }), true);
    assert.equal(s.detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from: 'b' }), false);
    assert.equal(s.detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from: 'self' }), false);
    // max - (max - min) * log(2) / log(4)
    assertExpiresAfter(s, 14_000);
  });

  it('two independent confirmations shorten it further, three reach the minimum', async () => {
    const two = await suspectA();
    two.detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from: 'b' });
    two.detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from: 'c' });
    assertExpiresAfter(two, Math.floor(MAX_MS - (MAX_MS - MIN_MS) * (Math.log(3) / Math.log(4))));

    const three = await suspectA();
    for (const from of ['b', 'c', 'd'])
      three.detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from });
    assertExpiresAfter(three, MIN_MS);
  });

  it('takes no confirmations beyond the expected number', async () => {
    const s = await suspectA(['a', 'b', 'c', 'd'], { indirectChecks: 1 });
    assert.equal(s.detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from: 'b' }), true);
    assert.equal(s.detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from: 'c' }), false);
    assertExpiresAfter(s, MIN_MS);
  });

  it('in a two-node cluster, where nobody can confirm, runs for the minimum', async () => {
    const s = await suspectA(['a']);
    assertExpiresAfter(s, MIN_MS);
  });

  it('scales the minimum with log10 of the cluster size', async () => {
    const members = Array.from({ length: 99 }, (_, i) => (i === 0 ? 'a' : `p${i}`));
    const s = await suspectA(members);
    assertExpiresAfter(s, 6 * 4 * 2 * 1000);
  });

  it('counts our own failed probe as a confirmation of a suspicion someone else raised', async () => {
    const { detector, transport, clock } = setup();
    const startedAt = clock.now();
    detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from: 'b' });
    transport.silent.add('a');
    await probePeer(detector, transport, 'a');
    assert.deepEqual(transport.rumors, [{ kind: 'suspect', peer: 'a', incarnation: 0, from: 'self' }]);
    clock.set(startedAt + 14_000);
    detector.expireSuspicions();
    assert.equal(state(detector, 'a'), 'dead');
  });
});

describe('FailureDetector rumors', () => {
  it('refutes a suspicion of self: raises the incarnation above it, disseminates alive, lowers health', () => {
    const { detector, transport } = setup();
    assert.equal(detector.onRumor({ kind: 'suspect', peer: 'self', incarnation: 0, from: 'a' }), false);
    assert.equal(detector.incarnation, 1);
    assert.equal(detector.awareness, 1);
    assert.deepEqual(transport.rumors, [{ kind: 'alive', peer: 'self', incarnation: 1, from: 'self' }]);

    detector.onRumor({ kind: 'dead', peer: 'self', incarnation: 5, from: 'b' });
    assert.equal(detector.incarnation, 6);
    assert.deepEqual(transport.rumors.at(-1), { kind: 'alive', peer: 'self', incarnation: 6, from: 'self' });
  });

  it('ignores an accusation of self older than our incarnation', () => {
    const { detector, transport } = setup();
    detector.setIncarnation(3);
    assert.equal(detector.onRumor({ kind: 'suspect', peer: 'self', incarnation: 2, from: 'a' }), false);
    assert.equal(detector.incarnation, 3);
    assert.equal(detector.awareness, 0);
    assert.deepEqual(transport.rumors, []);
  });

  it('refutes the buddy hint with the next incarnation', () => {
    const { detector, transport } = setup();
    detector.setIncarnation(4);
    detector.refuteSuspicion();
    assert.equal(detector.incarnation, 5);
    assert.equal(detector.awareness, 1);
    assert.deepEqual(transport.rumors, [{ kind: 'alive', peer: 'self', incarnation: 5, from: 'self' }]);
  });

  it('adopts a newer incarnation of self seen alive, so later refutations outrank it', () => {
    const { detector, transport } = setup();
    detector.onRumor({ kind: 'alive', peer: 'self', incarnation: 9, from: 'a' });
    assert.equal(detector.incarnation, 9);
    assert.deepEqual(transport.rumors, []);
  });

  it('a suspect rumor suspects an alive peer; alive with a higher incarnation clears it', () => {
    const { detector, changes, clock } = setup();
    assert.equal(detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 0, from: 'b' }), true);
    assert.equal(state(detector, 'a'), 'suspect');
    assert.equal(detector.onRumor({ kind: 'alive', peer: 'a', incarnation: 0, from: 'a' }), false);
    assert.equal(state(detector, 'a'), 'suspect', 'same incarnation does not refute');
    assert.equal(detector.onRumor({ kind: 'alive', peer: 'a', incarnation: 1, from: 'a' }), true);
    assert.deepEqual(detector.liveness('a'), { state: 'alive', incarnation: 1, lastSeenAt: null });
    clock.advance(MAX_MS * 2);
    detector.expireSuspicions();
    assert.equal(state(detector, 'a'), 'alive', 'the cleared suspicion no longer expires');
    assert.deepEqual(changes, [
      ['a', 'alive', 'suspect'],
      ['a', 'suspect', 'alive'],
    ]);
  });

  it('a dead rumor at the current incarnation overrides suspect; alive with a higher one revives', () => {
    const { detector } = setup();
    detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 2, from: 'b' });
    assert.equal(detector.onRumor({ kind: 'dead', peer: 'a', incarnation: 2, from: 'c' }), true);
    assert.equal(state(detector, 'a'), 'dead');
    assert.equal(detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 2, from: 'd' }), false);
    assert.equal(detector.onRumor({ kind: 'dead', peer: 'a', incarnation: 2, from: 'd' }), false);
    assert.equal(detector.onRumor({ kind: 'alive', peer: 'a', incarnation: 3, from: 'a' }), true);
    assert.equal(state(detector, 'a'), 'alive');
  });

  it('ignores stale rumors, rumors about non-members and malformed incarnations', () => {
    const { detector, changes } = setup();
    detector.onRumor({ kind: 'alive', peer: 'a', incarnation: 2, from: 'a' });
    changes.length = 0;
    for (const rumor of [
      { kind: 'suspect', peer: 'a', incarnation: 1, from: 'b' },
      { kind: 'dead', peer: 'a', incarnation: 1, from: 'b' },
      { kind: 'alive', peer: 'a', incarnation: 2, from: 'b' },
      { kind: 'suspect', peer: 'stranger', incarnation: 9, from: 'b' },
      { kind: 'suspect', peer: 'a', incarnation: Number.NaN, from: 'b' },
      { kind: 'dead', peer: 'a', incarnation: -1, from: 'b' },
    ] as LivenessRumor[]) {
      assert.equal(detector.onRumor(rumor), false, JSON.stringify(rumor));
    }
    assert.deepEqual(detector.liveness('a'), { state: 'alive', incarnation: 2, lastSeenAt: null });
    assert.equal(detector.liveness('stranger'), undefined);
    assert.deepEqual(changes, []);
  });
});

describe('FailureDetector heardFrom', () => {
  it('revives a dead peer on any message, and spreads that only for a newer incarnation', async () => {
    const { detector, transport, clock, changes } = setup();
    detector.onRumor({ kind: 'dead', peer: 'a', incarnation: 2, from: 'b' });
    detector.onRumor({ kind: 'dead', peer: 'c', incarnation: 2, from: 'b' });
    clock.advance(1234);

    detector.heardFrom('a');
    assert.deepEqual(detector.liveness('a'), { state: 'alive', incarnation: 2, lastSeenAt: clock.now() });
    detector.heardFrom('c', 3);
    assert.deepEqual(detector.liveness('c'), { state: 'alive', incarnation: 3, lastSeenAt: clock.now() });
    assert.deepEqual(transport.rumors, [{ kind: 'alive', peer: 'c', incarnation: 3, from: 'self' }]);
    assert.deepEqual(changes.slice(-2), [
      ['a', 'dead', 'alive'],
      ['c', 'dead', 'alive'],
    ]);
  });

  it('does not revive on a message older than the incarnation the peer was declared dead at', () => {
    const { detector, clock } = setup();
    detector.onRumor({ kind: 'dead', peer: 'a', incarnation: 2, from: 'b' });
    clock.advance(10);
    detector.heardFrom('a', 1);
    assert.deepEqual(detector.liveness('a'), { state: 'dead', incarnation: 2, lastSeenAt: clock.now() });
    detector.heardFrom('a', 2);
    assert.equal(state(detector, 'a'), 'alive');
  });

  it('revives a dead peer on a direct ack, without asking relays about dead peers', async () => {
    const { detector, transport } = setup();
    detector.onRumor({ kind: 'dead', peer: 'a', incarnation: 0, from: 'b' });
    transport.silent.add('a');
    await probePeer(detector, transport, 'a');
    assert.equal(transport.pings.at(-1)?.suspected, true);
    assert.equal(transport.pingReqs.length, 0);
    assert.equal(detector.awareness, 0);
    transport.silent.delete('a');
    await probePeer(detector, transport, 'a');
    assert.equal(state(detector, 'a'), 'alive');
  });

  it('ignores self and non-members', () => {
    const { detector } = setup();
    detector.heardFrom('self');
    detector.heardFrom('stranger');
    assert.deepEqual([...detector.all().keys()].sort(), ['a', 'b', 'c', 'd']);
  });
});

describe('FailureDetector awareness', () => {
  it('rises on failed probes, scales the probe timeout, falls on success, stays within 0..awarenessMax', async () => {
    const { detector, transport } = setup(['a']);
    transport.silent.add('a');
    const seen: number[] = [];
    for (let i = 0; i < 10; i++) {
      await detector.probeOnce();
      seen.push(detector.awareness);
    }
    assert.deepEqual(seen, [1, 2, 3, 4, 5, 6, 7, 8, 8, 8]);
    assert.deepEqual(
      transport.pings.map((p) => p.timeoutMs),
      [1, 2, 3, 4, 5, 6, 7, 8, 9, 9].map((scale) => 500 * scale),
    );

    transport.silent.delete('a');
    seen.length = 0;
    for (let i = 0; i < 10; i++) {
      await detector.probeOnce();
      seen.push(detector.awareness);
    }
    assert.deepEqual(seen, [7, 6, 5, 4, 3, 2, 1, 0, 0, 0]);
    assert.equal(transport.pings.at(-1)?.timeoutMs, 500);
  });

  it('scales the time given to relays too', async () => {
    const { detector, transport } = setup(['a', 'b'], { awarenessMax: 3 });
    transport.silent.add('a');
    // A successful probe of b lowers awareness, so raise it to the bound before every period.
    while (transport.pings.at(-1)?.peer !== 'a') {
      for (let i = 0; i < 4; i++) detector.refuteSuspicion();
      assert.equal(detector.awareness, 3);
      await detector.probeOnce();
    }
    assert.equal(transport.pings.at(-1)?.timeoutMs, 2000);
    assert.deepEqual(transport.pingReqs, [{ via: 'b', target: 'a', timeoutMs: 2000 }]);
  });
});

describe('FailureDetector membership', () => {
  it('keeps the state of members that stay and forgets removed ones', async () => {
    const { detector, transport } = setup(['a', 'b', 'c']);
    detector.onRumor({ kind: 'suspect', peer: 'a', incarnation: 2, from: 'c' });
    detector.onRumor({ kind: 'suspect', peer: 'b', incarnation: 1, from: 'c' });
    detector.setMembers(['a', 'c', 'd', 'self']);
    assert.deepEqual(detector.liveness('a'), { state: 'suspect', incarnation: 2, lastSeenAt: null });
    assert.equal(detector.liveness('b'), undefined);
    assert.deepEqual(detector.liveness('d'), { state: 'alive', incarnation: 0, lastSeenAt: null });
    assert.deepEqual([...detector.all().keys()].sort(), ['a', 'c', 'd']);

    for (let i = 0; i < 6; i++) await detector.probeOnce();
    assert.ok(!transport.pings.some((p) => p.peer === 'b' || p.peer === 'self'));

    detector.setMembers(['a', 'b', 'c', 'd']);
    assert.deepEqual(detector.liveness('b'), { state: 'alive', incarnation: 0, lastSeenAt: null });
  });

  it('probes a newcomer within the current pass without probing anyone twice in it', async () => {
    for (let seed = 1; seed <= 20; seed++) {
      const { detector, transport } = setup(['a', 'b', 'c'], undefined, seed);
      await detector.probeOnce();
      detector.setMembers(['a', 'b', 'c', 'd']);
      for (let i = 0; i < 3; i++) await detector.probeOnce();
      assert.deepEqual(transport.pings.map((p) => p.peer).sort(), ['a', 'b', 'c', 'd'], `seed ${seed}`);
    }
  });

  it('does nothing with no members', async () => {
    const { detector, transport } = setup([]);
    await detector.probeOnce();
    assert.deepEqual([transport.pings, transport.rumors], [[], []]);
  });

  it('returns snapshots that later changes do not show through', () => {
    const { detector } = setup(['a']);
    const before = detector.liveness('a')!;
    const all = detector.all();
    detector.onRumor({ kind: 'dead', peer: 'a', incarnation: 0, from: 'b' });
    assert.equal(before.state, 'alive');
    assert.equal(all.get('a')?.state, 'alive');
  });

  it('refuses a config that would make every suspicion expire at once', () => {
    const t = new ScriptedTransport();
    assert.throws(
      () => new FailureDetector('self', t, new ManualClock(), { probeIntervalMs: 0 }),
      RangeError,
    );
    assert.throws(
      () => new FailureDetector('self', t, new ManualClock(), { suspicionMult: Number.NaN }),
      RangeError,
    );
    assert.throws(
      () => new FailureDetector('self', t, new ManualClock(), { indirectChecks: 1.5 }),
      RangeError,
    );
  });
});

describe('FailureDetector over many periods (seeded)', () => {
  it('with one member silent and the rest answering, only that member is ever suspected and it ends dead', async () => {
    for (let seed = 1; seed <= 25; seed++) {
      const rng = mulberry32(seed * 7919);
      const members = Array.from({ length: 3 + Math.floor(rng() * 10) }, (_, i) => `p${i}`);
      const silent = members[Math.floor(rng() * members.length)]!;
      const { detector, transport, clock, changes } = setup(members, undefined, seed);
      transport.silent.add(silent);
      for (let period = 0; period < 400; period++) {
        await detector.probeOnce();
        clock.advance(1000);
      }
      const label = `seed ${seed}, ${members.length} members, silent ${silent}`;
      assert.deepEqual(
        changes,
        [
          [silent, 'alive', 'suspect'],
          [silent, 'suspect', 'dead'],
        ],
        label,
      );
      for (const [peer, liveness] of detector.all()) {
        assert.equal(liveness.state, peer === silent ? 'dead' : 'alive', `${label}: ${peer}`);
      }
      // Our own refutations would mean we suspected ourselves: only the silent member is talked about.
      assert.deepEqual(
        transport.rumors.map((r) => `${r.kind} ${r.peer}`),
        [`suspect ${silent}`, `dead ${silent}`],
        label,
      );
    }
  });
});
