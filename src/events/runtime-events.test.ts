// Unit tests of the runtime events' state keeping (runtime-events.ts) over a real event log.
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { pino } from 'pino';
import { ManualClock } from '../domain/clock.js';
import type { ObservedEvent } from '../domain/observed-event.js';
import { Store } from '../store/store.js';
import { EventLog, type MeshEvent } from './event-log.js';
import { lastEventOf, RuntimeEvents } from './runtime-events.js';

const stores: Store[] = [];
after(() => {
  for (const s of stores) s.close();
});

/** A real event log on a fresh store, counting its reads. */
class CountedLog {
  readonly log: EventLog;
  reads = 0;
  constructor() {
    const store = new Store(join(mkdtempSync(join(tmpdir(), 'runtime-events-')), 'db'));
    stores.push(store);
    this.log = new EventLog(store, 'self', new ManualClock());
  }
  get events(): MeshEvent[] {
    return this.log.after(0);
  }
  record = (e: Parameters<EventLog['record']>[0]) => this.log.record(e);
  after = (...args: Parameters<EventLog['after']>) => {
    this.reads++;
    return this.log.after(...args);
  };
}

const silent = pino({ level: 'silent' });
const reach = (peer: string, reachable: boolean): ObservedEvent => ({
  type: reachable ? 'peer.reachable' : 'peer.unreachable',
  resource: { kind: 'peer', id: peer },
  data: { last_seen_at: null },
});
const health = (service: string, state: string, reason: string | null = null): ObservedEvent => ({
  type: 'service.health_changed',
  resource: { kind: 'service', id: service },
  data: { state, reason, since: '2026-01-01T00:00:00.000Z' },
});
const types = (log: CountedLog) => log.events.map((e) => `${e.type} ${e.resource.id}`);

describe('RuntimeEvents: reachability and health are states, recorded when they change', () => {
  it('a peer: reachable by default (no event), one event per change, repeats dropped', () => {
    const log = new CountedLog();
    const events = new RuntimeEvents(log, silent);
    events.record(reach('p1', true));
    events.record(reach('p2', true));
    assert.deepEqual(types(log), [], 'the first contact with a peer is the default state');
    events.record(reach('p1', false));
    events.record(reach('p1', false));
    events.record(reach('p1', true));
    events.record(reach('p1', true));
    events.record(reach('p2', false));
    assert.deepEqual(types(log), ['peer.unreachable p1', 'peer.reachable p1', 'peer.unreachable p2']);
  });

  it('across a restart the log says the last state: no repeat, and a change is recorded', () => {
    const log = new CountedLog();
    new RuntimeEvents(log, silent).record(reach('p1', false));
    const restarted = new RuntimeEvents(log, silent);
    restarted.record(reach('p1', false));
    assert.equal(log.events.length, 1, 'still unreachable: not said again');
    const again = new RuntimeEvents(log, silent);
    again.record(reach('p1', true));
    assert.deepEqual(types(log), ['peer.unreachable p1', 'peer.reachable p1']);
  });

  it('reads the log once per peer, not once per observation', () => {
    const log = new CountedLog();
    const events = new RuntimeEvents(log, silent);
    for (let i = 0; i < 50; i++) events.record(reach('p1', i % 2 === 0));
    assert.equal(log.events.length, 49);
    assert.equal(log.reads, 2, 'one read per event type of the family');
  });

  it('a service: unknown is no observation; healthy by default; a new reason is a change', () => {
    const log = new CountedLog();
    const events = new RuntimeEvents(log, silent);
    events.record(health('s1', 'unknown'));
    events.record(health('s1', 'healthy'));
    assert.deepEqual(types(log), []);
    events.record(health('s1', 'unhealthy', 'tunnel_silent'));
    events.record(health('s1', 'unhealthy', 'tunnel_silent'));
    events.record(health('s1', 'unhealthy', 'exit_no_route'));
    events.record(health('s1', 'healthy'));
    assert.deepEqual(
      log.events.map((e) => [e.data.state, e.data.reason]),
      [
        ['unhealthy', 'tunnel_silent'],
        ['unhealthy', 'exit_no_route'],
        ['healthy', null],
      ],
    );
    // After a restart, the service healthy again is not said twice.
    new RuntimeEvents(log, silent).record(health('s1', 'healthy'));
    assert.equal(log.events.length, 3);
  });

  it('other types are recorded as reported, with the agent as actor (the log default)', () => {
    const log = new CountedLog();
    const events = new RuntimeEvents(log, silent);
    const tunnel = { type: 'tunnel.up', resource: { kind: 'tunnel', id: 'p1' }, data: { transport: 'tcp' } };
    events.record(tunnel);
    events.record(tunnel);
    assert.equal(log.events.length, 2);
    assert.deepEqual(log.events[0]!.actor, { client_id: null, agent: 'self' });
  });

  it('a log that fails does not throw into the observer', () => {
    const broken = {
      record(): MeshEvent {
        throw new Error('disk full');
      },
      after: () => [],
    };
    const events = new RuntimeEvents(broken, silent);
    assert.doesNotThrow(() => events.record(reach('p1', false)));
    assert.doesNotThrow(() =>
      events.record({ type: 'tunnel.up', resource: { kind: 'tunnel', id: 'p' }, data: {} }),
    );
  });

  it('lastEventOf pages through more than one read of the log, and matches the type exactly', () => {
    const log = new CountedLog();
    for (let i = 0; i < 2500; i++) log.record({ ...reach('p1', i % 2 === 1), data: { i } });
    log.record({ ...reach('p2', false), data: {} });
    const last = lastEventOf(log, 'peer.reachable', 'p1');
    assert.equal(last?.data.i, 2499);
    assert.equal(lastEventOf(log, 'peer.unreachable', 'p1')?.data.i, 2498);
    assert.equal(lastEventOf(log, 'peer.reachable', 'p3'), undefined);
  });
});
