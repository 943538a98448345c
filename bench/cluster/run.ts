/**
 * bench/cluster: how fast one change reaches every agent of a cluster, and what gossip costs on
 * the wire (`npm run bench:cluster`).
 *
 * - Agents: N in-process instances (`startAgent` from src/agent.ts), each with its own data dir,
 *   port and SQLite store, gossiping with each other over real loopback HTTP at a 200 ms
 *   interval. They run in forked host processes (host.ts), at most BENCH_AGENTS_PER_HOST (13)
 *   each: N = 10 in one, N = 50 in four. All 50 in one process shared one event loop with
 *   0.1-0.7 s of lag, enough to time out 100 ms probes, so that layout measured the bench
 *   machine's single core rather than the protocol. Set-up and writes go through each agent's
 *   own API (`app.inject` in its host): bootstrap with licenses of one vendor and license id,
 *   admin tokens, joins (agent 0 adds every other agent by the handshake). No message loss: the
 *   agents hold no switch to drop messages (the product has no test switch), and a packet filter
 *   under TCP turns loss into retransmission delay, another fault; convergence under message
 *   loss is measured by the simulator (sim.ts), these runs are its 0 % reference. The hosts' CPU
 *   and worst event-loop lag are reported for every phase, so a CPU-bound figure shows as such.
 * - Convergence: one change = a rename of a random peer (PUT /v1/peers/{id}) on a random agent.
 *   t0 is taken by the writer's host just before the write; every agent's store is watched
 *   directly in its host (a write listener plus a 5 ms poll) for the moment it first holds the
 *   new name (times on the machine-wide monotonic clock). Per change: the time until the last
 *   agent has it, which for N ≤ 10 000 is also the time until 99.99 % of the agents have it.
 *   p50 and p99 over the changes, in seconds and in gossip rounds (seconds / interval).
 * - Traffic: `mesh_gossip_http_bytes_total` (the HTTP bytes of every exchange, headers included,
 *   counted on the connection by the agent that started it) summed over the agents before and
 *   after a window, per agent per second: idle, and with one change per second; then again after
 *   adding services with 2 routes each (200, or N·(N−1) if fewer pairs exist). The estimate
 *   `mesh_gossip_bytes_total{direction="sent"}` (payload + 200 B per envelope) is printed beside
 *   it. The target is idle traffic independent of the number of records, checked on the bytes of
 *   one probe exchange (the idle rate also moves with indirect probes a loaded host causes) and
 *   on idle anti-entropy staying at about zero (states that never converged would cost that).
 * - Baselines in the same run: the anchor (Serf's epidemic model: 99.99 % of 50 nodes in
 *   about 1.0 s at a 200 ms interval), and a Monte-Carlo run, made here, of the memberlist model
 *   Serf uses (each gossip tick sends queued broadcasts to 3 random nodes, each broadcast is sent
 *   4·ceil(log10(N+1)) times, each message lost with the same probability) at the same N, loss
 *   and interval. Figures are printed as ratios to the targets and to the model.
 *
 * Output: a table on stdout and the same as JSON in bench/results/cluster-<timestamp>.json
 * (git-ignored). Exit code 1 when a target fails.
 *
 * Environment: BENCH_SIZES (10,50), BENCH_LOSSES (0; nothing else), BENCH_CHANGES (25, per configuration),
 * BENCH_WINDOW (10, seconds per traffic window), BENCH_SERVICES (200), BENCH_INTERVAL_MS (200),
 * BENCH_AGENTS_PER_HOST (13; 50 puts every agent in one host process), BENCH_MODEL_RUNS (20000),
 * BENCH_HOST_NODE_ARGS (node flags for the host processes, e.g. --cpu-prof),
 * BENCH_KEEP (0; 1 keeps the agents' data dirs and logs), BENCH_TRACE (0; 1 logs every change's
 * per-agent times).
 */
import { type ChildProcess, fork } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import type { License } from '../../src/domain/license.js';
import { generateLicenseKeyPair, loadLicenseSigningKey, signLicense } from '../../src/license/sign.js';
import { fmt, REPO_ROOT, sleep } from '../api/measure.js';
import {
  addCounters,
  type CallResult,
  type GossipCounters,
  type HostedAgent,
  type HostOp,
  type HostReply,
  type HostRequest,
  monoMs,
  type PhaseLoad,
  phaseMeter,
  type StateEntry,
} from './host.js';

// --- settings ------------------------------------------------------------------------------

const env = process.env;
const int = (name: string, fallback: number): number => {
  const v = env[name];
  if (v === undefined || v === '') return fallback;
  if (!/^\d+$/.test(v)) throw new Error(`${name} must be a whole number, got ${JSON.stringify(v)}`);
  return Number(v);
};
const numbers = (name: string, fallback: number[]): number[] => {
  const v = env[name];
  if (v === undefined || v === '') return fallback;
  const xs = v.split(',').map((s) => Number(s.trim()));
  if (xs.some((x) => !Number.isFinite(x))) throw new Error(`${name} must be numbers separated by commas`);
  return xs;
};
/** Real agents run at 0 % loss only (above): any other share is refused, naming sim.ts. */
const noLoss = (losses: number[]): number[] => {
  if (losses.some((l) => l !== 0)) {
    throw new Error('BENCH_LOSSES: real agents run at 0 % loss; bench/cluster/sim.ts measures loss');
  }
  return losses;
};
const settings = {
  sizes: numbers('BENCH_SIZES', [10, 50]),
  losses: noLoss(numbers('BENCH_LOSSES', [0])),
  changes: int('BENCH_CHANGES', 25),
  windowSeconds: int('BENCH_WINDOW', 10),
  services: int('BENCH_SERVICES', 200),
  intervalMs: int('BENCH_INTERVAL_MS', 200),
  agentsPerHost: Math.max(1, int('BENCH_AGENTS_PER_HOST', 13)),
  modelRuns: int('BENCH_MODEL_RUNS', 20_000),
  hostNodeArgs: (env.BENCH_HOST_NODE_ARGS ?? '').split(' ').filter(Boolean),
  keep: env.BENCH_KEEP === '1',
};

/** The gossip targets (p99 convergence: 2 s, 4 s under loss) and the Serf anchor, at a 200 ms interval. */
const TARGET_P99_S = (loss: number) => (loss > 0 ? 4 : 2);
const SERF_ANCHOR_S = 1.0;
/**
 * A probe exchange (ping and its answer, HTTP bytes) with the services may be at most this
 * multiple of one without them: the idle cost that could grow with the records. The whole idle
 * rate is printed beside it, but also moves with indirect probes that a loaded host causes.
 */
const IDLE_GROWTH_MAX = 1.1;
/**
 * Anti-entropy exchanges per agent per second allowed in an idle window: once a change has
 * spread, every root is equal and no probe starts one. More means states that never converge,
 * whose cost the per-probe figure would not show.
 */
const IDLE_ANTI_ENTROPY_MAX = 0.02;
/** A change not everywhere after this long counts as not converged (an infinite time). */
const CHANGE_TIMEOUT_MS = 30_000;

const log = (msg: string) =>
  process.stderr.write(`[bench:cluster ${new Date().toISOString().slice(11, 19)}] ${msg}\n`);

// --- statistics ----------------------------------------------------------------------------

/** Nearest-rank percentile; Infinity (a change that never converged) sorts last. */
function percentile(xs: readonly number[], p: number): number {
  const s = xs.filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}
const secs = (x: number, digits = 3) => (x === Number.POSITIVE_INFINITY ? 'never' : fmt(x, digits));

// --- host processes ------------------------------------------------------------------------

const HOST_SCRIPT = fileURLToPath(new URL('./host.js', import.meta.url));

/** One forked host process (host.ts) and its request/reply channel. */
class Host {
  private readonly proc: ChildProcess;
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
  private readonly exited: Promise<void>;

  constructor(onSeen: (watchId: number, index: number, at: number) => void) {
    this.proc = fork(HOST_SCRIPT, [], {
      stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
      execArgv: settings.hostNodeArgs,
    });
    this.proc.on('message', (raw) => {
      const msg = raw as HostReply;
      if ('op' in msg) {
        onSeen(msg.watchId, msg.index, msg.at);
        return;
      }
      const waiter = this.pending.get(msg.id);
      if (!waiter) return;
      this.pending.delete(msg.id);
      if (msg.ok) waiter.resolve(msg.result);
      else waiter.reject(new Error(`host ${this.proc.pid}: ${msg.error}`));
    });
    this.exited = new Promise((done) =>
      this.proc.once('exit', (code, signal) => {
        for (const w of this.pending.values()) w.reject(new Error(`host exited (${code ?? signal})`));
        this.pending.clear();
        done();
      }),
    );
  }

  get pid(): number {
    return this.proc.pid ?? 0;
  }

  request<T>(op: HostOp): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.proc.send({ id, ...op } satisfies HostRequest, (err) => {
        if (err) {
          this.pending.delete(id);
          reject(err);
        }
      });
    });
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      const timer = setTimeout(() => this.proc.kill('SIGKILL'), 30_000);
      await this.request({ op: 'stop' }).catch(() => this.proc.kill('SIGKILL'));
      await this.exited;
      clearTimeout(timer);
    }
  }
}

/** What a phase cost: the hosts' CPU summed, their event-loop lag at its worst. */
interface ClusterLoad extends PhaseLoad {
  /** This coordinating process's own CPU, 100 = one core (included in cpuPct). */
  coordinatorCpuPct: number;
  perHost: PhaseLoad[];
}

const describeLoad = (l: ClusterLoad) =>
  `CPU ${fmt(l.cpuPct)}% of a core (hosts ${l.perHost.map((h) => fmt(h.cpuPct)).join('+')}), worst host's event-loop lag p50 ${fmt(l.lagP50Ms, 1)} / p99 ${fmt(l.lagP99Ms, 1)} / max ${fmt(l.lagMaxMs)} ms, load ${fmt(l.loadAvg[0], 2)} -> ${fmt(l.loadAvg[1], 2)}`;

// --- the cluster ---------------------------------------------------------------------------

interface Member extends HostedAgent {
  host: Host;
}

/** The change being watched: when each agent first held it (monotonic ms, NaN = not yet). */
interface Watch {
  watchId: number;
  seenAt: Float64Array;
}

class Cluster {
  readonly members: Member[] = [];
  readonly hosts: Host[] = [];
  private current: Watch | undefined;
  private watchSeq = 0;
  private meterStop: (() => PhaseLoad) | undefined;

  private constructor(private readonly workDir: string) {}

  get n(): number {
    return this.members.length;
  }

  /**
   * Forks the hosts, which start and bootstrap their share of the n agents; then agent 0 adds
   * every other agent by the handshake, and this waits until every agent lists n active peers.
   */
  static async start(n: number, license: License, publicKeyPem: string): Promise<Cluster> {
    const cluster = new Cluster(mkdtempSync(join(tmpdir(), `bench-cluster-${n}-`)));
    try {
      const hostCount = Math.max(1, Math.ceil(n / settings.agentsPerHost));
      for (let h = 0; h < hostCount; h++) {
        cluster.hosts.push(new Host((watchId, index, at) => cluster.seen(watchId, index, at)));
      }
      const hosted = await Promise.all(
        cluster.hosts.map(async (host, h) => {
          const indices = Array.from({ length: n }, (_, i) => i).filter((i) => i % hostCount === h);
          const agents = await host.request<HostedAgent[]>({
            op: 'start',
            indices,
            workDir: cluster.workDir,
            license,
            publicKeyPem,
            intervalMs: settings.intervalMs,
          });
          return agents.map((a): Member => ({ ...a, host }));
        }),
      );
      cluster.members.push(...hosted.flat().sort((a, b) => a.index - b.index));
      const first = cluster.members[0]!;
      for (const m of cluster.members.slice(1)) {
        await cluster.call(first, 'POST', '/v1/peers', { address: m.address });
      }
      await cluster.waitUntil(
        async () => (await cluster.states()).every((s) => s.activePeers === n),
        120_000,
        `every agent to list ${n} peers`,
      );
      await cluster.settle();
      return cluster;
    } catch (err) {
      await cluster.stop();
      throw err;
    }
  }

  /** An API call on agent m (in its host, by app.inject with m's admin token); throws on non-2xx. */
  async call(m: Member, method: 'GET' | 'POST' | 'PUT' | 'DELETE', url: string, payload?: unknown) {
    const res = await m.host.request<CallResult>({ op: 'call', index: m.index, method, url, payload });
    if (res.status >= 300) {
      throw new Error(`${method} ${url} on agent ${m.index}: ${res.status} ${JSON.stringify(res.body)}`);
    }
    return res;
  }

  private async states(): Promise<StateEntry[]> {
    return (await Promise.all(this.hosts.map((h) => h.request<StateEntry[]>({ op: 'state' })))).flat();
  }

  async waitUntil(done: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (!(await done())) {
      if (performance.now() > deadline)
        throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
      await sleep(100);
    }
  }

  /**
   * Waits until every agent holds the same peers, services and routes, and then until no push or
   * anti-entropy message is sent for a whole second: after a burst of writes, copies of pushes
   * queued behind busy sockets keep arriving for a while after the states agree, and an idle
   * window must not count them.
   */
  async settle(timeoutMs = 180_000): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    await this.waitUntil(
      async () => new Set((await this.states()).map((s) => s.fingerprint)).size === 1,
      timeoutMs,
      'every agent to hold the same state',
    );
    const stateTraffic = (c: GossipCounters) =>
      ['push', 'push-reply', 'digest', 'digest-reply'].reduce((a, t) => a + (c.byType[t] ?? 0), 0);
    let before = stateTraffic(await this.counters());
    for (;;) {
      await sleep(1000);
      const now = stateTraffic(await this.counters());
      if (now === before) return;
      if (performance.now() > deadline) {
        log(`  warning: push and anti-entropy traffic did not stop within ${timeoutMs} ms`);
        return;
      }
      before = now;
    }
  }

  pick(): Member {
    return this.members[Math.floor(Math.random() * this.n)]!;
  }

  /** Starts reporting when each agent first holds `name` on peer `peerId`. */
  async watch(peerId: string, name: string): Promise<Watch> {
    const w: Watch = { watchId: ++this.watchSeq, seenAt: new Float64Array(this.n).fill(Number.NaN) };
    this.current = w;
    await Promise.all(this.hosts.map((h) => h.request({ op: 'watch', watchId: w.watchId, peerId, name })));
    return w;
  }

  async unwatch(): Promise<void> {
    this.current = undefined;
    await Promise.all(this.hosts.map((h) => h.request({ op: 'unwatch' })));
  }

  private seen(watchId: number, index: number, at: number): void {
    const w = this.current;
    if (w?.watchId === watchId && Number.isNaN(w.seenAt[index]!)) w.seenAt[index] = at;
  }

  async meterStart(): Promise<void> {
    await Promise.all(this.hosts.map((h) => h.request({ op: 'meter-start' })));
    this.meterStop = phaseMeter();
  }

  async meterEnd(): Promise<ClusterLoad> {
    const own = this.meterStop!();
    const perHost = await Promise.all(this.hosts.map((h) => h.request<PhaseLoad>({ op: 'meter-stop' })));
    const worst = (k: 'lagP50Ms' | 'lagP99Ms' | 'lagMaxMs') => Math.max(...perHost.map((h) => h[k]));
    return {
      cpuPct: own.cpuPct + perHost.reduce((a, h) => a + h.cpuPct, 0),
      lagP50Ms: worst('lagP50Ms'),
      lagP99Ms: worst('lagP99Ms'),
      lagMaxMs: worst('lagMaxMs'),
      loadAvg: own.loadAvg,
      coordinatorCpuPct: own.cpuPct,
      perHost,
    };
  }

  /** The gossip counters of every agent's /metrics, summed. */
  async counters(): Promise<GossipCounters> {
    return addCounters(
      await Promise.all(this.hosts.map((h) => h.request<GossipCounters>({ op: 'counters' }))),
    );
  }

  async stop(): Promise<void> {
    await Promise.all(this.hosts.map((h) => h.stop()));
    if (settings.keep) log(`kept ${this.workDir}`);
    else rmSync(this.workDir, { recursive: true, force: true });
  }
}

// --- convergence ---------------------------------------------------------------------------

interface ConvergenceRun {
  n: number;
  loss: number;
  changes: number;
  /** Seconds until the last agent had each change (Infinity: not within the timeout). */
  lastAgentS: number[];
  /** Seconds until half the agents had each change. */
  halfS: number[];
  /** Per change, the seconds until each agent had it, sorted (the writer first). */
  agentTimesS: number[][];
  p50S: number;
  p99S: number;
  maxS: number;
  p50Rounds: number;
  p99Rounds: number;
  halfP50S: number;
  /** Time the writer's own API call took, p50 (ms). */
  writeP50Ms: number;
  notConverged: number;
  targetP99S: number;
  model: ModelResult;
  load: ClusterLoad;
  /** Suspect and dead peers summed over all agents right after the run (liveness under loss). */
  suspectAfter: number;
  deadAfter: number;
}

/** The name a peer must carry; unique per change so that every change is a real write. */
let changeSeq = 0;
const nextName = () => `bench-${process.pid}-${++changeSeq}`;

function rename(cluster: Cluster): { writer: Member; peerId: string; name: string } {
  const writer = cluster.pick();
  const peerId = cluster.pick().peerId;
  const name = nextName();
  return { writer, peerId, name };
}

async function convergence(cluster: Cluster, loss: number, model: ModelResult): Promise<ConvergenceRun> {
  const n = cluster.n;
  const lastAgentS: number[] = [];
  const halfS: number[] = [];
  const agentTimesS: number[][] = [];
  const writeMs: number[] = [];
  await cluster.meterStart();
  for (let k = 0; k < settings.changes; k++) {
    const { writer, peerId, name } = rename(cluster);
    const w = await cluster.watch(peerId, name);
    // t0: when the writer's host handed the request to the agent's API.
    const { t0 } = await cluster.call(writer, 'PUT', `/v1/peers/${peerId}`, { name });
    writeMs.push(monoMs() - t0);
    const deadline = t0 + CHANGE_TIMEOUT_MS;
    while (w.seenAt.some(Number.isNaN) && monoMs() < deadline) await sleep(5);
    await cluster.unwatch();
    const times = [...w.seenAt].map((t) => (Number.isNaN(t) ? Number.POSITIVE_INFINITY : (t - t0) / 1000));
    lastAgentS.push(Math.max(...times));
    halfS.push(percentile(times, 50));
    agentTimesS.push(times.sort((a, b) => a - b).map((t) => Math.round(t * 1e4) / 1e4));
    if (env.BENCH_TRACE === '1') {
      log(
        `    change ${k}: write ${fmt(writeMs.at(-1)!, 1)} ms; agents at ms ${times.map((t) => fmt(t * 1000)).join(' ')}`,
      );
    }
    // A new change at a random phase of the agents' gossip ticks.
    await sleep(100 + Math.random() * settings.intervalMs * 2);
  }
  const load = await cluster.meterEnd();
  const after = await cluster.counters();
  const p50S = percentile(lastAgentS, 50);
  const p99S = percentile(lastAgentS, 99);
  const roundS = settings.intervalMs / 1000;
  return {
    n,
    loss,
    changes: settings.changes,
    lastAgentS,
    halfS,
    agentTimesS,
    p50S,
    p99S,
    maxS: Math.max(...lastAgentS),
    p50Rounds: p50S / roundS,
    p99Rounds: p99S / roundS,
    halfP50S: percentile(halfS, 50),
    writeP50Ms: percentile(writeMs, 50),
    notConverged: lastAgentS.filter((x) => x === Number.POSITIVE_INFINITY).length,
    targetP99S: TARGET_P99_S(loss),
    model,
    load,
    suspectAfter: after.suspect,
    deadAfter: after.dead,
  };
}

// --- traffic -------------------------------------------------------------------------------

interface TrafficWindow {
  n: number;
  services: number;
  routes: number;
  kind: 'idle' | 'one change per second';
  seconds: number;
  bytesPerAgentPerS: number;
  /** mesh_gossip_http_bytes_total of every exchange (exact, headers included), per agent per s. */
  httpBytesPerAgentPerS: number;
  /** HTTP bytes of one probe exchange (ping and its answer), on average over the window. */
  httpBytesPerProbe: number;
  messagesPerAgentPerS: number;
  antiEntropyPerAgentPerS: number;
  /** Messages sent per agent per second, by type. */
  messagesByTypePerAgentPerS: Record<string, number>;
  load: ClusterLoad;
}

async function trafficWindow(
  cluster: Cluster,
  kind: TrafficWindow['kind'],
  services: number,
): Promise<TrafficWindow> {
  const c0 = await cluster.counters();
  await cluster.meterStart();
  const t0 = performance.now();
  const ms = settings.windowSeconds * 1000;
  if (kind === 'idle') {
    await sleep(ms);
  } else {
    for (let s = 0; s < settings.windowSeconds; s++) {
      await sleep(Math.max(0, t0 + s * 1000 - performance.now()));
      const { writer, peerId, name } = rename(cluster);
      await cluster.call(writer, 'PUT', `/v1/peers/${peerId}`, { name });
    }
    await sleep(Math.max(0, t0 + ms - performance.now()));
  }
  const load = await cluster.meterEnd();
  const c1 = await cluster.counters();
  const perAgentPerS = (x: number) => x / cluster.n / ((performance.now() - t0) / 1000);
  return {
    n: cluster.n,
    services,
    routes: services * 2,
    kind,
    seconds: (performance.now() - t0) / 1000,
    bytesPerAgentPerS: perAgentPerS(c1.bytesSent - c0.bytesSent),
    httpBytesPerAgentPerS: perAgentPerS(c1.httpBytes - c0.httpBytes),
    httpBytesPerProbe:
      (c1.pingHttpBytes - c0.pingHttpBytes) / ((c1.byType.ping ?? 0) - (c0.byType.ping ?? 0)),
    messagesPerAgentPerS: perAgentPerS(c1.messagesSent - c0.messagesSent),
    antiEntropyPerAgentPerS: perAgentPerS(c1.antiEntropy - c0.antiEntropy),
    messagesByTypePerAgentPerS: Object.fromEntries(
      Object.entries(c1.byType)
        .map(([type, n]) => [type, Math.round(perAgentPerS(n - (c0.byType[type] ?? 0)) * 100) / 100])
        .filter(([, rate]) => rate !== 0),
    ),
    load,
  };
}

/** Creates `count` services with 2 routes each on agent 0 (the allocator); returns how many. */
async function addServices(cluster: Cluster, count: number): Promise<number> {
  const first = cluster.members[0]!;
  const ids = cluster.members.map((m) => m.peerId);
  const pairs = ids.flatMap((source) => ids.filter((t) => t !== source).map((target) => [source, target]));
  const made = Math.min(count, pairs.length);
  for (const [i, [source, target]] of pairs.slice(0, made).entries()) {
    const service = (
      await cluster.call(first, 'POST', '/v1/services', { source_peer_id: source, target_peer_id: target })
    ).body as { id: string };
    await cluster.call(first, 'POST', `/v1/services/${service.id}/routes`, {
      routes: [
        { priority: 10, source_cidr: null, dest_cidr: `10.${(i >> 8) & 255}.${i & 255}.0/24` },
        { priority: 20, source_cidr: `fd00:${i.toString(16)}::/32`, dest_cidr: '::/0' },
      ],
    });
  }
  return made;
}

// --- the model baseline --------------------------------------------------------------------

interface ModelResult {
  /**
   * Seconds until every node has the broadcast (= 99.99 % for N ≤ 10 000), over the runs where
   * it reached every node (memberlist's push-pull, every 30 s, repairs the others).
   */
  p50S: number;
  p99S: number;
  /** Share of runs where the broadcast died out before reaching everyone (push-pull repairs it later). */
  incomplete: number;
  runs: number;
}

/**
 * memberlist's broadcast model (what Serf's convergence figures come from): every node gossips
 * once per interval at its own phase to `fanout` random other nodes, piggybacking each queued
 * broadcast until it has been sent retransmitMult·ceil(log10(N+1)) times; a node that receives a
 * broadcast queues it for its next tick; each message is lost with probability `loss`; network
 * latency is taken as zero.
 */
function simulateEpidemic(n: number, loss: number, intervalMs: number, runs: number): ModelResult {
  const fanout = 3;
  const limit = 4 * Math.max(1, Math.ceil(Math.log10(n + 1)));
  const all: number[] = [];
  let incomplete = 0;
  const phase = new Float64Array(n);
  const infectedAt = new Float64Array(n);
  const sent = new Int32Array(n);
  const order = Array.from({ length: n }, (_, i) => i);
  for (let run = 0; run < runs; run++) {
    for (let i = 0; i < n; i++) phase[i] = Math.random() * intervalMs;
    order.sort((a, b) => phase[a]! - phase[b]!);
    infectedAt.fill(Number.POSITIVE_INFINITY);
    sent.fill(0);
    infectedAt[0] = 0;
    let infected = 1;
    for (let tick = 0; infected < n && tick < 1000; tick++) {
      for (const node of order) {
        const t = tick * intervalMs + phase[node]!;
        if (!(infectedAt[node]! < t)) continue;
        for (let k = 0; k < fanout && sent[node]! < limit; k++) {
          let target = Math.floor(Math.random() * (n - 1));
          if (target >= node) target++;
          sent[node]!++;
          if (Math.random() >= loss && infectedAt[target]! > t) {
            if (infectedAt[target] === Number.POSITIVE_INFINITY) infected++;
            infectedAt[target] = t;
          }
        }
      }
      // Every node that has it has sent it its last time: the broadcast died out.
      let active = false;
      for (let i = 0; i < n && !active; i++) {
        active = infectedAt[i] !== Number.POSITIVE_INFINITY && sent[i]! < limit;
      }
      if (!active) break;
    }
    let last = 0;
    for (let i = 0; i < n; i++) last = Math.max(last, infectedAt[i]!);
    if (last === Number.POSITIVE_INFINITY) incomplete++;
    else all.push(last / 1000);
  }
  return { p50S: percentile(all, 50), p99S: percentile(all, 99), incomplete: incomplete / runs, runs };
}

// --- the run -------------------------------------------------------------------------------

interface SizeResult {
  n: number;
  /** Host processes the agents ran in. */
  hosts: number;
  setupSeconds: number;
  convergence: ConvergenceRun[];
  traffic: TrafficWindow[];
  servicesSeconds: number;
}

async function benchSize(n: number, license: License, publicKeyPem: string): Promise<SizeResult> {
  log(`N = ${n}: starting, bootstrapping and joining ${n} agents`);
  const t0 = performance.now();
  const cluster = await Cluster.start(n, license, publicKeyPem);
  running = cluster;
  const setupSeconds = (performance.now() - t0) / 1000;
  log(
    `  cluster of ${n} ready in ${fmt(setupSeconds, 1)} s, in ${cluster.hosts.length} host processes (pids ${cluster.hosts.map((h) => h.pid).join(', ')}); load ${fmt(loadavg()[0]!, 2)}`,
  );
  try {
    const traffic: TrafficWindow[] = [];
    const window = async (kind: TrafficWindow['kind'], services: number) => {
      const w = await trafficWindow(cluster, kind, services);
      log(
        `  traffic, ${services} services, ${kind}: ${fmt(w.bytesPerAgentPerS)} B/agent/s (HTTP ${fmt(w.httpBytesPerAgentPerS)}, ${fmt(w.httpBytesPerProbe)} per probe), ${fmt(w.messagesPerAgentPerS, 1)} msg/agent/s, ${fmt(w.antiEntropyPerAgentPerS, 2)} anti-entropy/agent/s (${Object.entries(
          w.messagesByTypePerAgentPerS,
        )
          .map(([t, r]) => `${t} ${r}`)
          .join(', ')}); ${describeLoad(w.load)}`,
      );
      traffic.push(w);
      await cluster.settle();
    };
    await window('idle', 0);
    await window('one change per second', 0);

    const runs: ConvergenceRun[] = [];
    for (const loss of settings.losses) {
      const model = simulateEpidemic(n, loss, settings.intervalMs, settings.modelRuns);
      log(`  convergence at ${fmt(loss * 100)} % loss: ${settings.changes} changes`);
      const r = await convergence(cluster, loss, model);
      log(
        `    last agent p50 ${secs(r.p50S)} s, p99 ${secs(r.p99S)} s (${fmt(r.p99Rounds, 1)} rounds), half the agents p50 ${secs(r.halfP50S)} s, not converged ${r.notConverged}; model p50 ${secs(model.p50S)} / p99 ${secs(model.p99S)} s; ${describeLoad(r.load)}; suspect/dead after: ${r.suspectAfter}/${r.deadAfter}`,
      );
      runs.push(r);
      await cluster.settle();
    }

    log(`  adding services with 2 routes each`);
    const s0 = performance.now();
    const services = await addServices(cluster, settings.services);
    await cluster.settle();
    const servicesSeconds = (performance.now() - s0) / 1000;
    log(`  ${services} services and ${services * 2} routes everywhere in ${fmt(servicesSeconds, 1)} s`);
    await window('idle', services);
    await window('one change per second', services);
    return { n, hosts: cluster.hosts.length, setupSeconds, convergence: runs, traffic, servicesSeconds };
  } finally {
    running = undefined;
    await cluster.stop();
  }
}

/** The cluster being measured, stopped (hosts, data dirs) if this process is told to stop. */
let running: Cluster | undefined;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    log(`${signal}: stopping the agents`);
    void (running?.stop() ?? Promise.resolve()).finally(() => process.exit(130));
  });
}

function report(results: SizeResult[]): { table: string; failed: string[] } {
  const lines: string[] = [];
  const failed: string[] = [];
  const ratio = (a: number, b: number) => (a === Number.POSITIVE_INFINITY ? 'inf' : fmt(a / b, 2));
  lines.push(
    `Convergence of one change (rename of a random peer on a random agent), gossip interval ${settings.intervalMs} ms, ${settings.changes} changes per row.`,
    'Time until the LAST agent has it (= 99.99 % of agents for these N). Rounds = seconds / interval.',
    `Model = memberlist/Serf broadcast model simulated here (${settings.modelRuns} runs, same N, loss, interval; p50/p99 over the runs that reach every node, the share that dies out is shown). Anchor: Serf, 99.99 % of 50 nodes in ~${SERF_ANCHOR_S} s.`,
    '',
    "CPU = the hosts' CPU summed (100 = one core of the 2); lag = the worst host's event-loop lag; suspect/dead = peers held suspect/dead, summed over the agents, right after the row.",
    '',
    '| N (hosts) | loss | p50 s | p99 s | max s | p50 rounds | p99 rounds | half p50 s | target p99 | p99/target | model p50/p99 s | p99/model p99 | p99/anchor | CPU % | lag p99/max ms | suspect/dead |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  );
  for (const s of results) {
    for (const r of s.convergence) {
      const ok = r.p99S <= r.targetP99S;
      if (!ok) failed.push(`N=${r.n} loss ${r.loss}: p99 ${secs(r.p99S)} s > ${r.targetP99S} s`);
      lines.push(
        `| ${r.n} (${s.hosts}) | ${fmt(r.loss * 100)} % | ${secs(r.p50S)} | ${secs(r.p99S)} | ${secs(r.maxS)} | ${fmt(r.p50Rounds, 2)} | ${fmt(r.p99Rounds, 2)} | ${secs(r.halfP50S)} | ≤ ${r.targetP99S} | ${ratio(r.p99S, r.targetP99S)} ${ok ? 'ok' : 'FAIL'} | ${secs(r.model.p50S, 2)} / ${secs(r.model.p99S, 2)}${r.model.incomplete > 0 ? ` (${fmt(r.model.incomplete * 100, 2)} % of runs die out)` : ''} | ${ratio(r.p99S, r.model.p99S)} | ${ratio(r.p99S, SERF_ANCHOR_S)} | ${fmt(r.load.cpuPct)} | ${fmt(r.load.lagP99Ms, 1)}/${fmt(r.load.lagMaxMs)} | ${r.suspectAfter}/${r.deadAfter} |`,
      );
    }
  }
  lines.push(
    '',
    `Gossip traffic per agent per second, ${settings.windowSeconds} s windows, 0 % loss: HTTP = mesh_gossip_http_bytes_total (exact, headers included, every exchange counted once); envelope = mesh_gossip_bytes_total{direction="sent"} (payload + a flat 200 B per envelope).`,
    '',
    '| N | services (routes) | window | HTTP B/agent/s | vs idle without services | HTTP B per probe | vs without services | envelope B/agent/s | msgs/agent/s | anti-entropy/agent/s | CPU % | lag p99/max ms | msgs/agent/s by type |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  );
  for (const s of results) {
    const idle = s.traffic.find((w) => w.kind === 'idle' && w.services === 0);
    const base = idle?.httpBytesPerAgentPerS ?? Number.NaN;
    const baseProbe = idle?.httpBytesPerProbe ?? Number.NaN;
    for (const w of s.traffic) {
      let verdict = '';
      if (w.kind === 'idle' && w.services > 0) {
        const probeOk = w.httpBytesPerProbe <= baseProbe * IDLE_GROWTH_MAX;
        const quiet = w.antiEntropyPerAgentPerS <= IDLE_ANTI_ENTROPY_MAX;
        verdict = probeOk && quiet ? ' ok' : ' FAIL';
        if (!probeOk) {
          failed.push(
            `N=${s.n}: an idle probe with ${w.services} services costs ${fmt(w.httpBytesPerProbe / baseProbe, 2)}× one without (max ${IDLE_GROWTH_MAX})`,
          );
        }
        if (!quiet) {
          failed.push(
            `N=${s.n}: ${fmt(w.antiEntropyPerAgentPerS, 3)} anti-entropy exchanges per agent per second while idle with ${w.services} services (max ${IDLE_ANTI_ENTROPY_MAX})`,
          );
        }
      }
      lines.push(
        `| ${w.n} | ${w.services} (${w.routes}) | ${w.kind} | ${fmt(w.httpBytesPerAgentPerS)} | ${fmt(w.httpBytesPerAgentPerS / base, 2)} | ${fmt(w.httpBytesPerProbe)} | ${fmt(w.httpBytesPerProbe / baseProbe, 2)}${verdict} | ${fmt(w.bytesPerAgentPerS)} | ${fmt(w.messagesPerAgentPerS, 1)} | ${fmt(w.antiEntropyPerAgentPerS, 2)} | ${fmt(w.load.cpuPct)} | ${fmt(w.load.lagP99Ms, 1)}/${fmt(w.load.lagMaxMs)} | ${Object.entries(
          w.messagesByTypePerAgentPerS,
        )
          .map(([t, r]) => `${t} ${fmt(r, 2)}`)
          .join(', ')} |`,
      );
    }
  }
  lines.push(
    '',
    `Targets: p99 ≤ 2 s at 0 % loss, ≤ 4 s at 20 %; an idle probe with services ≤ ${IDLE_GROWTH_MAX}× one without, and ≤ ${IDLE_ANTI_ENTROPY_MAX} anti-entropy exchanges per agent per second while idle. ${failed.length === 0 ? 'Overall: ok' : `Overall: FAIL (${failed.join('; ')})`}`,
  );
  return { table: lines.join('\n'), failed };
}

async function main(): Promise<number> {
  const stamp = new Date()
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d+Z$/, 'Z');
  const vendor = generateLicenseKeyPair();
  const maxNodes = Math.max(...settings.sizes);
  const license = signLicense(
    {
      customer_id: 'customer-bench',
      license_id: 'license-bench-cluster',
      issued_at: new Date(Date.now() - 60_000).toISOString(),
      expires_at: new Date(Date.now() + 86_400_000).toISOString(),
      max_nodes: maxNodes,
      max_services: Math.max(settings.services, 1),
    },
    loadLicenseSigningKey(vendor.privatePem),
  );
  log(
    `Node ${process.version}, ${cpus().length} CPUs, sizes ${settings.sizes.join(', ')}, losses ${settings.losses.join(', ')}, ${settings.changes} changes each, interval ${settings.intervalMs} ms; at most ${settings.agentsPerHost} agents per host process`,
  );
  const results: SizeResult[] = [];
  const resultsDir = join(REPO_ROOT, 'bench/results');
  mkdirSync(resultsDir, { recursive: true });
  const file = join(resultsDir, `cluster-${stamp}.json`);
  /** Written after every cluster size, so that an interrupted run keeps what it measured. */
  const save = (complete: boolean) => {
    const { table, failed } = report(results);
    writeFileSync(
      file,
      JSON.stringify(
        {
          stamp,
          complete,
          node: process.version,
          cpus: cpus().length,
          layout: `agents in forked host processes, at most ${settings.agentsPerHost} each; gossip over loopback HTTP`,
          settings,
          targets: {
            p99S: { loss0: 2, loss20: 4 },
            serfAnchorS: SERF_ANCHOR_S,
            idleGrowthMax: IDLE_GROWTH_MAX,
          },
          results,
          failed,
          table,
        },
        (_k, v: unknown) => (v === Number.POSITIVE_INFINITY ? 'Infinity' : v),
        2,
      ),
    );
    return { table, failed };
  };
  for (const n of settings.sizes) {
    results.push(await benchSize(n, license, vendor.publicPem));
    save(false);
  }
  const { table, failed } = save(true);
  process.stdout.write(`${table}\n`);
  log(`wrote ${file}`);
  return failed.length === 0 ? 0 : 1;
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    process.stderr.write(`bench:cluster: ${(err as Error).stack ?? String(err)}\n`);
    process.exitCode = 2;
  },
);
