import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { newClientSecret, newRouteId, peerIdFromPublicKey } from './ids.js';

describe('ids', () => {
  it('route ids stay within [1, 2^53 - 1] even for extreme random bytes', () => {
    assert.equal(
      newRouteId(() => Buffer.alloc(8, 0xff)),
      Number.MAX_SAFE_INTEGER,
    );
    let calls = 0;
    const id = newRouteId(() => (calls++ === 0 ? Buffer.alloc(8, 0) : Buffer.from([0, 0, 0, 0, 0, 0, 0, 7])));
    assert.equal(id, 7, 'zero is redrawn');
    for (let i = 0; i < 1000; i++) {
      const r = newRouteId();
      assert.ok(Number.isSafeInteger(r) && r >= 1);
    }
  });
  it('client secrets carry 32 random bytes', () => {
    assert.equal(Buffer.from(newClientSecret(), 'base64url').length, 32);
  });
  it('peer ids are derived from the public key', () => {
    const key = Buffer.alloc(32, 1);
    assert.equal(peerIdFromPublicKey(key), peerIdFromPublicKey(Buffer.from(key)));
    assert.notEqual(peerIdFromPublicKey(key), peerIdFromPublicKey(Buffer.alloc(32, 2)));
  });
});
