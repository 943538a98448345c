import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { planRoute, planService, S1, S2, S3 } from '../../test/helpers/plan-fixtures.js';
import {
  AGENT_MARK,
  exitTableOf,
  INTERCEPT_MARK,
  INTERCEPT_TABLE,
  MARK_MASK,
  RULE_PREF,
  tableOf,
} from './kernel/ownership.js';
import { compareRoutes, networkOf, type PlanInput, plan, serviceOfConnection } from './plan.js';

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

describe('plan: route selection order (DECISIONS §6)', () => {
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
      { name: 'mesh-m1', kind: 'macvlan', parent: 'e0', mtu: 1500 },
    ]);
    assert.deepEqual(p.kernel.addresses, [
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
});
