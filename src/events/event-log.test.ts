import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { ManualClock } from '../domain/clock.js';
import { Store } from '../store/store.js';
import { EventLog, type MeshEvent, type NewEvent } from './event-log.js';

const AGENT = 'agent-a';
const dbFile = () => join(mkdtempSync(join(tmpdir(), 'events-')), 'db');
const open = (file = dbFile()) => {
  const store = new Store(file);
  return { store, log: new EventLog(store, AGENT, new ManualClock()), file };
};
const ev = (type: string, resource = 'r1', over: Partial<NewEvent> = {}): NewEvent => ({
  type,
  resource: { kind: type.split('.')[0]!, id: resource },
  data: { n: 1 },
  ...over,
});
const seqs = (events: readonly MeshEvent[]) => events.map((e) => e.seq);

describe('EventLog', () => {
  it('records with defaults: this agent as actor, a UUID, the clock as RFC 3339 with ms', () => {
    const { store, log } = open();
    const e = log.record(ev('service.created', 'svc-1'));
    assert.equal(e.seq, 1);
    assert.match(e.id, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    assert.equal(e.time, '2026-01-01T00:00:00.000Z');
    assert.deepEqual(e.actor, { client_id: null, agent: AGENT });
    assert.deepEqual(e.resource, { kind: 'service', id: 'svc-1' });
    assert.deepEqual(log.after(0), [e]);
    store.close();
  });

  it('never reuses a seq: not after deleting the newest, not across a reopen', () => {
    const { store, log, file } = open();
    for (let i = 0; i < 5; i++) log.record(ev('peer.added'));
    assert.equal(log.lastSeq(), 5);
    // Deleting every event (retention can) must not hand 1..5 out again.
    assert.equal(store.eventTable.deleteUpTo(5, 100), 5);
    assert.equal(log.oldestSeq(), undefined);
    assert.equal(log.lastSeq(), 5);
    assert.equal(log.record(ev('peer.added')).seq, 6);
    store.close();
    const again = open(file);
    assert.equal(again.log.lastSeq(), 6);
    assert.equal(again.log.record(ev('peer.removed')).seq, 7);
    assert.deepEqual(seqs(again.log.after(0)), [6, 7]);
    again.store.close();
  });

  it('keeps a given id once: recording it again returns the kept event and tells nobody', () => {
    const { store, log } = open();
    const heard: MeshEvent[] = [];
    log.subscribe((e) => heard.push(e));
    const first = log.record(ev('route.created', '7', { id: 'change-1' }));
    const second = log.record(ev('route.created', '7', { id: 'change-1', data: { other: true } }));
    assert.deepEqual(second, first);
    assert.deepEqual(seqs(heard), [1]);
    assert.equal(log.lastSeq(), 1);
    store.close();
  });

  it('filters by type prefix and exact resource, and limits', () => {
    const { store, log } = open();
    log.record(ev('peer.added', 'p1'));
    log.record(ev('peer.renamed', 'p1'));
    log.record(ev('peering.odd', 'p1'));
    log.record(ev('service.created', 's1'));
    log.record(ev('peer.removed', 'p2'));
    assert.deepEqual(seqs(log.after(0, { type: 'peer.' })), [1, 2, 5]);
    assert.deepEqual(seqs(log.after(0, { type: 'peer' })), [1, 2, 3, 5]);
    assert.deepEqual(seqs(log.after(0, { type: 'peer.renamed' })), [2]);
    assert.deepEqual(seqs(log.after(0, { resource: 'p1' })), [1, 2, 3]);
    assert.deepEqual(seqs(log.after(0, { resource: 'p' })), []);
    assert.deepEqual(seqs(log.after(0, { type: 'peer.', resource: 'p1' })), [1, 2]);
    assert.deepEqual(seqs(log.after(1, { type: 'peer.', limit: 1 })), [2]);
    assert.deepEqual(seqs(log.after(2, { limit: 2 })), [3, 4]);
    assert.deepEqual(seqs(log.after(5)), []);
    assert.throws(() => log.after(0, { limit: 0 }), RangeError);
    assert.throws(() => log.after(0, { limit: 1001 }), RangeError);
    assert.equal(log.after(0, { limit: 1000 }).length, 5);
    store.close();
  });

  it('refuses a type that is not <resource>.<what>', () => {
    const { store, log } = open();
    for (const bad of ['created', 'Service.created', 'service.', 'service created', '']) {
      assert.throws(() => log.record(ev(bad)), /not <resource>.<what>/, bad);
    }
    assert.equal(log.lastSeq(), 0);
    store.close();
  });

  it('tells subscribers once per event, in seq order, including events a listener records', () => {
    const { store, log } = open();
    const a: number[] = [];
    const b: number[] = [];
    log.subscribe((e) => {
      a.push(e.seq);
      if (e.type === 'peer.added') log.record(ev('peer.noticed'));
    });
    const unsubscribe = log.subscribe((e) => b.push(e.seq));
    log.record(ev('peer.added'));
    log.record(ev('service.created'));
    assert.deepEqual(a, [1, 2, 3]);
    assert.deepEqual(b, [1, 2, 3]);
    unsubscribe();
    log.record(ev('service.deleted'));
    assert.deepEqual(b, [1, 2, 3]);
    assert.deepEqual(a, [1, 2, 3, 4]);
    store.close();
  });

  it('inside a transaction: tells after the commit, and nothing of one that rolled back', () => {
    const { store, log } = open();
    const heard: number[] = [];
    log.subscribe((e) => heard.push(e.seq));
    store.transaction(() => {
      log.record(ev('service.created'));
      log.record(ev('route.created'));
      assert.deepEqual(heard, [], 'not before the commit');
    });
    assert.deepEqual(heard, [1, 2]);
    assert.throws(() =>
      store.transaction(() => {
        log.record(ev('service.deleted'));
        throw new Error('refused');
      }),
    );
    assert.deepEqual(heard, [1, 2]);
    assert.deepEqual(seqs(log.after(0)), [1, 2], 'the rolled-back event is not kept');
    // A nested transaction (a savepoint) that rolls back inside one that commits.
    store.transaction(() => {
      log.record(ev('peer.added'));
      assert.throws(() =>
        store.transaction(() => {
          log.record(ev('peer.removed'));
          throw new Error('inner refused');
        }),
      );
      log.record(ev('peer.renamed'));
    });
    const kept = log.after(0);
    assert.deepEqual(
      kept.map((e) => e.type),
      ['service.created', 'route.created', 'peer.added', 'peer.renamed'],
    );
    assert.deepEqual(heard, seqs(kept));
    store.close();
  });

  it('a listener that throws does not stop the others or undo the event', () => {
    const store = new Store(dbFile());
    const errors: unknown[] = [];
    const log = new EventLog(store, AGENT, new ManualClock(), (err) => errors.push(err));
    const heard: number[] = [];
    log.subscribe(() => {
      throw new Error('listener broke');
    });
    log.subscribe((e) => heard.push(e.seq));
    log.record(ev('peer.added'));
    assert.deepEqual(heard, [1]);
    assert.equal(errors.length, 1);
    assert.equal(log.after(0).length, 1);
    store.close();
  });

  it('retention deletes by seq and by time in batches, oldest first', () => {
    const store = new Store(dbFile());
    const clock = new ManualClock(Date.UTC(2026, 0, 1));
    const log = new EventLog(store, AGENT, clock);
    for (let i = 0; i < 10; i++) {
      log.record(ev('peer.added'));
      clock.advance(1000);
    }
    assert.equal(store.eventTable.deleteUpTo(4, 3), 3);
    assert.equal(log.oldestSeq(), 4);
    assert.equal(store.eventTable.deleteUpTo(4, 3), 1);
    assert.equal(log.oldestSeq(), 5);
    // Events 1..10 are at 0 s..9 s: before 7 s are 1..7, of which 5..7 are left.
    assert.equal(store.eventTable.deleteBefore('2026-01-01T00:00:07.000Z', 100), 3);
    assert.deepEqual(seqs(log.after(0)), [8, 9, 10]);
    store.close();
  });

  it('retention by age walks from the oldest seq and stops at the first event not old enough', () => {
    const store = new Store(dbFile());
    const log = new EventLog(store, AGENT, new ManualClock());
    // A replicated change keeps its origin's time: seq 2 was learned late, with an older time.
    for (const time of ['00:00:03', '00:00:01', '00:00:09', '00:00:02']) {
      log.record(ev('service.updated', 's', { time: `2026-01-01T${time}.000Z` }));
    }
    assert.equal(store.eventTable.deleteBefore('2026-01-01T00:00:05.000Z', 100), 2);
    assert.deepEqual(seqs(log.after(0)), [3, 4]);
    assert.equal(store.eventTable.deleteBefore('2026-01-01T00:00:10.000Z', 1), 1);
    assert.equal(store.eventTable.deleteBefore('2026-01-01T00:00:10.000Z', 1), 1);
    assert.equal(log.oldestSeq(), undefined);
    assert.equal(log.lastSeq(), 4);
    assert.equal(log.record(ev('peer.added')).seq, 5);
    store.close();
  });
});
