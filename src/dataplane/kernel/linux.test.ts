import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { LinuxKernel, nftBody, parseAddresses, parseLink, parseRoute, parseRule } from './linux.js';

// Samples are what iproute2 6.1 prints (`ip -N -j rule show`, `ip -N -j route show table all`,
// `ip -j -d addr show`); the root test in test/dataplane/kernel-port.root.test.ts checks the real thing.
describe('LinuxKernel parsing', () => {
  it('parses rules into the canonical form', () => {
    assert.deepStrictEqual(
      parseRule(4, {
        priority: 22000,
        src: '10.1.0.0',
        srclen: 16,
        dst: '10.2.0.5',
        ipproto: 'ipproto-6',
        sport: 443,
        table: '52007',
      }),
      {
        family: 4,
        pref: 22000,
        table: 52007,
        from: '10.1.0.0/16',
        to: '10.2.0.5/32',
        ipproto: 'tcp',
        sport: 443,
      },
    );
    assert.deepStrictEqual(
      parseRule(6, { priority: 21000, src: 'all', dst: 'fd00::', dstlen: 8, table: '254' }),
      {
        family: 6,
        pref: 21000,
        table: 'main',
        to: 'fd00::/8',
      },
    );
    assert.deepStrictEqual(
      parseRule(4, {
        priority: 21100,
        src: 'all',
        fwmark: '0x70000',
        fwmask: '0xfff0000',
        iif: 'mesh-t7',
        table: '52007',
      }),
      {
        family: 4,
        pref: 21100,
        table: 52007,
        iif: 'mesh-t7',
        fwmark: { value: 0x70000, mask: 0xfff0000 },
      },
    );
    // No mask printed: all ones. udp by number.
    assert.deepStrictEqual(
      parseRule(4, { priority: 1, src: 'all', fwmark: '0x5', ipproto: 'ipproto-17', table: '1' }),
      {
        family: 4,
        pref: 1,
        table: 1,
        fwmark: { value: 5, mask: 0xffffffff },
        ipproto: 'udp',
      },
    );
    // A rule that looks nothing up (unreachable, goto): not something the agent makes.
    assert.equal(parseRule(4, { priority: 23001, src: 'all' }), undefined);
  });

  it('parses routes of owned tables, leaving out what the kernel added or the agent never makes', () => {
    assert.deepStrictEqual(parseRoute(4, { dst: '10.3.0.1', dev: 'mesh-t7', table: '52007' }), {
      family: 4,
      table: 52007,
      dst: '10.3.0.1/32',
      dev: 'mesh-t7',
    });
    assert.deepStrictEqual(
      parseRoute(6, { dst: 'default', gateway: 'fe80::1', dev: 'mesh-m3', table: '52003', metric: 1024 }),
      {
        family: 6,
        table: 52003,
        dst: 'default',
        dev: 'mesh-m3',
        via: 'fe80::1',
      },
    );
    assert.equal(parseRoute(4, { dst: '10.3.0.0/16', dev: 'eth0' }), undefined); // main
    assert.equal(parseRoute(4, { dst: '10.3.0.0/16', dev: 'eth0', table: '100' }), undefined);
    // A local route (TPROXY's table): numeric type, as `ip -N` prints it.
    assert.deepEqual(parseRoute(4, { type: '2', dst: 'default', dev: 'lo', table: '60192' }), {
      family: 4,
      table: 60192,
      dst: 'default',
      dev: 'lo',
      type: 'local',
    });
    assert.equal(parseRoute(4, { type: '3', dst: '10.9.9.9', dev: 'mesh-m9', table: '52001' }), undefined); // broadcast
    assert.equal(
      parseRoute(6, { dst: 'fe80::/64', dev: 'mesh-m3', table: '52001', protocol: '2' }),
      undefined,
    );
    assert.equal(parseRoute(4, { type: '6', dst: '10.0.0.0/8', table: '52011' }), undefined); // blackhole
    assert.equal(
      parseRoute(4, { dst: 'default', table: '52001', nexthops: [{ dev: 'a' }, { dev: 'b' }] }),
      undefined,
    );
  });

  it('parses owned links: kind, MTU, the MACVLAN parent by name or by index, its MAC', () => {
    const byIndex = new Map([[3, 'veth-x']]);
    const tun = { ifindex: 4, ifname: 'mesh-t7', mtu: 1380, linkinfo: { info_kind: 'tun' } };
    assert.deepStrictEqual(parseLink(tun, byIndex), { name: 'mesh-t7', kind: 'tun', mtu: 1380 });
    const mv = {
      ifindex: 5,
      ifname: 'mesh-m3',
      mtu: 1400,
      link: 'veth-x',
      linkinfo: { info_kind: 'macvlan' },
    };
    assert.deepStrictEqual(parseLink(mv, byIndex), {
      name: 'mesh-m3',
      kind: 'macvlan',
      parent: 'veth-x',
      mtu: 1400,
    });
    assert.deepStrictEqual(parseLink({ ...mv, address: '02:AB:cd:ef:01:23' }, byIndex), {
      name: 'mesh-m3',
      kind: 'macvlan',
      parent: 'veth-x',
      mac: '02:ab:cd:ef:01:23',
      mtu: 1400,
    });
    assert.deepStrictEqual(parseLink({ ...mv, link: undefined, link_index: 3 }, byIndex), {
      name: 'mesh-m3',
      kind: 'macvlan',
      parent: 'veth-x',
      mtu: 1400,
    });
    // Parent in another namespace: unknown (so it never equals a desired parent).
    assert.deepStrictEqual(parseLink({ ...mv, link: undefined, link_index: 3, link_netnsid: 0 }, byIndex), {
      name: 'mesh-m3',
      kind: 'macvlan',
      mtu: 1400,
    });
    assert.equal(parseLink({ ...tun, ifname: 'veth-x' }, byIndex), undefined);
    assert.equal(parseLink({ ...tun, linkinfo: { info_kind: 'veth' } }, byIndex), undefined);
  });

  it('parses a pacer from its end that paces: its rate from the alias; its peer is not a link', () => {
    const veth = { ifindex: 9, mtu: 65_535, linkinfo: { info_kind: 'veth' } };
    assert.deepStrictEqual(
      parseLink({ ...veth, ifname: 'mesh-p4', ifalias: 'mesh-agent-pacer-bps=10000000' }, new Map()),
      { name: 'mesh-p4', kind: 'pacer', mtu: 65_535, rateBps: 10_000_000 },
    );
    // Without the alias the rate is unknown, so it never equals a desired one (made again).
    assert.deepStrictEqual(parseLink({ ...veth, ifname: 'mesh-p4' }, new Map()), {
      name: 'mesh-p4',
      kind: 'pacer',
      mtu: 65_535,
    });
    assert.equal(parseLink({ ...veth, ifname: 'mesh-q4' }, new Map()), undefined);
  });

  it('parses addresses without the link-local ones', () => {
    const link = {
      ifindex: 5,
      ifname: 'mesh-m3',
      mtu: 1500,
      addr_info: [
        { family: 'inet', local: '10.91.2.50', prefixlen: 24 },
        { family: 'inet6', local: 'fd00:91:2::50', prefixlen: 64 },
        { family: 'inet6', local: 'fe80::1cd5:12ff:fe40:2436', prefixlen: 64 },
      ],
    };
    assert.deepStrictEqual(parseAddresses(link), [
      { dev: 'mesh-m3', cidr: '10.91.2.50/24' },
      { dev: 'mesh-m3', cidr: 'fd00:91:2::50/64' },
    ]);
  });

  it('keeps the body of the nft listing, lines trimmed', () => {
    const listing = 'table inet mesh_agent {\n\tchain c {\n\t\tcounter\n\t}\n\n\tchain d {\n\t}\n}\n';
    assert.equal(nftBody(listing), 'chain c {\ncounter\n}\nchain d {\n}');
  });

  it('has no TUN support unless given one', () => {
    assert.throws(() => new LinuxKernel().openTun('mesh-t1'), /no TUN support/);
  });
});
