/**
 * bench/cluster with the simulator (test/sim): the real cluster layer of N agents in one
 * process on virtual time, gossip every 200 ms, over the in-memory network at 0 % and 20 % loss
 * (each direction), 5-25 ms one-way delay (BENCH_DELAY="base,jitter" in ms). BENCH_LOSS_KNOWN=1
 * makes a lost message fail at once at its sender, as the former fault switch did.
 *
 *   node dist/bench/cluster/sim.js [N ...]      (default 50 200)
 *
 * - Convergence: one change (a rename of a random peer on a random agent), then virtual time in
 *   10 ms steps until every agent holds it: seconds until the last agent has it; p50, p99 and max
 *   over CHANGES changes, 3 s apart (plus a random part of the interval).
 * - Bytes per agent per second: the in-memory network's count (envelope payload + 200 B per
 *   request, reply JSON), idle over 10 s, and under one change per second over 10 s.
 * - Wall time per simulated second, over the whole run after formation. Formation: the first
 *   agent adds every other by the real handshake while only its own rounds run (a cascade of
 *   pushes through every member at each join grew as N^2.6: 338 s of wall time at N = 200); the
 *   first agent's records are then handed to every agent, and every agent's rounds start, each
 *   at a random phase of the interval.
 */
import { createPublicKey } from 'node:crypto';
import { DEFAULT_TOMBSTONE_HORIZON_MS } from '../../src/cluster/replica.js';
import { keyOf } from '../../src/cluster/replicated-records.js';
import { loadLicenseSigningKey, signLicense } from '../../src/license/sign.js';
import { SimAgent } from '../../test/sim/agent.js';
import { SimNetwork } from '../../test/sim/network.js';
import { Prng } from '../../test/sim/prng.js';
import { seededEd25519Pem, withSeededCrypto } from '../../test/sim/seeded-crypto.js';
import { VirtualTime } from '../../test/sim/virtual-time.js';

const CHANGES = Number(process.env.BENCH_CHANGES ?? 20);
/** Seconds of each bytes window (idle, under change). */
const WINDOW_S = Number(process.env.BENCH_WINDOW_S ?? 10);
/** Loss levels, comma-separated shares. */
const LOSSES = (process.env.BENCH_LOSS ?? '0,0.2').split(',').map(Number);
/** One-way delay: base and uniform jitter in ms ("5,20": 5-25 ms). */
const [DELAY_MS, JITTER_MS] = (process.env.BENCH_DELAY ?? '5,20').split(',').map(Number) as [number, number];
/** 1: a lost message fails at once at its sender (the former fault switch's loss; network.ts). */
const LOSS_KNOWN = process.env.BENCH_LOSS_KNOWN === '1';
const INTERVAL_MS = 200;
const ACTOR = { client_id: null, agent: 'bench' };
const START = Date.UTC(2026, 0, 1);

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]!;
};

/** Forms one cluster of n agents, then measures it at each loss level in turn. */
async function run(n: number) {
  const root = new Prng(n * 1000);
  return withSeededCrypto(root.fork(), async () => {
    const time = new VirtualTime(START);
    const net = new SimNetwork(time, root.fork(), () => {});
    const key = loadLicenseSigningKey(seededEd25519Pem(root.fork()));
    const license = signLicense(
      {
        customer_id: 'bench',
        license_id: 'license-bench',
        issued_at: new Date(START - 86_400_000).toISOString(),
        expires_at: new Date(START + 365 * 86_400_000).toISOString(),
        max_nodes: n,
        max_services: 10,
      },
      key,
    );
    const agents: SimAgent[] = [];
    const env = {
      time,
      net,
      licenseKeys: [createPublicKey(key)],
      intervalMs: INTERVAL_MS,
      tombstoneHorizonMs: DEFAULT_TOMBSTONE_HORIZON_MS,
      factories: {},
      agentAt: (address: string) => agents[Number(address.slice(6, address.indexOf('.')))],
    };
    const formStart = performance.now();
    for (let i = 0; i < n; i++) {
      const a = new SimAgent(i, env, root.fork());
      a.start(i === 0);
      a.bootstrap(license);
      agents.push(a);
    }
    for (const a of agents.slice(1)) {
      let done = false;
      const p = agents[0]!.peers.add(a.address, ACTOR).finally(() => {
        done = true;
      });
      while (!done) await time.runUntil(time.now() + 20);
      await p;
    }
    // Each agent got the state as of its own join from the handshake; the rest of the
    // membership is handed over directly, as a restored backup would be, so that formation is
    // O(N^2) record checks instead of N anti-entropy cascades through every member.
    const all = agents[0]!.replica
      .digestEntries()
      .map(([k]) => agents[0]!.replica.record(k))
      .filter((r) => r !== undefined);
    for (const a of agents.slice(1)) a.replica.apply(all);
    // Then every agent's rounds, each at its own phase of the interval, as agents started at
    // different times have: rounds in lockstep made every change wait the same time for a probe.
    const phases = root.fork();
    for (const a of agents.slice(1)) time.at(phases.int(INTERVAL_MS), () => a.gossip.start());
    const root0 = () => agents[0]!.replica.digest().root;
    await time.runUntil(time.now() + INTERVAL_MS);
    while (agents.some((a) => a.replica.digest().root !== root0())) await time.runUntil(time.now() + 1000);
    await time.runUntil(time.now() + 5000);
    const formWall = performance.now() - formStart;
    // Progress on stderr: a large N runs for many minutes.
    console.error(`N = ${n}: formed in ${(formWall / 1000).toFixed(1)} s wall`);
    const rnd = root.fork();
    const measure = async (loss: number) => {
      net.faults = { loss, delayMs: DELAY_MS, jitterMs: JITTER_MS, duplicate: 0, lossKnown: LOSS_KNOWN };
      const wallStart = performance.now();
      const simStart = time.now();
      const total = () => net.bytesSent.reduce((s, b) => s + b, 0);
      // Idle bytes.
      let before = total();
      await time.runUntil(time.now() + WINDOW_S * 1000);
      const idle = (total() - before) / n / WINDOW_S;
      console.error(`N = ${n}: idle window done`);
      // Convergence of single changes.
      const times: number[] = [];
      for (let c = 0; c < CHANGES; c++) {
        const writer = rnd.pick(agents);
        const target = rnd.pick(agents);
        const rec = writer.peers.rename(target.id, `c${c}`, ACTOR);
        const k = keyOf('peer', target.id);
        const t0 = time.now();
        let pending = agents.filter((a) => (a.replica.vkeyOf(k) ?? '') < rec.vkey);
        while (pending.length > 0 && time.now() - t0 < 60_000) {
          await time.runUntil(time.now() + 10);
          pending = pending.filter((a) => (a.replica.vkeyOf(k) ?? '') < rec.vkey);
        }
        times.push((time.now() - t0) / 1000);
        // 3 s apart, at a random point of the interval.
        await time.runUntil(t0 + 3000 + rnd.int(INTERVAL_MS));
      }
      // Bytes under one change per second.
      before = total();
      for (let s = 0; s < WINDOW_S; s++) {
        rnd.pick(agents).peers.rename(rnd.pick(agents).id, `u${s}`, ACTOR);
        await time.runUntil(time.now() + 1000);
      }
      const busy = (total() - before) / n / WINDOW_S;
      const simSeconds = (time.now() - simStart) / 1000;
      const wallPerSimSecond = (performance.now() - wallStart) / 1000 / simSeconds;
      const rssMb = Math.round(process.memoryUsage().rss / 2 ** 20);
      return {
        n,
        loss,
        p50: pct(times, 50),
        p99: pct(times, 99),
        max: Math.max(...times),
        idleBytesPerAgentPerS: Math.round(idle),
        changeBytesPerAgentPerS: Math.round(busy),
        wallSPerSimS: Number(wallPerSimSecond.toFixed(3)),
        formationWallS: Number((formWall / 1000).toFixed(1)),
        delayMs: `${DELAY_MS}-${DELAY_MS + JITTER_MS}`,
        lossKnown: LOSS_KNOWN,
        rssMb,
      };
    };
    for (const loss of LOSSES) {
      console.log(JSON.stringify(await measure(loss)));
      // Calm again, and one state, before the next level.
      net.faults = { loss: 0, delayMs: DELAY_MS, jitterMs: JITTER_MS, duplicate: 0 };
      while (agents.some((a) => a.replica.digest().root !== root0())) await time.runUntil(time.now() + 1000);
    }
    for (const a of agents) a.crash();
    for (const a of agents) a.store.close();
  });
}

const sizes = process.argv.slice(2).map(Number);
for (const n of sizes.length > 0 ? sizes : [50, 200]) {
  await run(n);
}
