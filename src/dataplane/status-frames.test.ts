import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  decodeServiceStatus,
  encodeServiceStatus,
  KIND_SERVICE_STATUS,
  type ServiceStatus,
} from './status-frames.js';

const ID = '5e5e5e5e-0000-4000-8000-0000000000be';

describe('service status frames (tunnel message kind 9)', () => {
  it('round-trips every combination of known, passing and unknown', () => {
    for (const canForward of [null, true, false])
      for (const probePassing of [null, true, false]) {
        const s: ServiceStatus = {
          serviceId: ID,
          canForward,
          probePassing,
          detail: canForward ? '' : 'no route to 10.1.2.0/24',
        };
        const m = encodeServiceStatus(s);
        assert.equal(m[0], KIND_SERVICE_STATUS);
        assert.deepEqual(decodeServiceStatus(m), { kind: 'status', ...s });
      }
  });

  it('the wire layout: kind, 16 id bytes, flags, detail', () => {
    const m = encodeServiceStatus({ serviceId: ID, canForward: true, probePassing: false, detail: 'x' });
    assert.equal(m.toString('hex'), `09${ID.replaceAll('-', '')}0778`);
  });

  it('cuts a long detail at 200 bytes; refuses what is short, too long or not kind 9', () => {
    const long = encodeServiceStatus({
      serviceId: ID,
      canForward: false,
      probePassing: null,
      detail: 'é'.repeat(150),
    });
    assert.equal(long.length, 18 + 200);
    const decoded = decodeServiceStatus(long);
    assert.equal(decoded.kind, 'status');
    assert.equal(decoded.kind === 'status' && Buffer.byteLength(decoded.detail), 200);
    assert.equal(decodeServiceStatus(long.subarray(0, 17)).kind, 'malformed');
    assert.equal(decodeServiceStatus(Buffer.concat([long, Buffer.from('!')])).kind, 'malformed');
    assert.equal(decodeServiceStatus(Buffer.from([1, ...long.subarray(1)])).kind, 'malformed');
  });

  it('ignores flag bits it does not know', () => {
    const m = encodeServiceStatus({ serviceId: ID, canForward: true, probePassing: null, detail: '' });
    m[17] = m[17]! | 0xf0;
    assert.deepEqual(decodeServiceStatus(m), {
      kind: 'status',
      serviceId: ID,
      canForward: true,
      probePassing: null,
      detail: '',
    });
  });
});
