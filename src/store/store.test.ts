import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { PeerRecord } from './records.js';
import { Store } from './store.js';

const T = '2026-01-01T00:00:00.000Z';
const peer = (id: string): PeerRecord => ({
  id,
  name: '',
  publicKey: `${id}-key`,
  address: `${id}:1`,
  isActive: true,
  version: 1,
  deactivatedAt: null,
  createdAt: T,
  updatedAt: T,
  vkey: '',
});
const open = () => new Store(join(mkdtempSync(join(tmpdir(), 'store-')), 'db'));

describe('Store reads from its snapshot', () => {
  it('sees every write at once', () => {
    const s = open();
    assert.equal(s.peer('a'), undefined);
    s.insertPeer(peer('a'));
    assert.equal(s.peer('a')?.id, 'a');
    s.updatePeer({ ...peer('a'), name: 'renamed', version: 2 });
    assert.equal(s.peer('a')?.name, 'renamed');
    s.deletePeer('a');
    assert.equal(s.peer('a'), undefined);
    s.close();
  });

  it('keeps nothing of a transaction that rolled back', () => {
    const s = open();
    s.insertPeer(peer('a'));
    assert.equal(s.peers().length, 1, 'snapshot built');
    assert.throws(() =>
      s.transaction(() => {
        s.insertPeer(peer('b'));
        assert.equal(s.peer('b')?.id, 'b', 'inside, the transaction sees its own write');
        throw new Error('abort');
      }),
    );
    assert.equal(s.peer('b'), undefined);
    assert.deepEqual(
      s.peers().map((p) => p.id),
      ['a'],
    );
    s.close();
  });

  it('cascades: deleting a peer removes its services and their routes from reads', () => {
    const s = open();
    s.insertPeer(peer('a'));
    s.insertPeer(peer('b'));
    s.insertService({
      id: 'svc',
      sourcePeerId: 'a',
      targetPeerId: 'b',
      transportType: 'tcp',
      requiresInterface: false,
      desiredIpv4Cidr: null,
      desiredIpv6Cidr: null,
      fullyTransparent: false,
      bandwidthLimitMbps: 0,
      version: 1,
      createdAt: T,
      updatedAt: T,
      vkey: '',
      createdStamp: '',
    });
    s.insertRoute({
      id: 7,
      serviceId: 'svc',
      priority: 1,
      sourceCidr: null,
      destCidr: '10.0.0.0/8',
      version: 1,
      createdAt: T,
      updatedAt: T,
      vkey: '',
    });
    assert.equal(s.routeCount('svc'), 1);
    assert.equal(s.serviceIdForPair('a', 'b'), 'svc');
    s.deletePeer('b');
    assert.equal(s.service('svc'), undefined);
    assert.equal(s.route(7), undefined);
    assert.equal(s.serviceCount(), 0);
    s.close();
  });
});
