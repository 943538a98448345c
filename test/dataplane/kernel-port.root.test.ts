/**
 * The kernel port against the real kernel, and its twin against the same script: one scenario of
 * apply() batches (links, addresses, routes, rules of both families, the nft table, failures) runs
 * on RecordingKernel and on LinuxKernel in a fresh network namespace, and after every step both
 * observe() the expected state, and a failing step fails on the same command line in both. Then
 * flush() on the real kernel leaves the namespace as it was, other people's state included.
 *
 * Needs root, iproute2 and nftables; fails (never skips) without them.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import {
  canonicalAddress,
  canonicalNft,
  canonicalRoute,
  canonicalRule,
  canonicalState,
} from '../../src/dataplane/kernel/canonical.js';
import { LinuxKernel } from '../../src/dataplane/kernel/linux.js';
import {
  type KernelChange,
  KernelError,
  type KernelPort,
  type KernelState,
  type RouteQuery,
  type RouteSpec,
  type RuleSpec,
  type Tun,
} from '../../src/dataplane/kernel/port.js';
import { RecordingKernel } from '../../src/dataplane/kernel/recording.js';
import { eventually } from '../helpers/cluster.js';

const NS = `mkp${process.pid}`;

function sh(args: string[], input?: string): string {
  try {
    return execFileSync(args[0]!, args.slice(1), { input, encoding: 'utf8', timeout: 20_000, stdio: 'pipe' });
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`${args.join(' ')}: ${e.stderr || e.message}`);
  }
}
const ip = (...args: string[]) => sh(['ip', '-n', NS, ...args]);
const nft = (args: string[], input?: string) => sh(['ip', 'netns', 'exec', NS, 'nft', ...args], input);

/** Everything in the namespace, as `ip -j` and `nft -j` print it, without handles and counts. */
function dumps(): Record<string, unknown> {
  const json = (text: string) => JSON.parse(text || '[]') as unknown;
  const stripHandles = (x: unknown): unknown => {
    if (Array.isArray(x)) return x.map(stripHandles);
    if (x && typeof x === 'object')
      return Object.fromEntries(
        Object.entries(x)
          .filter(([k]) => k !== 'handle' && k !== 'packets' && k !== 'bytes')
          .map(([k, v]) => [k, stripHandles(v)]),
      );
    return x;
  };
  return {
    links: json(ip('-j', '-d', 'link', 'show')),
    addresses: json(ip('-j', 'addr', 'show')),
    rules4: json(ip('-j', '-4', 'rule', 'show')),
    rules6: json(ip('-j', '-6', 'rule', 'show')),
    routes4: json(ip('-j', '-4', 'route', 'show', 'table', 'all')),
    routes6: json(ip('-j', '-6', 'route', 'show', 'table', 'all')),
    nft: stripHandles(json(nft(['-j', 'list', 'ruleset']))),
  };
}

/** Stands in for the native addon: a persistent TUN made with `ip tuntap` (it carries no packets). */
function standInTun(name: string): Tun {
  ip('tuntap', 'add', 'mode', 'tun', 'name', name);
  const none = () => {
    throw new Error('stand-in TUN: no packets');
  };
  return {
    name,
    onPackets: none,
    onError: () => {},
    write: none,
    pause: none,
    resume: none,
    close: () => {
      if (JSON.parse(ip('-j', 'link', 'show')).some((l: { ifname: string }) => l.ifname === name))
        ip('tuntap', 'del', 'mode', 'tun', 'name', name);
    },
  };
}

const EMPTY: KernelState = { links: [], addresses: [], rules: [], routes: [], nft: null };

// The nft table the reconciler writes, in the form `nft list` prints it (see canonical.ts).
const RULESET = `
  chain prerouting {
    type filter hook prerouting priority mangle; policy accept;
    iifname "mesh-t7" ct mark set 0x00070000
    ct direction reply ct mark & 0x0fff0000 != 0x00000000 meta mark set ct mark & 0x0fff0000
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    iifname "mesh-t7" oifname != "mesh-t7" masquerade
  }
  chain forward {
    type filter hook forward priority mangle; policy accept;
    oifname "mesh-t*" tcp flags syn tcp option maxseg size set rt mtu
  }`;
const RULESET_SMALL = `
chain postrouting {
type nat hook postrouting priority srcnat; policy accept;
iifname "mesh-t7" oifname != "mesh-t7" masquerade
}`;

const T7 = { name: 'mesh-t7', kind: 'tun' as const, mtu: 1400 };
// MACVLANs are made with their MAC (the agent's are derived from the service id): one the kernel
// picked at random would differ between the real kernel and the recording one.
/** A pacer as plan() makes it (render.ts renderPacer). */
const P5 = {
  name: 'mesh-p5',
  kind: 'pacer' as const,
  mtu: 65_535,
  rateBps: 10_455_801,
  peerAddress: '169.254.224.5/32',
};
const M3 = {
  name: 'mesh-m3',
  kind: 'macvlan' as const,
  parent: 'veth-x',
  mac: '02:00:00:00:00:03',
  mtu: 1450,
};
const M4_MAC = '02:00:00:00:00:04';
const addr = (dev: string, cidr: string) => ({ dev, cidr });
const v4 = (pref: number, table: number | 'main', more: Partial<RuleSpec> = {}): RuleSpec => ({
  family: 4,
  pref,
  table,
  ...more,
});
const v6 = (pref: number, table: number | 'main', more: Partial<RuleSpec> = {}): RuleSpec => ({
  family: 6,
  pref,
  table,
  ...more,
});
const route = (family: 4 | 6, table: number, dst: string, dev: string, via?: string): RouteSpec =>
  via === undefined ? { family, table, dst, dev } : { family, table, dst, dev, via };
const add = (x: object) => ({ op: 'add', ...kindOf(x) }) as KernelChange;
const del = (x: object) => ({ op: 'del', ...kindOf(x) }) as KernelChange;
function kindOf(x: object): object {
  if ('kind' in x) return { link: x };
  if ('cidr' in x) return { address: x };
  if ('pref' in x) return { rule: x };
  return { route: x };
}

// The state the scenario builds, step by step (given in input form: the test canonicalises).
const ADDRESSES = [
  addr('mesh-m3', '10.91.2.50/24'),
  addr('mesh-m3', 'FD00:0091:0002:0000::0050/64'), // not canonical on purpose
  addr('mesh-t7', '100.64.0.1'), // a host: /32
  addr('mesh-t7', 'fd00:64::1/128'),
];
const ROUTES = [
  route(4, 52007, 'default', 'mesh-t7'),
  route(4, 52007, '10.3.0.1', 'mesh-t7'),
  route(4, 52003, '10.91.2.0/24', 'mesh-m3'),
  route(4, 52003, '0.0.0.0/0', 'mesh-m3', '10.91.2.1'),
  route(4, 52003, '10.2.0.0/16', 'mesh-m3', '10.91.2.1'),
  route(6, 52007, '::/0', 'mesh-t7'),
  route(6, 52007, 'fd03::1', 'mesh-t7'),
  route(6, 52007, 'fd04::5/64', 'mesh-t7'), // IPv6 host bits: the kernel clears them
  route(6, 52003, 'fd02::/64', 'mesh-m3', 'fd00:91:2::1'),
  route(6, 52003, 'default', 'mesh-m3', 'fe80::1'),
  // Where TPROXY's marked packets go: delivered to this host.
  { family: 4, table: 60192, dst: 'default', dev: 'lo', type: 'local' } as RouteSpec,
  { family: 6, table: 60192, dst: 'default', dev: 'lo', type: 'local' } as RouteSpec,
];
const MARK = { value: 0x70000, mask: 0x0fff_0000 };
const RULES = [
  v4(21000, 'main', { to: '192.0.2.0/24' }),
  v4(21000, 'main', { iif: 'lo' }),
  v4(21100, 52007, { fwmark: MARK }),
  v4(21200, 52007, { iif: 'mesh-t7' }),
  v4(22000, 52007, { from: '10.1.0.0/16', to: '10.2.0.5', ipproto: 'tcp', sport: 443 }),
  v4(22001, 52007, { from: '0.0.0.0/0' }), // from all
  v4(22002, 52007, { to: '10.3.0.1/32', ipproto: 'udp' }),
  v4(22003, 52007, { fwmark: { value: 5, mask: 0xffff_ffff } }),
  v4(22004, 52007, { from: '10.1.2.3/16' }), // host bits stay in rules
  v6(21000, 'main', { to: 'fd00::/8' }),
  v6(21100, 52007, { fwmark: MARK }),
  v6(21200, 52007, { iif: 'mesh-t7' }),
  v6(22000, 52007, { from: 'fd01::/64', to: 'fd02::5/128', ipproto: 'tcp', sport: 443 }),
  v6(22001, 52007, { to: '::/0', ipproto: 'udp' }),
];

interface Step {
  name: string;
  /** Runs before apply on each kernel (opening TUNs). */
  before?: (k: KernelPort, tuns: Map<string, Tun>) => void;
  changes: KernelChange[];
  /** The command line both must fail on. */
  fails?: string;
  /** Changes the expected state (starting from the previous step's). */
  expect: (s: KernelState) => void;
}

const without = <T>(list: T[], ...gone: T[]) => {
  for (const g of gone) {
    const i = list.findIndex((x) => JSON.stringify(x) === JSON.stringify(g));
    assert.ok(i >= 0, `test bug: ${JSON.stringify(g)} not in the expected state`);
    list.splice(i, 1);
  }
};

const STEPS: Step[] = [
  {
    name: 'a TUN opened by the process shows as a link, 1500 bytes',
    before: (k, tuns) => tuns.set('mesh-t7', k.openTun('mesh-t7')),
    changes: [],
    expect: (s) => {
      s.links.push({ ...T7, mtu: 1500 });
    },
  },
  {
    name: 'links and addresses',
    changes: [add(T7), add(M3), ...ADDRESSES.map(add)],
    expect: (s) => {
      s.links = [T7, M3];
      s.addresses.push(...ADDRESSES);
    },
  },
  {
    name: 'routes: default, host, via, IPv6 host bits',
    changes: ROUTES.map(add),
    expect: (s) => {
      s.routes.push(...ROUTES);
    },
  },
  {
    name: 'rules of every shape, both families',
    changes: RULES.map(add),
    expect: (s) => {
      s.rules.push(...RULES);
    },
  },
  {
    name: 'the nft table',
    changes: [{ op: 'nft', ruleset: RULESET }],
    expect: (s) => {
      s.nft = RULESET;
    },
  },
  {
    name: 'a failing batch stops at its failing line; the lines before it stay',
    changes: [add(route(4, 52007, '10.50.0.0/16', 'mesh-t7')), add(ROUTES[1]!), add(v4(22100, 52007))],
    fails: 'ip -4 route add 10.3.0.1 dev mesh-t7 table 52007',
    expect: (s) => {
      s.routes.push(route(4, 52007, '10.50.0.0/16', 'mesh-t7'));
    },
  },
  {
    name: 'an address on a missing link',
    changes: [add(addr('mesh-m9', '10.9.9.9/24'))],
    fails: 'ip address add 10.9.9.9/24 dev mesh-m9 noprefixroute',
    expect: () => {},
  },
  {
    name: 'a route through a missing device',
    changes: [add(route(4, 52007, '10.60.0.0/16', 'mesh-m9'))],
    fails: 'ip -4 route add 10.60.0.0/16 dev mesh-m9 table 52007',
    expect: () => {},
  },
  {
    name: 'a route through a TUN that is not up yet',
    before: (k, tuns) => tuns.set('mesh-t8', k.openTun('mesh-t8')),
    changes: [add(route(6, 52008, 'default', 'mesh-t8'))],
    fails: 'ip -6 route add default dev mesh-t8 table 52008',
    expect: (s) => {
      s.links.push({ name: 'mesh-t8', kind: 'tun', mtu: 1500 });
    },
  },
  {
    name: 'an IPv4 route with host bits',
    changes: [add(route(4, 52007, '10.70.0.1/16', 'mesh-t7'))],
    fails: 'ip -4 route add 10.70.0.1/16 dev mesh-t7 table 52007',
    expect: () => {},
  },
  {
    name: 'an existing link',
    changes: [add(M3)],
    fails: 'ip link add link veth-x name mesh-m3 address 02:00:00:00:00:03 type macvlan mode bridge',
    expect: () => {},
  },
  {
    name: 'a MACVLAN above its parent MTU: created, then refused at the MTU line',
    changes: [add({ name: 'mesh-m4', kind: 'macvlan', parent: 'veth-x', mac: M4_MAC, mtu: 9000 }), add(T7)],
    fails: 'ip link set mesh-m4 mtu 9000 up',
    expect: (s) => {
      s.links.push({ name: 'mesh-m4', kind: 'macvlan', parent: 'veth-x', mac: M4_MAC, mtu: 1500 });
    },
  },
  {
    name: 'an existing address (IPv4: same prefix)',
    changes: [add(ADDRESSES[0]!)],
    fails: 'ip address add 10.91.2.50/24 dev mesh-m3 noprefixroute',
    expect: () => {},
  },
  {
    name: 'an existing address (IPv6: any prefix)',
    changes: [add(addr('mesh-m3', 'fd00:91:2::50/80'))],
    fails: 'ip address add fd00:91:2::50/80 dev mesh-m3 noprefixroute nodad',
    expect: () => {},
  },
  {
    name: 'an existing rule',
    changes: [add(v6(21100, 52007, { fwmark: MARK }))],
    fails: 'ip -6 rule add pref 21100 fwmark 0x70000/0xfff0000 lookup 52007',
    expect: () => {},
  },
  {
    name: 'a rule without from, where one with a from exists (the kernel calls it a duplicate)',
    changes: [add(v4(22004, 52007))],
    fails: 'ip -4 rule add pref 22004 lookup 52007',
    expect: () => {},
  },
  {
    name: 'an existing route (another device)',
    changes: [add(route(6, 52007, 'fd03::1/128', 'mesh-m3'))],
    fails: 'ip -6 route add fd03::1/128 dev mesh-m3 table 52007',
    expect: () => {},
  },
  {
    name: 'a missing rule',
    changes: [del(v4(22010, 52007, { from: '10.77.0.0/16' }))],
    fails: 'ip -4 rule del pref 22010 from 10.77.0.0/16 lookup 52007',
    expect: () => {},
  },
  {
    name: 'a missing route (right destination, other device)',
    changes: [del(route(4, 52007, '10.3.0.1/32', 'mesh-m3'))],
    fails: 'ip -4 route del 10.3.0.1/32 dev mesh-m3 table 52007',
    expect: () => {},
  },
  {
    name: 'a missing address',
    changes: [del(addr('mesh-m3', '10.91.2.50/25'))],
    fails: 'ip address del 10.91.2.50/25 dev mesh-m3',
    expect: () => {},
  },
  {
    name: 'a missing link',
    changes: [del(M3), del({ name: 'mesh-m9', kind: 'macvlan', parent: 'veth-x', mtu: 1500 })],
    fails: 'ip link del mesh-m9',
    expect: (s) => {
      // mesh-m3 went first, with its addresses and the routes through it.
      without(s.links, M3);
      s.addresses = s.addresses.filter((a) => a.dev !== 'mesh-m3');
      s.routes = s.routes.filter((r) => r.dev !== 'mesh-m3');
    },
  },
  {
    name: 'deletions: deleting a rule without from removes one with a from; routes, addresses, nft',
    changes: [
      del({ name: 'mesh-m4', kind: 'macvlan', mtu: 1500 }),
      add(v4(22020, 52007, { from: '10.8.0.0/16' })),
      del(v4(22020, 52007)), // no such rule, yet it deletes the one above (a missing selector matches any)
      del(v4(22001, 52007)),
      del(v6(22000, 52007, { from: 'fd01::/64', to: 'fd02::5/128', ipproto: 'tcp', sport: 443 })),
      del(route(6, 52007, 'fd04::/64', 'mesh-t7')),
      del(route(4, 52007, 'default', 'mesh-t7')),
      del(addr('mesh-t7', 'fd00:64::1/128')),
      { op: 'nft', ruleset: RULESET_SMALL },
    ],
    expect: (s) => {
      without(s.links, { name: 'mesh-m4', kind: 'macvlan', parent: 'veth-x', mac: M4_MAC, mtu: 1500 });
      without(s.rules, RULES[5]!, RULES[12]!);
      without(s.routes, ROUTES[7]!, ROUTES[0]!);
      without(s.addresses, ADDRESSES[3]!);
      s.nft = RULESET_SMALL;
    },
  },
  {
    name: 'a primary IPv4 address takes its secondaries along',
    changes: [
      add({ ...M3, mtu: 1500 }),
      add(addr('mesh-m3', '10.91.2.50/24')),
      add(addr('mesh-m3', '10.91.2.51/24')),
      add(addr('mesh-m3', '10.91.2.52/25')),
      del(addr('mesh-m3', '10.91.2.50/24')),
    ],
    expect: (s) => {
      s.links.push({ ...M3, mtu: 1500 });
      s.addresses.push(addr('mesh-m3', '10.91.2.52/25'));
    },
  },
  {
    name: 'a pacer: a veth pair with its peer address and queue, one link; a route through it',
    changes: [add(P5), add({ ...route(4, 60197, 'default', 'mesh-p5'), via: '169.254.208.5' })],
    expect: (s) => {
      s.links.push(P5);
      s.routes.push({ ...route(4, 60197, 'default', 'mesh-p5'), via: '169.254.208.5' });
    },
  },
  {
    name: 'deleting a TUN link removes its routes; deleting it again is not an error; nft off',
    changes: [
      add(route(4, 52009, 'default', 'mesh-m3')),
      del(T7),
      del(T7),
      add(v4(22030, 52007, { iif: 'mesh-t7' })),
      { op: 'nft', ruleset: null },
    ],
    expect: (s) => {
      without(s.links, T7);
      s.addresses = s.addresses.filter((a) => a.dev !== 'mesh-t7');
      s.routes = s.routes.filter((r) => r.dev !== 'mesh-t7');
      s.routes.push(route(4, 52009, 'default', 'mesh-m3'));
      s.rules.push(v4(22030, 52007, { iif: 'mesh-t7' })); // rules naming a gone link stay
      s.nft = null;
    },
  },
];

/** The object with its keys sorted (for comparing by JSON text). */
const canonicalOrder = (x: object): object =>
  Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : 1)));

function expectCanonicalItems(s: KernelState): void {
  // observe() reports canonical items already (the order is the kernel's).
  assert.deepStrictEqual(s.rules.map(canonicalRule), s.rules);
  assert.deepStrictEqual(s.routes.map(canonicalRoute), s.routes);
  assert.deepStrictEqual(s.addresses.map(canonicalAddress), s.addresses);
  assert.equal(canonicalNft(s.nft), s.nft);
}

describe('kernel port: RecordingKernel and LinuxKernel on one scenario', { timeout: 120_000 }, () => {
  let real: LinuxKernel;
  let fake: RecordingKernel;
  let before0: Record<string, unknown>;
  const tuns = { real: new Map<string, Tun>(), fake: new Map<string, Tun>() };

  before(() => {
    if (process.getuid?.() !== 0) throw new Error('kernel-port tests need root (network namespaces)');
    sh(['nft', '--version']);
    sh(['ip', 'netns', 'add', NS]);
    // No duplicate address detection: link-local addresses would still be tentative in the
    // first dump and not in the last.
    const sysctl = ['ip', 'netns', 'exec', NS, 'sysctl', '-qw'];
    sh([...sysctl, 'net.ipv6.conf.all.accept_dad=0', 'net.ipv6.conf.default.accept_dad=0']);
    ip('link', 'set', 'lo', 'up');
    ip('link', 'add', 'veth-x', 'type', 'veth', 'peer', 'name', 'veth-y');
    ip('link', 'set', 'veth-x', 'up');
    ip('link', 'set', 'veth-y', 'up');
    ip('addr', 'add', '192.0.2.2/24', 'dev', 'veth-x');
    ip('-6', 'addr', 'add', 'fd00:192::2/64', 'dev', 'veth-x', 'nodad');
    ip('route', 'add', 'default', 'via', '192.0.2.1', 'dev', 'veth-x');
    ip('-6', 'route', 'add', 'default', 'via', 'fd00:192::1', 'dev', 'veth-x');
    // Somebody else's state, which flush() must leave alone.
    ip('rule', 'add', 'pref', '100', 'to', '198.51.100.0/24', 'lookup', '100');
    ip('-6', 'rule', 'add', 'pref', '100', 'to', 'fd00:198::/64', 'lookup', '100');
    ip('route', 'add', '198.51.100.0/24', 'dev', 'veth-x', 'table', '100');
    nft(
      ['-f', '-'],
      'table inet other {\n chain c {\n type filter hook input priority 0; policy accept;\n counter\n }\n}\n',
    );
    real = new LinuxKernel({ netns: NS, openTun: standInTun });
    fake = new RecordingKernel({
      foreignLinks: { lo: 65_536, 'veth-x': 1500, 'veth-y': 1500 },
      uplink: { dev: 'veth-x', gateway4: '192.0.2.1', gateway6: 'fd00:192::1' },
      sysctls: { 'net.ipv4.ip_forward': '0' },
    });
    before0 = dumps();
  });

  after(() => {
    for (const t of [...tuns.real.values()]) t.close();
    sh(['ip', 'netns', 'del', NS]);
  });

  it('starts with nothing owned', async () => {
    assert.deepStrictEqual(await real.observe(), EMPTY);
    assert.deepStrictEqual(await fake.observe(), EMPTY);
  });

  it('reads sysctls and the uplink the same way', async () => {
    for (const k of [real, fake]) {
      assert.equal(await k.readSysctl('net.ipv4.ip_forward'), '0');
      assert.deepStrictEqual(await k.uplink(), {
        dev: 'veth-x',
        gateway4: '192.0.2.1',
        gateway6: 'fd00:192::1',
      });
    }
    assert.equal(await real.readSysctl('net.ipv4.no_such_key'), null);
    assert.equal(await real.readSysctl('net/ipv4/conf/veth-x/forwarding'), '0');
    await assert.rejects(real.readSysctl('net/../../etc/passwd'), KernelError);
  });

  it('writes a sysctl the same way; the namespace has it, nothing else does; a key that is not there fails', async () => {
    const key = 'net.ipv4.conf.veth-x.rp_filter';
    const before = await real.readSysctl(key);
    const hostValue = readFileSync('/proc/sys/net/ipv4/conf/all/rp_filter', 'utf8').trim();
    for (const k of [real, fake]) {
      await k.writeSysctl(key, '2');
      assert.equal(await k.readSysctl(key), '2');
      await assert.rejects(k.writeSysctl('net.ipv4.conf.no-such-link.rp_filter', '2'), KernelError);
    }
    assert.equal(
      sh(['ip', 'netns', 'exec', NS, 'cat', '/proc/sys/net/ipv4/conf/veth-x/rp_filter']).trim(),
      '2',
    );
    assert.equal(readFileSync('/proc/sys/net/ipv4/conf/all/rp_filter', 'utf8').trim(), hostValue);
    await assert.rejects(real.writeSysctl('net/../../etc/passwd', '1'), KernelError);
    await assert.rejects(real.writeSysctl(key, '1; reboot'), KernelError);
    await real.writeSysctl(key, before ?? '0');
  });

  it('without a namespace, reads this process’s /proc/sys', async () => {
    const here = readFileSync('/proc/sys/net/ipv4/ip_forward', 'utf8').trim();
    assert.equal(await new LinuxKernel().readSysctl('net.ipv4.ip_forward'), here);
  });

  it('in a namespace with nothing: no uplink, nothing owned, flush() does nothing', async () => {
    const bare = `${NS}b`;
    sh(['ip', 'netns', 'add', bare]);
    try {
      const k = new LinuxKernel({ netns: bare });
      assert.equal(await k.uplink(), null);
      assert.deepStrictEqual(await k.observe(), EMPTY);
      await k.flush();
      assert.deepStrictEqual(await k.observe(), EMPTY);
    } finally {
      sh(['ip', 'netns', 'del', bare]);
    }
  });

  const expected: KernelState = structuredClone(EMPTY);
  const snapshots = new Map<string, KernelState>();
  for (const step of STEPS) {
    it(`step: ${step.name}`, async () => {
      const outcomes: Record<string, unknown> = {};
      for (const [name, k] of [
        ['fake', fake],
        ['real', real],
      ] as const) {
        step.before?.(k, tuns[name]);
        outcomes[name] = await k.apply(step.changes).then(
          () => null,
          (err: unknown) => err,
        );
      }
      if (step.fails === undefined) {
        assert.equal(outcomes.real, null, `real: ${outcomes.real}`);
        assert.equal(outcomes.fake, null, `fake: ${outcomes.fake}`);
      } else {
        for (const name of ['real', 'fake']) {
          const err = outcomes[name];
          assert.ok(err instanceof KernelError, `${name} did not fail with a KernelError: ${err}`);
          assert.equal(err.command, step.fails, `${name}: ${err.message}`);
          assert.ok(err.output.trim() !== '', `${name}: no output`);
        }
      }
      step.expect(expected);
      const want = canonicalState(expected);
      const [r, f] = [await real.observe(), await fake.observe()];
      expectCanonicalItems(r);
      expectCanonicalItems(f);
      snapshots.set(step.name, r);
      assert.deepStrictEqual(canonicalState(r), want, 'real kernel');
      assert.deepStrictEqual(canonicalState(f), want, 'recording kernel');
    });
  }

  it('the canonical forms in the observed state are the kernel’s', async () => {
    // Spot checks of forms the steps produced (beyond fake == real == expected).
    const s = snapshots.get('rules of every shape, both families');
    assert.ok(s);
    const has = (list: object[], item: object) =>
      assert.ok(
        list.some((x) => JSON.stringify(canonicalOrder(x)) === JSON.stringify(canonicalOrder(item))),
        `${JSON.stringify(item)} not in ${JSON.stringify(list)}`,
      );
    has(s.links, { name: 'mesh-m3', kind: 'macvlan', parent: 'veth-x', mac: '02:00:00:00:00:03', mtu: 1450 });
    has(s.addresses, { dev: 'mesh-m3', cidr: 'fd00:91:2::50/64' });
    has(s.addresses, { dev: 'mesh-t7', cidr: '100.64.0.1/32' });
    has(s.routes, { family: 4, table: 52007, dst: '10.3.0.1/32', dev: 'mesh-t7' });
    has(s.routes, { family: 4, table: 52003, dst: 'default', dev: 'mesh-m3', via: '10.91.2.1' });
    has(s.routes, { family: 6, table: 52007, dst: 'default', dev: 'mesh-t7' });
    has(s.routes, { family: 6, table: 52007, dst: 'fd04::/64', dev: 'mesh-t7' });
    has(s.routes, { family: 6, table: 52007, dst: 'fd03::1/128', dev: 'mesh-t7' });
    has(s.rules, {
      family: 4,
      pref: 22000,
      table: 52007,
      from: '10.1.0.0/16',
      to: '10.2.0.5/32',
      ipproto: 'tcp',
      sport: 443,
    });
    has(s.rules, { family: 4, pref: 22001, table: 52007 });
    has(s.rules, { family: 4, pref: 22003, table: 52007, fwmark: { value: 5, mask: 0xffff_ffff } });
    has(s.rules, { family: 4, pref: 22004, table: 52007, from: '10.1.2.3/16' });
    has(s.rules, { family: 4, pref: 21000, table: 'main', iif: 'lo' });
    has(s.rules, { family: 6, pref: 22001, table: 52007, ipproto: 'udp' });
    has(s.rules, { family: 6, pref: 21100, table: 52007, fwmark: MARK });
  });

  it('a failing nft script names its line and leaves the table as it was', async () => {
    await real.apply([{ op: 'nft', ruleset: RULESET }]);
    const err = await real.apply([{ op: 'nft', ruleset: 'chain c {\n  bogus stuff\n}' }]).then(
      () => null,
      (e: unknown) => e,
    );
    assert.ok(err instanceof KernelError, String(err));
    assert.equal(err.command, 'nft bogus stuff');
    assert.match(err.output, /Error/);
    assert.equal((await real.observe()).nft, canonicalNft(RULESET));
  });

  it('an invalid field is refused before anything runs, by both', async () => {
    const changes: KernelChange[] = [
      add(route(4, 52007, '10.80.0.0/16', 'mesh-m3')),
      add(addr('mesh-m3\nlink del veth-x', '10.0.0.1/8')),
    ];
    for (const k of [real, fake]) {
      const before1 = await k.observe();
      await assert.rejects(
        k.apply(changes),
        (e: unknown) => e instanceof KernelError && /invalid device/.test(e.message),
      );
      assert.deepStrictEqual(await k.observe(), before1);
    }
    await assert.rejects(
      fake.apply([{ op: 'nft', ruleset: '}\ndelete table inet other\ntable inet x {' }]),
      KernelError,
    );
  });

  it('flush() removes everything owned, also what observe() cannot express, and nothing else', async () => {
    // A crashed predecessor's leftovers of shapes the agent never makes.
    ip('link', 'add', 'mesh-v1', 'type', 'veth', 'peer', 'name', 'mesh-v2');
    ip('rule', 'add', 'pref', '23000', 'not', 'from', '10.0.0.0/8', 'oif', 'veth-x', 'lookup', '52011');
    ip('rule', 'add', 'pref', '23001', 'unreachable');
    ip('route', 'add', 'blackhole', '10.0.0.0/8', 'table', '52011');
    ip('-6', 'route', 'add', 'unreachable', 'fd00:dead::/64', 'table', '52011');
    await real.apply([{ op: 'nft', ruleset: RULESET }]);
    await real.flush();
    assert.deepStrictEqual(await real.observe(), EMPTY);
    assert.deepStrictEqual(dumps(), before0);
    // Others' state survived by name, too (the dump comparison above covers it all).
    assert.match(ip('rule', 'show', 'pref', '100'), /198\.51\.100\.0\/24 lookup 100/);
    assert.match(ip('route', 'show', 'table', '100'), /198\.51\.100\.0\/24 dev veth-x/);
    assert.match(nft(['list', 'table', 'inet', 'other']), /counter/);
    // And again, with nothing there.
    await real.flush();
    assert.deepStrictEqual(dumps(), before0);
  });

  it('flush() on the twin leaves nothing owned and writes what LinuxKernel would run', async () => {
    await fake.apply([{ op: 'nft', ruleset: RULESET }]);
    const from = fake.transcript.length;
    await fake.flush();
    assert.deepStrictEqual(await fake.observe(), EMPTY);
    assert.deepStrictEqual(fake.transcript.slice(from), [
      'ip -4 rule del pref 21000',
      'ip -4 rule del pref 21000',
      'ip -4 rule del pref 21100',
      'ip -4 rule del pref 21200',
      'ip -4 rule del pref 22000',
      'ip -4 rule del pref 22002',
      'ip -4 rule del pref 22003',
      'ip -4 rule del pref 22004',
      'ip -4 rule del pref 22030',
      'ip -4 route flush table 52009',
      'ip -4 route flush table 60192',
      'ip -4 route flush table 60197',
      'ip -6 rule del pref 21000',
      'ip -6 rule del pref 21100',
      'ip -6 rule del pref 21200',
      'ip -6 rule del pref 22001',
      'ip -6 route flush table 60192',
      'nft table inet mesh_agent {}',
      'nft delete table inet mesh_agent',
      'ip link del mesh-t8',
      'ip link del mesh-m3',
      'ip link del mesh-p5', // its peer goes with it
    ]);
    await fake.flush();
    assert.equal(fake.transcript.length, from + 22);
  });

  it('routeGet: the route matched, the device, its carrier, the policy rules by mark, no route', async () => {
    const one = async (k: KernelPort, q: RouteQuery) => (await k.routeGet([q]))[0] ?? null;
    ip('link', 'add', 'veth-h0', 'type', 'veth', 'peer', 'name', 'veth-h1');
    try {
      ip('link', 'set', 'veth-h0', 'up');
      ip('link', 'set', 'veth-h1', 'up');
      ip('addr', 'add', '203.0.113.1/24', 'dev', 'veth-h0');
      ip('route', 'add', '203.0.113.0/24', 'dev', 'veth-h0', 'table', '777');
      ip('rule', 'add', 'pref', '777', 'fwmark', '0x770000/0xffff0000', 'lookup', '777');
      // By the main table: the default route's device.
      assert.deepStrictEqual(await one(real, { dst: '198.18.0.1' }), {
        dev: 'veth-x',
        gateway: '192.0.2.1',
        prefix: '0.0.0.0/0',
        usable: true,
        operstate: 'UP',
      });
      // With the mark, the rule sends it to table 777: veth-h0, which has carrier.
      const marked = await one(real, { dst: '203.0.113.9', mark: 0x770000 });
      assert.equal(marked?.dev, 'veth-h0');
      assert.equal(marked?.prefix, '203.0.113.0/24');
      assert.equal(marked?.usable, true);
      // An address of this host: a local route (explain: a packet from it has no input interface).
      assert.equal((await one(real, { dst: '203.0.113.1' }))?.local, true);
      assert.equal(marked?.local, undefined);
      // The far end goes down: the route is still there, the device has no carrier.
      ip('link', 'set', 'veth-h1', 'down');
      await eventually(
        'no carrier',
        async () =>
          (await one(real, { dst: '203.0.113.9', mark: 0x770000 }))?.usable === false ? true : undefined,
        5000,
      );
      const dark = await one(real, { dst: '203.0.113.9', mark: 0x770000 });
      assert.equal(dark?.dev, 'veth-h0');
      assert.equal(dark?.operstate, 'LOWERLAYERDOWN');
      // The device itself down: its routes go, table 777 is empty and the lookup falls through to
      // main's default route (what an exit's health check must not take for its LAN).
      ip('link', 'set', 'veth-h0', 'down');
      const fellThrough = await one(real, { dst: '203.0.113.9', mark: 0x770000 });
      assert.equal(fellThrough?.dev, 'veth-x');
      assert.equal(fellThrough?.prefix, '0.0.0.0/0');
      // An unreachable destination of the other family: no route either.
      ip('-6', 'route', 'add', 'unreachable', 'fd00:777::/64');
      assert.equal(await one(real, { dst: 'fd00:777::1' }), null);
      // Several at once: one answer each, in order, the refused one null.
      assert.deepStrictEqual(
        (await real.routeGet([{ dst: 'fd00:777::1' }, { dst: '198.18.0.1' }, { dst: 'fd00:777::2' }])).map(
          (a) => a?.dev ?? null,
        ),
        [null, 'veth-x', null],
      );
      // The twin answers from the uplink unless told otherwise.
      assert.deepStrictEqual(await one(fake, { dst: '198.18.0.1' }), {
        dev: 'veth-x',
        gateway: '192.0.2.1',
        prefix: '0.0.0.0/0',
        usable: true,
        operstate: 'UP',
      });
      fake.answerRouteGet('198.18.0.1', null);
      assert.equal(await one(fake, { dst: '198.18.0.1' }), null);
    } finally {
      // Whatever the test got to: each undone if it was done.
      for (const undo of [
        ['-6', 'route', 'del', 'unreachable', 'fd00:777::/64'],
        ['rule', 'del', 'pref', '777'],
        ['route', 'flush', 'table', '777'],
        ['link', 'del', 'veth-h0'],
      ])
        try {
          ip(...undo);
        } catch {}
    }
  });
});
