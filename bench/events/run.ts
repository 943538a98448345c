/**
 * bench/events: what the event log costs and how fast it tells (docs/events.md).
 *
 * 1. Latency from an acknowledged write to its event on an SSE client, on the agent that took
 *    the write and on another agent (real agent processes, default gossip interval): LATENCY_N
 *    sequential PUT /v1/services/{id} on A, each waited for on both streams; p50/p99/max. A
 *    stream may hear of the event before the HTTP answer arrives (it is told at commit, the
 *    answer follows): that latency counts as 0.
 * 2. Events per second one agent records and streams: BURSTS x 1000 routes in one POST each
 *    (1000 events per transaction), timed from the first request to the last event on an SSE
 *    client; and single writes (one event per transaction), as in 4.
 * 3. Store growth per 100,000 events, in process: a real Store in a temp dir, 100,000 events
 *    shaped like `route.created` (the size of a real one) recorded in transactions of 1000; the
 *    file (WAL checkpointed) before and after.
 * 4. Write throughput with and without the log: this build against the same build with the
 *    replica's config events cut out (a copy of dist/ in a temp dir whose Replica.noteChange
 *    returns at once; no switch in the agent turns the log off). One agent of each, the same
 *    workload (PUT /v1/peers/{self} renaming it, a replicated write with fsync; with the log it
 *    also records peer.renamed), WRITES writes each from one client, alternating write by write
 *    between the two agents so that disk and CPU noise hit both alike; throughput of each and
 *    their ratio (with over without), and the ratio of the per-write medians.
 *
 * Run: npm run build && node dist/bench/events/run.js
 * Environment: LATENCY_N (200), BURSTS (20), WRITES (2000).
 * Output: a summary on stdout and JSON in bench/results/events-<timestamp>.json.
 */
import {
  cpSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { systemClock } from '../../src/domain/clock.js';
import { EventLog } from '../../src/events/event-log.js';
import { Store } from '../../src/store/store.js';
import { AgentProcess } from '../../test/helpers/agent-process.js';
import { makeVendor } from '../../test/helpers/licenses.js';
import { bootstrapNode, join as joinNodes } from '../../test/helpers/nodes.js';
import { SseClient } from '../../test/helpers/sse-client.js';
import { fmt, median, REPO_ROOT } from '../api/measure.js';

const int = (v: string | undefined, d: number) => (v && /^\d+$/.test(v) ? Number(v) : d);
const LATENCY_N = int(process.env.LATENCY_N, 200);
const BURSTS = int(process.env.BURSTS, 20);
const WRITES = int(process.env.WRITES, 2000);
const LICENSE = {
  license_id: 'bench-events',
  expires_at: new Date(Date.now() + 365 * 86_400_000).toISOString(),
};

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN;
};
const ok = (res: { status: number; text: string }, status: number, what: string) => {
  if (res.status !== status) throw new Error(`${what}: ${res.status} ${res.text}`);
};

const vendor = makeVendor();
const result: Record<string, unknown> = { at: new Date().toISOString() };

async function latencyAndRate(): Promise<void> {
  const agents = [await AgentProcess.start({ vendor }), await AgentProcess.start({ vendor })];
  try {
    const a = await bootstrapNode(agents[0]!, vendor, LICENSE);
    const b = await bootstrapNode(agents[1]!, vendor, LICENSE);
    await joinNodes(a, b);
    const created = await a.agent.client.post('/v1/services', {
      token: a.token,
      json: { target_peer_id: b.peerId },
    });
    ok(created, 201, 'service');
    const id = created.body.id as string;
    const query = `type=service.updated&resource=${id}`;
    const onA = await SseClient.open(a.agent.url, { token: a.token, query });
    const onB = await SseClient.open(b.agent.url, { token: b.token, query });
    // When each stream got the event of each bandwidth value (the writes' one changed field).
    const heardAt = (c: SseClient, mbps: number) =>
      c.messages.find((m) => JSON.parse(m.data).data.after.bandwidth_limit_mbps === mbps)?.receivedAt;
    const same: number[] = [];
    const other: number[] = [];
    const sameFromSend: number[] = [];
    for (let i = 1; i <= LATENCY_N; i++) {
      const sent = performance.now();
      const res = await a.agent.client.put(`/v1/services/${id}`, {
        token: a.token,
        json: { bandwidth_limit_mbps: i },
      });
      const ack = performance.now();
      ok(res, 200, 'update');
      const deadline = Date.now() + 10_000;
      while ((heardAt(onA, i) === undefined || heardAt(onB, i) === undefined) && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 1));
      }
      same.push(Math.max(0, (heardAt(onA, i) ?? Number.NaN) - ack));
      sameFromSend.push((heardAt(onA, i) ?? Number.NaN) - sent);
      other.push(Math.max(0, (heardAt(onB, i) ?? Number.NaN) - ack));
    }
    onA.close();
    onB.close();
    result.latency = {
      writes: LATENCY_N,
      same_agent_ms: { p50: pct(same, 50), p99: pct(same, 99), max: Math.max(...same) },
      // The same event timed from when the request was sent: the whole write plus delivery.
      same_agent_from_request_ms: { p50: pct(sameFromSend, 50), p99: pct(sameFromSend, 99) },
      other_agent_ms: { p50: pct(other, 50), p99: pct(other, 99), max: Math.max(...other) },
    };

    // Events per second: bursts of 1000 routes (1000 events per transaction) to one stream.
    const routes = await SseClient.open(a.agent.url, { token: a.token, query: 'type=route.created' });
    const t0 = performance.now();
    let ackedAt = 0;
    for (let k = 0; k < BURSTS; k++) {
      const batch = Array.from({ length: 1000 }, (_, i) => ({
        priority: i,
        dest_cidr: `10.${k}.${i >> 8}.${i & 255}/32`,
      }));
      const res = await a.agent.client.post(`/v1/services/${id}/routes`, {
        token: a.token,
        json: { routes: batch },
      });
      ok(res, 201, 'routes');
      ackedAt = performance.now();
    }
    await routes.waitFor(BURSTS * 1000, 120_000);
    const streamedAt = performance.now();
    routes.close();
    result.rate = {
      events: BURSTS * 1000,
      recorded_per_s: (BURSTS * 1000) / ((ackedAt - t0) / 1000),
      recorded_and_streamed_per_s: (BURSTS * 1000) / ((streamedAt - t0) / 1000),
    };
  } finally {
    for (const agent of agents) await agent.stop();
  }
}

function storeGrowth(): void {
  // On the repo's disk, like the agent's data dir (tmpfs would hide the fsyncs).
  const dir = mkdtempSync(join(REPO_ROOT, 'bench/results/events-store-'));
  const file = join(dir, 'db');
  const store = new Store(file);
  const log = new EventLog(store, '7c1e94b0a1d24e0f8f0c2c4b9e6a1d3f', systemClock);
  const size = () => {
    store.db.pragma('wal_checkpoint(TRUNCATE)');
    return statSync(file).size;
  };
  const before = size();
  const N = 100_000;
  const t0 = performance.now();
  for (let k = 0; k < N / 1000; k++) {
    store.transaction(() => {
      for (let i = 0; i < 1000; i++) {
        const routeId = 1_000_000_000 + k * 1000 + i;
        log.record({
          id: `route/${routeId}@000000.00000000.0193a8c2f1e0.000000.7c1e94b0a1d24e0f8f0c2c4b9e6a1d3f`,
          type: 'route.created',
          actor: { client_id: 'mcl_3kq0d5P7qk3v4xY2c7m9Ag', agent: '7c1e94b0a1d24e0f8f0c2c4b9e6a1d3f' },
          resource: { kind: 'route', id: String(routeId) },
          data: {
            before: null,
            after: {
              id: routeId,
              service_id: 'svc_2fK9q1Xb3Lq8Vn0Rt7Yw4A',
              priority: i,
              source_cidr: null,
              dest_cidr: `10.${k & 255}.${i >> 8}.${i & 255}/32`,
            },
          },
        });
      }
    });
  }
  const ms = performance.now() - t0;
  const after = size();
  store.close();
  rmSync(dir, { recursive: true, force: true });
  result.store = {
    events: N,
    bytes_per_100k: after - before,
    bytes_per_event: (after - before) / N,
    in_process_record_per_s: N / (ms / 1000),
  };
}

/**
 * This build with the replica's config events cut out: dist/ copied, one method patched, the
 * rest (node_modules, the native addons, package.json) shared with the repository.
 */
function buildWithoutLog(): string {
  const dir = mkdtempSync(join(tmpdir(), 'mesh-nolog-'));
  cpSync(join(REPO_ROOT, 'dist'), join(dir, 'dist'), { recursive: true });
  for (const shared of ['node_modules', 'build', 'package.json']) {
    symlinkSync(join(REPO_ROOT, shared), join(dir, shared));
  }
  const replica = join(dir, 'dist/src/cluster/replica.js');
  const code = readFileSync(replica, 'utf8');
  const head = /noteChange\(key, before, actor\) \{/g;
  const found = code.match(head)?.length ?? 0;
  if (found !== 1) throw new Error(`replica.js: ${found} noteChange definitions, expected 1`);
  writeFileSync(
    replica,
    code.replace(head, (m) => `${m} return;`),
  );
  return dir;
}

/** Closed-loop renames on both agents, alternating write by write; per-write times in ms. */
async function throughput(): Promise<void> {
  const noLog = buildWithoutLog();
  const agents = [
    await AgentProcess.start({ vendor, mainJs: join(noLog, 'dist/src/cli/main.js') }),
    await AgentProcess.start({ vendor }),
  ];
  try {
    const nodes = [
      await bootstrapNode(agents[0]!, vendor, LICENSE),
      await bootstrapNode(agents[1]!, vendor, LICENSE),
    ];
    const times: number[][] = [[], []];
    for (let i = 0; i < WRITES * 2; i++) {
      const n = nodes[i % 2]!;
      const t0 = performance.now();
      const res = await n.agent.client.put(`/v1/peers/${n.peerId}`, {
        token: n.token,
        json: { name: `n${i}` },
      });
      ok(res, 200, 'rename');
      times[i % 2]!.push(performance.now() - t0);
    }
    const events = await nodes[1]!.agent.client.get('/v1/events?type=peer.renamed&limit=1000', {
      token: nodes[1]!.token,
    });
    const noLogEvents = await nodes[0]!.agent.client.get('/v1/events?type=peer.renamed&limit=1000', {
      token: nodes[0]!.token,
    });
    const count = (r: { body: unknown }) => ((r.body as { events?: unknown[] }).events ?? []).length;
    const perS = (xs: number[]) => xs.length / (xs.reduce((a, b) => a + b, 0) / 1000);
    result.throughput = {
      writes_each: WRITES,
      without_log_writes_per_s: perS(times[0]!),
      with_log_writes_per_s: perS(times[1]!),
      ratio_with_over_without: perS(times[1]!) / perS(times[0]!),
      per_write_median_ms: { without: median(times[0]!), with: median(times[1]!) },
      ratio_of_medians: median(times[0]!) / median(times[1]!),
      // What each build recorded, so a patch that missed (or cut too much) shows.
      peer_renamed_events_seen: { without: count(noLogEvents), with: count(events) },
    };
  } finally {
    for (const a of agents) await a.stop();
    rmSync(noLog, { recursive: true, force: true });
  }
}

await latencyAndRate();
storeGrowth();
await throughput();

const l = result.latency as {
  same_agent_ms: Record<string, number>;
  same_agent_from_request_ms: Record<string, number>;
  other_agent_ms: Record<string, number>;
};
const r = result.rate as Record<string, number>;
const s = result.store as Record<string, number>;
const t = result.throughput as {
  without_log_writes_per_s: number;
  with_log_writes_per_s: number;
  ratio_with_over_without: number;
  per_write_median_ms: { without: number; with: number };
  ratio_of_medians: number;
  peer_renamed_events_seen: { without: number; with: number };
};
const lines = [
  `write ack -> SSE event, same agent:  p50 ${fmt(l.same_agent_ms.p50!, 1)} ms  p99 ${fmt(l.same_agent_ms.p99!, 1)} ms  max ${fmt(l.same_agent_ms.max!, 1)} ms  (${LATENCY_N} writes)`,
  `request sent -> SSE event, same agent: p50 ${fmt(l.same_agent_from_request_ms.p50!, 1)} ms  p99 ${fmt(l.same_agent_from_request_ms.p99!, 1)} ms`,
  `write ack -> SSE event, other agent: p50 ${fmt(l.other_agent_ms.p50!, 1)} ms  p99 ${fmt(l.other_agent_ms.p99!, 1)} ms  max ${fmt(l.other_agent_ms.max!, 1)} ms`,
  `events recorded/s (1000 per transaction): ${fmt(r.recorded_per_s!)}; recorded and streamed/s: ${fmt(r.recorded_and_streamed_per_s!)}`,
  `store growth per 100,000 events: ${fmt(s.bytes_per_100k! / 1e6, 1)} MB (${fmt(s.bytes_per_event!)} B/event); in-process record ${fmt(s.in_process_record_per_s!)}/s`,
  `writes/s, PUT /v1/peers/self, ${WRITES} each, alternating: without the log ${fmt(t.without_log_writes_per_s)}, with ${fmt(t.with_log_writes_per_s)}, ratio ${fmt(t.ratio_with_over_without, 3)}; per-write median ${fmt(t.per_write_median_ms.without, 2)} / ${fmt(t.per_write_median_ms.with, 2)} ms, ratio ${fmt(t.ratio_of_medians, 3)}; peer.renamed events seen ${t.peer_renamed_events_seen.without} / ${t.peer_renamed_events_seen.with}`,
];
process.stdout.write(`${lines.join('\n')}\n`);
const out = join(REPO_ROOT, 'bench/results');
mkdirSync(out, { recursive: true });
writeFileSync(
  join(out, `events-${result.at as string}.json`.replace(/[:.]/g, '').replace('json', '.json')),
  `${JSON.stringify(result, null, 2)}\n`,
);
