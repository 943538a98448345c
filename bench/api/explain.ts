/**
 * GET /v1/explain against 1,000 routes, without a peer hop (docs/decisions.md §7, "Explain": under
 * 50 ms p99), beside GET /v1/services on the same agent in the same run as the baseline: two
 * services from the agent asked with 500 routes each (overlapping prefixes, mixed priorities,
 * both families), requests one at a time, explain and the baseline interleaved so that both see
 * the same machine. Prints p50/p99 of each and the ratio.
 *
 * Two cases:
 * - default: three real agents without a data plane (the ranking alone over HTTP), plus the
 *   ranking's own cost in this process, compiled once and compiled each time;
 * - `--dataplane` (root): the data-plane tests' network namespaces (test/helpers/mesh-netns.ts:
 *   ingress, two exits, their data planes on), the 1,000 routes as policy rules in the ingress's
 *   kernel, so every explain also reads the kernel's view of its packet (DataPlane.kernelView).
 *   Sources are routed back toward the client namespace, so each lookup has an input interface
 *   as a client's packet does. It takes the data-plane tests' lock (test/helpers/exclusive.ts).
 *
 *   node dist/bench/api/explain.js [--requests N] [--dataplane]
 */
import { writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { explain, RouteExplainer } from '../../src/dataplane/explain.js';
import type { PlanRoute, PlanService } from '../../src/dataplane/plan.js';
import { formatIp } from '../../src/domain/cidr.js';
import { startCluster, stopAll } from '../../test/helpers/cluster.js';
import { makeVendor } from '../../test/helpers/licenses.js';
import { createService, meshNetnsUp } from '../../test/helpers/mesh-netns.js';
import { IP } from '../../test/helpers/netns-topology.js';
import type { Node } from '../../test/helpers/nodes.js';
import { prng } from '../../test/helpers/seeded-random.js';

const ROUTES = 1000;
const SEED = 0x0e_c1a1;
const TARGET_P99_MS = 50;

const percentile = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};
const f = (x: number) => x.toFixed(2);

/** The bench's routes and packets, from one seeded sequence. */
function generators(rand: () => number) {
  const int = (n: number) => Math.floor(rand() * n);
  const route = () => {
    if (rand() < 0.2) {
      const hex = (n: number) => int(n).toString(16);
      const dest = [`fd00::/16`, `fd00:${hex(4)}::/32`, `fd00:${hex(4)}:${hex(8)}::/48`][int(3)];
      return { priority: int(5), dest_cidr: dest };
    }
    const prefix = 8 + int(17);
    const bytes = Uint8Array.from([10, int(4), int(256), 0]);
    for (let bit = prefix; bit < 32; bit++) bytes[bit >> 3]! &= ~(1 << (7 - (bit & 7)));
    const r: Record<string, unknown> = { priority: int(5), dest_cidr: `${formatIp(bytes)}/${prefix}` };
    if (rand() < 0.3) r.source_cidr = `10.${100 + int(4)}.0.0/16`;
    return r;
  };
  const packet = () =>
    rand() < 0.2
      ? { source: 'fd01::1', destination: `fd00:${int(4).toString(16)}:${int(8).toString(16)}::${int(999)}` }
      : { source: `10.${100 + int(5)}.1.1`, destination: `10.${int(4)}.${int(256)}.${1 + int(254)}` };
  return { route, packet };
}

interface Timings {
  explainMs: number[];
  servicesMs: number[];
  selected: number;
  ranked: number;
  /** Answers with a kernel view that agreed with the configuration (data plane only). */
  agreed: number;
  /** The first few differences the kernel view named. */
  differences: string[];
}

/** Explain and the baseline, interleaved, one request at a time, after a warm-up. */
async function interleaved(
  node: Node,
  packet: () => Record<string, string>,
  requests: number,
  warmUp: number,
): Promise<Timings> {
  const ask = async (path: string) => {
    const t = performance.now();
    const res = await node.agent.client.get(path, { token: node.token });
    const ms = performance.now() - t;
    if (res.status !== 200) throw new Error(`${path}: ${res.status} ${res.text}`);
    return { ms, body: res.body };
  };
  // Warm-up: compiled schemas, JIT.
  for (let i = 0; i < warmUp; i++) {
    await ask(`/v1/explain?${new URLSearchParams(packet())}`);
    await ask('/v1/services');
  }
  const t: Timings = { explainMs: [], servicesMs: [], selected: 0, ranked: 0, agreed: 0, differences: [] };
  for (let i = 0; i < requests; i++) {
    const e = await ask(`/v1/explain?${new URLSearchParams(packet())}`);
    t.explainMs.push(e.ms);
    t.ranked += e.body.ranking.length;
    if (e.body.selected) t.selected++;
    if (e.body.kernel_agrees === true) t.agreed++;
    else if (e.body.kernel_agrees === false && t.differences.length < 3) t.differences.push(e.body.verdict);
    t.servicesMs.push((await ask('/v1/services')).ms);
  }
  return t;
}

function printTimings(t: Timings, requests: number): void {
  const e50 = percentile(t.explainMs, 50);
  const e99 = percentile(t.explainMs, 99);
  const s50 = percentile(t.servicesMs, 50);
  const s99 = percentile(t.servicesMs, 99);
  console.log(`  GET /v1/explain   p50 ${f(e50)} ms  p99 ${f(e99)} ms`);
  console.log(`  GET /v1/services  p50 ${f(s50)} ms  p99 ${f(s99)} ms (baseline)`);
  console.log(`  ratio explain/baseline  p50 ${f(e50 / s50)}  p99 ${f(e99 / s99)}`);
  console.log(
    `  packets selected ${t.selected} of ${requests}, ${(t.ranked / requests).toFixed(1)} routes ranked per packet`,
  );
  console.log(`  target p99 < ${TARGET_P99_MS} ms: ${e99 < TARGET_P99_MS ? 'met' : 'NOT met'}`);
}

/** Posts `count` routes split between two services of `node`, to `targets`. */
async function twoServices(node: Node, targets: string[], route: () => Record<string, unknown>) {
  for (const target of targets) {
    await createService(
      node,
      { target_peer_id: target },
      Array.from({ length: ROUTES / targets.length }, route),
    );
  }
}

async function withoutDataPlane(requests: number): Promise<void> {
  const { route, packet } = generators(prng(SEED));
  const vendor = makeVendor();
  const nodes = await startCluster(vendor, 3, {
    license_id: 'bench-explain',
    max_nodes: 5,
    max_services: 10,
  });
  try {
    const [a, b, c] = nodes as [Node, Node, Node];
    await twoServices(a, [b.peerId, c.peerId], route);
    const timings = await interleaved(a, packet, requests, 200);

    // The ranking alone, in this process, over the agent's own configuration.
    const client = a.agent.client;
    const services = (await client.get('/v1/services', { token: a.token })).body as {
      id: string;
      target_peer_id: string;
    }[];
    const planServices: PlanService[] = services.map((s) => ({
      id: s.id,
      sourcePeerId: a.peerId,
      targetPeerId: s.target_peer_id,
      isActive: true,
      requiresInterface: false,
      desiredIpv4Cidr: null,
      desiredIpv6Cidr: null,
    }));
    const planRoutes: PlanRoute[] = [];
    for (const s of services) {
      const rs = (await client.get(`/v1/services/${s.id}/routes`, { token: a.token })).body as {
        id: number;
        priority: number;
        source_cidr: string | null;
        dest_cidr: string | null;
      }[];
      for (const r of rs)
        planRoutes.push({
          id: r.id,
          serviceId: s.id,
          priority: r.priority,
          sourceCidr: r.source_cidr,
          destCidr: r.dest_cidr,
        });
    }
    // As the API does: compiled once per configuration, asked per packet; and compiled each time
    // (what the first request after a write pays).
    const config = { localPeerId: a.peerId, services: planServices, routes: planRoutes, peerIps: [] };
    const compiled = new RouteExplainer(config, new Set());
    const pureMs: number[] = [];
    const coldMs: number[] = [];
    for (let i = 0; i < requests; i++) {
      const p = { ...packet(), protocol: null, port: null };
      let t = performance.now();
      compiled.explain(p, null, Date.now());
      pureMs.push(performance.now() - t);
      t = performance.now();
      explain(config, p, null, Date.now());
      coldMs.push(performance.now() - t);
    }

    console.log(
      `explain bench, no data plane: ${planRoutes.length} routes, ${requests} requests each, seed ${SEED}`,
    );
    printTimings(timings, requests);
    console.log(
      `  ranking alone     p50 ${f(percentile(pureMs, 50))} ms  p99 ${f(percentile(pureMs, 99))} ms (compiled once, as the API keeps it)`,
    );
    console.log(
      `  compile + rank    p50 ${f(percentile(coldMs, 50))} ms  p99 ${f(percentile(coldMs, 99))} ms (the first request after a write)`,
    );
  } finally {
    await stopAll(nodes.map((n) => n.agent));
  }
}

async function withDataPlane(requests: number): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('--dataplane needs root (network namespaces)');
  const { route, packet } = generators(prng(SEED));
  const mesh = await meshNetnsUp('mbex', 74, {
    // EXPLAIN_BENCH_PROFILE=DIR: a CPU profile of each agent, written when it stops.
    ...(process.env.EXPLAIN_BENCH_PROFILE
      ? {
          // The flag serve would restart itself for (src/cli/v8-flags.ts): an execv with the
          // profiler's timer armed dies of SIGPROF.
          agentNodeArgs: [
            '--initial-old-space-size=32',
            '--cpu-prof',
            `--cpu-prof-dir=${process.env.EXPLAIN_BENCH_PROFILE}`,
          ],
        }
      : {}),
    // The bench's sources live behind the client, as a client's traffic does: the kernel's
    // lookup then has an input interface (i0), as it has for real packets.
    prepare: async (topo) => {
      for (const net of ['10.100.0.0/14', '10.104.0.0/16'])
        await topo.run(topo.ns.ingress, 'ip', ['route', 'add', net, 'via', IP.client]);
      await topo.run(topo.ns.ingress, 'ip', ['-6', 'route', 'add', 'fd01::/16', 'via', IP.client6]);
      // And the destinations lie behind each exit, as a real service's do: an exit without a
      // route toward them says so (exit_no_route), and its service stands aside mid-run.
      for (const [ns, v4, v6] of [
        [topo.ns.exit, IP.dest, IP.dest6],
        [topo.ns.exit2, IP.dest2, IP.dest26],
      ] as const) {
        if (ns === null) continue;
        await topo.run(ns, 'ip', ['route', 'add', '10.0.0.0/14', 'via', v4]);
        await topo.run(ns, 'ip', ['-6', 'route', 'add', 'fd00::/16', 'via', v6]);
      }
    },
  });
  try {
    const node = mesh.ingress;
    await twoServices(node, [mesh.exit.peerId, mesh.exit2.peerId], route);
    // Every route a policy rule in the ingress's kernel before the first question.
    const started = Date.now();
    for (;;) {
      const r = await node.agent.client.get('/v1/dataplane', { token: node.token });
      if (r.body.in_step === true && r.body.owned.rules >= ROUTES) break;
      if (Date.now() - started > 60_000) throw new Error(`kernel not in step: ${r.text}`);
      await new Promise((res) => setTimeout(res, 200));
    }
    const owned = (await node.agent.client.get('/v1/dataplane', { token: node.token })).body.owned;
    const timings = await interleaved(node, packet, requests, 20);
    console.log(
      `explain bench, with a data plane: ${ROUTES} routes (${owned.rules} policy rules, ${owned.routes} routes owned), ${requests} requests each, seed ${SEED}`,
    );
    printTimings(timings, requests);
    console.log(`  the kernel view agreed on ${timings.agreed} of ${requests}`);
    for (const d of timings.differences) console.log(`    ${d.slice(0, 400)}`);
    // What else the agents did meanwhile: a health change redoes hundreds of policy rules.
    for (const [name, n] of [
      ['ingress', mesh.ingress],
      ['exit', mesh.exit],
      ['exit2', mesh.exit2],
    ] as const) {
      const changes = n.agent.logs.split('\n').filter((l) => l.includes('service health changed'));
      console.log(`  ${name}: ${changes.length} service health changes logged`);
      for (const l of changes.slice(0, 10)) console.log(`    ${l.slice(0, 200)}`);
    }
  } finally {
    // Kept on request, a failed run's too.
    const logs = process.env.EXPLAIN_BENCH_LOGS;
    if (logs)
      for (const [name, n] of [
        ['ingress', mesh.ingress],
        ['exit', mesh.exit],
        ['exit2', mesh.exit2],
      ] as const)
        writeFileSync(`${logs}-${name}.log`, n.agent.logs);
    await mesh.down();
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { requests: { type: 'string' }, dataplane: { type: 'boolean', default: false } },
  });
  const requests = Number(values.requests ?? (values.dataplane ? 500 : 2000));
  if (values.dataplane) await withDataPlane(requests);
  else await withoutDataPlane(requests);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
