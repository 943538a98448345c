import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  decodeLinks,
  decodeRoutes,
  decodeRules,
  NetlinkError,
  replies,
  routeGetRequest,
} from './rtnetlink.js';

// Replies built here as the kernel lays them out; test/dataplane/kernel-port.root.test.ts reads
// the real kernel through the same code.
const attr = (type: number, value: Buffer) => {
  const head = Buffer.alloc(4);
  head.writeUInt16LE(4 + value.length, 0);
  head.writeUInt16LE(type, 2);
  return Buffer.concat([head, value, Buffer.alloc((4 - (value.length % 4)) % 4)]);
};
const u32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n, 0);
  return b;
};
const msg = (type: number, body: Buffer) => {
  const h = Buffer.alloc(16);
  h.writeUInt32LE(16 + body.length, 0);
  h.writeUInt16LE(type, 4);
  return Buffer.concat([h, body]);
};
const done = msg(3, Buffer.alloc(4));

describe('rtnetlink', () => {
  it('reads a link with its kind and alias (a pacer keeps its rate there)', () => {
    const info = Buffer.alloc(16);
    info.writeInt32LE(9, 4); // ifindex
    info.writeUInt32LE(0x1 | 0x40, 8); // IFF_UP | IFF_RUNNING
    const body = Buffer.concat([
      info,
      attr(3, Buffer.from('mesh-p4\0')),
      attr(4, u32(65_535)),
      attr(18, attr(1, Buffer.from('veth\0'))),
      attr(20, Buffer.from('mesh-agent-pacer-bps=10000000\0')),
    ]);
    const [link] = decodeLinks(Buffer.concat([msg(16, body), done]));
    assert.equal(link!.ifname, 'mesh-p4');
    assert.equal(link!.mtu, 65_535);
    assert.deepEqual(link!.linkinfo, { info_kind: 'veth' });
    assert.equal(link!.ifalias, 'mesh-agent-pacer-bps=10000000');
  });

  it('asks a route lookup as `ip route get fibmatch` does: addresses, iif by index, mark', () => {
    const m = routeGetRequest({ dst: '10.1.2.3', from: '10.9.0.1', iifIndex: 7, mark: 0x10 });
    assert.equal(m.readUInt32LE(0), m.length);
    assert.equal(m.readUInt16LE(4), 26); // RTM_GETROUTE
    assert.equal(m.readUInt8(16), 2); // AF_INET
    assert.equal(m.readUInt8(17), 32); // dst_len
    assert.equal(m.readUInt8(18), 32); // src_len
    assert.equal(m.readUInt32LE(24), 0x2000); // RTM_F_FIB_MATCH
    assert.deepEqual(
      [...m.subarray(28)],
      [
        ...attr(1, Buffer.from([10, 1, 2, 3])),
        ...attr(2, Buffer.from([10, 9, 0, 1])),
        ...attr(3, u32(7)),
        ...attr(16, u32(0x10)),
      ],
    );
    assert.throws(() => routeGetRequest({ dst: '10.1.2.3', from: 'fd00::1' }), /no source/);
  });

  it('reads rules as `ip -N -j rule show` prints them', () => {
    const hdr = Buffer.alloc(12);
    hdr.writeUInt8(2, 0);
    hdr.writeUInt8(24, 1); // dst_len
    hdr.writeUInt8(1, 7); // FR_ACT_TO_TBL
    const body = Buffer.concat([
      hdr,
      attr(6, u32(22000)),
      attr(1, Buffer.from([10, 91, 2, 0])),
      attr(3, Buffer.from('mesh-t1\0')),
      attr(10, u32(0x10000)),
      attr(16, u32(0xfff0000)),
      attr(15, u32(52001)),
    ]);
    assert.deepStrictEqual(decodeRules(Buffer.concat([msg(32, body), done])), [
      {
        priority: 22000,
        dst: '10.91.2.0',
        dstlen: 24,
        iif: 'mesh-t1',
        fwmark: '0x10000',
        fwmask: '0xfff0000',
        table: '52001',
      },
    ]);
  });

  it('reads a matched route with its device by name; a refused lookup is a NetlinkError', () => {
    const hdr = Buffer.alloc(12);
    hdr.writeUInt8(10, 0); // AF_INET6
    hdr.writeUInt8(0, 1); // a default route
    hdr.writeUInt8(254, 4);
    hdr.writeUInt8(3, 5); // proto boot
    hdr.writeUInt8(1, 7); // unicast
    const body = Buffer.concat([hdr, attr(4, u32(3)), attr(15, u32(254))]);
    assert.deepStrictEqual(decodeRoutes(msg(24, body), new Map([[3, 'd0']]), 'get'), [
      { type: 'unicast', dst: '::/0', table: '254', protocol: '3', dev: 'd0' },
    ]);
    const refused = Buffer.alloc(4);
    refused.writeInt32LE(-101, 0); // ENETUNREACH
    assert.throws(
      () => replies(msg(2, refused), 'route get'),
      (e) => e instanceof NetlinkError && e.errno === 101,
    );
  });
});
