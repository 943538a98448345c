import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { canonicalCidr, canonicalDst, canonicalNft, canonicalSelector, canonicalState } from './canonical.js';
import type { KernelState } from './port.js';

describe('canonical forms', () => {
  it('writes addresses the way the kernel prints them, always with a prefix', () => {
    assert.equal(canonicalCidr('10.0.0.1'), '10.0.0.1/32');
    assert.equal(canonicalCidr('10.91.2.50/24'), '10.91.2.50/24');
    assert.equal(canonicalCidr('FD00:0091:0002:0000:0000:0000:0000:0050/64'), 'fd00:91:2::50/64');
    assert.equal(canonicalCidr('fd00:0:0:1:0:0:0:1'), 'fd00:0:0:1::1/128');
    assert.equal(canonicalCidr('fd00:1:0:1:1:1:1:1/64'), 'fd00:1:0:1:1:1:1:1/64');
    assert.equal(canonicalCidr('not an address'), 'not an address');
  });

  it('drops /0 rule selectors (the kernel’s `all`) and keeps host bits', () => {
    assert.equal(canonicalSelector('0.0.0.0/0'), undefined);
    assert.equal(canonicalSelector('::/0'), undefined);
    assert.equal(canonicalSelector('all'), undefined);
    assert.equal(canonicalSelector('10.1.2.3/16'), '10.1.2.3/16');
  });

  it('names /0 destinations default and clears IPv6 host bits only', () => {
    assert.equal(canonicalDst('0.0.0.0/0'), 'default');
    assert.equal(canonicalDst('::/0'), 'default');
    assert.equal(canonicalDst('fd04::5/64'), 'fd04::/64');
    assert.equal(canonicalDst('10.2.3.4/16'), '10.2.3.4/16'); // the kernel refuses it; left as given
    assert.equal(canonicalDst('10.3.0.1'), '10.3.0.1/32');
  });

  it('trims nft lines and drops blank ones', () => {
    assert.equal(canonicalNft('\n  chain c {\n\n\t counter \n  }\n'), 'chain c {\ncounter\n}');
    assert.equal(canonicalNft(null), null);
  });

  it('makes two writings of one state deep-equal', () => {
    const a: KernelState = {
      links: [
        { name: 'mesh-t1', kind: 'tun', mtu: 1400, parent: undefined },
        { name: 'mesh-m1', kind: 'macvlan', parent: 'eth0', mtu: 1500 },
      ],
      addresses: [{ dev: 'mesh-m1', cidr: 'FD00::1/64' }],
      rules: [
        { family: 6, pref: 22000, table: 254, from: '::/0', to: 'fd00::5' },
        { family: 4, pref: 21000, table: 'main', fwmark: { value: -1, mask: 0xffffffff } },
      ],
      routes: [{ family: 4, table: 52001, dst: '0.0.0.0/0', dev: 'mesh-t1', via: undefined }],
      nft: '  chain c {\n  }',
    };
    const b: KernelState = {
      links: [
        { name: 'mesh-m1', kind: 'macvlan', parent: 'eth0', mtu: 1500 },
        { name: 'mesh-t1', kind: 'tun', mtu: 1400 },
      ],
      addresses: [{ dev: 'mesh-m1', cidr: 'fd00::1/64' }],
      rules: [
        { family: 4, pref: 21000, table: 'main', fwmark: { value: 0xffffffff, mask: 0xffffffff } },
        { family: 6, pref: 22000, table: 'main', to: 'fd00::5/128' },
      ],
      routes: [{ family: 4, table: 52001, dst: 'default', dev: 'mesh-t1' }],
      nft: 'chain c {\n}',
    };
    assert.deepStrictEqual(canonicalState(a), canonicalState(b));
    assert.notDeepStrictEqual(canonicalState(a), canonicalState({ ...b, nft: null }));
  });

  it('sorts rules by family, then pref, then selectors', () => {
    const s = canonicalState({
      links: [],
      addresses: [],
      routes: [],
      nft: null,
      rules: [
        { family: 6, pref: 1, table: 1 },
        { family: 4, pref: 100, table: 1 },
        { family: 4, pref: 20, table: 1, to: '10.0.0.2/32' },
        { family: 4, pref: 20, table: 1, to: '10.0.0.1/32' },
      ],
    });
    assert.deepStrictEqual(
      s.rules.map((r) => `${r.family}/${r.pref}/${r.to ?? ''}`),
      ['4/20/10.0.0.1/32', '4/20/10.0.0.2/32', '4/100/', '6/1/'],
    );
  });
});
