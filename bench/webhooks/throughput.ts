/**
 * Webhook delivery throughput on one agent's parts in process: a burst of events recorded into a
 * real store (a temp SQLite file, WAL + FULL), delivered by the dispatcher to a loopback receiver
 * that answers 204 at once. Prints events per second per endpoint and the share of the wall time
 * the event loop spent in store writes of the queues (their commits block it). Run:
 * `node dist/bench/webhooks/throughput.js [EVENTS] [ENDPOINTS]`.
 */

import { mkdtempSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { Registry } from 'prom-client';
import { systemClock } from '../../src/domain/clock.js';
import { EventLog } from '../../src/events/event-log.js';
import { Store } from '../../src/store/store.js';
import { WebhookDispatcher } from '../../src/webhooks/dispatcher.js';
import { WebhookMetrics } from '../../src/webhooks/webhook-metrics.js';
import { Webhooks } from '../../src/webhooks/webhooks.js';

const EVENTS = Number(process.argv[2] ?? 2000);
const ENDPOINTS = Number(process.argv[3] ?? 2);

const store = new Store(join(mkdtempSync(join(tmpdir(), 'bench-webhooks-')), 'db'));
const events = new EventLog(store, 'bench-agent', systemClock);
let received = 0;
const server = http.createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    received++;
    res.writeHead(204).end();
  });
});
await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;

// Time spent in the queues' store writes, measured around the table's one write method.
let writeMs = 0;
let writes = 0;
const table = store.webhookTable;
const save = table.saveProgress.bind(table);
table.saveProgress = (id, p) => {
  const t = performance.now();
  try {
    return save(id, p);
  } finally {
    writeMs += performance.now() - t;
    writes++;
  }
};

const dispatcher = new WebhookDispatcher({
  table,
  events,
  clock: systemClock,
  logger: pino({ level: 'warn' }),
  metrics: new WebhookMetrics(new Registry(), () => webhooks.pending()),
  userAgent: 'bench',
});
const webhooks: Webhooks = new Webhooks(store, events, dispatcher, systemClock, 'bench');
dispatcher.start();
for (let i = 0; i < ENDPOINTS; i++) {
  webhooks.create(url, ['bench.'], { client_id: null, agent: 'bench-agent' });
}
const start = performance.now();
for (let i = 0; i < EVENTS; i++) {
  events.record({ type: 'bench.happened', resource: { kind: 'bench', id: String(i) }, data: { i } });
}
const recordedMs = performance.now() - start;
const target = EVENTS * ENDPOINTS;
while (received < target) await new Promise((r) => setTimeout(r, 5));
const wallMs = performance.now() - start;
await dispatcher.stop();
server.close();
store.close();
console.log(
  JSON.stringify({
    events: EVENTS,
    endpoints: ENDPOINTS,
    record_ms: Math.round(recordedMs),
    deliver_all_ms: Math.round(wallMs),
    per_endpoint_events_per_s: Math.round((EVENTS / wallMs) * 1000),
    queue_writes: writes,
    queue_write_ms: Math.round(writeMs),
    queue_write_share: Number((writeMs / wallMs).toFixed(3)),
  }),
);
