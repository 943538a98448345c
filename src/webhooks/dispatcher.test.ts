import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import pino from 'pino';
import { Registry } from 'prom-client';
import { waitUntil } from '../../test/helpers/wait-until.js';
import { WebhookReceiver } from '../../test/helpers/webhook-receiver.js';
import { isoTime, ManualClock } from '../domain/clock.js';
import { EventLog } from '../events/event-log.js';
import { Store } from '../store/store.js';
import { progressOf } from '../store/webhook-table.js';
import { typeMatches, WebhookDispatcher } from './dispatcher.js';
import { GIVE_UP_AFTER_MS } from './retry-schedule.js';
import { WebhookMetrics } from './webhook-metrics.js';
import { Webhooks } from './webhooks.js';

const ACTOR = { client_id: null, agent: 'agent-a' };

/** The agent's webhook parts on a temp SQLite file, a movable clock and a real receiver. */
function parts(clock: ManualClock) {
  const store = new Store(join(mkdtempSync(join(tmpdir(), 'webhooks-')), 'db'));
  const events = new EventLog(store, 'agent-a', clock);
  const registry = new Registry();
  let webhooks: Webhooks | undefined;
  const dispatcher = new WebhookDispatcher({
    table: store.webhookTable,
    events,
    clock,
    logger: pino({ level: 'silent' }),
    metrics: new WebhookMetrics(registry, () => webhooks?.pending() ?? []),
    userAgent: 'test',
  });
  webhooks = new Webhooks(store, events, dispatcher, clock, 'test');
  return { store, events, dispatcher, webhooks, registry };
}

describe('typeMatches', () => {
  it('matches by prefix, any of several, all when none', () => {
    assert.equal(typeMatches([], 'peer.added'), true);
    assert.equal(typeMatches(['peer.'], 'peer.added'), true);
    assert.equal(typeMatches(['service.created', 'peer.'], 'service.created'), true);
    assert.equal(typeMatches(['peer.'], 'service.created'), false);
    assert.equal(typeMatches(['service.created'], 'service.deleted'), false);
  });
});

describe('WebhookDispatcher', () => {
  const receivers: WebhookReceiver[] = [];
  after(async () => {
    for (const r of receivers) await r.close();
  });

  it('gives up, on the last failed attempt, every event whose 24 h are over, past one read of 1000', async () => {
    const clock = new ManualClock(Date.parse('2026-03-01T00:00:00.000Z'));
    const { store, events, dispatcher, webhooks, registry } = parts(clock);
    const r = await WebhookReceiver.open();
    receivers.push(r);
    await r.close();
    dispatcher.start();
    const hook = webhooks.create(r.url, ['bench.'], ACTOR);
    // 2500 events of the filter, two of another type between them, all recorded now.
    for (let i = 0; i < 2500; i++) {
      events.record({ type: 'bench.happened', resource: { kind: 'bench', id: String(i) }, data: {} });
      if (i === 1200 || i === 2100)
        events.record({ type: 'other.thing', resource: { kind: 'x', id: '1' }, data: {} });
    }
    await waitUntil(
      'the first attempt failed',
      () => (webhooks.get(hook.id).delivery.failures ?? 0) >= 1,
      10_000,
    );
    assert.equal(webhooks.get(hook.id).delivery.pending, 2500);
    // Then one event young enough to stay: recorded 2 h later.
    clock.advance(2 * 3600_000);
    const young = events.record({
      type: 'bench.happened',
      resource: { kind: 'bench', id: 'young' },
      data: {},
    });
    // The next retry (5 s after the first failure, in real time) comes 24 h and 1 s after the
    // failures began: the 2500 are over, the young one is not.
    clock.advance(GIVE_UP_AFTER_MS - 2 * 3600_000 + 1000);
    await waitUntil('the old events are given up', () => webhooks.get(hook.id).delivery.given_up > 0, 15_000);
    const d = webhooks.get(hook.id).delivery;
    assert.equal(d.given_up, 2500);
    assert.equal(d.pending, 1, 'the young event waits');
    assert.equal(d.cursor, young.seq - 1);
    assert.equal(d.last_given_up_seq, young.seq - 1);
    assert.equal(d.failures, 2);
    assert.equal(d.failing_since, isoTime(Date.parse('2026-03-01T00:00:00.000Z')));
    // Its own 24 h bound the next attempt, never a later one.
    assert.ok(Date.parse(d.next_attempt_at!) <= Date.parse(young.time) + GIVE_UP_AFTER_MS);
    const text = await registry.metrics();
    assert.match(text, /^mesh_webhook_deliveries_total\{outcome="given_up"\} 2500$/m);
    assert.match(text, new RegExp(`^mesh_webhook_pending_events\\{webhook_id="${hook.id}"\\} 1$`, 'm'));
    await dispatcher.stop();
    // The row holds it all after the stop (written at once, being a failure).
    assert.equal(store.webhookTable.get(hook.id)?.givenUp, 2500);
    store.close();
  });

  it('keeps delivering in order after a restart from the written cursor, skipping nothing', async () => {
    const clock = new ManualClock();
    const first = parts(clock);
    const r = await WebhookReceiver.open();
    receivers.push(r);
    first.dispatcher.start();
    const hook = first.webhooks.create(r.url, [], ACTOR);
    r.secret = hook.secret;
    for (let i = 0; i < 50; i++) {
      first.events.record({ type: 'bench.happened', resource: { kind: 'bench', id: String(i) }, data: {} });
    }
    await waitUntil('all 51 delivered', () => r.events.length >= 51, 10_000);
    // Stopped the way a crash does: the worker is abandoned without writing what it holds.
    const file = first.store.db.name;
    const written = first.store.webhookTable.get(hook.id)!.cursor;
    await first.dispatcher.stop();
    const held = progressOf(first.store.webhookTable.get(hook.id)!);
    first.store.webhookTable.saveProgress(hook.id, { ...held, cursor: written });
    first.store.close();

    const store = new Store(file);
    const events = new EventLog(store, 'agent-a', clock);
    const dispatcher = new WebhookDispatcher({
      table: store.webhookTable,
      events,
      clock,
      logger: pino({ level: 'silent' }),
      metrics: new WebhookMetrics(new Registry(), () => []),
      userAgent: 'test',
    });
    dispatcher.start();
    const next = events.record({
      type: 'bench.happened',
      resource: { kind: 'bench', id: 'after' },
      data: {},
    });
    await waitUntil(
      'the event after the restart arrives',
      () => r.events.some((e) => e.seq === next.seq),
      10_000,
    );
    await dispatcher.stop();
    store.close();
    const seqs = r.events.map((e) => e.seq as number);
    assert.ok(r.received.every((x) => x.verifyError === undefined));
    // Every seq from the first to the last, each at least once; a repeat only of what followed the
    // written cursor, and in order from it.
    const unique = [...new Set(seqs)];
    assert.deepEqual(
      unique,
      Array.from({ length: next.seq - seqs[0]! + 1 }, (_, i) => seqs[0]! + i),
    );
    const resent = seqs.slice(51, -1);
    assert.deepEqual(
      resent,
      Array.from({ length: resent.length }, (_, i) => written + 1 + i),
    );
  });

  it('starts a worker again after its store failed under it, and goes on from its queue', async () => {
    const clock = new ManualClock();
    const { store, events, dispatcher, webhooks } = parts(clock);
    const r = await WebhookReceiver.open();
    receivers.push(r);
    dispatcher.start();
    const hook = webhooks.create(r.url, ['bench.'], ACTOR);
    r.secret = hook.secret;
    // The first write of progress fails, as on a full disk.
    const table = store.webhookTable;
    const save = table.saveProgress.bind(table);
    let failures = 0;
    table.saveProgress = (id, p) => {
      if (failures++ === 0) throw new Error('SQLITE_FULL: database or disk is full');
      return save(id, p);
    };
    const recorded = [0, 1, 2].map((i) =>
      events.record({ type: 'bench.happened', resource: { kind: 'bench', id: String(i) }, data: {} }),
    );
    // Arrived, and answered: the receiver records a delivery before its answer reaches the
    // dispatcher, and a stop in between aborts that attempt (sent again after a restart).
    await waitUntil(
      'all three arrive after the restart, the last one answered',
      () =>
        new Set(r.events.map((e) => e.seq)).size >= 3 &&
        dispatcher.progress(hook.id)?.cursor === recorded[2]!.seq,
      15_000,
    );
    await dispatcher.stop();
    const seqs = r.events.map((e) => e.seq as number);
    // The first was delivered, its write failed, so it is sent again: at least once, in order.
    assert.deepEqual(
      [...new Set(seqs)],
      recorded.map((e) => e.seq),
    );
    assert.deepEqual(
      seqs,
      [...seqs].sort((a, b) => a - b),
    );
    assert.equal(table.get(hook.id)?.cursor, recorded[2]!.seq);
    store.close();
  });
});
