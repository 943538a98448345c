import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { planRoute, planService, S1, S2, S3 } from '../../test/helpers/plan-fixtures.js';
import { oldIsSpecialText, oldServiceOfConnection } from '../../test/helpers/route-match-oracle.js';
import { prng } from '../../test/helpers/seeded-random.js';
import { formatIp } from '../domain/cidr.js';
import {
  AGENT_MARK,
  exitTableOf,
  INTERCEPT_MARK,
  INTERCEPT_TABLE,
  MARK_MASK,
  macvlanMac,
  PACE_MARK,
  paceMarkOf,
  pacerTableOf,
  RULE_PREF,
  TRANSPARENT_MARK,
  tableOf,
  transparentSocketMark,
} from './kernel/ownership.js';
import {
  compareRoutes,
  isSpecialDestination,
  networkOf,
  type PlanInput,
  type PlanRoute,
  parseAddress,
  plan,
  RouteMatcher,
  serviceOfConnection,
} from './plan.js';

const ME = 'a'.repeat(32);
const EXIT = 'b'.repeat(32);
const OTHER = 'c'.repeat(32);
const svc = planService;
const route = planRoute;

function input(extra: Partial<PlanInput>): PlanInput {
  return {
    localPeerId: ME,
    services: [],
    routes: [],
    peerIps: ['10.91.0.1', '10.91.0.2'],
    apiPort: 7480,
    slots: new Map([
      [S1, 1],
      [S2, 2],
      [S3, 3],
    ]),
    uplink: { dev: 'e0', gateway4: '10.91.2.254', gateway6: null },
    tunMtu: 1500,
    unreachable: new Set(),
    ...extra,
  };
}

describe('plan: route selection order (docs/decisions.md §6)', () => {
  it('lower priority, then longer destination, longer source, lower id', () => {
    const routes = [
      route(5, S1, 10, null, '10.0.0.0/8'),
      route(4, S1, 10, '10.1.0.0/16', '10.0.0.0/8'),
      route(3, S1, 10, null, '10.0.0.0/16'),
      route(2, S1, 5, null, null),
      route(1, S1, 10, '10.1.0.0/16', '10.0.0.0/8'),
    ];
    assert.deepEqual(
      [...routes].sort(compareRoutes).map((r) => r.id),
      [2, 3, 1, 4, 5],
    );
  });

  it('turns the ingress routes of all services into rules in that order, per family', () => {
    const p = plan(
      input({
        services: [svc(S1, ME, EXIT), svc(S2, ME, OTHER)],
        routes: [
          route(1, S1, 100, null, '10.91.2.0/24'),
          route(2, S2, 100, null, '10.91.2.2/32'),
          route(3, S1, 100, null, 'fd91:2::/64'),
          route(4, S2, 7, null, null),
        ],
      }),
    );
    const selecting = p.kernel.rules.filter((r) => r.pref >= RULE_PREF.ROUTES_FIRST);
    assert.deepEqual(selecting, [
      { family: 4, pref: 22_000, table: tableOf(2) },
      { family: 6, pref: 22_000, table: tableOf(2) },
      // Families are numbered apart; across them the order is immaterial (/64 sorts before /32).
      { family: 6, pref: 22_001, table: tableOf(1), to: 'fd91:2::/64' },
      { family: 4, pref: 22_001, table: tableOf(2), to: '10.91.2.2/32' },
      { family: 4, pref: 22_002, table: tableOf(1), to: '10.91.2.0/24' },
    ]);
    assert.deepEqual(
      p.carried.map((c) => [c.serviceId, c.role, c.peerId, c.tun]),
      [
        [S1, 'ingress', EXIT, 'mesh-t1'],
        [S2, 'ingress', OTHER, 'mesh-t2'],
      ],
    );
  });

  it('excludes peer addresses, loopback and API replies before any route, only when routes select', () => {
    const none = plan(input({ services: [svc(S1, ME, EXIT)] }));
    assert.equal(none.kernel.rules.filter((r) => r.pref === RULE_PREF.EXCLUDE).length, 0);
    const p = plan(input({ services: [svc(S1, ME, EXIT)], routes: [route(1, S1, 0, null, null)] }));
    const excl = p.kernel.rules.filter((r) => r.pref === RULE_PREF.EXCLUDE);
    assert.deepEqual(
      excl.map((r) => [r.family, r.to ?? `sport ${r.sport}`, r.table]),
      [
        [4, '10.91.0.1/32', 'main'],
        [4, '10.91.0.2/32', 'main'],
        [4, '127.0.0.0/8', 'main'],
        [4, 'sport 7480', 'main'],
        [6, '::1/128', 'main'],
        [6, 'sport 7480', 'main'],
      ],
    );
    assert.ok(
      Math.max(...excl.map((r) => r.pref)) <
        Math.min(
          ...p.kernel.rules
            .filter((r) => r.to === undefined && r.sport === undefined && r.iif === undefined)
            .map((r) => r.pref),
        ),
    );
  });

  it('failover: the routes of a service standing aside rank after all others, in order among themselves', () => {
    const services = [svc(S1, ME, EXIT), svc(S2, ME, OTHER)];
    const routes = [
      route(1, S1, 10, null, '10.91.2.0/25'),
      route(2, S2, 20, null, '10.91.2.0/24'),
      route(3, S1, 30, null, '10.91.3.0/24'),
    ];
    const rulesOf = (standby?: ReadonlySet<string>) =>
      plan(input({ services, routes, ...(standby ? { standby } : {}) }))
        .kernel.rules.filter((r) => r.pref >= RULE_PREF.ROUTES_FIRST && r.family === 4)
        .map((r) => [r.pref, r.to, r.table]);
    assert.deepEqual(rulesOf(), [
      [22_000, '10.91.2.0/25', tableOf(1)],
      [22_001, '10.91.2.0/24', tableOf(2)],
      [22_002, '10.91.3.0/24', tableOf(1)],
    ]);
    // S1 stands aside: the /24 of S2 takes its /25's traffic; S1 keeps only what nothing else
    // selects (10.91.3.0/24), where it is dropped as before.
    assert.deepEqual(rulesOf(new Set([S1])), [
      [22_000, '10.91.2.0/24', tableOf(2)],
      [22_001, '10.91.2.0/25', tableOf(1)],
      [22_002, '10.91.3.0/24', tableOf(1)],
    ]);
    // Both aside: the selection order among them, as with none.
    assert.deepEqual(rulesOf(new Set([S1, S2])), rulesOf());
  });

  it('leaves inactive services and services of other peers out', () => {
    const p = plan(
      input({
        services: [svc(S1, ME, EXIT, { isActive: false }), svc(S2, EXIT, OTHER)],
        routes: [route(1, S1, 0, null, null), route(2, S2, 0, null, null)],
      }),
    );
    assert.deepEqual(p.kernel, { links: [], addresses: [], rules: [], routes: [], nft: null });
  });
});

describe('plan: exit', () => {
  it('NAT exit: TUN, reply mark rule, masquerade, no selection rules', () => {
    const p = plan(input({ services: [svc(S3, OTHER, ME)], routes: [route(1, S3, 0, null, '10.0.0.0/8')] }));
    assert.deepEqual(p.kernel.links, [{ name: 'mesh-t3', kind: 'tun', mtu: 1500 }]);
    assert.deepEqual(
      p.kernel.rules.map((r) => [r.family, r.pref, r.iif ?? r.fwmark, r.table]),
      [
        [4, RULE_PREF.FROM_TUN, 'mesh-t3', 'main'],
        [4, RULE_PREF.REPLY, { value: 3 << 16, mask: MARK_MASK }, tableOf(3)],
        [6, RULE_PREF.FROM_TUN, 'mesh-t3', 'main'],
        [6, RULE_PREF.REPLY, { value: 3 << 16, mask: MARK_MASK }, tableOf(3)],
      ],
    );
    assert.match(p.kernel.nft!, /iifname "mesh-t3" ct mark set 0x00030000/);
    assert.match(p.kernel.nft!, /iifname "mesh-t3" oifname != "mesh-t3" masquerade/);
    assert.match(
      p.kernel.nft!,
      /ct direction reply ct mark and 0x0fff0000 != 0 meta mark set ct mark and 0x0fff0000/,
    );
  });

  it('MACVLAN exit: link on the uplink, address, its own table with the subnet and gateway, SNAT', () => {
    const p = plan(
      input({
        services: [
          svc(S1, OTHER, ME, {
            requiresInterface: true,
            desiredIpv4Cidr: '10.91.2.50/24',
            desiredIpv6Cidr: 'fd91:2::50/64',
          }),
        ],
      }),
    );
    assert.deepEqual(p.kernel.links, [
      { name: 'mesh-t1', kind: 'tun', mtu: 1500 },
      { name: 'mesh-m1', kind: 'macvlan', parent: 'e0', mac: macvlanMac(S1), mtu: 1500 },
    ]);
    // The service's own MAC every time: locally administered (bit 1), unicast (bit 0 clear).
    const mac = macvlanMac(S1);
    assert.match(mac, /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/);
    assert.equal(Number.parseInt(mac.slice(0, 2), 16) & 0x03, 0x02);
    assert.notEqual(macvlanMac(S2), mac);
    assert.deepEqual(p.kernel.addresses, [
      // The exit's TUN: its link-local address, for reverse-path filtering (ownership.ts).
      { dev: 'mesh-t1', cidr: '169.254.240.1/32' },
      { dev: 'mesh-m1', cidr: '10.91.2.50/24' },
      { dev: 'mesh-m1', cidr: 'fd91:2::50/64' },
    ]);
    assert.deepEqual(
      p.kernel.routes.filter((r) => r.table === exitTableOf(1)),
      [
        { family: 4, table: exitTableOf(1), dst: '10.91.2.0/24', dev: 'mesh-m1' },
        { family: 4, table: exitTableOf(1), dst: 'default', dev: 'mesh-m1', via: '10.91.2.254' },
        { family: 6, table: exitTableOf(1), dst: 'fd91:2::/64', dev: 'mesh-m1' },
      ],
    );
    assert.ok(p.kernel.rules.some((r) => r.iif === 'mesh-t1' && r.table === exitTableOf(1)));
    assert.match(p.kernel.nft!, /oifname "mesh-m1" meta nfproto ipv4 snat ip to 10.91.2.50/);
    assert.match(p.kernel.nft!, /oifname "mesh-m1" meta nfproto ipv6 snat ip6 to fd91:2::50/);
  });

  it('reports a MACVLAN exit without an uplink as a problem instead of half-building it', () => {
    const p = plan(
      input({
        uplink: null,
        services: [svc(S1, OTHER, ME, { requiresInterface: true, desiredIpv4Cidr: '10.91.2.50/24' })],
      }),
    );
    assert.match(p.problems.get(S1)!, /macvlan-parent/);
    assert.ok(!p.kernel.links.some((l) => l.kind === 'macvlan'));
  });

  it('refuses traffic into the TUN of a service whose tunnel is down', () => {
    const up = plan(input({ services: [svc(S1, ME, EXIT)] }));
    assert.doesNotMatch(up.kernel.nft!, /reject/);
    const down = plan(input({ services: [svc(S1, ME, EXIT)], unreachable: new Set([S1]) }));
    assert.match(down.kernel.nft!, /oifname \{ "mesh-t1" \} meta l4proto tcp reject with tcp reset/);
  });

  it('networkOf masks host bits', () => {
    assert.equal(networkOf('10.91.2.50/24'), '10.91.2.0/24');
    assert.equal(networkOf('fd91:2::50/64'), 'fd91:2::/64');
  });
});

describe('plan: pacers for limited services (docs/dataplane.md, "Pacing a limited service\'s clients")', () => {
  const limited = svc(S1, ME, EXIT, { bandwidthLimitMbps: 10 });
  const routes = [route(1, S1, 10, null, '10.92.0.0/16')];
  const both = new Set([4, 6] as const);
  const pacing = { routes, interceptPort: 7481, pacing: both };

  it('gives the ingress of a limited service a pacer at the limit, a table and a rule into it', () => {
    const p = plan(input({ services: [limited], ...pacing }));
    assert.deepEqual(
      p.kernel.links.filter((l) => l.kind === 'pacer'),
      [{ name: 'mesh-p1', kind: 'pacer', mtu: 65_535, rateBps: 10_455_801, peerAddress: '169.254.224.1/32' }],
    );
    for (const family of [4, 6] as const) {
      assert.ok(
        p.kernel.routes.some(
          (r) =>
            r.family === family && r.table === pacerTableOf(1) && r.dst === 'default' && r.dev === 'mesh-p1',
        ),
      );
      assert.ok(
        p.kernel.rules.some(
          (r) =>
            r.family === family &&
            r.pref === RULE_PREF.PACE &&
            r.fwmark?.value === paceMarkOf(1) &&
            r.fwmark.mask === (PACE_MARK | MARK_MASK) >>> 0 &&
            r.table === pacerTableOf(1),
        ),
      );
    }
    // Before the rule that delivers intercepted TCP, after the one that excludes the agent's own.
    assert.ok(RULE_PREF.INTERCEPT < RULE_PREF.PACE && RULE_PREF.PACE < RULE_PREF.TRANSPARENT);
    const nft = p.kernel.nft!;
    const detour = nft.indexOf(
      `iifname != "lo" iifname != "mesh-q*" meta l4proto tcp fib daddr oifname "mesh-t1" meta mark set meta mark and 0x7000ffff or 0x80010000 accept`,
    );
    const established = nft.indexOf('socket transparent 1 socket mark');
    assert.ok(detour > 0 && detour < established, "the detour comes before the accepted sockets' rule");
    assert.match(nft, /iifname "mesh-q\*" meta mark set meta mark and 0x7000ffff\n/);
    assert.match(nft, /meta mark & 0x80000000 == 0x80000000 oifname != "mesh-p\*" drop/);
  });

  it('paces nothing for an unlimited service, an exit, without interception or where the host refuses', () => {
    const none = (extra: Partial<PlanInput>) => {
      const p = plan(input(extra));
      assert.equal(p.kernel.links.filter((l) => l.kind === 'pacer').length, 0);
      assert.equal(p.kernel.rules.filter((r) => r.pref === RULE_PREF.PACE).length, 0);
      assert.doesNotMatch(p.kernel.nft ?? '', /mesh-q|0x8/);
    };
    none({ services: [svc(S1, ME, EXIT)], ...pacing });
    none({ services: [svc(S1, EXIT, ME, { bandwidthLimitMbps: 10 })], ...pacing });
    none({ services: [limited], routes, pacing: both });
    none({ services: [limited], routes, interceptPort: 7481, pacing: new Set() });
    none({ services: [limited], routes, interceptPort: 7481 });
  });

  it('paces only the families the host forwards', () => {
    const p = plan(input({ services: [limited], ...pacing, pacing: new Set([4] as const) }));
    assert.match(
      p.kernel.nft!,
      /iifname != "mesh-q\*" meta nfproto ipv4 meta l4proto tcp fib daddr oifname "mesh-t1"/,
    );
  });

  it('a new limit is a new pacer rate, in frames for the limit in payload', () => {
    const p = plan(input({ services: [{ ...limited, bandwidthLimitMbps: 250 }], ...pacing }));
    // 1514-byte frames for 1448 bytes of payload.
    assert.equal(p.kernel.links.find((l) => l.kind === 'pacer')?.rateBps, 261_395_028);
  });
});

describe('plan: TCP interception (TPROXY) for the stream path', () => {
  const services = [
    svc(S1, ME, EXIT),
    svc(S2, OTHER, ME, {
      requiresInterface: true,
      desiredIpv4Cidr: '10.91.2.50/24',
      desiredIpv6Cidr: 'fd91:2::50/64',
    }),
  ];
  const routes = [route(1, S1, 10, null, '10.92.0.0/16')];

  it('without an intercept port, nothing of it is planned', () => {
    const p = plan(input({ services, routes }));
    assert.doesNotMatch(p.kernel.nft ?? '', /tproxy|intercept/);
    assert.equal(
      p.kernel.rules.some((r) => r.pref === RULE_PREF.INTERCEPT),
      false,
    );
    assert.equal(
      p.kernel.routes.some((r) => r.type === 'local'),
      false,
    );
  });

  it('marks selected TCP for the listener, delivers marked packets locally, and exempts the agent', () => {
    const p = plan(input({ services, routes, interceptPort: 7481 }));
    for (const family of [4, 6] as const) {
      assert.deepEqual(
        p.kernel.routes.filter((r) => r.type === 'local' && r.family === family),
        [{ family, table: INTERCEPT_TABLE, dst: 'default', dev: 'lo', type: 'local' }],
      );
      assert.ok(
        p.kernel.rules.some(
          (r) =>
            r.family === family &&
            r.pref === RULE_PREF.INTERCEPT &&
            r.fwmark?.value === INTERCEPT_MARK &&
            r.table === INTERCEPT_TABLE,
        ),
      );
      assert.ok(
        p.kernel.rules.some(
          (r) => r.family === family && r.pref === RULE_PREF.AGENT && r.fwmark?.value === AGENT_MARK,
        ),
        'the agent own sockets are excluded from selection',
      );
    }
    const nft = p.kernel.nft ?? '';
    // Only the ingress TUN (slot 1) is intercepted, by the kernel's own route lookup.
    assert.match(
      nft,
      /meta nfproto ipv4 meta l4proto tcp fib daddr oifname \{ "mesh-t1" \} tproxy ip to 127\.0\.0\.1:7481/,
    );
    assert.match(
      nft,
      /meta nfproto ipv6 meta l4proto tcp fib daddr oifname \{ "mesh-t1" \} tproxy ip6 to \[::1\]:7481/,
    );
    assert.doesNotMatch(nft, /oifname \{[^}]*mesh-t2/);
    assert.match(
      nft,
      /type route hook output priority mangle;[\s\S]*meta l4proto tcp oifname \{ "mesh-t1" \} meta mark set meta mark \| 0x10000000/,
    );
    // The exit's stream sockets bound to the MACVLAN addresses leave by the MACVLAN's table.
    assert.ok(p.kernel.rules.some((r) => r.from === '10.91.2.50/32' && r.table === exitTableOf(2)));
    assert.ok(p.kernel.rules.some((r) => r.from === 'fd91:2::50/128' && r.table === exitTableOf(2)));
  });

  it('an agent that is only an exit intercepts nothing', () => {
    const p = plan(input({ services: [services[1]!], routes: [], interceptPort: 7481 }));
    assert.doesNotMatch(p.kernel.nft ?? '', /tproxy/);
    assert.equal(
      p.kernel.routes.some((r) => r.type === 'local'),
      false,
    );
  });
});

describe('plan: fully transparent exit (docs/transparent.md)', () => {
  const exitOf = (fullyTransparent: boolean) =>
    svc(S2, OTHER, ME, {
      requiresInterface: true,
      desiredIpv4Cidr: '10.91.2.50/24',
      desiredIpv6Cidr: 'fd91:2::50/64',
      fullyTransparent,
    });

  it("routes the client-address sockets out of the MACVLAN's table, before the reply rule, and delivers their replies locally", () => {
    const p = plan(input({ services: [exitOf(true)], routes: [], interceptPort: 7481 }));
    assert.equal(p.carried[0]!.transparent, true);
    const mark = transparentSocketMark(2);
    assert.equal(mark, AGENT_MARK | TRANSPARENT_MARK | (2 << 16));
    for (const family of [4, 6] as const) {
      const rule = p.kernel.rules.find((r) => r.family === family && r.pref === RULE_PREF.TRANSPARENT);
      assert.deepEqual(rule, {
        family,
        pref: RULE_PREF.TRANSPARENT,
        fwmark: { value: TRANSPARENT_MARK | (2 << 16), mask: TRANSPARENT_MARK | MARK_MASK },
        table: exitTableOf(2),
      });
      // The socket's mark holds the slot bits the reply rule matches too: it must come first.
      assert.ok(RULE_PREF.TRANSPARENT < RULE_PREF.REPLY);
      assert.ok(
        p.kernel.rules.some(
          (r) => r.family === family && r.pref === RULE_PREF.INTERCEPT && r.table === INTERCEPT_TABLE,
        ),
      );
      assert.deepEqual(
        p.kernel.routes.filter((r) => r.type === 'local' && r.family === family),
        [{ family, table: INTERCEPT_TABLE, dst: 'default', dev: 'lo', type: 'local' }],
      );
    }
    assert.match(
      p.kernel.nft ?? '',
      /meta l4proto tcp socket transparent 1 socket mark and 0x40000000 == 0x40000000 meta mark set meta mark \| 0x10000000 accept/,
    );
    // An exit only: nothing is intercepted.
    assert.doesNotMatch(p.kernel.nft ?? '', /tproxy/);
  });

  it('plans none of it for a MACVLAN exit without transparency, nor without stream sockets', () => {
    for (const p of [
      plan(input({ services: [exitOf(false)], routes: [], interceptPort: 7481 })),
      plan(input({ services: [exitOf(true)], routes: [] })),
    ]) {
      assert.equal(
        p.kernel.rules.some((r) => r.pref === RULE_PREF.TRANSPARENT || r.pref === RULE_PREF.INTERCEPT),
        false,
      );
      assert.doesNotMatch(p.kernel.nft ?? '', /socket transparent/);
    }
  });

  it('flags the ingress end too (its streams ask for transparency), and never a service without an interface', () => {
    const ingress = plan(
      input({ services: [svc(S1, ME, EXIT, { requiresInterface: true, fullyTransparent: true })] }),
    );
    assert.equal(ingress.carried[0]!.transparent, true);
    const invalid = plan(input({ services: [svc(S1, ME, EXIT, { fullyTransparent: true })] }));
    assert.equal(invalid.carried[0]!.transparent, false);
  });
});

describe('plan: the service of an intercepted connection', () => {
  const routes = [
    route(3, S2, 20, null, '10.92.0.0/16'),
    route(1, S1, 10, '10.91.1.0/24', '10.92.5.0/24'),
    route(2, S3, 10, null, '10.92.5.0/24'),
    route(4, S3, 30, null, null),
    route(5, S1, 10, null, 'fd92::/64'),
  ];
  it('follows the selection order: priority, longer destination, longer source, lower id', () => {
    assert.equal(serviceOfConnection(routes, '10.91.1.7', '10.92.5.1'), S1); // longer source wins the tie
    assert.equal(serviceOfConnection(routes, '10.91.9.7', '10.92.5.1'), S3); // S1's source does not hold it
    assert.equal(serviceOfConnection(routes, '10.91.9.7', '10.92.6.1'), S2);
    assert.equal(serviceOfConnection(routes, '10.91.9.7', '192.0.2.1'), S3); // the catch-all
    assert.equal(serviceOfConnection(routes, 'fd91:1::2', 'fd92::1'), S1);
    assert.equal(serviceOfConnection(routes.slice(0, 3), '10.91.9.7', '192.0.2.1'), null);
    assert.equal(serviceOfConnection(routes.slice(0, 3), 'fd91:1::2', 'fd92::1'), null); // IPv4 routes only
  });

  it('asks the routes of services standing aside last, as the policy rules do', () => {
    assert.equal(serviceOfConnection(routes, '10.91.1.7', '10.92.5.1', new Set([S1])), S3);
    assert.equal(serviceOfConnection(routes, '10.91.1.7', '10.92.5.1', new Set([S1, S3])), S2);
    // The catch-all takes it; without one nothing else selects it, and the service standing
    // aside still names it (dropped there).
    assert.equal(serviceOfConnection(routes, 'fd91:1::2', 'fd92::1', new Set([S1])), S3);
    const noCatchAll = routes.filter((r) => r.id !== 4);
    assert.equal(serviceOfConnection(noCatchAll, 'fd91:1::2', 'fd92::1', new Set([S1])), S1);
  });
});

describe('plan: RouteMatcher agrees with the old serviceOfConnection (seeded random)', () => {
  const SEED = 0x5eed_0a7c;
  const rand = prng(SEED);
  const int = (n: number) => Math.floor(rand() * n);
  const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)]!;
  const SERVICES = [S1, S2, S3];
  // Few bases, so that routes overlap and addresses fall inside them often.
  const randomBytes = (n: number) => Uint8Array.from({ length: n }, () => int(256));
  const bases = [
    ...Array.from({ length: 4 }, () => randomBytes(4)),
    ...Array.from({ length: 4 }, () => {
      const b = randomBytes(16);
      b.fill(0, 4, 4 + int(12)); // zero runs, so the texts compress
      return b;
    }),
  ];
  /** A copy of `base` sharing at least its first `keep` bits, the rest random. */
  const near = (base: Uint8Array, keep: number) => {
    const b = Uint8Array.from(base);
    for (let bit = keep; bit < b.length * 8; bit++) {
      if (rand() < 0.5) b[bit >> 3]! ^= 1 << (7 - (bit & 7));
    }
    return b;
  };
  /** Address text: canonical mostly; sometimes uppercase or fully spelled out (both parse). */
  const spell = (b: Uint8Array) => {
    const text = formatIp(b);
    if (b.length === 4 || rand() < 0.8) return text;
    if (rand() < 0.5) return text.toUpperCase();
    const groups: string[] = [];
    for (let i = 0; i < 16; i += 2) groups.push(((b[i]! << 8) | b[i + 1]!).toString(16));
    return groups.join(':');
  };
  const INVALID_CIDRS = [
    '',
    'garbage',
    '10.0.0.1/33',
    '10.0.0.01/8',
    'fd00::/129',
    '1.2.3.4/',
    '::ffff:1.2.3.4/96',
  ];
  const INVALID_ADDRESSES = [
    '',
    'x',
    '::ffff:10.0.0.1',
    '10.0.0.256',
    '1.2.3.4/40',
    'fe80::1%eth0',
    ' 10.0.0.1',
  ];
  const randomCidr = (): string | null => {
    const r = rand();
    if (r < 0.2) return null;
    if (r < 0.25) return pick(INVALID_CIDRS);
    const base = pick(bases);
    const bits = base.length * 8;
    const prefix = int(bits + 1);
    const b = near(base, Math.max(0, prefix - int(3))); // sometimes off the base's network
    if (rand() < 0.5) for (let bit = prefix; bit < bits; bit++) b[bit >> 3]! &= ~(1 << (7 - (bit & 7)));
    // A bare address is a host (parseCidrLoose), as the kernel's own selectors take it.
    return rand() < 0.05 ? spell(b) : `${spell(b)}/${prefix}`;
  };
  const randomAddress = (): string => {
    if (rand() < 0.1) return pick(INVALID_ADDRESSES);
    const base = pick(bases);
    const text = spell(near(base, int(base.length * 8 + 1)));
    return rand() < 0.03 ? `${text}/${int(base.length * 8 + 1)}` : text;
  };
  const randomRoutes = (): PlanRoute[] =>
    Array.from({ length: int(13) }, (_, i) =>
      route(rand() < 0.1 ? int(i + 1) : i + 1, pick(SERVICES), int(3), randomCidr(), randomCidr()),
    );

  it(`20,000 lookups over 1,000 route sets (seed ${SEED})`, () => {
    let named = 0;
    let cases = 0;
    for (let set = 0; set < 1000; set++) {
      const routes = randomRoutes();
      const matcher = new RouteMatcher(routes);
      for (let i = 0; i < 20; i++) {
        const src = randomAddress();
        const dst = randomAddress();
        const want = oldServiceOfConnection(routes, src, dst);
        const got = [
          matcher.serviceOf(src, dst),
          matcher.serviceOfParsed(parseAddress(src), parseAddress(dst)),
          serviceOfConnection(routes, src, dst),
        ];
        if (got.some((g) => g !== want)) {
          assert.deepEqual(
            got,
            [want, want, want],
            `set ${set}, ${src} -> ${dst}, ${JSON.stringify(routes)}`,
          );
        }
        cases++;
        if (want !== null) named++;
      }
    }
    // Both outcomes are common: the comparison is not all nulls, nor all catch-alls.
    assert.ok(named > cases * 0.25 && named < cases * 0.9, `${named} of ${cases} named a service`);
  });

  it('prefixes at the word edges, /0 and full length, both families', () => {
    for (const [cidr, inside, outside] of [
      ['0.0.0.0/0', '255.255.255.255', 'fd00::1'],
      ['10.1.2.3/32', '10.1.2.3', '10.1.2.2'],
      ['10.128.0.0/9', '10.255.0.1', '10.127.0.1'],
      ['::/0', 'ffff::1', '10.0.0.1'],
      ['fd00:0:0:1::/32', 'fd00::1', 'fd01::'],
      ['fd00:0:8000::/33', 'fd00:0:ffff::', 'fd00:0:7fff::'],
      ['fd00::1:0:0:0/64', 'fd00::ffff:ffff:ffff:ffff', 'fd00:0:0:1::'],
      ['fd00::1:2/127', 'fd00::1:3', 'fd00::1:4'],
      ['fd00::1:2/128', 'fd00::1:2', 'fd00::1:3'],
    ] as const) {
      const routes = [route(1, S1, 0, null, cidr)];
      const m = new RouteMatcher(routes);
      assert.equal(m.serviceOf('10.0.0.9', inside), S1, `${cidr} holds ${inside}`);
      assert.equal(m.serviceOf('10.0.0.9', outside), null, `${cidr} does not hold ${outside}`);
      for (const dst of [inside, outside]) {
        assert.equal(m.serviceOf('10.0.0.9', dst), oldServiceOfConnection(routes, '10.0.0.9', dst));
      }
    }
  });

  it('a missing CIDR holds even what is not an address; a CIDR that does not parse holds nothing', () => {
    const m = new RouteMatcher([route(1, S1, 0, 'garbage', null), route(2, S2, 1, null, null)]);
    assert.equal(m.serviceOf('not an address', 'neither'), S2);
    assert.equal(new RouteMatcher([]).serviceOf('10.0.0.1', '10.0.0.2'), null);
  });
});

describe('plan: special destinations (never dialled by an exit)', () => {
  const special = (text: string) => isSpecialDestination(parseAddress(text)!);

  it('refuses each class, in both families', () => {
    for (const text of [
      '127.0.0.1',
      '127.255.255.254',
      '::1',
      '0.0.0.0',
      '0.1.2.3',
      '::',
      '224.0.0.1',
      '239.255.255.255',
      'ff02::1',
      'ff00::',
      'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff',
      '255.255.255.255',
      '::ffff:0:0',
      '::ffff:a00:1',
      '::ffff:ffff:ffff',
      '::ffff:1:2:3', // 0:0:0:0:ffff:1:2:3 prints so; the old text test refused it too
    ]) {
      assert.equal(special(text), true, text);
      assert.equal(oldIsSpecialText(text), true, `${text} (old)`);
    }
  });

  it('lets ordinary addresses through, the neighbours of each class included', () => {
    for (const text of [
      '126.255.255.255',
      '128.0.0.0',
      '1.0.0.0',
      '223.255.255.255',
      '240.0.0.1',
      '255.255.255.254',
      '10.91.2.1',
      '::2',
      '::ffff',
      '::fffe:0:0',
      '1::ffff:0:0',
      'fe80::1',
      'feff::1',
      'fd92::1',
      '2001:db8::1',
    ]) {
      assert.equal(special(text), false, text);
      assert.equal(oldIsSpecialText(text), false, `${text} (old)`);
    }
  });

  it('agrees with the old text test on the canonical text of 50,000 seeded addresses', () => {
    const rand = prng(0x5bec_1a1);
    const int = (n: number) => Math.floor(rand() * n);
    let refused = 0;
    for (let i = 0; i < 50_000; i++) {
      let bytes: Uint8Array;
      if (rand() < 0.4) {
        bytes = Uint8Array.from({ length: 4 }, () => int(256));
        if (rand() < 0.3) bytes[0] = pick([0, 127, 223, 224, 239, 240, 255]);
        if (rand() < 0.05) bytes.fill(255);
      } else {
        // Zero groups and ffff groups at random places: the `::`, `::1` and `::ffff:` texts.
        bytes = new Uint8Array(16);
        for (let g = 0; g < 8; g++) {
          const r = rand();
          const v = r < 0.5 ? 0 : r < 0.65 ? 0xffff : r < 0.75 ? 1 : int(0x10000);
          bytes[2 * g] = v >> 8;
          bytes[2 * g + 1] = v & 0xff;
        }
        if (rand() < 0.1) bytes[0] = 0xff;
      }
      const text = formatIp(bytes);
      const want = oldIsSpecialText(text);
      assert.equal(isSpecialDestination(bytes), want, text);
      if (want) refused++;
    }
    assert.ok(refused > 5_000 && refused < 45_000, `${refused} refused`);

    function pick<T>(xs: readonly T[]): T {
      return xs[int(xs.length)]!;
    }
  });
});
