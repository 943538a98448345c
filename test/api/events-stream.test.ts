/**
 * The event log across agents and across failures (docs/events.md): a write on A appears in B's
 * log and stream with A's actor and the same id; a stream resumed with Last-Event-ID gets exactly
 * the events it missed, in order; a cursor older than what is kept gets exactly one `resync`;
 * kill -9 during a burst of writes loses no acknowledged write's event and reuses no seq; an open
 * stream does not hold up a stop; bad cursors and limits are 400 in the documented shape.
 */
import assert from 'node:assert/strict';
import { connect } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { AgentProcess } from '../helpers/agent-process.js';
import { assertError } from '../helpers/api-assertions.js';
import type { ApiResponse } from '../helpers/api-client.js';
import { CLUSTER_ARGS, eventually } from '../helpers/cluster.js';
import { makeVendor } from '../helpers/licenses.js';
import { bootstrapNode, join, type Node } from '../helpers/nodes.js';
import { SseClient } from '../helpers/sse-client.js';

type Ev = ApiResponse['body'];

/** A year to run: no license.expiring event among the config events counted here. */
const LICENSE = {
  license_id: 'lic-events',
  expires_at: new Date(Date.now() + 365 * 86_400_000).toISOString(),
};

const events = async (
  n: Node,
  query = '',
): Promise<{ events: Ev[]; next: number; oldest_seq: number | null }> => {
  const res = await n.agent.client.get(`/v1/events?limit=1000${query ? `&${query}` : ''}`, {
    token: n.token,
  });
  assert.equal(res.status, 200, res.text);
  return res.body;
};
const createCredential = async (n: Node): Promise<string> => {
  const res = await n.agent.client.post('/v1/credentials', { token: n.token, json: { scopes: [] } });
  assert.equal(res.status, 201, res.text);
  return res.body.client_id;
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('event log: across agents, streams, retention and crashes', () => {
  const vendor = makeVendor();
  const agents: AgentProcess[] = [];
  let a: Node;
  let b: Node;
  let clientId: string;
  let serviceId: string;

  before(async () => {
    // A keeps at most 1000 events (the least allowed), so the resync test can outrun it.
    agents.push(
      await AgentProcess.start({ vendor, extraArgs: [...CLUSTER_ARGS, '--events-max-count', '1000'] }),
      await AgentProcess.start({ vendor, extraArgs: CLUSTER_ARGS }),
    );
    a = await bootstrapNode(agents[0]!, vendor, LICENSE);
    b = await bootstrapNode(agents[1]!, vendor, LICENSE);
    await join(a, b);
    clientId = (await a.agent.client.get('/v1/credentials', { token: a.token })).body[0].client_id;
  });
  after(async () => {
    for (const agent of agents) assert.equal(await agent.stop(), 0);
  });

  it("a write on A appears in B's log and stream with A's actor and the same id", async () => {
    const stream = await SseClient.open(b.agent.url, { token: b.token, query: 'type=service.' });
    assert.equal(stream.status, 200);
    assert.match(String(stream.headers['content-type']), /^text\/event-stream/);
    const res = await a.agent.client.post('/v1/services', {
      token: a.token,
      json: { target_peer_id: b.peerId },
    });
    assert.equal(res.status, 201, res.text);
    serviceId = res.body.id;
    const onA = (await events(a, `resource=${serviceId}`)).events;
    assert.equal(onA.length, 1);
    assert.deepEqual(onA[0].actor, { client_id: clientId, agent: a.peerId });
    const onB = await eventually('the event on B', async () => {
      const got = (await events(b, `resource=${serviceId}`)).events;
      return got.length > 0 ? got : undefined;
    });
    assert.equal(onB.length, 1);
    const { seq: _a, ...restA } = onA[0];
    const { seq: _b, ...restB } = onB[0];
    assert.deepEqual(restB, restA, 'the same event, seq aside');
    await stream.waitFor(1);
    const [streamed] = stream.events;
    assert.equal(streamed.id, onA[0].id);
    assert.deepEqual(streamed.actor, { client_id: clientId, agent: a.peerId });
    assert.equal(stream.messages[0]!.id, String(streamed.seq));
    assert.equal(stream.messages[0]!.event, 'service.created');
    stream.close();
  });

  it('a stream resumed with Last-Event-ID gets exactly the missed events, in order', async () => {
    // Credential events only: runtime events (a peer's reachability) may come in between.
    const first = await SseClient.open(a.agent.url, { token: a.token, query: 'type=credential.' });
    const seen: string[] = [];
    for (let i = 0; i < 3; i++) seen.push(await createCredential(a));
    await first.waitFor(3);
    first.close();
    await first.ended;
    const lastId = first.messages.at(-1)!.id!;
    const missed: string[] = [];
    for (let i = 0; i < 4; i++) missed.push(await createCredential(a));
    const resumed = await SseClient.open(a.agent.url, {
      token: a.token,
      lastEventId: lastId,
      query: 'type=credential.',
    });
    await resumed.waitFor(4);
    await sleep(300);
    assert.deepEqual(
      resumed.events.map((e) => e.resource.id),
      missed,
    );
    const seqs = resumed.events.map((e) => e.seq);
    assert.ok(seqs[0] > Number(lastId), 'after the cursor');
    assert.deepEqual(
      seqs,
      [...seqs].sort((x, y) => x - y),
      'in order',
    );
    // ?since= does the same when there is no header.
    const bySince = await SseClient.open(a.agent.url, {
      token: a.token,
      query: `since=${lastId}&type=credential.`,
    });
    await bySince.waitFor(4);
    assert.deepEqual(
      bySince.events.map((e) => e.resource.id),
      missed,
    );
    resumed.close();
    bySince.close();
  });

  it('refuses a bad cursor, limit or filter with 400 in the documented shape', async () => {
    for (const q of ['since=-1', 'since=abc', 'limit=0', 'limit=1001', 'type=Bad%20Type']) {
      const res = await a.agent.client.get(`/v1/events?${q}`, { token: a.token });
      assertError(res, 400, 'INVALID_REQUEST');
    }
    const bad = await SseClient.open(a.agent.url, { token: a.token, lastEventId: 'x1' });
    assert.equal(bad.status, 400);
    bad.close();
  });

  it('kill -9 in a burst of writes: every acknowledged write has its event, no seq is reused', async () => {
    const acked: string[] = [];
    const burst = Array.from({ length: 4 }, async () => {
      for (;;) {
        const res = await a.agent.client
          .post('/v1/credentials', { token: a.token, json: { scopes: [] } })
          .catch(() => undefined);
        if (res?.status !== 201) return;
        acked.push(res.body.client_id);
      }
    });
    await eventually('writes under way', async () => (acked.length >= 30 ? true : undefined));
    await a.agent.kill9();
    await Promise.all(burst);
    const before = acked.length;
    await a.agent.restart();
    const all = (await events(a, 'type=credential.created')).events;
    const recorded = new Set(all.map((e) => e.resource.id));
    const lost = acked.filter((id) => !recorded.has(id));
    assert.deepEqual(lost, [], `of ${before} acknowledged writes`);
    const last = (await events(a)).next;
    await createCredential(a);
    const after = (await events(a, `since=${last}`)).events;
    assert.equal(after.length, 1);
    assert.equal(after[0].seq, last + 1, 'the first seq after the restart follows the last one given');
  });

  it('a cursor older than the oldest kept gets exactly one resync, then the stream goes on', async () => {
    // 1000 routes in one request: 1000 events; with --events-max-count 1000 the oldest go at restart.
    const routes = Array.from({ length: 1000 }, (_, i) => ({
      priority: i,
      dest_cidr: `10.${i >> 8}.${i & 255}.0/24`,
    }));
    const res = await a.agent.client.post(`/v1/services/${serviceId}/routes`, {
      token: a.token,
      json: { routes },
    });
    assert.equal(res.status, 201, res.text);
    await a.agent.stop();
    await a.agent.restart();
    const kept = await events(a);
    const oldest_seq = kept.oldest_seq!;
    assert.ok(oldest_seq > 1, `oldest kept ${oldest_seq}`);
    assert.equal(kept.events.length, 1000);
    assert.equal(kept.events[0].seq, oldest_seq);
    assert.equal(kept.events.at(-1).seq - oldest_seq + 1, 1000, 'exactly the newest 1000 kept');
    const stream = await SseClient.open(a.agent.url, { token: a.token, query: 'since=0' });
    await stream.waitFor(1001);
    await createCredential(a);
    await stream.waitFor(1002);
    const resyncs = stream.messages.filter((m) => m.event === 'resync');
    assert.equal(resyncs.length, 1);
    assert.equal(stream.messages[0]!.event, 'resync');
    assert.equal(JSON.parse(resyncs[0]!.data).oldest_seq, oldest_seq);
    const seqs = stream.events.map((e) => e.seq);
    assert.equal(seqs[0], oldest_seq);
    assert.deepEqual(
      seqs,
      seqs.map((_, i) => oldest_seq + i),
      'then every kept event, once, in order',
    );
    stream.close();
  });

  it('sends a heartbeat comment every 15 s on an idle stream', async () => {
    const stream = await SseClient.open(a.agent.url, { token: a.token, query: 'type=nothing.matches' });
    const opened = stream.comments;
    await sleep(15_500);
    assert.ok(stream.comments >= opened + 1, `${stream.comments - opened} heartbeats in 15.5 s`);
    assert.equal(stream.messages.length, 0);
    stream.close();
  });

  it('cuts off a reader that does not read, which then resumes with Last-Event-ID', async () => {
    // A raw socket that never reads: the kernel's buffers fill, then the agent's 4 MiB bound.
    const socket = connect(a.agent.port, '127.0.0.1');
    await new Promise<void>((r) => socket.once('connect', () => r()));
    socket.write(`GET /v1/events/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${a.token}\r\n\r\n`);
    socket.pause();
    const closed = new Promise<void>((r) => socket.once('end', () => r()));
    // 40,000 events of about 550 bytes: more than the kernel's buffers and the agent's bound.
    for (let k = 0; k < 40; k++) {
      const routes = Array.from({ length: 1000 }, (_, i) => ({
        priority: i,
        dest_cidr: `10.${100 + k}.${i >> 8}.${i & 255}/32`,
      }));
      const res = await a.agent.client.post(`/v1/services/${serviceId}/routes`, {
        token: a.token,
        json: { routes },
      });
      assert.equal(res.status, 201, res.text);
    }
    // Without the cut-off the stream would stay open and this would time out.
    let received = 0;
    socket.on('data', (c: Buffer) => {
      received += c.length;
    });
    socket.resume();
    await closed;
    assert.ok(received < 40_000 * 500, `${received} bytes: cut off before it all`);
    socket.destroy();
    // The agent still serves other streams and writes.
    const other = await SseClient.open(a.agent.url, {
      token: a.token,
      lastEventId: '0',
      query: 'type=credential.',
    });
    await other.waitFor(1);
    other.close();
  });

  it('an open stream ends when the agent stops, and the stop is prompt', async () => {
    const stream = await SseClient.open(b.agent.url, { token: b.token });
    const started = Date.now();
    assert.equal(await b.agent.stop(), 0);
    await stream.ended;
    assert.ok(Date.now() - started < 10_000, `stop took ${Date.now() - started} ms`);
  });
});
