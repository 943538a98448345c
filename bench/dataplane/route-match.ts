/**
 * bench/dataplane/route-match: what naming a connection's service costs, before and after the
 * routes were compiled (`node dist/bench/dataplane/route-match.js`). "old" is serviceOfConnection
 * as it was (test/helpers/route-match-oracle.ts: sort on every call, CIDRs parsed and formatted
 * for each comparison), "compiled" a RouteMatcher built once (src/dataplane/plan.ts), as the
 * ingress (every intercepted connection) and the exit (every stream it opens) now use it.
 *
 * Routes: 3 services, priorities 0..2, destinations /16../32 (a quarter with a source CIDR);
 * per family its own route set. Lookups cycle through 1024 (src, dst) pairs: 3 in 4 fall inside a
 * route picked at random (so on average half the list is scanned), 1 in 4 inside none (all of
 * it). Each figure: lookups/s, median of BENCH_ROUNDS (5) rounds of about BENCH_ROUND_MS (300) ms.
 */

import { type PlanRoute, RouteMatcher } from '../../src/dataplane/plan.js';
import { formatIp } from '../../src/domain/cidr.js';
import { oldServiceOfConnection } from '../../test/helpers/route-match-oracle.js';
import { prng } from '../../test/helpers/seeded-random.js';

const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 5);
const ROUND_MS = Number(process.env['BENCH_ROUND_MS'] ?? 300);
const SERVICES = ['11111111-1111-4111-8111-111111111111', '22222222-2222-4222-8222-222222222222', 'x'];

const rand = prng(0xbe7c4);
const int = (n: number) => Math.floor(rand() * n);

/** Random bytes inside `network`/`prefix` (host bits random). */
function inside(network: Uint8Array, prefix: number): Uint8Array {
  const b = Uint8Array.from(network);
  for (let bit = prefix; bit < b.length * 8; bit++) {
    if (rand() < 0.5) b[bit >> 3]! ^= 1 << (7 - (bit & 7));
  }
  return b;
}

function workload(n: number, family: 4 | 6): { routes: PlanRoute[]; pairs: [string, string][] } {
  const size = family === 4 ? 4 : 16;
  const bits = size * 8;
  // Destinations under 10/8 or fd00::/16, sources under 10.200/16 or fd01::/16; the misses go
  // to 192.0.2.0/24 or 2001:db8::/32, which no route holds.
  const under = (first: number[], prefix: number) => {
    const b = new Uint8Array(size).map(() => int(256));
    first.forEach((v, i) => {
      b[i] = v;
    });
    for (let bit = prefix; bit < bits; bit++) b[bit >> 3]! &= ~(1 << (7 - (bit & 7)));
    return b;
  };
  const routes: PlanRoute[] = [];
  const nets: { dst: Uint8Array; dstPrefix: number; src: Uint8Array | null; srcPrefix: number }[] = [];
  for (let i = 0; i < n; i++) {
    const dstPrefix = family === 4 ? 16 + int(17) : 32 + int(97);
    const dst = under(family === 4 ? [10] : [0xfd, 0x00], dstPrefix);
    const srcPrefix = family === 4 ? 24 : 64;
    const src = rand() < 0.25 ? under(family === 4 ? [10, 200] : [0xfd, 0x01], srcPrefix) : null;
    nets.push({ dst, dstPrefix, src, srcPrefix });
    routes.push({
      id: i + 1,
      serviceId: SERVICES[i % 3]!,
      priority: int(3),
      sourceCidr: src ? `${formatIp(src)}/${srcPrefix}` : null,
      destCidr: `${formatIp(dst)}/${dstPrefix}`,
    });
  }
  const pairs: [string, string][] = [];
  for (let i = 0; i < 1024; i++) {
    const net = nets[int(n)]!;
    const hit = rand() < 0.75;
    const src = net.src
      ? inside(net.src, net.srcPrefix)
      : under(family === 4 ? [10, 200] : [0xfd, 0x01], bits);
    const dst = hit
      ? inside(net.dst, net.dstPrefix)
      : under(family === 4 ? [192, 0, 2] : [0x20, 0x01, 0x0d, 0xb8], bits);
    pairs.push([formatIp(src), formatIp(dst)]);
  }
  return { routes, pairs };
}

/** Lookups per second of `lookup` over the pairs, median of the rounds after a warm-up. */
function rate(
  pairs: readonly [string, string][],
  lookup: (src: string, dst: string) => string | null,
): number {
  const round = (ms: number) => {
    let done = 0;
    const t0 = performance.now();
    let t = t0;
    while (t - t0 < ms) {
      for (let i = 0; i < 64; i++) {
        const [src, dst] = pairs[(done + i) & 1023]!;
        lookup(src, dst);
      }
      done += 64;
      t = performance.now();
    }
    return (done * 1000) / (t - t0);
  };
  round(ROUND_MS / 2);
  const out = Array.from({ length: ROUNDS }, () => round(ROUND_MS)).sort((a, b) => a - b);
  return out[Math.floor(out.length / 2)]!;
}

const fmt = (x: number) => (x >= 1e6 ? `${(x / 1e6).toFixed(2)} M` : `${(x / 1e3).toFixed(1)} k`);
const rows: string[][] = [['routes', 'family', 'named', 'old lookups/s', 'compiled lookups/s', 'ratio']];
for (const n of [3, 30, 300]) {
  for (const family of [4, 6] as const) {
    const { routes, pairs } = workload(n, family);
    const matcher = new RouteMatcher(routes);
    // Both must name the same services, or the comparison means nothing.
    let named = 0;
    for (const [src, dst] of pairs) {
      const want = oldServiceOfConnection(routes, src, dst);
      if (matcher.serviceOf(src, dst) !== want) throw new Error(`disagree on ${src} -> ${dst}`);
      if (want !== null) named++;
    }
    const old = rate(pairs, (src, dst) => oldServiceOfConnection(routes, src, dst));
    const compiled = rate(pairs, (src, dst) => matcher.serviceOf(src, dst));
    rows.push([
      String(n),
      `IPv${family}`,
      `${Math.round((named / pairs.length) * 100)} %`,
      fmt(old),
      fmt(compiled),
      `${(compiled / old).toFixed(1)}x`,
    ]);
  }
}
const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
for (const r of rows) console.log(r.map((cell, c) => cell.padStart(widths[c]!)).join('  '));
