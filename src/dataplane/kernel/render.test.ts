import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type KernelChange, KernelError } from './port.js';
import { bracesBalance, commandsOf, renderChange } from './render.js';

const lines = (c: KernelChange) => renderChange(c).flatMap(commandsOf);

describe('render', () => {
  const table: [string, KernelChange, string[]][] = [
    [
      'TUN add: the device exists, set it up',
      { op: 'add', link: { name: 'mesh-t7', kind: 'tun', mtu: 1400 } },
      ['ip link set mesh-t7 mtu 1400 txqueuelen 1000 up'],
    ],
    ['TUN del', { op: 'del', link: { name: 'mesh-t7', kind: 'tun', mtu: 1400 } }, ['ip link del mesh-t7']],
    [
      'MACVLAN add',
      { op: 'add', link: { name: 'mesh-m3', kind: 'macvlan', parent: 'eth0', mtu: 1500 } },
      ['ip link add link eth0 name mesh-m3 type macvlan mode bridge', 'ip link set mesh-m3 mtu 1500 up'],
    ],
    [
      'MACVLAN add with its MAC',
      {
        op: 'add',
        link: { name: 'mesh-m3', kind: 'macvlan', parent: 'eth0', mac: '02:ab:cd:ef:01:23', mtu: 1500 },
      },
      [
        'ip link add link eth0 name mesh-m3 address 02:ab:cd:ef:01:23 type macvlan mode bridge',
        'ip link set mesh-m3 mtu 1500 up',
      ],
    ],
    [
      'MACVLAN del',
      { op: 'del', link: { name: 'mesh-m3', kind: 'macvlan', parent: 'eth0', mtu: 1500 } },
      ['ip link del mesh-m3'],
    ],
    [
      'IPv4 address add',
      { op: 'add', address: { dev: 'mesh-m3', cidr: '10.91.2.50/24' } },
      ['ip address add 10.91.2.50/24 dev mesh-m3 noprefixroute'],
    ],
    [
      'IPv6 address add: no DAD',
      { op: 'add', address: { dev: 'mesh-m3', cidr: 'fd00:91:2::50/64' } },
      ['ip address add fd00:91:2::50/64 dev mesh-m3 noprefixroute nodad'],
    ],
    [
      'address del',
      { op: 'del', address: { dev: 'mesh-m3', cidr: 'fd00:91:2::50/64' } },
      ['ip address del fd00:91:2::50/64 dev mesh-m3'],
    ],
    [
      'rule: exclusion to main',
      { op: 'add', rule: { family: 4, pref: 21000, to: '192.0.2.7/32', table: 'main' } },
      ['ip -4 rule add pref 21000 to 192.0.2.7/32 lookup main'],
    ],
    [
      'rule: reply mark, hex',
      {
        op: 'add',
        rule: { family: 6, pref: 21100, fwmark: { value: 0x70000, mask: 0xfff0000 }, table: 52007 },
      },
      ['ip -6 rule add pref 21100 fwmark 0x70000/0xfff0000 lookup 52007'],
    ],
    [
      'rule: every selector, in a fixed order',
      {
        op: 'del',
        rule: {
          family: 4,
          pref: 22000,
          table: 52007,
          sport: 443,
          ipproto: 'tcp',
          fwmark: { value: 1, mask: 0xffffffff },
          iif: 'mesh-t7',
          to: '10.2.0.0/16',
          from: '10.1.0.0/16',
        },
      },
      [
        'ip -4 rule del pref 22000 from 10.1.0.0/16 to 10.2.0.0/16 iif mesh-t7 fwmark 0x1/0xffffffff ipproto tcp sport 443 lookup 52007',
      ],
    ],
    [
      'route: default through a TUN',
      { op: 'add', route: { family: 4, table: 52007, dst: 'default', dev: 'mesh-t7' } },
      ['ip -4 route add default dev mesh-t7 table 52007'],
    ],
    [
      'route with a gateway: onlink on add',
      {
        op: 'add',
        route: { family: 6, table: 52003, dst: 'fd02::/64', dev: 'mesh-m3', via: 'fd00:91:2::1' },
      },
      ['ip -6 route add fd02::/64 dev mesh-m3 via fd00:91:2::1 onlink table 52003'],
    ],
    [
      'route with a gateway: no flag on del',
      { op: 'del', route: { family: 4, table: 52003, dst: '10.2.0.0/16', dev: 'mesh-m3', via: '10.91.2.1' } },
      ['ip -4 route del 10.2.0.0/16 dev mesh-m3 via 10.91.2.1 table 52003'],
    ],
    [
      'local route (TPROXY delivery), both ways',
      { op: 'del', route: { family: 6, table: 60192, dst: 'default', dev: 'lo', type: 'local' } },
      ['ip -6 route del local default dev lo table 60192'],
    ],
    [
      'nft: the table replaced in one transaction',
      { op: 'nft', ruleset: 'chain c {\n\tcounter\n}' },
      [
        'nft table inet mesh_agent {}',
        'nft delete table inet mesh_agent',
        'nft table inet mesh_agent {\nchain c {\n\tcounter\n}\n}',
      ],
    ],
    [
      'nft: removal works whether the table exists or not',
      { op: 'nft', ruleset: null },
      ['nft table inet mesh_agent {}', 'nft delete table inet mesh_agent'],
    ],
  ];
  for (const [name, change, want] of table) {
    it(name, () => assert.deepStrictEqual(lines(change), want));
  }

  it('makes a pacer whole: the veth pair, its peer address, then its queue by tc', () => {
    const pacer = {
      name: 'mesh-p3',
      kind: 'pacer' as const,
      mtu: 65_535,
      rateBps: 10_000_000,
      peerAddress: '169.254.224.3/32',
    };
    const rendered = renderChange({ op: 'add', link: pacer });
    // The alias that records the rate comes last: a pacer without its queue reads as unknown.
    assert.deepStrictEqual(
      rendered.map((r) => r.tool),
      ['ip', 'tc', 'ip'],
    );
    assert.deepStrictEqual(rendered[2]!.lines, ['link set mesh-p3 alias mesh-agent-pacer-bps=10000000']);
    assert.deepStrictEqual(rendered[0]!.lines, [
      'link add mesh-p3 mtu 65535 address 02:6d:70:00:00:03 type veth peer name mesh-q3 mtu 65535 address 02:6d:70:00:00:03',
      'link set mesh-p3 addrgenmode none arp off',
      'link set mesh-q3 addrgenmode none',
      'address add 169.254.224.3/32 dev mesh-q3 noprefixroute',
      'link set mesh-q3 up',
      'link set mesh-p3 up',
    ]);
    // htb at the rate; small packets first; then 64 buckets of equal priority, served in turn,
    // each a FIFO of 10 ms of the rate (12,500 bytes) but at least two jumbo frames, which flows
    // are hashed into by port. The guaranteed rates add up to the parent's.
    const tc = rendered[1]!.lines;
    assert.deepStrictEqual(tc.slice(0, 4), [
      'qdisc add dev mesh-p3 root handle 1: htb default 100',
      'class add dev mesh-p3 parent 1: classid 1:1 htb rate 10000000bit ceil 10000000bit',
      'class add dev mesh-p3 parent 1:1 classid 1:2 htb rate 1000000bit ceil 10000000bit prio 0',
      'qdisc add dev mesh-p3 parent 1:2 handle 2: pfifo limit 1000',
    ]);
    // A bucket's quantum is the largest packet it passes whole (9216 bytes at 10 Mbit/s).
    const buckets = tc.filter((l) => / prio 1 quantum 9216$/.test(l));
    assert.equal(buckets.length, 64);
    assert.equal(
      buckets[63],
      'class add dev mesh-p3 parent 1:1 classid 1:13f htb rate 140625bit ceil 10000000bit prio 1 quantum 9216',
    );
    assert.ok(
      tc.includes(
        'qdisc add dev mesh-p3 parent 1:13f handle 13f: tbf rate 40000000bit burst 9216 limit 18432',
      ),
    );
    for (const want of [
      'filter add dev mesh-p3 parent 1: protocol ip prio 1 u32 match u16 0x0000 0xff00 at 2 flowid 1:2',
      'filter add dev mesh-p3 parent 1: protocol ipv6 prio 2 u32 match u16 0x0000 0xff00 at 4 flowid 1:2',
      'filter add dev mesh-p3 parent 1: protocol ip prio 3 handle 3: u32 divisor 64',
      'filter add dev mesh-p3 parent 1: protocol ip prio 3 u32 ht 3:3f: match u8 0 0 flowid 1:13f',
      'filter add dev mesh-p3 parent 1: protocol ip prio 3 u32 match u8 6 0xff at 9 hashkey mask 0x007e0000 at 20 link 3:',
      'filter add dev mesh-p3 parent 1: protocol ipv6 prio 4 u32 match u8 6 0xff at 6 hashkey mask 0x007e0000 at 40 link 4:',
    ]) {
      assert.ok(tc.includes(want), want);
    }
    // At 100 Mbit/s a bucket holds 10 ms of the rate and passes a TSO packet of up to 4 ms whole.
    const fast = renderChange({ op: 'add', link: { ...pacer, rateBps: 100_000_000 } });
    assert.match(fast[1]!.lines[5]!, /tbf .* burst 50000 limit 125000$/);
    assert.match(fast[1]!.lines[4]!, / quantum 50000$/);
    // Above 131 Mbit/s 4 ms is more than any packet: the quantum stops at the largest, 64 KiB.
    const faster = renderChange({ op: 'add', link: { ...pacer, rateBps: 1_000_000_000 } });
    assert.match(faster[1]!.lines[4]!, / quantum 65664$/);
    assert.deepStrictEqual(lines({ op: 'del', link: pacer }), ['ip link del mesh-p3']);
    assert.throws(
      () => renderChange({ op: 'add', link: { ...pacer, rateBps: 0 } }),
      (e: unknown) => e instanceof KernelError && /invalid pacer rate/.test(e.output),
    );
    assert.throws(
      () => renderChange({ op: 'add', link: { ...pacer, peerAddress: 'fd00::1/128' } }),
      (e: unknown) => e instanceof KernelError && /invalid peer address/.test(e.output),
    );
  });

  it('sends each change to the tool of its kind and family', () => {
    assert.equal(renderChange({ op: 'add', address: { dev: 'mesh-m3', cidr: 'fd00::1/64' } })[0]!.tool, 'ip');
    assert.equal(
      renderChange({ op: 'add', rule: { family: 6, pref: 21000, table: 'main' } })[0]!.tool,
      'ip -6',
    );
    assert.equal(
      renderChange({ op: 'del', route: { family: 4, table: 52001, dst: 'default', dev: 'x' } })[0]!.tool,
      'ip -4',
    );
    assert.equal(renderChange({ op: 'nft', ruleset: null })[0]!.tool, 'nft');
  });

  it('marks only a TUN deletion as conditional on the link existing', () => {
    assert.equal(
      renderChange({ op: 'del', link: { name: 'mesh-t1', kind: 'tun', mtu: 1500 } })[0]!.onlyIfLinkExists,
      'mesh-t1',
    );
    assert.equal(
      renderChange({ op: 'del', link: { name: 'mesh-m1', kind: 'macvlan', mtu: 1500 } })[0]!.onlyIfLinkExists,
      undefined,
    );
  });

  const invalid: [string, KernelChange, RegExp][] = [
    [
      'a newline in a name',
      { op: 'add', address: { dev: 'x\nlink del eth0', cidr: '10.0.0.1/8' } },
      /invalid device/,
    ],
    [
      'a name too long for the kernel',
      { op: 'add', link: { name: 'mesh-0123456789a', kind: 'tun', mtu: 1500 } },
      /invalid link name/,
    ],
    [
      'a space in a parent',
      { op: 'add', link: { name: 'mesh-m1', kind: 'macvlan', parent: 'eth0 up', mtu: 1500 } },
      /invalid MACVLAN parent/,
    ],
    [
      'a MAC that is not one',
      {
        op: 'add',
        link: { name: 'mesh-m1', kind: 'macvlan', parent: 'eth0', mac: '02:ab:cd:ef:01', mtu: 1500 },
      },
      /invalid MAC address/,
    ],
    [
      'a MACVLAN without parent',
      { op: 'add', link: { name: 'mesh-m1', kind: 'macvlan', mtu: 1500 } },
      /invalid MACVLAN parent/,
    ],
    [
      'an MTU that is not a number',
      { op: 'add', link: { name: 'mesh-t1', kind: 'tun', mtu: 1.5 } },
      /invalid mtu/,
    ],
    [
      'an address that is not one',
      { op: 'add', address: { dev: 'mesh-m1', cidr: '10.0.0.256/8' } },
      /invalid address/,
    ],
    [
      'an IPv6 selector in an IPv4 rule',
      { op: 'add', rule: { family: 4, pref: 21000, from: 'fd00::/8', table: 1 } },
      /invalid from \(IPv4\)/,
    ],
    [
      'a mark over 32 bits',
      { op: 'add', rule: { family: 4, pref: 21000, fwmark: { value: 2 ** 32, mask: 1 }, table: 1 } },
      /invalid fwmark value/,
    ],
    [
      'another protocol',
      { op: 'add', rule: { family: 4, pref: 21000, ipproto: 'icmp' as 'tcp', table: 1 } },
      /invalid ipproto/,
    ],
    ['port 0', { op: 'add', rule: { family: 4, pref: 21000, sport: 0, table: 1 } }, /invalid sport/],
    ['table 0', { op: 'add', rule: { family: 4, pref: 21000, table: 0 } }, /invalid table/],
    ['a negative pref', { op: 'add', rule: { family: 4, pref: -1, table: 1 } }, /invalid pref/],
    [
      'an IPv4 gateway on an IPv6 route',
      { op: 'add', route: { family: 6, table: 1, dst: 'default', dev: 'x', via: '10.0.0.1' } },
      /invalid gateway \(IPv6\)/,
    ],
    [
      'a gateway with a prefix',
      { op: 'add', route: { family: 4, table: 1, dst: 'default', dev: 'x', via: '10.0.0.1/32' } },
      /invalid gateway/,
    ],
    [
      'a destination of the other family',
      { op: 'add', route: { family: 4, table: 1, dst: 'fd00::/8', dev: 'x' } },
      /invalid destination/,
    ],
    [
      'an nft body that closes the table',
      { op: 'nft', ruleset: '}\ntable inet other {' },
      /unbalanced braces/,
    ],
  ];
  for (const [name, change, message] of invalid) {
    it(`refuses ${name}, naming the command`, () => {
      assert.throws(
        () => renderChange(change),
        (e: unknown) =>
          e instanceof KernelError && message.test(e.output) && e.command.startsWith(renderTool(change)),
      );
    });
  }

  it('balances braces outside strings and comments only', () => {
    assert.equal(bracesBalance('chain c {\n iifname "}" accept # }\n}'), true);
    assert.equal(bracesBalance('chain c { }'), true);
    assert.equal(bracesBalance('}{'), false);
    assert.equal(bracesBalance('chain c {'), false);
    assert.equal(bracesBalance('chain c { iifname "x }'), false);
  });
});

function renderTool(c: KernelChange): string {
  if ('rule' in c) return `ip -${c.rule.family} rule`;
  if ('route' in c) return `ip -${c.route.family} route`;
  if ('nft' === c.op) return 'nft table';
  return 'ip ';
}
