import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { Store } from './store.js';
import { MAX_COUNTED, progressOf } from './webhook-table.js';

const open = () => new Store(join(mkdtempSync(join(tmpdir(), 'webhook-table-')), 'db'));
const T = '2026-01-01T00:00:00.000Z';

function record(store: Store, types: string[]): void {
  store.transaction(() => {
    types.forEach((type, i) => {
      store.eventTable.insert({
        id: `e${store.eventTable.lastSeq() + 1}-${i}`,
        type,
        time: T,
        actor: { client_id: null, agent: 'a' },
        resource: { kind: 'x', id: String(i) },
        data: {},
      });
    });
  });
}

describe('WebhookTable queues', () => {
  it('reads an endpoint queue after its cursor, by type prefix, in seq order', () => {
    const store = open();
    record(store, ['peer.added', 'service.created', 'peer.removed', 'route.created', 'service.deleted']);
    const t = store.webhookTable;
    const seqs = (types: string[], cursor = 0) => t.queued(cursor, types, 10).map((q) => q.seq);
    assert.deepEqual(seqs([]), [1, 2, 3, 4, 5]);
    assert.deepEqual(seqs(['peer.']), [1, 3]);
    assert.deepEqual(seqs(['service.created', 'route']), [2, 4]);
    assert.deepEqual(seqs(['peer.', 'service.'], 2), [3, 5]);
    assert.deepEqual(seqs(['nothing.']), []);
    assert.equal(t.queued(0, [], 2).length, 2);
    assert.equal(t.queued(0, [], 1)[0]?.time, T);
    assert.equal(t.queuedCount(0, ['peer.', 'service.']), 4);
    assert.equal(t.queuedCount(3, ['peer.', 'service.']), 1);
    store.close();
  });

  it('counts pending events up to its cap, whatever the filter', () => {
    const store = open();
    record(
      store,
      Array.from({ length: MAX_COUNTED + 50 }, (_, i) => (i % 2 ? 'peer.added' : 'service.created')),
    );
    const t = store.webhookTable;
    assert.equal(t.queuedCount(0, []), MAX_COUNTED);
    assert.equal(t.queuedCount(0, ['peer.', 'service.']), MAX_COUNTED);
    assert.equal(t.queuedCount(0, ['peer.']), (MAX_COUNTED + 50) / 2);
    assert.equal(t.queuedCount(MAX_COUNTED, []), 50);
    store.close();
  });

  it('keeps an endpoint and its progress across a reopen, and forgets it when deleted', () => {
    const dir = mkdtempSync(join(tmpdir(), 'webhook-table-'));
    let store = new Store(join(dir, 'db'));
    const base = { id: 'wh_1', url: 'http://127.0.0.1/', types: ['peer.'], secret: 'whsec_x', createdAt: T };
    store.webhookTable.insert({ ...base, cursor: 7 });
    const progress = progressOf(store.webhookTable.get('wh_1')!);
    assert.equal(store.webhookTable.saveProgress('wh_1', { ...progress, cursor: 9, failures: 2 }), true);
    store.close();
    store = new Store(join(dir, 'db'));
    const w = store.webhookTable.get('wh_1');
    assert.deepEqual([w?.cursor, w?.failures, w?.types], [9, 2, ['peer.']]);
    assert.equal(store.webhookTable.delete('wh_1'), true);
    assert.equal(store.webhookTable.saveProgress('wh_1', { ...progress, cursor: 10 }), false);
    assert.equal(store.webhookTable.delete('wh_1'), false);
    store.close();
  });
});
