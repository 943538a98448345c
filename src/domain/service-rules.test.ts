import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { ApiError } from './errors.js';
import { checkRoute, checkService, isServiceActive, type ServiceShape } from './service-rules.js';

const base: ServiceShape = {
  sourcePeerId: 'a',
  targetPeerId: 'b',
  transportType: 'tcp',
  requiresInterface: false,
  desiredIpv4Cidr: null,
  desiredIpv6Cidr: null,
  fullyTransparent: false,
};
const codeOf = (fn: () => unknown) => {
  try {
    fn();
    return 'ok';
  } catch (e) {
    return (e as ApiError).code;
  }
};

describe('checkService', () => {
  it('refuses invalid transparent combinations and same source and target', () => {
    assert.equal(
      codeOf(() => checkService({ ...base, fullyTransparent: true })),
      'INVALID_REQUEST',
    );
    assert.equal(
      codeOf(() =>
        checkService({ ...base, fullyTransparent: true, requiresInterface: true, transportType: 'kcp' }),
      ),
      'INVALID_REQUEST',
    );
    assert.equal(
      codeOf(() => checkService({ ...base, fullyTransparent: true, requiresInterface: true })),
      'ok',
    );
    assert.equal(
      codeOf(() => checkService({ ...base, targetPeerId: 'a' })),
      'INVALID_REQUEST',
    );
    assert.equal(
      codeOf(() => checkService({ ...base, transportType: 'udp' })),
      'INVALID_TRANSPORT',
    );
  });
  it('checks interface addresses by family and needs an interface for them', () => {
    assert.equal(
      codeOf(() => checkService({ ...base, desiredIpv4Cidr: '192.0.2.1/24' })),
      'INVALID_REQUEST',
    );
    const ok = checkService({ ...base, requiresInterface: true, desiredIpv6Cidr: '2001:DB8::1/64' });
    assert.equal(ok.desiredIpv6Cidr, '2001:db8::1/64');
    assert.equal(
      codeOf(() => checkService({ ...base, requiresInterface: true, desiredIpv4Cidr: '2001:db8::1/64' })),
      'INVALID_REQUEST',
    );
  });
});

describe('checkRoute', () => {
  it('needs one CIDR, a priority in range and one family', () => {
    assert.equal(
      codeOf(() => checkRoute({ priority: 0, sourceCidr: null, destCidr: null })),
      'INVALID_REQUEST',
    );
    assert.equal(
      codeOf(() => checkRoute({ priority: 65536, sourceCidr: null, destCidr: '10.0.0.0/8' })),
      'INVALID_REQUEST',
    );
    assert.equal(
      codeOf(() => checkRoute({ priority: -1, sourceCidr: null, destCidr: '10.0.0.0/8' })),
      'INVALID_REQUEST',
    );
    assert.equal(
      codeOf(() => checkRoute({ priority: 1, sourceCidr: '10.0.0.0/8', destCidr: '::/0' })),
      'INVALID_CIDR',
    );
    assert.equal(
      codeOf(() => checkRoute({ priority: 1, sourceCidr: null, destCidr: '10.0.0.1/8' })),
      'INVALID_CIDR',
    );
    assert.deepEqual(checkRoute({ priority: 7, sourceCidr: null, destCidr: '2001:DB8::/32' }), {
      priority: 7,
      sourceCidr: null,
      destCidr: '2001:db8::/32',
    });
  });
});

describe('isServiceActive', () => {
  it('is true only while both the source and the target peer are active', () => {
    assert.equal(isServiceActive(base, new Set(['a', 'b', 'c'])), true);
    assert.equal(isServiceActive(base, new Set(['a'])), false);
    assert.equal(isServiceActive(base, new Set(['b'])), false);
    assert.equal(isServiceActive(base, new Set()), false);
  });
});
