/**
 * GET /v1/explain against 1,000 routes, without a peer hop (docs/decisions.md §7, "Explain": under
 * 50 ms p99), beside GET /v1/services on the same agent in the same run as the baseline: three
 * real agents (no data plane), two services from the first with 500 routes each (overlapping
 * prefixes, mixed priorities, both families), requests one at a time, explain and the baseline
 * interleaved so that both see the same machine. Prints p50/p99 of each and the ratio, and the
 * ranking's own cost in this process, compiled once and compiled each time.
 *
 *   node dist/bench/api/explain.js [--requests N]
 */
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { explain, RouteExplainer } from '../../src/dataplane/explain.js';
import type { PlanRoute, PlanService } from '../../src/dataplane/plan.js';
import { formatIp } from '../../src/domain/cidr.js';
import { startCluster, stopAll } from '../../test/helpers/cluster.js';
import { makeVendor } from '../../test/helpers/licenses.js';
import { prng } from '../../test/helpers/seeded-random.js';

const ROUTES = 1000;
const SEED = 0x0e_c1a1;

const percentile = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { requests: { type: 'string', default: '2000' } } });
  const requests = Number(values.requests);
  const rand = prng(SEED);
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

  const vendor = makeVendor();
  const nodes = await startCluster(vendor, 3, {
    license_id: 'bench-explain',
    max_nodes: 5,
    max_services: 10,
  });
  try {
    const [a, b, c] = nodes as [(typeof nodes)[0], (typeof nodes)[0], (typeof nodes)[0]];
    const client = a.agent.client;
    for (const target of [b, c]) {
      const s = await client.post('/v1/services', {
        token: a.token,
        json: { target_peer_id: target.peerId },
      });
      if (s.status !== 201) throw new Error(s.text);
      const r = await client.post(`/v1/services/${s.body.id}/routes`, {
        token: a.token,
        json: { routes: Array.from({ length: ROUTES / 2 }, route) },
      });
      if (r.status !== 201) throw new Error(r.text);
    }
    const ask = async (path: string) => {
      const t = performance.now();
      const res = await client.get(path, { token: a.token });
      const ms = performance.now() - t;
      if (res.status !== 200) throw new Error(`${path}: ${res.status} ${res.text}`);
      return { ms, body: res.body };
    };
    // Warm-up: compiled schemas, JIT.
    for (let i = 0; i < 200; i++) {
      await ask(`/v1/explain?${new URLSearchParams(packet())}`);
      await ask('/v1/services');
    }
    const explainMs: number[] = [];
    const servicesMs: number[] = [];
    let ranked = 0;
    let selected = 0;
    for (let i = 0; i < requests; i++) {
      const e = await ask(`/v1/explain?${new URLSearchParams(packet())}`);
      explainMs.push(e.ms);
      ranked += e.body.ranking.length;
      if (e.body.selected) selected++;
      servicesMs.push((await ask('/v1/services')).ms);
    }

    // The ranking alone, in this process, over the agent's own configuration.
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

    const f = (x: number) => x.toFixed(2);
    console.log(`explain bench: ${planRoutes.length} routes, ${requests} requests each, seed ${SEED}`);
    console.log(
      `  GET /v1/explain   p50 ${f(percentile(explainMs, 50))} ms  p99 ${f(percentile(explainMs, 99))} ms`,
    );
    console.log(
      `  GET /v1/services  p50 ${f(percentile(servicesMs, 50))} ms  p99 ${f(percentile(servicesMs, 99))} ms (baseline)`,
    );
    console.log(
      `  ratio explain/baseline  p50 ${f(percentile(explainMs, 50) / percentile(servicesMs, 50))}  p99 ${f(percentile(explainMs, 99) / percentile(servicesMs, 99))}`,
    );
    console.log(
      `  ranking alone     p50 ${f(percentile(pureMs, 50))} ms  p99 ${f(percentile(pureMs, 99))} ms (compiled once, as the API keeps it)`,
    );
    console.log(
      `  compile + rank    p50 ${f(percentile(coldMs, 50))} ms  p99 ${f(percentile(coldMs, 99))} ms (the first request after a write)`,
    );
    console.log(
      `  packets selected ${selected} of ${requests}, ${(ranked / requests).toFixed(1)} routes ranked per packet`,
    );
    console.log(`  target p99 < 50 ms: ${percentile(explainMs, 99) < 50 ? 'met' : 'NOT met'}`);
  } finally {
    await stopAll(nodes.map((n) => n.agent));
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
