import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { isoTime, ManualClock } from '../domain/clock.js';
import { Store } from '../store/store.js';
import {
  CLUSTER_SECRET_GRACE_MS,
  ClusterCredential,
  hashClusterSecret,
  keyId,
} from './cluster-credential.js';
import { encodeStamp } from './hlc.js';
import { makeVkey } from './replicated-records.js';

/** The actor of the writes these tests make (docs/events.md). */
const BY = { client_id: null, agent: 'test' };

function setup() {
  const clock = new ManualClock();
  const store = new Store(join(mkdtempSync(join(tmpdir(), 'cc-')), 'db'));
  store.insertClusterSecret({
    kid: keyId(hashClusterSecret('first')),
    replicated: true,
    version: 1,
    clientId: 'mcc_x',
    secretHash: hashClusterSecret('first'),
    rotatedBy: 'p1',
    rotatedAt: isoTime(clock.now()),
    validUntil: null,
  });
  return {
    clock,
    store,
    cc: new ClusterCredential(store, clock, {
      nextVkey: () => makeVkey(0, 1, encodeStamp({ wall: clock.now(), counter: 0, origin: 'p1' })),
      change: (_key, _actor, write) => store.transaction(write),
    }),
  };
}

describe('ClusterCredential', () => {
  it('rotation raises the version by one and makes the new secret work at once', () => {
    const { cc, store } = setup();
    const r = cc.rotate('p2', BY);
    assert.equal(r.version, 2);
    assert.equal(r.rotated_by, 'p2');
    assert.equal(cc.accepts('mcc_x', r.client_secret), true);
    assert.deepEqual(cc.current(), {
      client_id: 'mcc_x',
      version: 2,
      rotated_by: 'p2',
      rotated_at: r.rotated_at,
    });
    store.close();
  });

  it('keeps the previous secret for 24 hours, then refuses it', () => {
    const { cc, clock, store } = setup();
    cc.rotate('p1', BY);
    clock.advance(CLUSTER_SECRET_GRACE_MS - 1);
    assert.equal(cc.accepts('mcc_x', 'first'), true);
    clock.advance(1);
    assert.equal(cc.accepts('mcc_x', 'first'), false);
    store.close();
  });

  it('refuses a wrong secret or client id', () => {
    const { cc, store } = setup();
    assert.equal(cc.accepts('mcc_x', 'second'), false);
    assert.equal(cc.accepts('mcc_y', 'first'), false);
    store.close();
  });
});
