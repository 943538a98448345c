import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import Database from 'better-sqlite3';
import { serviceRecord } from '../../test/helpers/service-record.js';
import type { PeerRecord, ServiceRecord } from './records.js';
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
const service = (id: string, over: Partial<ServiceRecord> = {}): ServiceRecord =>
  serviceRecord({ id, sourcePeerId: 'a', targetPeerId: 'b', ...over });

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
    s.insertService(service('svc'));
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

  it('keeps the tables a write did not touch, and rereads the ones it did', () => {
    const s = open();
    s.insertPeer(peer('a'));
    s.insertPeer(peer('b'));
    const peers = s.peers();
    const keys = s.clusterSecrets();
    s.insertService(service('svc'));
    assert.equal(s.peers(), peers, 'a service write rereads the peers');
    assert.equal(s.clusterSecrets(), keys, 'a service write rereads the cluster keys');
    const key = (kid: string, validUntil: string | null) => ({
      kid,
      version: 1,
      clientId: 'cluster',
      secretHash: Buffer.alloc(32, kid.charCodeAt(0)),
      rotatedBy: 'a',
      rotatedAt: T,
      validUntil,
      replicated: true,
    });
    s.insertClusterSecret(key('k1', null));
    assert.deepEqual(
      s.clusterSecrets().map((k) => k.kid),
      ['k1'],
    );
    s.rotateClusterSecret({ ...key('k2', null), version: 2 }, 'k1', '2026-01-02T00:00:00.000Z', 'v2');
    assert.deepEqual(
      s.clusterSecrets().map((k) => [k.kid, k.validUntil]),
      [
        ['k2', null],
        ['k1', '2026-01-02T00:00:00.000Z'],
      ],
    );
    s.deleteExpiredClusterSecrets('2026-01-03T00:00:00.000Z');
    assert.deepEqual(
      s.clusterSecrets().map((k) => k.kid),
      ['k2'],
    );
    // A cascade rereads what it reached: the peer's services and their routes.
    assert.equal(s.serviceCount(), 1);
    s.deletePeer('b');
    assert.equal(s.serviceCount(), 0);
    assert.equal(s.service('svc'), undefined);
    assert.equal(s.peers().length, 1);
    s.close();
  });

  it('keeps health_check as canonical JSON through insert, update and upsert, and after a reopen', () => {
    const file = join(mkdtempSync(join(tmpdir(), 'store-')), 'db');
    const s = new Store(file);
    s.insertPeer(peer('a'));
    s.insertPeer(peer('b'));
    s.insertService(service('svc', { healthCheck: { tcp: '10.1.2.3:443', interval_ms: 1000, failures: 3 } }));
    // Keys out of order: the store writes the canonical order whatever it is given.
    s.updateService(
      service('svc', {
        healthCheck: { failures: 2, interval_ms: 500, icmp: 'fd00::1' } as ServiceRecord['healthCheck'],
      }),
    );
    s.close();
    const raw = new Database(file, { readonly: true });
    assert.deepEqual(raw.prepare('SELECT health_check FROM services').all(), [
      { health_check: '{"icmp":"fd00::1","interval_ms":500,"failures":2}' },
    ]);
    raw.close();
    const again = new Store(file);
    assert.deepEqual(again.service('svc')?.healthCheck, { icmp: 'fd00::1', interval_ms: 500, failures: 2 });
    again.upsertService(service('svc', { version: 2 }));
    assert.equal(again.service('svc')?.healthCheck, null);
    again.close();
    assert.equal(new Store(file).service('svc')?.healthCheck, null);
  });
});

describe('Store tells its write listeners', () => {
  it('after each write outside a transaction', () => {
    const s = open();
    let told = 0;
    s.onWrite(() => told++);
    s.insertPeer(peer('a'));
    s.updatePeer({ ...peer('a'), name: 'renamed', version: 2 });
    assert.equal(told, 2);
    s.close();
  });

  it('once per transaction, when the outermost ends, seeing only committed writes', () => {
    // A gossip merge of 1,000 routes is one transaction: told per write, the data plane read
    // every route 1,000 times, and read writes that might yet roll back.
    const s = open();
    const seen: string[][] = [];
    s.onWrite(() => {
      assert.equal(s.db.inTransaction, false, 'told inside a transaction');
      seen.push(s.peers().map((p) => p.id));
    });
    s.transaction(() => {
      for (const id of ['a', 'b', 'c']) s.insertPeer(peer(id));
      s.transaction(() => s.insertPeer(peer('d')));
    });
    assert.deepEqual(seen, [['a', 'b', 'c', 'd']]);
    s.transaction(() => s.peers());
    assert.equal(seen.length, 1, 'a transaction that wrote nothing tells nobody');
    s.close();
  });
});
