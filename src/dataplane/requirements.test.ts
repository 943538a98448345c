import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { forwardingProblems, hasNetAdmin } from './requirements.js';

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
