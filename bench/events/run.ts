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
 * 4. Write throughput with and without the log, as a same-run ratio against a baseline BUILD
 *    (BENCH_BASELINE=DIR: a checkout of the commit before the log, built; no switch in the
 *    agent turns the log off): one agent of each build, the same workload (PUT /v1/peers/{self}
 *    renaming it, a replicated write with fsync; with the log it also records peer.renamed),
 *    ROUNDS rounds alternating the builds so disk noise hits both, WRITES writes per round from
 *    one client in a closed loop; median writes/s of each build and their ratio.
 *
 * Run: npm run build && node dist/bench/events/run.js
 * Environment: LATENCY_N (200), BURSTS (20), WRITES (300), ROUNDS (4), BENCH_BASELINE.
 * Output: a summary on stdout and JSON in bench/results/events-<timestamp>.json.
 */
import { mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { systemClock } from '../../src/domain/clock.js';
import { EventLog } from '../../src/events/event-log.js';
import { Store } from '../../src/store/store.js';
import { AgentProcess } from '../../test/helpers/agent-process.js';
import { makeVendor } from '../../test/helpers/licenses.js';
import { bootstrapNode, join as joinNodes, type Node } from '../../test/helpers/nodes.js';
import { SseClient } from '../../test/helpers/sse-client.js';
import { fmt, median, REPO_ROOT } from '../api/measure.js';

const int = (v: string | undefined, d: number) => (v && /^\d+$/.test(v) ? Number(v) : d);
const LATENCY_N = int(process.env.LATENCY_N, 200);
const BURSTS = int(process.env.BURSTS, 20);
const WRITES = int(process.env.WRITES, 300);
const ROUNDS = int(process.env.ROUNDS, 4);
const BASELINE = process.env.BENCH_BASELINE ? resolve(process.env.BENCH_BASELINE) : undefined;
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
const result: Record<string, unknown> = { at: new Date().toISOString(), baseline: BASELINE ?? null };

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

async function throughput(build: string, rounds: number[][], tag: number): Promise<void> {
  const agent = await AgentProcess.start({ vendor, mainJs: join(build, 'dist/src/cli/main.js') });
  try {
    const n: Node = await bootstrapNode(agent, vendor, LICENSE);
    const t0 = performance.now();
    for (let i = 0; i < WRITES; i++) {
      const res = await agent.client.put(`/v1/peers/${n.peerId}`, {
        token: n.token,
        json: { name: `n${tag}-${i}` },
      });
      ok(res, 200, 'rename');
    }
    rounds[tag % 2]!.push(WRITES / ((performance.now() - t0) / 1000));
  } finally {
    await agent.stop();
  }
}

await latencyAndRate();
storeGrowth();
if (BASELINE) {
  // [0]: the baseline build, [1]: this one; alternating, so drift and disk noise hit both.
  const rounds: number[][] = [[], []];
  for (let r = 0; r < ROUNDS * 2; r++) await throughput(r % 2 === 0 ? BASELINE : REPO_ROOT, rounds, r);
  const base = median(rounds[0]!);
  const cur = median(rounds[1]!);
  result.throughput = {
    writes_per_round: WRITES,
    rounds: ROUNDS,
    baseline_writes_per_s: rounds[0],
    with_log_writes_per_s: rounds[1],
    ratio_with_log_over_baseline: cur / base,
  };
}

const l = result.latency as {
  same_agent_ms: Record<string, number>;
  same_agent_from_request_ms: Record<string, number>;
  other_agent_ms: Record<string, number>;
};
const r = result.rate as Record<string, number>;
const s = result.store as Record<string, number>;
const t = result.throughput as
  | { baseline_writes_per_s: number[]; with_log_writes_per_s: number[]; ratio_with_log_over_baseline: number }
  | undefined;
const lines = [
  `write ack -> SSE event, same agent:  p50 ${fmt(l.same_agent_ms.p50!, 1)} ms  p99 ${fmt(l.same_agent_ms.p99!, 1)} ms  max ${fmt(l.same_agent_ms.max!, 1)} ms  (${LATENCY_N} writes)`,
  `request sent -> SSE event, same agent: p50 ${fmt(l.same_agent_from_request_ms.p50!, 1)} ms  p99 ${fmt(l.same_agent_from_request_ms.p99!, 1)} ms`,
  `write ack -> SSE event, other agent: p50 ${fmt(l.other_agent_ms.p50!, 1)} ms  p99 ${fmt(l.other_agent_ms.p99!, 1)} ms  max ${fmt(l.other_agent_ms.max!, 1)} ms`,
  `events recorded/s (1000 per transaction): ${fmt(r.recorded_per_s!)}; recorded and streamed/s: ${fmt(r.recorded_and_streamed_per_s!)}`,
  `store growth per 100,000 events: ${fmt(s.bytes_per_100k! / 1e6, 1)} MB (${fmt(s.bytes_per_event!)} B/event); in-process record ${fmt(s.in_process_record_per_s!)}/s`,
  t
    ? `writes/s, PUT /v1/peers/self: baseline ${t.baseline_writes_per_s.map((x) => fmt(x)).join(' ')}; with the log ${t.with_log_writes_per_s.map((x) => fmt(x)).join(' ')}; ratio ${fmt(t.ratio_with_log_over_baseline, 3)}`
    : 'write throughput ratio: skipped (set BENCH_BASELINE to a built checkout of the commit before the log)',
];
process.stdout.write(`${lines.join('\n')}\n`);
const out = join(REPO_ROOT, 'bench/results');
mkdirSync(out, { recursive: true });
writeFileSync(
  join(out, `events-${result.at as string}.json`.replace(/[:.]/g, '').replace('json', '.json')),
  `${JSON.stringify(result, null, 2)}\n`,
);
