import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { planRoute as route, S1, S2, S3, planService as service } from '../../test/helpers/plan-fixtures.js';
import { prng, SEED } from '../../test/helpers/seeded-random.js';
import { formatIp } from '../domain/cidr.js';
import type { ApiError } from '../domain/errors.js';
import {
  type ExplainConfig,
  type ExplainPacket,
  explain,
  type IngressRuntime,
  type KernelView,
  RouteExplainer,
  withKernel,
} from './explain.js';
import { applyProposal, PROPOSED_SERVICE_ID } from './explain-proposal.js';
import type { HealthVerdict } from './health.js';
import { RULE_PREF, tableOf } from './kernel/ownership.js';
import { cidrHolds, type PlanRoute, type PlanService, plan, RouteMatcher, routeOrder } from './plan.js';

const A = 'a'.repeat(32);
const B = 'b'.repeat(32);
const C = 'c'.repeat(32);
const NOW = 1_800_000_000_000;

const packet = (
  source: string,
  destination: string,
  protocol: ExplainPacket['protocol'] = null,
): ExplainPacket => ({
  source,
  destination,
  protocol,
  port: null,
});

const config = (services: PlanService[], routes: PlanRoute[], peerIps: string[] = []): ExplainConfig => ({
  localPeerId: A,
  services,
  routes,
  peerIps,
});

const healthy: HealthVerdict = {
  state: 'healthy',
  reason: null,
  since: NOW - 60_000,
  carrying: true,
  standbyReason: null,
  holdDownUntil: null,
};

function runtime(standby: Record<string, HealthVerdict> = {}, streams = true): IngressRuntime {
  const health = new Map<string, HealthVerdict>([
    [S1, healthy],
    [S2, healthy],
    [S3, healthy],
  ]);
  for (const [id, v] of Object.entries(standby)) health.set(id, v);
  return {
    standby: new Set(Object.keys(standby)),
    health,
    tunnels: new Map([[S1, { state: 'up', rttMs: 0.4 }]]),
    tuns: new Map([[S1, 'mesh-t7']]),
    streams,
    peerIps: [],
  };
}

describe('explain: the ranking and its reasons', () => {
  const services = [service(S1, A, B), service(S2, A, C), service(S3, B, C)];

  it('ranks every selecting route and says which key of the order decided each', () => {
    const routes = [
      route(10, S1, 5, null, '10.92.0.0/16'),
      route(11, S2, 1, null, '10.92.0.0/16'), // lower priority number: wins
      route(12, S1, 1, null, '10.92.5.0/24'), // same priority, longer destination: beats 11
      route(13, S2, 1, '10.91.0.0/16', '10.92.5.0/24'), // same, longer source: beats 12
      route(14, S2, 1, '10.91.0.0/16', '10.92.5.0/24'), // identical but the id
      route(15, S1, 0, null, '10.93.0.0/16'), // does not select
      route(16, S3, 0, null, '10.92.0.0/16'), // another agent's ingress
    ];
    const e = explain(config(services, routes), packet('10.91.1.2', '10.92.5.9', 'tcp'), runtime(), NOW);
    assert.deepEqual(
      e.ranking.map((r) => [r.route_id, r.outcome, r.decided_by]),
      [
        [13, 'wins', 'id'],
        [14, 'loses', 'id'],
        [12, 'loses', 'source_prefix'],
        [11, 'loses', 'dest_prefix'],
        [10, 'loses', 'priority'],
      ],
    );
    assert.match(e.ranking[4]!.reason, /priority 1 before 5 \(lower wins\)/);
    assert.match(e.ranking[3]!.reason, /destination 10\.92\.5\.0\/24 is more specific than 10\.92\.0\.0\/16/);
    assert.match(e.ranking[1]!.reason, /lower route id wins \(13 < 14\)/);
    assert.equal(e.selected, true);
    assert.equal(e.winner?.service_id, S2);
    assert.equal(e.winner?.target_peer_id, C);
    assert.equal(e.winner?.carried_as, 'stream');
    assert.equal(e.closest, null);
  });

  it('the winner: exit mode, addresses, limit, transport, tunnel and health', () => {
    const macvlan = service(S1, A, B, {
      requiresInterface: true,
      desiredIpv4Cidr: '10.92.0.50/24',
      bandwidthLimitMbps: 20,
      transportType: 'kcp',
    });
    const e = explain(
      config([macvlan], [route(1, S1, 1, null, '10.92.0.0/24')]),
      packet('10.91.0.1', '10.92.0.7', 'udp'),
      runtime(),
      NOW,
    );
    assert.deepEqual(e.winner, {
      service_id: S1,
      route_id: 1,
      target_peer_id: B,
      transport: 'kcp',
      exit_mode: 'macvlan',
      exit_addresses: ['10.92.0.50/24'],
      bandwidth_limit_mbps: 20,
      carried_as: 'packets',
      interface: 'mesh-t7',
      tunnel: { state: 'up', rtt_ms: 0.4 },
      health: {
        state: 'healthy',
        reason: null,
        since: new Date(NOW - 60_000).toISOString(),
        carrying: true,
        hold_down_until: null,
      },
    });
    assert.match(
      e.verdict,
      /service 1{8}.* by route 1, to peer b{32} over kcp, exit macvlan, as packets, healthy, tunnel up rtt 0.4 ms/,
    );
  });

  it('a service standing aside: its route ranks after the others with the health reason, then as waiting', () => {
    const routes = [route(1, S1, 1, null, '10.92.0.0/16'), route(2, S2, 9, null, '10.92.0.0/16')];
    const silent: HealthVerdict = {
      state: 'unhealthy',
      reason: 'tunnel_silent',
      since: NOW - 5000,
      carrying: false,
      standbyReason: 'tunnel_silent',
      holdDownUntil: null,
    };
    const e = explain(
      config(services, routes),
      packet('10.91.0.1', '10.92.1.1'),
      runtime({ [S1]: silent }),
      NOW,
    );
    assert.deepEqual(
      e.ranking.map((r) => [r.route_id, r.outcome, r.decided_by, r.standby_reason]),
      [
        [2, 'wins', 'standby', null],
        [1, 'stands_aside', 'standby', 'tunnel_silent'],
      ],
    );
    assert.match(e.ranking[1]!.reason, /stands aside \(its tunnel is silent\)/);
    const holding: HealthVerdict = {
      ...silent,
      state: 'healthy',
      reason: null,
      standbyReason: 'hold_down',
      holdDownUntil: NOW + 20_000,
    };
    const later = explain(
      config(services, routes),
      packet('10.91.0.1', '10.92.1.1'),
      runtime({ [S1]: holding }),
      NOW,
    );
    assert.equal(later.ranking[1]!.standby_reason, 'hold_down');
    assert.match(later.ranking[1]!.reason, /waits out the failback hold-down/);
  });

  it('a service standing aside that alone selects the packet keeps it, and says so', () => {
    const unknown: HealthVerdict = {
      ...healthy,
      state: 'unknown',
      carrying: false,
      standbyReason: 'unknown',
    };
    const e = explain(
      config(services, [route(1, S1, 1, null, '10.92.0.0/16')]),
      packet('10.91.0.1', '10.92.1.1'),
      runtime({ [S1]: unknown }),
      NOW,
    );
    assert.equal(e.winner?.service_id, S1);
    assert.equal(e.ranking[0]!.standby_reason, 'unknown');
    assert.match(e.ranking[0]!.reason, /no other route selects the packet/);
  });

  it("an inactive service's routes select nothing and are listed as inactive", () => {
    const e = explain(
      config(
        [service(S1, A, B, { isActive: false }), service(S2, A, C)],
        [route(1, S1, 0, null, '10.92.0.0/16'), route(2, S2, 5, null, '10.92.0.0/16')],
      ),
      packet('10.91.0.1', '10.92.1.1'),
      null,
      NOW,
    );
    assert.deepEqual(
      e.ranking.map((r) => [r.route_id, r.outcome]),
      [
        [2, 'wins'],
        [1, 'inactive'],
      ],
    );
    assert.equal(e.dataplane, false);
    assert.equal(e.winner?.health, null);
    assert.equal(e.winner?.carried_as, null);
    assert.match(e.verdict, /no data plane on this agent/);
  });

  it('nothing selects it: the closest route and why it does not match', () => {
    const routes = [
      route(1, S1, 0, null, '10.92.0.0/16'),
      route(2, S2, 0, '192.168.0.0/16', '10.93.0.0/16'),
      route(3, S3, 0, null, '172.16.0.0/12'), // holds the packet, but B is its ingress
      route(4, S1, 0, null, 'fd00::/8'),
    ];
    const near = explain(config(services, routes), packet('10.91.0.1', '10.93.7.7'), null, NOW);
    assert.equal(near.selected, false);
    assert.deepEqual(near.ranking, []);
    assert.equal(near.closest?.route_id, 1);
    assert.deepEqual(near.closest?.why, [
      'destination 10.93.7.7 is outside 10.92.0.0/16 (15 of its 16 prefix bits match)',
    ]);
    const family = explain(config(services, routes), packet('fd01::1', 'fc00::2'), null, NOW);
    assert.equal(family.closest?.route_id, 4);
    assert.deepEqual(family.closest?.why, [
      'destination fc00::2 is outside fd00::/8 (7 of its 8 prefix bits match)',
    ]);
    const elsewhere = explain(config(services, routes), packet('10.91.0.1', '172.20.0.1'), null, NOW);
    assert.equal(elsewhere.closest?.route_id, 3);
    assert.deepEqual(elsewhere.closest?.why, [
      `its service's ingress is peer ${B}, not this agent: ask that agent (peer=${B})`,
    ]);
    assert.match(elsewhere.verdict, /no route selects it at this agent; .*closest: route 3/);
  });

  it("a peer's address or loopback is never selected, whatever the routes say", () => {
    const routes = [route(1, S1, 0, null, '10.0.0.0/8')];
    const e = explain(config(services, routes, ['10.0.0.2']), packet('10.91.0.1', '10.0.0.2'), null, NOW);
    assert.equal(e.selected, false);
    assert.equal(e.winner, null);
    assert.match(e.excluded ?? '', /peer's address/);
    assert.equal(e.ranking[0]!.outcome, 'loses');
    const names = explain(
      config(services, routes),
      packet('10.91.0.1', '10.0.0.3'),
      { ...runtime(), peerIps: ['10.0.0.3'] },
      NOW,
    );
    assert.match(names.excluded ?? '', /peer's address/);
  });
});

describe('explain: with a proposed change', () => {
  const services = [service(S1, A, B), service(S2, A, C)];
  const peers = new Map([
    [A, { isActive: true }],
    [B, { isActive: true }],
    [C, { isActive: true }],
  ]);
  const base = config(services, [route(1, S1, 5, null, '10.92.0.0/16')]);

  it('a proposed route that would win is shown winning, unnumbered; nothing else changes', () => {
    const proposed = applyProposal(
      base,
      { routes: [{ service_id: S2, priority: 1, dest_cidr: '10.92.5.0/24' }] },
      { peers },
    );
    const e = explain(proposed, packet('10.91.0.1', '10.92.5.1'), null, NOW);
    assert.equal(e.proposed, true);
    assert.deepEqual(
      e.ranking.map((r) => [r.route_id, r.proposed, r.outcome]),
      [
        [null, true, 'wins'],
        [1, false, 'loses'],
      ],
    );
    assert.equal(base.routes.length, 1);
  });

  it('a proposed service with its routes; a removed route; a changed route', () => {
    const withService = applyProposal(
      config([service(S1, A, B)], [...base.routes]),
      {
        service: { target_peer_id: C, source_peer_id: A },
        routes: [{ priority: 0, dest_cidr: '10.92.0.0/16' }],
      },
      { peers },
    );
    assert.equal(
      explain(withService, packet('10.91.0.1', '10.92.0.1'), null, NOW).winner?.service_id,
      PROPOSED_SERVICE_ID,
    );
    const removed = applyProposal(base, { remove_routes: [1] }, { peers });
    assert.equal(explain(removed, packet('10.91.0.1', '10.92.0.1'), null, NOW).selected, false);
    const changed = applyProposal(base, { routes: [{ route_id: 1, dest_cidr: '10.93.0.0/16' }] }, { peers });
    assert.equal(explain(changed, packet('10.91.0.1', '10.93.0.1'), null, NOW).winner?.route_id, 1);
  });

  it('what a real write would refuse is refused with the same error', () => {
    const code = (f: () => unknown) => {
      try {
        f();
      } catch (err) {
        return (err as ApiError).code;
      }
      return 'none';
    };
    assert.equal(
      code(() =>
        applyProposal(
          base,
          { routes: [{ service_id: S1, priority: 1, dest_cidr: '10.92.0.1/16' }] },
          { peers },
        ),
      ),
      'INVALID_CIDR',
    );
    assert.equal(
      code(() =>
        applyProposal(
          base,
          { routes: [{ service_id: S1, priority: 70000, dest_cidr: '10.92.0.0/16' }] },
          { peers },
        ),
      ),
      'INVALID_REQUEST',
    );
    assert.equal(
      code(() =>
        applyProposal(
          base,
          { routes: [{ service_id: S3, priority: 1, dest_cidr: '10.92.0.0/16' }] },
          { peers },
        ),
      ),
      'NOT_FOUND',
    );
    assert.equal(
      code(() => applyProposal(base, { routes: [{ priority: 1, dest_cidr: '10.92.0.0/16' }] }, { peers })),
      'INVALID_REQUEST',
    );
    assert.equal(
      code(() => applyProposal(base, { remove_routes: [99] }, { peers })),
      'NOT_FOUND',
    );
    assert.equal(
      code(() => applyProposal(base, { service: { target_peer_id: B } }, { peers })),
      'ALREADY_EXISTS',
    );
    assert.equal(
      code(() => applyProposal(base, { service: { target_peer_id: 'f'.repeat(32) } }, { peers })),
      'NOT_FOUND',
    );
    assert.equal(
      code(() => applyProposal(base, { service: { target_peer_id: C, transport_type: 'udp' } }, { peers })),
      'INVALID_TRANSPORT',
    );
  });
});

describe('explain agrees with the plan (seeded random)', () => {
  const seed = SEED;
  const rand = prng(seed);
  const int = (n: number) => Math.floor(rand() * n);
  const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)]!;
  const bases4 = Array.from({ length: 3 }, () => Uint8Array.from({ length: 4 }, () => int(256)));
  const bases6 = Array.from({ length: 3 }, () => {
    const b = Uint8Array.from({ length: 16 }, () => int(256));
    b[0] = 0xfd;
    return b;
  });
  const near = (base: Uint8Array, keep: number) => {
    const b = Uint8Array.from(base);
    for (let bit = keep; bit < b.length * 8; bit++) if (rand() < 0.5) b[bit >> 3]! ^= 1 << (7 - (bit & 7));
    return b;
  };
  const cidr = (base: Uint8Array) => {
    const bits = base.length * 8;
    const prefix = int(bits + 1);
    const b = near(base, prefix);
    for (let bit = prefix; bit < bits; bit++) b[bit >> 3]! &= ~(1 << (7 - (bit & 7)));
    return `${formatIp(b)}/${prefix}`;
  };

  it('the winner is the service of the first policy rule (in pref order) that holds the packet', () => {
    let cases = 0;
    let selected = 0;
    for (let set = 0; set < 300; set++) {
      const ids = [S1, S2, S3];
      const services = ids.map((id, i) => service(id, i === 2 && rand() < 0.3 ? B : A, pick([B, C])));
      const routes = Array.from({ length: 1 + int(12) }, (_, i) => {
        const v6 = rand() < 0.4;
        const bases = v6 ? bases6 : bases4;
        const source = rand() < 0.5 ? null : cidr(pick(bases));
        const dest = rand() < 0.2 && source !== null ? null : cidr(pick(bases));
        return route(i + 1 + int(3) * 100, pick(ids), int(3), source, dest);
      });
      const standbyIds = ids.filter(() => rand() < 0.2);
      const verdict: HealthVerdict = {
        ...healthy,
        state: 'unhealthy',
        reason: 'tunnel_silent',
        carrying: false,
        standbyReason: 'tunnel_silent',
      };
      const rt = runtime(Object.fromEntries(standbyIds.map((id) => [id, verdict])));
      const slots = new Map(ids.map((id, i) => [id, i + 1]));
      const p = plan({
        localPeerId: A,
        services,
        routes,
        peerIps: [],
        apiPort: 7000,
        slots,
        uplink: null,
        tunMtu: 1500,
        unreachable: new Set(),
        standby: rt.standby,
      });
      // The exclusions (but the API port's, which needs ports) and the routes' rules, in order.
      const selection = p.kernel.rules
        .filter(
          (r) =>
            (r.pref === RULE_PREF.EXCLUDE && r.ipproto === undefined) || r.pref >= RULE_PREF.ROUTES_FIRST,
        )
        .sort((a, b) => a.pref - b.pref);
      for (let k = 0; k < 20; k++) {
        const v6 = rand() < 0.4;
        const bases = v6 ? bases6 : bases4;
        const src = formatIp(near(pick(bases), int(v6 ? 129 : 33)));
        const dst = formatIp(near(pick(bases), int(v6 ? 129 : 33)));
        const e = explain(config(services, routes), packet(src, dst), rt, NOW);
        const family = v6 ? 6 : 4;
        const rule = selection.find(
          (r) =>
            r.family === family &&
            (r.from === undefined || cidrHolds(r.from, src)) &&
            (r.to === undefined || cidrHolds(r.to, dst)),
        );
        const byRule =
          rule && rule.table !== 'main' ? ids.find((id) => tableOf(slots.get(id)!) === rule.table)! : null;
        assert.equal(e.winner?.service_id ?? null, byRule, `seed ${seed}: ${src} -> ${dst}`);
        // The ranking is in the order the plan and the interception use.
        const expected = new RouteMatcher(
          routes.filter((r) => services.find((s) => s.id === r.serviceId)!.sourcePeerId === A),
          rt.standby,
        );
        if (e.excluded === null)
          assert.equal(e.winner?.service_id ?? null, expected.serviceOf(src, dst), `seed ${seed}`);
        const ranked = e.ranking.map((r) => routes.find((x) => x.id === r.route_id)!);
        assert.deepEqual(ranked, [...ranked].sort(routeOrder(rt.standby)));
        cases++;
        if (e.selected) selected++;
      }
    }
    console.log(`explain vs plan: ${cases} packets, ${selected} selected (seed ${seed})`);
    assert.ok(selected > cases / 10, `too few packets selected to mean anything: ${selected} of ${cases}`);
  });
});

describe('explain: the work per packet (the latency target without timing)', () => {
  it('1,000 routes are sorted once; a packet costs comparisons in the routes it ranks, not in all routes', () => {
    /** Counts the selection order's questions: every comparison asks it (standby is not empty). */
    class CountingSet extends Set<string> {
      asked = 0;
      override has(value: string): boolean {
        this.asked++;
        return super.has(value);
      }
    }
    const rand = prng(7);
    const int = (n: number) => Math.floor(rand() * n);
    const services = [service(S1, A, B), service(S2, A, C), service(S3, A, B)];
    const routes = Array.from({ length: 1000 }, (_, i) =>
      route(i + 1, [S1, S2][i % 2]!, int(5), null, `10.${int(4)}.${int(256)}.0/24`),
    );
    const standby = new CountingSet([S3]);
    const explainer = new RouteExplainer(config(services, routes), standby);
    const n = routes.length;
    // A merge sort asks at most n·log2(n) comparisons, each asking two questions.
    assert.ok(standby.asked <= 2 * n * Math.ceil(Math.log2(n)), `compiling asked ${standby.asked}`);
    let ranked = 0;
    for (let i = 0; i < 200; i++) {
      standby.asked = 0;
      const e = explainer.explain(
        packet('10.91.0.1', `10.${int(4)}.${int(256)}.9`),
        { ...runtime(), standby },
        NOW,
      );
      ranked += e.ranking.length;
      // Per ranked route: is it standing aside, and one comparison with the winner.
      assert.ok(
        standby.asked <= 3 * e.ranking.length + 2,
        `${standby.asked} questions for ${e.ranking.length} routes`,
      );
    }
    assert.ok(ranked > 0);
  });
});

describe("explain: the kernel's view against the configuration", () => {
  const services = [service(S1, A, B), service(S2, A, C)];
  const routes = [route(1, S1, 1, null, '10.92.0.0/16')];
  const view = (extra: Partial<KernelView>): KernelView => ({
    lookup: 'ip route get fibmatch 10.92.0.1 from 10.91.0.1 iif eth1',
    iif: 'eth1',
    route: { dev: 'mesh-t7', gateway: null, prefix: '0.0.0.0/0', usable: true },
    service_id: S1,
    rule: 'pref 22000 to 10.92.0.0/16 lookup 52007',
    nft: [],
    repairs: [],
    ...extra,
  });

  it('agrees when the kernel takes the TUN of the service the configuration selects', () => {
    const e = withKernel(
      explain(config(services, routes), packet('10.91.0.1', '10.92.0.1'), runtime(), NOW),
      view({}),
    );
    assert.equal(e.kernel_agrees, true);
    assert.equal(e.kernel_difference, null);
    assert.match(e.verdict, /the kernel agrees \(into service 1{8}.*'s tunnel \(mesh-t7\)\)$/);
  });

  it('disagrees, naming where the kernel sends it and what the reconciler will repair', () => {
    const e = withKernel(
      explain(config(services, routes), packet('10.91.0.1', '10.92.0.1'), runtime(), NOW),
      view({
        route: { dev: 'eth0', gateway: '10.91.0.254', prefix: '0.0.0.0/0', usable: true },
        service_id: null,
        rule: null,
        repairs: ['ip -4 rule add pref 22000 to 10.92.0.0/16 lookup 52007'],
      }),
    );
    assert.equal(e.kernel_agrees, false);
    assert.equal(
      e.kernel_difference,
      `the configuration selects service ${S1} (route 1), but the kernel sends it out of eth0 via 10.91.0.254 (route 0.0.0.0/0), not into a tunnel; the reconciler will repair: ip -4 rule add pref 22000 to 10.92.0.0/16 lookup 52007`,
    );
    // Nothing selected, yet the kernel tunnels it: also a disagreement.
    const none = withKernel(
      explain(config(services, routes), packet('10.91.0.1', '10.93.0.1'), runtime(), NOW),
      view({}),
    );
    assert.equal(none.kernel_agrees, false);
    assert.match(
      none.kernel_difference ?? '',
      /^the configuration selects no service, but the kernel sends it into service/,
    );
  });
});
