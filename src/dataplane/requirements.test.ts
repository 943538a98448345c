import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { forwardingProblems, hasNetAdmin, pacingVerdict } from './requirements.js';

describe('data plane host requirements', () => {
  it('reads CAP_NET_ADMIN (bit 12) from the effective set', () => {
    assert.equal(hasNetAdmin('CapEff:\t0000000000001000\n'), true);
    assert.equal(hasNetAdmin('CapEff:\t000001ffffffffff\n'), true);
    assert.equal(hasNetAdmin('CapEff:\t0000000000000fff\n'), false);
    assert.equal(hasNetAdmin('CapInh:\t0000000000001000\n'), false);
  });

  it('names forwarding that is off, with the command that turns it on', () => {
    assert.deepEqual(forwardingProblems({ ipv4Forward: '1\n', ipv6Forward: '1' }), []);
    const off = forwardingProblems({ ipv4Forward: '0\n', ipv6Forward: '0' });
    assert.equal(off.length, 2);
    assert.match(off[0]!, /sysctl -w net\.ipv4\.ip_forward=1/);
    assert.match(off[1]!, /sysctl -w net\.ipv6\.conf\.all\.forwarding=1/);
    // Unreadable (no IPv6 in this kernel): nothing to say.
    assert.deepEqual(forwardingProblems({ ipv4Forward: '1', ipv6Forward: null }), []);
  });

  it('names strict reverse-path filtering on all or default, not loose or off', () => {
    const base = { ipv4Forward: '1', ipv6Forward: '1' };
    assert.deepEqual(forwardingProblems({ ...base, rpFilterAll: '0', rpFilterDefault: '2\n' }), []);
    const strict = forwardingProblems({ ...base, rpFilterAll: '0', rpFilterDefault: '1\n' });
    assert.equal(strict.length, 1);
    assert.match(
      strict[0]!,
      /net\.ipv4\.conf\.default\.rp_filter is 1.*sysctl -w net\.ipv4\.conf\.default\.rp_filter=2/,
    );
    assert.equal(forwardingProblems({ ...base, rpFilterAll: '1', rpFilterDefault: '1' }).length, 2);
  });
});

describe('pacingVerdict', () => {
  const host = { ipv4Forward: '1\n', ipv6Forward: '1\n', rpFilterAll: '2\n', earlyDemux: '1\n' };

  it('paces the families the host forwards, turning early demux off when it is on', () => {
    assert.deepEqual(pacingVerdict(host), {
      families: new Set([4, 6]),
      reason: null,
      turnOffEarlyDemux: true,
    });
    assert.deepEqual(pacingVerdict({ ...host, ipv6Forward: '0', earlyDemux: '0' }), {
      families: new Set([4]),
      reason: null,
      turnOffEarlyDemux: false,
    });
    assert.deepEqual(pacingVerdict({ ...host, ipv4Forward: null, rpFilterAll: '0' }).families, new Set([6]));
  });

  it('paces nothing, and says why, where the host would drop what a pacer sends', () => {
    for (const [values, why] of [
      [{ ipv4Forward: '0', ipv6Forward: null }, /forwarding is off/],
      [{ rpFilterAll: '1' }, /rp_filter is 1 \(strict\).*sysctl -w net\.ipv4\.conf\.all\.rp_filter=2/],
      [{ earlyDemux: null }, /tcp_early_demux is missing, not 0 or 1/],
      [{ earlyDemux: '2' }, /tcp_early_demux is 2, not 0 or 1/],
    ] as const) {
      const v = pacingVerdict({ ...host, ...values });
      assert.equal(v.families.size, 0, JSON.stringify(values));
      assert.match(v.reason ?? '', why);
      assert.equal(v.turnOffEarlyDemux, false, 'nothing is changed for a host that will not pace');
    }
  });
});
