import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type KernelChange, KernelError, type KernelState } from './port.js';
import { RecordingKernel, type RecordingTun, TUN_QUEUE } from './recording.js';

const T1 = { name: 'mesh-t1', kind: 'tun' as const, mtu: 1400 };
const M1 = { name: 'mesh-m1', kind: 'macvlan' as const, parent: 'eth0', mtu: 1500 };
const EMPTY: KernelState = { links: [], addresses: [], rules: [], routes: [], nft: null };

function kernel(): RecordingKernel {
  return new RecordingKernel({ foreignLinks: { lo: 65_536, eth0: 1500 } });
}

async function failure(k: RecordingKernel, changes: KernelChange[]): Promise<KernelError> {
  const err = await k.apply(changes).then(
    () => null,
    (e: unknown) => e,
  );
  assert.ok(err instanceof KernelError, `expected a KernelError, got ${err}`);
  return err;
}

describe('RecordingKernel', () => {
  it('builds state from changes and writes the command lines to the transcript', async () => {
    const k = kernel();
    k.openTun('mesh-t1');
    await k.apply([
      { op: 'add', link: T1 },
      { op: 'add', link: M1 },
      { op: 'add', address: { dev: 'mesh-m1', cidr: '10.91.2.50/24' } },
      { op: 'add', address: { dev: 'mesh-t1', cidr: 'FD00::0001/64' } },
      { op: 'add', route: { family: 4, table: 52001, dst: '0.0.0.0/0', dev: 'mesh-t1' } },
      { op: 'add', route: { family: 4, table: 52002, dst: '10.2.0.0/16', dev: 'mesh-m1', via: '10.91.2.1' } },
      { op: 'add', rule: { family: 4, pref: 22000, from: '0.0.0.0/0', to: '10.2.0.5', table: 52001 } },
      { op: 'add', rule: { family: 6, pref: 21000, to: 'fd00::/8', table: 254 } },
      { op: 'nft', ruleset: '  chain c {\n\n    counter\n  }' },
    ]);
    assert.deepStrictEqual(await k.observe(), {
      links: [T1, M1],
      addresses: [
        { dev: 'mesh-m1', cidr: '10.91.2.50/24' },
        { dev: 'mesh-t1', cidr: 'fd00::1/64' },
      ],
      rules: [
        { family: 4, pref: 22000, to: '10.2.0.5/32', table: 52001 },
        { family: 6, pref: 21000, to: 'fd00::/8', table: 'main' },
      ],
      routes: [
        { family: 4, table: 52001, dst: 'default', dev: 'mesh-t1' },
        { family: 4, table: 52002, dst: '10.2.0.0/16', dev: 'mesh-m1', via: '10.91.2.1' },
      ],
      nft: 'chain c {\ncounter\n}',
    });
    assert.deepStrictEqual(k.transcript, [
      'ip link set mesh-t1 mtu 1400 txqueuelen 1000 up',
      'ip link add link eth0 name mesh-m1 type macvlan mode bridge',
      'ip link set mesh-m1 mtu 1500 up',
      'ip address add 10.91.2.50/24 dev mesh-m1 noprefixroute',
      'ip address add FD00::0001/64 dev mesh-t1 noprefixroute nodad',
      'ip -4 route add 0.0.0.0/0 dev mesh-t1 table 52001',
      'ip -4 route add 10.2.0.0/16 dev mesh-m1 via 10.91.2.1 onlink table 52002',
      'ip -4 rule add pref 22000 from 0.0.0.0/0 to 10.2.0.5 lookup 52001',
      'ip -6 rule add pref 21000 to fd00::/8 lookup 254',
      'nft table inet mesh_agent {}',
      'nft delete table inet mesh_agent',
      'nft table inet mesh_agent {\n  chain c {\n\n    counter\n  }\n}',
    ]);
  });

  it('makes a pacer as one link, routes through it, and takes them with it', async () => {
    const k = kernel();
    const P3 = {
      name: 'mesh-p3',
      kind: 'pacer' as const,
      mtu: 65_535,
      rateBps: 8_000_000,
      peerAddress: '169.254.224.3/32',
    };
    await k.apply([
      { op: 'add', link: P3 },
      { op: 'add', route: { family: 4, table: 60195, dst: 'default', dev: 'mesh-p3' } },
    ]);
    const seen = await k.observe();
    assert.deepStrictEqual(seen.links, [P3]);
    assert.deepStrictEqual(seen.addresses, [], "the peer's address is part of the pacer");
    assert.equal(k.transcript.filter((l) => l.startsWith('tc ')).length, 266);
    await k.apply([{ op: 'del', link: P3 }]);
    assert.deepStrictEqual(await k.observe(), EMPTY);
  });

  it('observes only what the agent owns', async () => {
    const k = kernel();
    await k.apply([
      { op: 'add', link: { name: 'other0', kind: 'macvlan', parent: 'eth0', mtu: 1500 } },
      { op: 'add', address: { dev: 'other0', cidr: '10.0.0.1/8' } },
      { op: 'add', address: { dev: 'eth0', cidr: '10.1.0.1/16' } },
      { op: 'add', route: { family: 4, table: 100, dst: 'default', dev: 'other0' } },
      { op: 'add', route: { family: 4, table: 52000, dst: 'default', dev: 'other0' } },
      { op: 'add', rule: { family: 4, pref: 100, table: 100 } },
      { op: 'add', rule: { family: 4, pref: 30000, table: 100 } },
    ]);
    assert.deepStrictEqual(await k.observe(), EMPTY);
  });

  const errors: [string, KernelChange[], string, RegExp][] = [
    [
      'an existing MACVLAN',
      [
        { op: 'add', link: M1 },
        { op: 'add', link: M1 },
      ],
      'ip link add link eth0 name mesh-m1 type macvlan mode bridge',
      /File exists/,
    ],
    [
      'a MACVLAN on a missing parent',
      [{ op: 'add', link: { ...M1, parent: 'eth9' } }],
      'ip link add link eth9 name mesh-m1 type macvlan mode bridge',
      /Cannot find device "eth9"/,
    ],
    [
      'a TUN nobody opened',
      [{ op: 'add', link: T1 }],
      'ip link set mesh-t1 mtu 1400 txqueuelen 1000 up',
      /Cannot find device "mesh-t1"/,
    ],
    [
      'an MTU over the parent’s',
      [{ op: 'add', link: { ...M1, mtu: 9000 } }],
      'ip link set mesh-m1 mtu 9000 up',
      /Invalid argument/,
    ],
    ['deleting a missing MACVLAN', [{ op: 'del', link: M1 }], 'ip link del mesh-m1', /Cannot find device/],
    [
      'an address on a missing link',
      [{ op: 'add', address: { dev: 'mesh-m1', cidr: '10.0.0.1/8' } }],
      'ip address add 10.0.0.1/8 dev mesh-m1 noprefixroute',
      /Cannot find device/,
    ],
    [
      'an existing IPv4 address',
      [
        { op: 'add', address: { dev: 'eth0', cidr: '10.0.0.1/8' } },
        { op: 'add', address: { dev: 'eth0', cidr: '10.0.0.1/8' } },
      ],
      'ip address add 10.0.0.1/8 dev eth0 noprefixroute',
      /File exists/,
    ],
    [
      'an existing IPv6 address with another prefix',
      [
        { op: 'add', address: { dev: 'eth0', cidr: 'fd00::1/64' } },
        { op: 'add', address: { dev: 'eth0', cidr: 'fd00::1/80' } },
      ],
      'ip address add fd00::1/80 dev eth0 noprefixroute nodad',
      /already assigned/,
    ],
    [
      'deleting a missing address',
      [{ op: 'del', address: { dev: 'eth0', cidr: '10.0.0.1/8' } }],
      'ip address del 10.0.0.1/8 dev eth0',
      /Cannot assign/,
    ],
    [
      'an existing rule',
      [
        { op: 'add', rule: { family: 4, pref: 21000, to: '10.0.0.0/8', table: 'main' } },
        { op: 'add', rule: { family: 4, pref: 21000, to: '10.0.0.0/8', table: 'main' } },
      ],
      'ip -4 rule add pref 21000 to 10.0.0.0/8 lookup main',
      /File exists/,
    ],
    [
      'a rule lacking the from of an existing one (the kernel’s duplicate test)',
      [
        { op: 'add', rule: { family: 4, pref: 21000, from: '10.0.0.0/8', table: 1 } },
        { op: 'add', rule: { family: 4, pref: 21000, table: 1 } },
      ],
      'ip -4 rule add pref 21000 lookup 1',
      /File exists/,
    ],
    [
      'deleting a missing rule',
      [{ op: 'del', rule: { family: 6, pref: 21000, table: 1 } }],
      'ip -6 rule del pref 21000 lookup 1',
      /No such file/,
    ],
    [
      'a route through a missing device',
      [{ op: 'add', route: { family: 4, table: 1, dst: 'default', dev: 'mesh-t1' } }],
      'ip -4 route add default dev mesh-t1 table 1',
      /Cannot find device/,
    ],
    [
      'an existing route',
      [
        { op: 'add', route: { family: 4, table: 1, dst: '10.0.0.0/8', dev: 'eth0' } },
        { op: 'add', route: { family: 4, table: 1, dst: '10.0.0.0/8', dev: 'lo' } },
      ],
      'ip -4 route add 10.0.0.0/8 dev lo table 1',
      /File exists/,
    ],
    [
      'an IPv4 route with host bits',
      [{ op: 'add', route: { family: 4, table: 1, dst: '10.0.0.1/8', dev: 'eth0' } }],
      'ip -4 route add 10.0.0.1/8 dev eth0 table 1',
      /Invalid prefix/,
    ],
    [
      'deleting a route through another device',
      [
        { op: 'add', route: { family: 6, table: 1, dst: 'fd00::/8', dev: 'eth0' } },
        { op: 'del', route: { family: 6, table: 1, dst: 'fd00::/8', dev: 'lo' } },
      ],
      'ip -6 route del fd00::/8 dev lo table 1',
      /No such process/,
    ],
  ];
  for (const [name, changes, command, output] of errors) {
    it(`refuses ${name}, naming the line`, async () => {
      const k = kernel();
      const err = await failure(k, changes);
      assert.equal(err.command, command);
      assert.match(err.output, output);
      assert.equal(k.transcript.at(-1), command);
    });
  }

  it('keeps what a failing batch did before its failing line, and stops there', async () => {
    const k = kernel();
    const err = await failure(k, [
      { op: 'add', link: M1 },
      { op: 'add', address: { dev: 'mesh-m1', cidr: '10.0.0.1/8' } },
      { op: 'add', address: { dev: 'mesh-m9', cidr: '10.0.0.2/8' } },
      { op: 'add', address: { dev: 'mesh-m1', cidr: '10.0.0.3/8' } },
    ]);
    assert.equal(err.command, 'ip address add 10.0.0.2/8 dev mesh-m9 noprefixroute');
    const s = await k.observe();
    assert.deepStrictEqual(s.links, [M1]);
    assert.deepStrictEqual(s.addresses, [{ dev: 'mesh-m1', cidr: '10.0.0.1/8' }]);
    assert.equal(k.transcript.length, 4);
  });

  it('refuses an invalid change before applying any of the batch', async () => {
    const k = kernel();
    await failure(k, [
      { op: 'add', link: M1 },
      { op: 'add', rule: { family: 4, pref: 21000, from: 'fd00::/8', table: 1 } },
    ]);
    assert.deepStrictEqual(await k.observe(), EMPTY);
    assert.deepStrictEqual(k.transcript, []);
  });

  it('deletes the first rule matching the selectors given, as the kernel does', async () => {
    const k = kernel();
    await k.apply([
      { op: 'add', rule: { family: 4, pref: 22000, from: '10.1.0.0/16', ipproto: 'tcp', table: 1 } },
      { op: 'add', rule: { family: 4, pref: 22000, from: '10.1.0.0/16', table: 1 } },
      { op: 'add', rule: { family: 4, pref: 21999, table: 1 } },
      { op: 'del', rule: { family: 4, pref: 22000, from: '10.1.0.0/16', table: 1 } },
    ]);
    // The rule with ipproto went: it came first and matches every selector named.
    assert.deepStrictEqual((await k.observe()).rules, [
      { family: 4, pref: 21999, table: 1 },
      { family: 4, pref: 22000, from: '10.1.0.0/16', table: 1 },
    ]);
  });

  it('removes addresses and routes with their link, and MACVLANs with their parent', async () => {
    const k = new RecordingKernel({ foreignLinks: { eth0: 1500, 'mesh-x': 1500 } });
    await k.apply([
      { op: 'add', link: { ...M1, parent: 'mesh-x' } },
      { op: 'add', address: { dev: 'mesh-m1', cidr: '10.0.0.1/8' } },
      { op: 'add', route: { family: 4, table: 52001, dst: 'default', dev: 'mesh-m1' } },
      { op: 'add', route: { family: 4, table: 52001, dst: '10.0.0.0/8', dev: 'eth0' } },
      { op: 'add', rule: { family: 4, pref: 21200, iif: 'mesh-m1', table: 52001 } },
      { op: 'del', link: { name: 'mesh-x', kind: 'macvlan', mtu: 1500 } },
    ]);
    assert.deepStrictEqual(await k.observe(), {
      ...EMPTY,
      routes: [{ family: 4, table: 52001, dst: '10.0.0.0/8', dev: 'eth0' }],
      rules: [{ family: 4, pref: 21200, iif: 'mesh-m1', table: 52001 }],
    });
  });

  it('deletes the secondaries of a primary IPv4 address, not those of other subnets', async () => {
    const k = kernel();
    await k.apply([
      { op: 'add', address: { dev: 'eth0', cidr: '10.0.0.1/24' } },
      { op: 'add', address: { dev: 'eth0', cidr: '10.0.0.2/24' } },
      { op: 'add', address: { dev: 'eth0', cidr: '10.0.0.3/25' } },
      { op: 'add', address: { dev: 'eth0', cidr: '10.0.1.1/24' } },
      { op: 'del', address: { dev: 'eth0', cidr: '10.0.0.2/24' } },
      { op: 'add', address: { dev: 'eth0', cidr: '10.0.0.2/24' } },
      { op: 'del', address: { dev: 'eth0', cidr: '10.0.0.1/24' } },
    ]);
    // Only a secondary went the first time; the primary took 10.0.0.2/24 along the second.
    await failure(k, [{ op: 'del', address: { dev: 'eth0', cidr: '10.0.0.2/24' } }]);
    await k.apply([
      { op: 'del', address: { dev: 'eth0', cidr: '10.0.0.3/25' } },
      { op: 'del', address: { dev: 'eth0', cidr: '10.0.1.1/24' } },
    ]);
  });

  it('needs a link up for a route; an opened TUN is down until added', async () => {
    const k = kernel();
    k.openTun('mesh-t1');
    assert.deepStrictEqual((await k.observe()).links, [{ name: 'mesh-t1', kind: 'tun', mtu: 1500 }]);
    const route = { family: 6 as const, table: 52001, dst: 'default', dev: 'mesh-t1' };
    const err = await failure(k, [{ op: 'add', route }]);
    assert.match(err.output, /not up/);
    await k.apply([
      { op: 'add', link: T1 },
      { op: 'add', route },
    ]);
    assert.deepStrictEqual((await k.observe()).routes, [route]);
  });

  it('deleting a TUN that is gone is not an error and runs nothing', async () => {
    const k = kernel();
    await k.apply([{ op: 'del', link: T1 }]);
    assert.deepStrictEqual(k.transcript, []);
  });

  it('masks IPv6 route destinations and matches them masked on delete', async () => {
    const k = kernel();
    await k.apply([{ op: 'add', route: { family: 6, table: 52001, dst: 'fd00::5/64', dev: 'eth0' } }]);
    assert.deepStrictEqual((await k.observe()).routes, [
      { family: 6, table: 52001, dst: 'fd00::/64', dev: 'eth0' },
    ]);
    await k.apply([{ op: 'del', route: { family: 6, table: 52001, dst: 'fd00::7/64', dev: 'eth0' } }]);
    assert.deepStrictEqual((await k.observe()).routes, []);
  });

  it('flush() removes everything owned, even on a missing table, and leaves the rest', async () => {
    const k = kernel();
    k.openTun('mesh-t1');
    await k.apply([
      { op: 'add', link: T1 },
      { op: 'add', link: { name: 'other0', kind: 'macvlan', parent: 'eth0', mtu: 1500 } },
      { op: 'add', route: { family: 4, table: 52001, dst: 'default', dev: 'other0' } },
      { op: 'add', route: { family: 4, table: 100, dst: 'default', dev: 'other0' } },
      { op: 'add', rule: { family: 6, pref: 29999, table: 52001 } },
      { op: 'add', rule: { family: 6, pref: 20999, table: 52001 } },
    ]);
    const tun = k.tuns.get('mesh-t1') as RecordingTun;
    k.transcript.length = 0;
    await k.flush();
    assert.deepStrictEqual(await k.observe(), EMPTY);
    assert.deepStrictEqual(k.transcript, [
      'ip -4 route flush table 52001',
      'ip -6 rule del pref 29999',
      'ip link del mesh-t1',
    ]);
    assert.equal(tun.detached, true);
    assert.equal(tun.write([Buffer.from('x')]), 0);
    // The other link, its route in table 100 and the rule at pref 20999 are still there: a
    // second route in table 100 is refused, the rule can be deleted.
    await failure(k, [{ op: 'add', route: { family: 4, table: 100, dst: 'default', dev: 'other0' } }]);
    await k.apply([{ op: 'del', rule: { family: 6, pref: 20999, table: 52001 } }]);
  });

  it('failOn makes the next matching line fail once', async () => {
    const k = kernel();
    k.failOn('mesh-m1 mtu', 'RTNETLINK answers: Device or resource busy');
    const err = await failure(k, [{ op: 'add', link: M1 }]);
    assert.equal(err.command, 'ip link set mesh-m1 mtu 1500 up');
    assert.match(err.output, /busy/);
    assert.deepStrictEqual((await k.observe()).links, [{ ...M1 }]);
    await k.apply([{ op: 'add', link: { ...M1, kind: 'tun' } }]);
  });

  it('failOn on an nft line fails the whole transaction', async () => {
    const k = kernel();
    await k.apply([{ op: 'nft', ruleset: 'chain a {\n}' }]);
    k.failOn(/^nft table inet mesh_agent \{\n/);
    await failure(k, [{ op: 'nft', ruleset: 'chain b {\n}' }]);
    assert.equal((await k.observe()).nft, 'chain a {\n}');
  });

  it('reads sysctls and the uplink it was given', async () => {
    const k = new RecordingKernel({
      sysctls: { 'net.ipv4.ip_forward': '1' },
      uplink: { dev: 'eth0', gateway4: '10.0.0.1', gateway6: null },
    });
    assert.equal(await k.readSysctl('net.ipv4.ip_forward'), '1');
    assert.equal(await k.readSysctl('net.ipv6.conf.all.forwarding'), null);
    assert.deepStrictEqual(await k.uplink(), { dev: 'eth0', gateway4: '10.0.0.1', gateway6: null });
    assert.equal(await kernel().uplink(), null);
  });
});

describe('RecordingTun', () => {
  const packet = (n: number) => Buffer.from([0x45, n]);

  it('keeps copies of what was written, up to the write limit', () => {
    const k = kernel();
    const tun = k.openTun('mesh-t1') as RecordingTun;
    const p = packet(1);
    assert.equal(tun.write([p, packet(2)]), 2);
    p[1] = 99;
    tun.writeLimit = 1;
    assert.equal(tun.write([packet(3), packet(4)]), 1);
    assert.deepStrictEqual(tun.written, [packet(1), packet(2), packet(3)]);
  });

  it('delivers injected packets, queues them while paused (dropping past the queue) and delivers on resume', () => {
    const tun = kernel().openTun('mesh-t1') as RecordingTun;
    const got: Buffer[][] = [];
    tun.onPackets((ps) => got.push(ps));
    tun.inject([packet(1), packet(2)]);
    assert.deepStrictEqual(got, [[packet(1), packet(2)]]);
    tun.pause();
    tun.inject(Array.from({ length: TUN_QUEUE + 3 }, (_, i) => packet(i % 256)));
    assert.equal(got.length, 1);
    assert.equal(tun.dropped, 3);
    tun.resume();
    assert.equal(got.length, 2);
    assert.equal(got[1]!.length, TUN_QUEUE);
  });

  it('close() removes the link with its addresses and routes; writing after close throws', async () => {
    const k = kernel();
    const tun = k.openTun('mesh-t1') as RecordingTun;
    await k.apply([
      { op: 'add', link: T1 },
      { op: 'add', address: { dev: 'mesh-t1', cidr: '100.64.0.1/32' } },
      { op: 'add', route: { family: 4, table: 52001, dst: 'default', dev: 'mesh-t1' } },
    ]);
    tun.close();
    tun.close();
    assert.deepStrictEqual(await k.observe(), EMPTY);
    assert.equal(k.tuns.size, 0);
    assert.throws(() => tun.write([packet(1)]), /closed/);
    assert.throws(() => tun.inject([packet(1)]), /closed/);
  });

  it('a device whose link was deleted takes no packets, and closing it leaves a new one alone', async () => {
    const k = kernel();
    const old = k.openTun('mesh-t1') as RecordingTun;
    await k.apply([{ op: 'del', link: T1 }]);
    assert.equal(old.detached, true);
    assert.equal(old.write([packet(1)]), 0);
    assert.throws(() => old.inject([packet(1)]), /detached/);
    const again = k.openTun('mesh-t1');
    old.close();
    assert.deepStrictEqual((await k.observe()).links, [{ name: 'mesh-t1', kind: 'tun', mtu: 1500 }]);
    again.close();
    assert.deepStrictEqual((await k.observe()).links, []);
  });

  it('refuses a name in use or not valid', () => {
    const k = kernel();
    k.openTun('mesh-t1');
    assert.throws(() => k.openTun('mesh-t1'), /busy/);
    assert.throws(() => k.openTun('eth0'), /busy/);
    assert.throws(() => k.openTun('bad name'), KernelError);
  });
});
