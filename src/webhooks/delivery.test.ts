import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, describe, it } from 'node:test';
import { Webhook } from 'standardwebhooks';
import { attemptDelivery, DeliveryAgents } from './delivery.js';
import { newWebhookSecret } from './webhooks.js';

type Handler = (req: http.IncomingMessage, res: http.ServerResponse, body: string) => void;

/** A loopback receiver whose answer each test chooses; counts requests by path. */
async function receiver(handler: Handler) {
  const paths: string[] = [];
  const closed: string[] = [];
  const server = http.createServer((req, res) => {
    paths.push(req.url ?? '');
    req.socket.once('close', () => closed.push(req.url ?? ''));
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => handler(req, res, Buffer.concat(chunks).toString()));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    base,
    paths,
    closed,
    close: () => {
      server.closeAllConnections();
      return new Promise<void>((r) => server.close(() => r()));
    },
  };
}

describe('attemptDelivery', () => {
  const agents = new DeliveryAgents();
  const secret = newWebhookSecret();
  const body = JSON.stringify({ seq: 7, id: 'evt-7', type: 'peer.added' });
  const opts = { agents, userAgent: 'mesh-agent/test' };
  after(() => agents.destroy());

  it('POSTs the body signed as Standard Webhooks says; a 2xx is a delivery', async () => {
    let verified: unknown;
    let headers: http.IncomingHttpHeaders = {};
    const r = await receiver((req, res, got) => {
      headers = req.headers;
      verified = new Webhook(secret).verify(got, req.headers as Record<string, string>);
      res.writeHead(202).end('ok');
    });
    const o = await attemptDelivery({ url: `${r.base}/hook`, secret }, 'evt-7', body, opts);
    await r.close();
    assert.deepEqual(o.delivered, true);
    assert.equal(o.status, 202);
    assert.equal(o.error, null);
    assert.deepEqual(verified, JSON.parse(body));
    assert.equal(headers['webhook-id'], 'evt-7');
    assert.match(String(headers['webhook-signature']), /^v1,[A-Za-z0-9+/]{43}=$/);
    assert.ok(Math.abs(Number(headers['webhook-timestamp']) - Date.now() / 1000) < 60);
    assert.equal(headers['content-type'], 'application/json');
    assert.equal(headers['user-agent'], 'mesh-agent/test');
  });

  it('a signature under another secret does not verify', async () => {
    let error: unknown;
    const r = await receiver((req, res, got) => {
      try {
        new Webhook(newWebhookSecret()).verify(got, req.headers as Record<string, string>);
      } catch (err) {
        error = err;
      }
      res.writeHead(204).end();
    });
    await attemptDelivery({ url: `${r.base}/hook`, secret }, 'evt-7', body, opts);
    await r.close();
    assert.ok(error instanceof Error);
  });

  it('follows no redirect: a 3xx is a failure and the Location is never asked', async () => {
    const r = await receiver((req, res) => {
      if (req.url === '/hook') res.writeHead(307, { location: '/elsewhere' }).end();
      else res.writeHead(204).end();
    });
    const o = await attemptDelivery({ url: `${r.base}/hook`, secret }, 'evt-7', body, opts);
    await r.close();
    assert.equal(o.delivered, false);
    assert.equal(o.status, 307);
    assert.match(o.error ?? '', /redirects are not followed/);
    assert.deepEqual(r.paths, ['/hook']);
  });

  it('a 4xx or 5xx is a failure with its status', async () => {
    const r = await receiver((_req, res) => res.writeHead(503).end());
    const o = await attemptDelivery({ url: `${r.base}/hook`, secret }, 'evt-7', body, opts);
    await r.close();
    assert.deepEqual([o.delivered, o.status, o.error], [false, 503, 'HTTP 503']);
  });

  it('gives up a receiver that never answers at its deadline, and closes the connection', async () => {
    const r = await receiver(() => {});
    const o = await attemptDelivery({ url: `${r.base}/hook`, secret }, 'evt-7', body, {
      ...opts,
      timeoutMs: 300,
    });
    assert.equal(o.delivered, false);
    assert.equal(o.status, null);
    assert.match(o.error ?? '', /no answer within 0.3 s/);
    assert.ok(o.ms >= 290, `${o.ms} ms`);
    for (let i = 0; i < 100 && r.closed.length === 0; i++) await new Promise((x) => setTimeout(x, 10));
    assert.deepEqual(r.closed, ['/hook'], 'the connection was closed');
    await r.close();
  });

  it('stops at once when aborted (the agent stopping, the webhook deleted)', async () => {
    const r = await receiver(() => {});
    const abort = new AbortController();
    const pending = attemptDelivery({ url: `${r.base}/hook`, secret }, 'evt-7', body, {
      ...opts,
      signal: abort.signal,
    });
    setTimeout(() => abort.abort(), 50);
    const o = await pending;
    await r.close();
    assert.deepEqual([o.delivered, o.error], [false, 'aborted']);
    assert.ok(o.ms < 5000);
  });

  it('reports a refused connection', async () => {
    const r = await receiver(() => {});
    await r.close();
    const o = await attemptDelivery({ url: `${r.base}/hook`, secret }, 'evt-7', body, opts);
    assert.equal(o.delivered, false);
    assert.match(o.error ?? '', /ECONNREFUSED/);
  });
});
