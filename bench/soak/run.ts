/**
 * bench/soak/run: does an agent's memory stay flat under an operator's steady load? Two real agent
 * processes (ingress and exit) in network namespaces, one cluster, one `tcp` service ingress ->
 * exit carrying a client network's traffic to a destination network, for hours; every agent is
 * sampled at a fixed interval and the figures' growth over the measured window is computed.
 * `npm run bench:soak -- [--duration 2h] [--warmup 15m] [--idle 2m] [--sample 30s]
 * [--variant modest|heavy] [--snapshots] [--gc-every 1] [--prefix msoak] [--mgmt-index 230]
 * [--node-args=--initial-old-space-size=32]`, as root, after
 * `npm run build`; not part of the tests. Durations: 90s, 15m, 2h, or plain seconds.
 *
 * - Topology: test/helpers/netns-topology.ts (client, ingress, exit, dest; a management veth from
 *   this process to each agent namespace, in 10.254.MGMT_INDEX.0/28). The destination's server is
 *   test/helpers/netns-apps.ts `serve` (HTTP 8080, UDP echo 9090). Agents: AgentProcess with the
 *   agent's defaults (gossip interval, log level info, its V8 flags), data plane on, NAT exit.
 *   Service: transport tcp, route 10.91.1.0/24 -> 10.91.2.0/24 (priority 100). The run takes no
 *   lock against the data-plane test suites: run it on a machine of its own.
 * - Phases: setup (one GET through the service checks it), idle (--idle: service up, no traffic),
 *   warm-up (--warmup: full load, sampled, excluded from every growth figure), measured window
 *   (the rest of --duration, which counts from the start of the load and includes the warm-up).
 * - Load, modest (default), from the client namespace (load.ts) and this process: 5 downloads/s of
 *   1 MiB (new connection each, length and SHA-256 checked), a UDP echo every 500 ms (new socket
 *   each), a ping every second; through the ingress's API: the route's dest_cidr set to
 *   10.91.2.0/25 and back every 10 s (one PUT every 5 s; both cover the destination, so traffic
 *   must not notice), every 30 s a credential created, a token taken with it and used, the
 *   credential revoked and its token checked to be refused, and POST /v1/cluster/sync every
 *   minute. Heavy: 20 downloads/s of 256 KiB (a quarter of them through a second service, with
 *   transport_type kcp: the API allows one service per pair of agents, so it runs from the ingress
 *   to the topology's second exit, exit2, a third agent, sampled too, with route 10.91.1.0/24 ->
 *   10.91.4.0/24, the destination's second leg), 20 short GETs/s, a UDP echo every 250 ms (both
 *   services in turn), a ping per service every second, route churn every 2 s.
 * - Samples, per agent, every --sample: RSS (VmRSS of /proc/PID/status, before the forced GC),
 *   open fds (/proc/PID/fd), and through probe.ts (loaded into the agent with `node --expose-gc
 *   --import probe.js`, no switch of the product; checked at start to have survived the agent's
 *   restart in place with its V8 flags): V8 heap used after a forced full GC, external and array
 *   buffer memory, active handles (process.getActiveResourcesInfo(), including the probe's own
 *   connection), event-loop delay p99 since the previous sample (above the monitor's 10 ms tick);
 *   plus the agent's CPU % and its services' open streams (GET /v1/services/{id}). The forced GC
 *   keeps the heap compact, so an agent under the probe shows a lower RSS than the same agent left
 *   alone (whose old generation may grow to its headroom, 32 MB, before V8 collects it, src/cli/v8-flags.ts):
 *   idle samples force no GC but the last one (idle RSS is the agent's own), and --gc-every N
 *   forces it only every Nth sample under load (the after-GC figures then come from those).
 * - Figures, per agent, over the measured window: start and end = medians of the first and last
 *   max(5, 10 % of the samples); growth per hour = least-squares slope; for RSS, the ratio
 *   end/start over the last hour of the window (the whole window when it is shorter than an hour,
 *   said so beside it). Budgets, printed as PASS/FAIL: RSS after warm-up (its maximum over the
 *   measured window) under 120 MB; RSS growth over the last hour at most 10 %; idle RSS under
 *   90 MB: the median of the second half of the idle samples, once V8 has given back what start-up
 *   took (the first idle sample, shown beside it, can be 30-40 MB higher; give --idle a minute or
 *   more).
 * - Failures, counted per kind and phase and printed: a download that failed, was short or
 *   corrupt, timed out (30 s) or could not start (100 unfinished), a lost or wrong UDP echo, a lost
 *   ping, a short connection that failed, an API call with an unexpected status, a probe that did
 *   not answer, an agent that exited, a secret of the run found in an agent's log. A soak with any
 *   failure, or a FAIL budget, exits 1.
 * - --snapshots: a heap snapshot of each agent (v8.writeHeapSnapshot through the probe) at the
 *   start and at the end of the measured window, and the top 20 constructors by count difference
 *   (heap-snapshot.ts: self sizes, no retainers; open the files in Chrome DevTools for those).
 *   Writing a snapshot blocks the agent for seconds (the load is held meanwhile, so the pause is
 *   not counted as failures) and leaves its RSS far higher for good (the snapshot writer's memory
 *   stays with the process: +80 to +100 MB on a 23 MB heap here). The window's samples all come
 *   after the start snapshot; its RSS figures are then not the agent's own, and the two RSS budgets
 *   of the window are printed as not valid and left out of the result. Run without --snapshots
 *   for the RSS budgets, with it to see what grows.
 * Reading it: a flat heap after GC with a rising RSS points at native memory (Buffers, the addons,
 *   malloc fragmentation), a rising heap at JavaScript objects kept alive (see the snapshot diff),
 *   rising handles or fds at sockets or timers never closed. A short run's slopes are noisy: the
 *   budget's last-hour figure needs a 2-hour soak.
 * Output: Markdown tables on stdout, progress on stderr, JSON in bench/results/soak-<timestamp>.json,
 * agent logs and snapshots in bench/results/soak-<timestamp>-raw/ (git-ignored). First Ctrl-C: the
 * soak ends early and reports what it has; second Ctrl-C or SIGTERM: tear down at once. Agents,
 * processes and namespaces are removed on every exit.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { cpus, loadavg, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as delay } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { AgentProcess, bootstrap } from '../../test/helpers/agent-process.js';
import type { ApiResponse } from '../../test/helpers/api-client.js';
import { makeVendor, type Vendor } from '../../test/helpers/licenses.js';
import { APPS, HTTP, PORT, UDP, until, waitUp } from '../../test/helpers/mesh-netns.js';
import { IP, type Topology, topologyUp } from '../../test/helpers/netns-topology.js';
import type { Node } from '../../test/helpers/nodes.js';
import { cpuMs, fmt, median, procStatusKb, REPO_ROOT } from '../api/measure.js';
import {
  type ConstructorDiff,
  diffHeapSummaries,
  diffTable,
  summarizeHeapSnapshot,
} from './heap-snapshot.js';
import type { LoadConfig, Target } from './load.js';
import type { ProbeSample } from './probe.js';

// --- settings --------------------------------------------------------------------------------

const USAGE =
  'usage: node dist/bench/soak/run.js [--duration 2h] [--warmup 15m] [--idle 2m] [--sample 30s] ' +
  '[--variant modest|heavy] [--snapshots] [--gc-every 1] [--prefix msoak] [--mgmt-index 230] [--node-args ARGS]';

class UsageError extends Error {}

/** "90s", "15m", "2h", "500ms" or plain seconds, in ms. */
export function parseDuration(text: string, flag: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text.trim());
  if (!m) throw new UsageError(`--${flag}: not a duration: ${text} (e.g. 90s, 15m, 2h)`);
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(m[2] ?? 's') as 'ms' | 's' | 'm' | 'h'];
  return Math.round(Number(m[1]) * unit);
}

const human = (ms: number) =>
  ms >= 3_600_000 && ms % 3_600_000 === 0
    ? `${ms / 3_600_000}h`
    : ms >= 60_000 && ms % 60_000 === 0
      ? `${ms / 60_000}m`
      : `${ms / 1000}s`;

interface Variant {
  downloadsPerSec: number;
  downloadBytes: number;
  /** Weight of the kcp service's destination among the downloads (0: no kcp service). */
  kcpWeight: number;
  tcpWeight: number;
  shortPerSec: number;
  udpEveryMs: number;
  routeChurnMs: number;
  credentialEveryMs: number;
  syncEveryMs: number;
}

const VARIANTS: Record<'modest' | 'heavy', Variant> = {
  modest: {
    downloadsPerSec: 5,
    downloadBytes: 1024 * 1024,
    kcpWeight: 0,
    tcpWeight: 1,
    shortPerSec: 0,
    udpEveryMs: 500,
    routeChurnMs: 10_000,
    credentialEveryMs: 30_000,
    syncEveryMs: 60_000,
  },
  heavy: {
    downloadsPerSec: 20,
    downloadBytes: 256 * 1024,
    kcpWeight: 1,
    tcpWeight: 3,
    shortPerSec: 20,
    udpEveryMs: 250,
    routeChurnMs: 2_000,
    credentialEveryMs: 30_000,
    syncEveryMs: 60_000,
  },
};

const BUDGET = { rssMb: 120, lastHourGrowth: 0.1, idleRssMb: 90 };

const parseOptions = () =>
  parseArgs({
    options: {
      duration: { type: 'string', default: '2h' },
      warmup: { type: 'string', default: '15m' },
      idle: { type: 'string', default: '2m' },
      sample: { type: 'string', default: '30s' },
      variant: { type: 'string', default: 'modest' },
      snapshots: { type: 'boolean', default: false },
      prefix: { type: 'string', default: 'msoak' },
      'mgmt-index': { type: 'string', default: '230' },
      'gc-every': { type: 'string', default: '1' },
      'node-args': { type: 'string', default: '' },
      help: { type: 'boolean', default: false },
    },
    strict: true,
  });

function settings() {
  let parsed: ReturnType<typeof parseOptions>;
  try {
    parsed = parseOptions();
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n${USAGE}`);
  }
  const { values } = parsed;
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  const variant = values.variant as string;
  if (variant !== 'modest' && variant !== 'heavy')
    throw new UsageError(`--variant: modest or heavy, not ${variant}`);
  const s = {
    durationMs: parseDuration(values.duration!, 'duration'),
    warmupMs: parseDuration(values.warmup!, 'warmup'),
    idleMs: parseDuration(values.idle!, 'idle'),
    sampleMs: parseDuration(values.sample!, 'sample'),
    variant: variant as 'modest' | 'heavy',
    snapshots: values.snapshots!,
    prefix: values.prefix!,
    mgmtIndex: Number(values['mgmt-index']),
    gcEvery: Number(values['gc-every']),
    /** More Node options for the agents, e.g. another --initial-old-space-size (the operator's value wins). */
    nodeArgs: values['node-args']!.split(/\s+/).filter(Boolean),
  };
  if (!Number.isInteger(s.gcEvery) || s.gcEvery < 1) throw new UsageError('--gc-every: a whole number >= 1');
  if (s.sampleMs < 1000) throw new UsageError('--sample: at least 1s');
  if (s.durationMs <= s.warmupMs)
    throw new UsageError('--duration counts from the start of the load: longer than --warmup');
  if (s.durationMs - s.warmupMs < 2 * s.sampleMs)
    throw new UsageError(
      'the measured window (--duration minus --warmup) needs at least two --sample intervals',
    );
  if (!/^[a-z][a-z0-9]{0,7}$/.test(s.prefix))
    throw new UsageError('--prefix: 1 to 8 lowercase letters and digits');
  if (!Number.isInteger(s.mgmtIndex) || s.mgmtIndex < 1 || s.mgmtIndex > 250)
    throw new UsageError('--mgmt-index: 1..250');
  return s;
}

// --- constants and state ---------------------------------------------------------------------

type Phase = 'setup' | 'idle' | 'warmup' | 'measured' | 'teardown';
type Role = 'ingress' | 'exit' | 'exit2';
/** The agents of the run: ingress and exit, and exit2 for the heavy variant's kcp service. */
let ROLES: readonly Role[] = ['ingress', 'exit'];

const CLIENT_NET = '10.91.1.0/24';
const DEST_NET = '10.91.2.0/24';
/** The route's other dest_cidr during churn: still covers the destination's server. */
const DEST_NET_ALT = '10.91.2.0/25';
/**
 * The heavy variant's kcp service: the API allows one service per (source, target) pair, so it
 * goes from the ingress to the topology's second exit, to the destination's second leg.
 */
const KCP_DEST = IP.dest2;
const KCP_NET = '10.91.4.0/24';

const PROBE_JS = join(REPO_ROOT, 'dist/bench/soak/probe.js');
const LOAD_JS = join(REPO_ROOT, 'dist/bench/soak/load.js');
const STAMP = new Date()
  .toISOString()
  .replace(/[-:]/g, '')
  .replace(/\.\d+Z$/, 'Z');
const RESULTS = join(REPO_ROOT, 'bench/results');
const RAW = join(RESULTS, `soak-${STAMP}-raw`);

interface Soaked {
  role: Role;
  node: Node;
  clientId: string;
  clientSecret: string;
  tokenAt: number;
  probeSocket: string;
  dataDir: string;
  probeInfo?: { execArgv: string[]; gcExposed: boolean; pid: number };
}

interface AgentSample {
  role: Role;
  phase: Phase;
  /** ms since the load started (negative: idle). */
  t: number;
  at: string;
  rssMb: number;
  fds: number;
  cpuPct: number;
  /** The probe ran a full GC before measuring: the heap figures are the live heap. */
  gcForced: boolean;
  heapUsedBeforeGcMb: number;
  heapTotalBeforeGcMb: number;
  heapUsedMb: number;
  heapTotalMb: number;
  externalMb: number;
  arrayBuffersMb: number;
  mallocedMb: number;
  handles: number;
  handlesByType: Record<string, number>;
  loopP50Ms: number;
  loopP99Ms: number;
  loopMaxMs: number;
  gcMs: number;
  streamsOpen: number | null;
  streams: Record<string, { open: number; opened: number; reset: number; refused: number }>;
}

interface FailureEvent {
  at: string;
  phase: Phase;
  kind: string;
  label: string;
  detail: string;
}

const log = (msg: string) => process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${msg}\n`);

let S: ReturnType<typeof settings>;
let V: Variant;
let phase: Phase = 'setup';
let topo: Topology | undefined;
let vendor: Vendor | undefined;
let workDir: string | undefined;
let server: ChildProcess | undefined;
let load: ChildProcess | undefined;
const agents: Partial<Record<Role, Soaked>> = {};
const services: { id: string; transport: 'tcp' | 'kcp'; routeId: number }[] = [];
const samples: AgentSample[] = [];
/** Counters of this process's own operations, per phase: `ok:<op>`, `fail:<kind>@<label>`. */
const counters: Record<string, Record<string, number>> = {};
const failureEvents: FailureEvent[] = [];
const failureCountByKind = new Map<string, number>();
let loadStartMs = 0;
/** Aborted to end the soak early (first Ctrl-C, an agent that died). */
const stopSoak = new AbortController();
let stopReason: string | undefined;

function count(key: string, n = 1, p: Phase = phase): void {
  const c = counters[p] ?? {};
  counters[p] = c;
  c[key] = (c[key] ?? 0) + n;
}

function failure(kind: string, label: string, detail: string): void {
  count(`fail:${kind}@${label}`);
  const seen = (failureCountByKind.get(kind) ?? 0) + 1;
  failureCountByKind.set(kind, seen);
  if (failureEvents.length < 1000)
    failureEvents.push({ at: new Date().toISOString(), phase, kind, label, detail: detail.slice(0, 500) });
  if (seen <= 10 || seen % 100 === 0) log(`FAILURE ${kind}@${label} (${seen}): ${detail.slice(0, 300)}`);
}

function endSoak(reason: string): void {
  if (stopSoak.signal.aborted) return;
  stopReason = reason;
  log(`ending the soak early: ${reason}`);
  stopSoak.abort();
}

/** Sleeps until time t (Date.now() scale); false when the soak was ended meanwhile. */
async function sleepUntil(t: number): Promise<boolean> {
  const ms = t - Date.now();
  if (stopSoak.signal.aborted) return false;
  if (ms <= 0) return true;
  try {
    await delay(ms, undefined, { signal: stopSoak.signal });
    return true;
  } catch {
    return false;
  }
}

// --- the probe ---------------------------------------------------------------------------------

/** One command to an agent's probe (probe.ts); its JSON answer. */
function probe(socketPath: string, cmd: Record<string, unknown>, timeoutMs: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(socketPath);
    let buf = '';
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`probe ${cmd['cmd']} timed out after ${timeoutMs} ms`));
    }, timeoutMs);
    sock.setEncoding('utf8');
    sock.on('connect', () => sock.write(`${JSON.stringify(cmd)}\n`));
    sock.on('data', (c: string) => {
      buf += c;
    });
    sock.on('end', () => {
      clearTimeout(timer);
      try {
        const answer = JSON.parse(buf) as { error?: string };
        if (answer.error) reject(new Error(`probe: ${answer.error}`));
        else resolve(answer);
      } catch {
        reject(new Error(`probe answered ${JSON.stringify(buf.slice(0, 200))}`));
      }
    });
    sock.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}

// --- API calls ---------------------------------------------------------------------------------

/** The agent's admin token, taken again after 30 min (tokens live an hour). */
async function adminToken(a: Soaked): Promise<string> {
  if (Date.now() - a.tokenAt > 30 * 60_000) {
    a.node.token = await a.node.agent.client.token(a.clientId, a.clientSecret);
    a.tokenAt = Date.now();
    count(`ok:admin_token@${a.role}`);
  }
  return a.node.token;
}

/** Runs one API call of the load: counted as ok when it answers `expect`, as a failure otherwise. */
async function apiCall(
  op: string,
  label: string,
  expect: number,
  call: () => Promise<ApiResponse>,
): Promise<ApiResponse | undefined> {
  try {
    const res = await call();
    if (res.status === expect) {
      count(`ok:api_${op}@${label}`);
      return res;
    }
    failure(`api_${op}`, label, `status ${res.status}, expected ${expect}: ${res.text.slice(0, 300)}`);
  } catch (err) {
    failure(`api_${op}`, label, (err as Error).message);
  }
  return undefined;
}

/** While set, the API load waits for it (heap snapshots). */
let apiGate: Promise<void> | undefined;
let openApiGate: (() => void) | undefined;
let apiInFlight = 0;

/** Holds the API load; resolves once no call of it is in flight (at most 30 s). */
async function pauseApiLoad(): Promise<void> {
  apiGate = new Promise((r) => {
    openApiGate = r;
  });
  const deadline = Date.now() + 30_000;
  while (apiInFlight > 0 && Date.now() < deadline) await delay(50);
}

function resumeApiLoad(): void {
  apiGate = undefined;
  openApiGate?.();
}

/** Repeats fn every periodMs (first run after one period) until the soak or the load ends. */
async function every(periodMs: number, stop: AbortSignal, fn: () => Promise<void>): Promise<void> {
  const signal = AbortSignal.any([stop, stopSoak.signal]);
  let next = Date.now() + periodMs;
  while (!signal.aborted) {
    try {
      await delay(Math.max(0, next - Date.now()), undefined, { signal });
    } catch {
      return;
    }
    if (apiGate) await apiGate;
    if (signal.aborted) return;
    apiInFlight++;
    try {
      await fn();
    } catch (err) {
      // The admin token could not be renewed: the call was not made.
      failure('api_admin_token', 'ingress', (err as Error).message);
    } finally {
      apiInFlight--;
    }
    next += periodMs;
    // Behind by more than a period (a slow call): skip the missed turns rather than burst.
    if (next < Date.now()) next = Date.now() + periodMs;
  }
}

/** The load of the API: route churn, credential cycles and sync, all through the ingress. */
function apiLoad(loadEnd: AbortSignal): Promise<void>[] {
  const a = agents.ingress!;
  const client = a.node.agent.client;
  const svc = services[0]!;
  let alternate = false;
  const churn = every(V.routeChurnMs / 2, loadEnd, async () => {
    alternate = !alternate;
    const token = await adminToken(a);
    await apiCall('route_put', 'ingress', 200, () =>
      client.put(`/v1/services/${svc.id}/routes/${svc.routeId}`, {
        token,
        json: { priority: 100, source_cidr: CLIENT_NET, dest_cidr: alternate ? DEST_NET_ALT : DEST_NET },
      }),
    );
  });
  const credentials = every(V.credentialEveryMs, loadEnd, async () => {
    const token = await adminToken(a);
    const created = await apiCall('credential_create', 'ingress', 201, () =>
      client.post('/v1/credentials', { token, json: { scopes: ['urn:vendor:service:services.read'] } }),
    );
    if (!created) return;
    const { client_id: id, client_secret: secret } = created.body as {
      client_id: string;
      client_secret: string;
    };
    const issued = await apiCall('token', 'ingress', 200, () => client.tokenResponse(id, secret));
    const scoped = (issued?.body as { access_token?: string } | undefined)?.access_token;
    if (scoped)
      await apiCall('credential_use', 'ingress', 200, () => client.get('/v1/services', { token: scoped }));
    await apiCall('credential_delete', 'ingress', 200, () =>
      client.delete(`/v1/credentials/${encodeURIComponent(id)}`, { token }),
    );
    if (scoped)
      await apiCall('revoked_token_refused', 'ingress', 401, () =>
        client.get('/v1/services', { token: scoped }),
      );
  });
  const sync = every(V.syncEveryMs, loadEnd, async () => {
    const token = await adminToken(a);
    await apiCall('cluster_sync', 'ingress', 200, () => client.post('/v1/cluster/sync', { token }));
  });
  return [churn, credentials, sync];
}

// --- setup -----------------------------------------------------------------------------------

async function startAgent(role: Role, advertise: string): Promise<Soaked> {
  const dataDir = mkdtempSync(join(tmpdir(), `mesh-soak-${role}-`));
  const probeSocket = join(workDir!, `${role}.sock`);
  const agent = await AgentProcess.start({
    vendor: vendor!,
    dataDir,
    netns: topo!.ns[role]!,
    port: PORT,
    listen: `0.0.0.0:${PORT}`,
    apiHost: topo!.mgmt[role],
    nodeArgs: ['--expose-gc', '--import', pathToFileURL(PROBE_JS).href, ...S.nodeArgs],
    env: { SOAK_PROBE_SOCKET: probeSocket },
    extraArgs: ['--advertise', `${advertise}:${PORT}`, '--dataplane', 'on'],
  });
  const creds = await bootstrap(agent, vendor!, { max_nodes: 5, max_services: 10 });
  const token = await agent.client.token(creds.clientId, creds.clientSecret);
  const a: Soaked = {
    role,
    node: { agent, token, peerId: creds.body.peer_id as string },
    clientId: creds.clientId,
    clientSecret: creds.clientSecret,
    tokenAt: Date.now(),
    probeSocket,
    dataDir,
  };
  agents[role] = a;
  agent.proc.once('exit', (code, signal) => {
    if (phase === 'teardown') return;
    failure(
      'agent_exit',
      role,
      `exited (${code ?? signal}); last log lines:\n${agent.logs.split('\n').slice(-20).join('\n')}`,
    );
    endSoak(`the ${role} agent exited`);
  });
  // The probe must be in the agent that serves, with gc exposed, after the restart in place.
  const p = (await probe(probeSocket, { cmd: 'info' }, 15_000)) as ProbeSample;
  a.probeInfo = { execArgv: p.execArgv, gcExposed: p.gcExposed, pid: p.pid };
  if (!p.gcExposed)
    throw new Error(`${role}: gc() is not exposed in the agent (execArgv ${p.execArgv.join(' ')})`);
  if (p.pid !== agent.pid)
    throw new Error(`${role}: the probe answers from pid ${p.pid}, the agent is ${agent.pid}`);
  log(`${role} agent pid ${agent.pid}, peer ${a.node.peerId}, execArgv ${p.execArgv.join(' ')}`);
  return a;
}

async function createService(transport: 'tcp' | 'kcp', target: Role, destCidr: string): Promise<void> {
  const a = agents.ingress!;
  const to = agents[target]!;
  const client = a.node.agent.client;
  const res = await client.post('/v1/services', {
    token: a.node.token,
    json: { target_peer_id: to.node.peerId, transport_type: transport },
  });
  if (res.status !== 201) throw new Error(`create ${transport} service: ${res.status} ${res.text}`);
  const id = res.body.id as string;
  const r = await client.post(`/v1/services/${id}/routes`, {
    token: a.node.token,
    json: { routes: [{ priority: 100, source_cidr: CLIENT_NET, dest_cidr: destCidr }] },
  });
  if (r.status !== 201) throw new Error(`add route: ${r.status} ${r.text}`);
  services.push({ id, transport, routeId: (r.body.route_ids as number[])[0]! });
  await client.post('/v1/cluster/sync', { token: a.node.token });
  await waitUp(id, a.node, to.node);
  log(`${transport} service ${id} ingress -> ${target} up (route ${CLIENT_NET} -> ${destCidr})`);
}

function startServer(): Promise<void> {
  server = spawn(
    'ip',
    ['netns', 'exec', topo!.ns.dest, process.execPath, APPS, 'serve', String(HTTP), String(UDP)],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  const proc = server;
  return new Promise((resolve, reject) => {
    let listening = false;
    // Read everything it prints (one line per UDP datagram and per GET /): a full pipe would stall it.
    proc.stdout!.on('data', (c: Buffer) => {
      if (!listening && c.toString().includes('listening')) {
        listening = true;
        resolve();
      }
    });
    proc.stderr!.on('data', (c: Buffer) => log(`dest server: ${c.toString().trim()}`));
    proc.once('exit', (code, signal) => {
      if (!listening) reject(new Error(`the destination's server exited (${code ?? signal})`));
      else if (phase !== 'teardown') {
        failure('server_exit', 'dest', `the destination's server exited (${code ?? signal})`);
        endSoak("the destination's server exited");
      }
    });
  });
}

/** One GET through each service before the idle phase: the setup works end to end. */
async function checkPath(): Promise<void> {
  const paths: [string, string][] = [
    [IP.dest, IP.exitOut],
    ...(services.some((s) => s.transport === 'kcp') ? [[KCP_DEST, IP.exit2Out] as [string, string]] : []),
  ];
  for (const [host, exitAddress] of paths) {
    await until(
      `GET http://${host}:${HTTP}/ from the client through the service`,
      async () => {
        const out = await topo!.run(
          topo!.ns.client,
          'curl',
          ['-sS', '--max-time', '3', `http://${host}:${HTTP}/`],
          10_000,
        );
        const remote = (JSON.parse(out) as { remote: string }).remote;
        if (remote !== exitAddress)
          throw new Error(`the destination saw ${remote}, not the exit's ${exitAddress}`);
      },
      30_000,
    );
  }
}

// --- load ------------------------------------------------------------------------------------

interface LoadHandle {
  /** Cumulative counters of the load process now. */
  report(): Promise<Record<string, number>>;
  /** Stops it; its final counters. */
  stop(): Promise<Record<string, number>>;
  /** Starts no new work; resolves once the work in flight has ended. */
  pause(): Promise<void>;
  resume(): void;
}

function startLoad(): Promise<LoadHandle> {
  const tcp: Target = { host: IP.dest, label: 'tcp', weight: V.tcpWeight };
  const kcp: Target = { host: KCP_DEST, label: 'kcp', weight: V.kcpWeight };
  const both = V.kcpWeight > 0 ? [tcp, kcp] : [tcp];
  const cfg: LoadConfig = {
    httpPort: HTTP,
    udpPort: UDP,
    downloadsPerSec: V.downloadsPerSec,
    downloadBytes: V.downloadBytes,
    downloadTargets: both,
    shortPerSec: V.shortPerSec,
    shortTargets: [tcp],
    udpEveryMs: V.udpEveryMs,
    udpTargets: both.map((t) => ({ ...t, weight: 1 })),
    pingTargets: both,
    maxInFlight: 100,
    downloadTimeoutMs: 30_000,
  };
  const proc = spawn(
    'ip',
    ['netns', 'exec', topo!.ns.client, process.execPath, LOAD_JS, JSON.stringify(cfg)],
    {
      stdio: ['pipe', 'pipe', 'pipe'],
    },
  );
  load = proc;
  let latest: Record<string, number> = {};
  let waiters: ((c: Record<string, number>) => void)[] = [];
  let finalWaiter: ((c: Record<string, number>) => void) | undefined;
  let pauseWaiter: (() => void) | undefined;
  let stopping = false;
  const gone = () => proc.exitCode !== null || proc.signalCode !== null;
  proc.stdin!.on('error', () => {});
  return new Promise((resolve, reject) => {
    createInterface({ input: proc.stdout! }).on('line', (line) => {
      let msg: {
        started?: boolean;
        paused?: boolean;
        counters?: Record<string, number>;
        reply?: boolean;
        final?: boolean;
        event?: string;
        label?: string;
        detail?: string;
        seen?: number;
      };
      try {
        msg = JSON.parse(line);
      } catch {
        log(`load: ${line}`);
        return;
      }
      if (msg.started) {
        resolve({
          report: () =>
            new Promise((r) => {
              if (gone()) return r(latest);
              waiters.push(r);
              proc.stdin!.write('report\n');
            }),
          stop: () =>
            new Promise((r) => {
              stopping = true;
              if (gone()) return r(latest);
              finalWaiter = r;
              proc.stdin!.write('stop\n');
              setTimeout(() => {
                if (finalWaiter) {
                  log('load: no final counters within 15 s; using the last ones');
                  proc.kill('SIGKILL');
                  finalWaiter(latest);
                  finalWaiter = undefined;
                }
              }, 15_000).unref();
            }),
          pause: () =>
            new Promise((r) => {
              if (gone()) return r();
              pauseWaiter = r;
              proc.stdin!.write('pause\n');
            }),
          resume: () => {
            if (!gone()) proc.stdin!.write('resume\n');
          },
        });
      }
      if (msg.counters) latest = msg.counters;
      if (msg.paused) {
        pauseWaiter?.();
        pauseWaiter = undefined;
      }
      if (msg.reply && msg.counters) {
        const w = waiters;
        waiters = [];
        for (const r of w) r(msg.counters);
      }
      if (msg.final && msg.counters && finalWaiter) {
        finalWaiter(msg.counters);
        finalWaiter = undefined;
      }
      if (msg.event) {
        if (failureEvents.length < 1000)
          failureEvents.push({
            at: new Date().toISOString(),
            phase,
            kind: msg.event,
            label: msg.label ?? '',
            detail: String(msg.detail ?? '').slice(0, 500),
          });
        if ((msg.seen ?? 0) <= 10 || (msg.seen ?? 0) % 100 === 0)
          log(`FAILURE ${msg.event}@${msg.label} (${msg.seen}): ${String(msg.detail).slice(0, 300)}`);
      }
    });
    proc.stderr!.on('data', (c: Buffer) => log(`load: ${c.toString().trim()}`));
    proc.once('exit', (code, signal) => {
      reject(new Error(`the load exited at start (${code ?? signal})`));
      if (!stopping && phase !== 'teardown') {
        failure('load_exit', 'client', `the load generator exited (${code ?? signal})`);
        endSoak('the load generator exited');
      }
      finalWaiter?.(latest);
      finalWaiter = undefined;
      pauseWaiter?.();
      pauseWaiter = undefined;
      for (const r of waiters) r(latest);
      waiters = [];
    });
  });
}

const diffCounters = (a: Record<string, number>, b: Record<string, number>) => {
  const out: Record<string, number> = {};
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    const d = (b[k] ?? 0) - (a[k] ?? 0);
    if (d !== 0) out[k] = d;
  }
  return out;
};

// --- sampling ----------------------------------------------------------------------------------

const lastCpu = new Map<Role, { t: number; ms: number }>();

async function sampleAgent(a: Soaked, gc: boolean): Promise<void> {
  const pid = a.node.agent.pid;
  const now = Date.now();
  const rssKb = procStatusKb(pid, 'VmRSS');
  let fds = Number.NaN;
  try {
    fds = readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    // gone: the exit handler says so
  }
  const cpu = cpuMs(pid);
  const prev = lastCpu.get(a.role);
  lastCpu.set(a.role, { t: now, ms: cpu });
  const cpuPct = prev ? ((cpu - prev.ms) / (now - prev.t)) * 100 : Number.NaN;
  let p: ProbeSample;
  try {
    p = (await probe(a.probeSocket, { cmd: 'sample', gc }, 30_000)) as ProbeSample;
  } catch (err) {
    failure('probe', a.role, (err as Error).message);
    return;
  }
  const streams: AgentSample['streams'] = {};
  let streamsOpen: number | null = 0;
  for (const s of services) {
    const res = await apiCall('status', a.role, 200, async () =>
      a.node.agent.client.get(`/v1/services/${s.id}`, { token: await adminToken(a) }),
    );
    const dp = (res?.body as { dataplane?: Record<string, number> } | undefined)?.dataplane;
    if (!dp) {
      streamsOpen = null;
      continue;
    }
    streams[s.transport] = {
      open: dp['streams_open'] ?? 0,
      opened: dp['streams_opened'] ?? 0,
      reset: dp['streams_reset'] ?? 0,
      refused: dp['streams_refused'] ?? 0,
    };
    if (streamsOpen !== null) streamsOpen += dp['streams_open'] ?? 0;
  }
  const MB = 1024 * 1024;
  samples.push({
    role: a.role,
    phase,
    t: now - loadStartMs,
    at: new Date(now).toISOString(),
    rssMb: (rssKb ?? Number.NaN) / 1024,
    fds,
    cpuPct,
    gcForced: p.gcForced,
    heapUsedBeforeGcMb: p.heapUsedBeforeGc / MB,
    heapTotalBeforeGcMb: p.heapTotalBeforeGc / MB,
    heapUsedMb: p.heapUsed / MB,
    heapTotalMb: p.heapTotal / MB,
    externalMb: p.external / MB,
    arrayBuffersMb: p.arrayBuffers / MB,
    mallocedMb: p.mallocedMemory / MB,
    handles: p.handles,
    handlesByType: p.handlesByType,
    loopP50Ms: p.loopDelayP50Ms,
    loopP99Ms: p.loopDelayP99Ms,
    loopMaxMs: p.loopDelayMaxMs,
    gcMs: p.gcMs,
    streamsOpen,
    streams,
  });
}

async function sampleAll(gc: boolean): Promise<void> {
  for (const role of ROLES) {
    const a = agents[role];
    if (a && a.node.agent.exitCode === null && a.node.agent.exitSignal === null) await sampleAgent(a, gc);
  }
  const last = ROLES.map((r) => samples.findLast((s) => s.role === r && s.phase === phase)).filter(
    (s): s is AgentSample => s !== undefined,
  );
  log(
    `${phase} ${last
      .map(
        (s) =>
          `${s.role}: RSS ${fmt(s.rssMb, 1)} MB heap ${fmt(s.heapUsedMb, 1)} MB${s.gcForced ? ' (after GC)' : ''} ext ${fmt(s.externalMb, 1)} MB handles ${s.handles} fds ${s.fds} p99 ${fmt(s.loopP99Ms, 1)} ms cpu ${fmt(s.cpuPct, 0)}% streams ${s.streamsOpen ?? '?'}`,
      )
      .join(' | ')}`,
  );
}

/**
 * Samples every S.sampleMs from `from` until `end`: the first sample at `from` when `atStart`,
 * else one interval later; the last at `end` when `atEnd` (else strictly before it). `gc(i,
 * last)`: whether the i-th sample of the phase (from 0) forces a full GC first.
 */
async function samplePhase(
  from: number,
  end: number,
  atStart: boolean,
  atEnd: boolean,
  gc: (i: number, last: boolean) => boolean,
): Promise<void> {
  const inside = (t: number) => t < end || (atEnd && t === end);
  for (let k = atStart ? 0 : 1, i = 0; inside(from + k * S.sampleMs); k++, i++) {
    if (!(await sleepUntil(from + k * S.sampleMs))) return;
    await sampleAll(gc(i, !inside(from + (k + 1) * S.sampleMs)));
  }
  await sleepUntil(end);
}

// --- snapshots -------------------------------------------------------------------------------

interface SnapshotTaken {
  role: Role;
  which: 'start' | 'end';
  file: string;
  ms: number;
  rssBeforeMb: number;
  rssAfterMb: number;
}
const snapshots: SnapshotTaken[] = [];

/**
 * A heap snapshot of each agent. Writing one blocks the agent for seconds: the load and the API
 * load are held meanwhile, so that the harness's own pause is not counted as lost echoes,
 * timed-out downloads or failed calls.
 */
async function snapshotAll(which: 'start' | 'end', load: LoadHandle): Promise<void> {
  mkdirSync(RAW, { recursive: true });
  log(`holding the load for the ${which} heap snapshots`);
  await load.pause();
  await pauseApiLoad();
  try {
    await snapshotEach(which);
  } finally {
    resumeApiLoad();
    load.resume();
  }
}

async function snapshotEach(which: 'start' | 'end'): Promise<void> {
  for (const role of ROLES) {
    const a = agents[role];
    if (!a || a.node.agent.exitCode !== null) continue;
    const file = join(RAW, `${role}-${which}.heapsnapshot`);
    const rssBeforeMb = (procStatusKb(a.node.agent.pid, 'VmRSS') ?? Number.NaN) / 1024;
    try {
      const r = (await probe(a.probeSocket, { cmd: 'snapshot', path: file }, 300_000)) as { ms: number };
      const rssAfterMb = (procStatusKb(a.node.agent.pid, 'VmRSS') ?? Number.NaN) / 1024;
      snapshots.push({ role, which, file, ms: r.ms, rssBeforeMb, rssAfterMb });
      log(
        `${role}: heap snapshot (${which}) in ${fmt(r.ms / 1000, 1)} s, RSS ${fmt(rssBeforeMb, 1)} -> ${fmt(rssAfterMb, 1)} MB`,
      );
    } catch (err) {
      failure('probe', role, `snapshot ${which}: ${(err as Error).message}`);
    }
  }
}

// --- analysis ----------------------------------------------------------------------------------

const FIGURES = [
  ['rssMb', 'RSS MB', 1],
  ['heapUsedMb', 'heap used after GC MB', 1],
  ['externalMb', 'external MB (after GC)', 1],
  ['arrayBuffersMb', 'array buffers MB (after GC)', 1],
  ['handles', 'active handles', 0],
  ['fds', 'open fds', 0],
  ['loopP99Ms', 'loop delay p99 ms', 1],
  ['cpuPct', 'CPU %', 0],
  ['streamsOpen', 'streams open', 0],
] as const;
type FigureKey = (typeof FIGURES)[number][0];

/** How many samples make the start and end medians: max(5, 10 %), at most half the window. */
const edgeCount = (n: number) => {
  const k = Math.max(5, Math.ceil(n * 0.1));
  return 2 * k > n ? Math.max(1, Math.floor(n / 2)) : k;
};

/** Least-squares slope of v over t (ms), per hour. */
function slopePerHour(points: { t: number; v: number }[]): number {
  const f = points.filter((p) => Number.isFinite(p.v));
  if (f.length < 2) return Number.NaN;
  const mt = f.reduce((s, p) => s + p.t, 0) / f.length;
  const mv = f.reduce((s, p) => s + p.v, 0) / f.length;
  let num = 0;
  let den = 0;
  for (const p of f) {
    num += (p.t - mt) * (p.v - mv);
    den += (p.t - mt) ** 2;
  }
  return den === 0 ? Number.NaN : (num / den) * 3_600_000;
}

interface FigureStats {
  start: number;
  end: number;
  perHour: number;
  min: number;
  max: number;
}

/** Figures measured after the forced GC: taken only from the samples that forced one. */
const AFTER_GC: ReadonlySet<FigureKey> = new Set(['heapUsedMb', 'externalMb', 'arrayBuffersMb']);

function figureStats(all: AgentSample[], key: FigureKey): FigureStats {
  const xs = AFTER_GC.has(key) ? all.filter((s) => s.gcForced) : all;
  const vals = xs.map((s) => ({ t: s.t, v: (s[key] ?? Number.NaN) as number }));
  const k = edgeCount(xs.length);
  const finite = vals.map((p) => p.v).filter(Number.isFinite);
  return {
    start: median(vals.slice(0, k).map((p) => p.v)),
    end: median(vals.slice(-k).map((p) => p.v)),
    perHour: slopePerHour(vals),
    min: finite.length ? Math.min(...finite) : Number.NaN,
    max: finite.length ? Math.max(...finite) : Number.NaN,
  };
}

interface AgentAnalysis {
  role: Role;
  idle: {
    samples: number;
    /** RSS at the first idle sample: the agent just after start-up and setup. */
    rssFirstMb: number;
    /** Median RSS of the second half of the idle samples: the settled idle agent. */
    rssSettledMb: number;
    rssMaxMb: number;
    heapMb: number;
    handles: number;
    fds: number;
  };
  measured: { samples: number; edge: number; spanMin: number; figures: Record<string, FigureStats> };
  lastHour: {
    spanMin: number;
    samples: number;
    startMb: number;
    endMb: number;
    ratio: number;
    short: boolean;
  };
  /** valid false: the figure was disturbed by the bench itself (a heap snapshot); not counted. */
  budgets: { name: string; pass: boolean; valid: boolean; line: string }[];
}

function analyse(role: Role): AgentAnalysis {
  const mine = samples.filter((s) => s.role === role);
  const idle = mine.filter((s) => s.phase === 'idle');
  const measured = mine.filter((s) => s.phase === 'measured');
  const figures: Record<string, FigureStats> = {};
  for (const [key] of FIGURES) figures[key] = figureStats(measured, key);
  const span = measured.length ? measured.at(-1)!.t - measured[0]!.t : 0;
  const hourFrom = (measured.at(-1)?.t ?? 0) - 3_600_000;
  const hour = measured.filter((s) => s.t >= hourFrom);
  const hk = edgeCount(hour.length);
  const hourStart = median(hour.slice(0, hk).map((s) => s.rssMb));
  const hourEnd = median(hour.slice(-hk).map((s) => s.rssMb));
  const hourSpan = hour.length ? hour.at(-1)!.t - hour[0]!.t : 0;
  const short = hourSpan < 3_600_000 - S.sampleMs;
  const ratio = hourEnd / hourStart;
  const settled = idle.slice(Math.floor(idle.length / 2));
  const idleRss = median(settled.map((s) => s.rssMb));
  const maxRss = figures['rssMb']!.max;
  // Writing a heap snapshot leaves the agent's RSS far higher (the snapshot writer's memory stays
  // with the process): the window's RSS is then not the agent's own.
  const snap = snapshots.find((s) => s.role === role && s.which === 'start');
  const rssValid = !snap;
  const budgets = [
    {
      name: 'rss_after_warmup',
      valid: rssValid,
      pass: maxRss < BUDGET.rssMb,
      line: `${role}: RSS after warm-up, maximum over the measured window ${fmt(maxRss, 1)} MB (budget < ${BUDGET.rssMb} MB)`,
    },
    {
      name: 'rss_growth_last_hour',
      valid: rssValid,
      pass: Number.isFinite(ratio) && ratio <= 1 + BUDGET.lastHourGrowth,
      line: `${role}: RSS growth over the last hour, end/start ${fmt(ratio, 3)} (${fmt(hourStart, 1)} -> ${fmt(hourEnd, 1)} MB; budget <= ${fmt(1 + BUDGET.lastHourGrowth, 2)})${short ? ` [the measured window is only ${fmt(hourSpan / 60_000, 1)} min: ratio over all of it, not the budget's hour]` : ''}`,
    },
    {
      name: 'idle_rss',
      valid: true,
      pass: Number.isFinite(idleRss) && idleRss < BUDGET.idleRssMb,
      line: `${role}: idle RSS, median of the last ${settled.length} of ${idle.length} idle samples ${fmt(idleRss, 1)} MB (budget < ${BUDGET.idleRssMb} MB; ${fmt(idle[0]?.rssMb ?? Number.NaN, 1)} MB at the first)`,
    },
  ];
  if (snap)
    for (const b of budgets)
      if (!b.valid)
        b.line += ` [NOT VALID: the start heap snapshot took the RSS from ${fmt(snap.rssBeforeMb, 1)} to ${fmt(snap.rssAfterMb, 1)} MB; run without --snapshots for the RSS budgets]`;
  return {
    role,
    idle: {
      samples: idle.length,
      rssFirstMb: idle[0]?.rssMb ?? Number.NaN,
      rssSettledMb: idleRss,
      rssMaxMb: idle.length ? Math.max(...idle.map((s) => s.rssMb)) : Number.NaN,
      heapMb: median(idle.filter((s) => s.gcForced).map((s) => s.heapUsedMb)),
      handles: median(idle.map((s) => s.handles)),
      fds: median(idle.map((s) => s.fds)),
    },
    measured: { samples: measured.length, edge: edgeCount(measured.length), spanMin: span / 60_000, figures },
    lastHour: {
      spanMin: hourSpan / 60_000,
      samples: hour.length,
      startMb: hourStart,
      endMb: hourEnd,
      ratio,
      short,
    },
    budgets,
  };
}

const signed = (x: number, d: number) => (Number.isFinite(x) ? `${x >= 0 ? '+' : ''}${x.toFixed(d)}` : 'NA');

function report(
  analyses: AgentAnalysis[],
  phaseCounters: Record<string, Record<string, number>>,
  snapshotDiffs: { role: Role; rows: ConstructorDiff[]; heapStartMb: number; heapEndMb: number }[],
  envInfo: Record<string, string>,
): { text: string; failures: number; budgetsFailed: number } {
  const out: string[] = [];
  const measuredMs = S.durationMs - S.warmupMs;
  out.push(`# Soak: ${S.variant} variant, ${STAMP}`);
  out.push('');
  out.push(
    `Idle ${human(S.idleMs)}, load ${human(S.durationMs)} = warm-up ${human(S.warmupMs)} + measured ${human(measuredMs)}, a sample every ${human(S.sampleMs)}${S.snapshots ? ', heap snapshots' : ''}. Node ${envInfo['node']}, commit ${envInfo['commit']?.slice(0, 12)}${envInfo['dirty_src'] ? ' (src/ has uncommitted changes)' : ''}, ${envInfo['nproc']} cores, load average ${envInfo['load_avg_start']} at the start, ${envInfo['load_avg_end']} at the end.`,
  );
  if (stopReason) out.push(`\n**The soak ended early: ${stopReason}.** The figures cover what was sampled.`);
  for (const role of ROLES) {
    const info = agents[role]?.probeInfo;
    if (info) out.push(`\n${role} agent ran with execArgv: \`${info.execArgv.join(' ')}\``);
  }

  out.push(
    '',
    `## Idle (${human(S.idleMs)}: service up, no traffic; no forced GC before the last idle sample, whose heap is shown)`,
    '',
  );
  out.push(
    '| agent | samples | RSS MB first sample | RSS MB settled (median of the second half) | RSS MB max | heap after GC MB | handles | fds |',
  );
  out.push('|---|---|---|---|---|---|---|---|');
  for (const a of analyses)
    out.push(
      `| ${a.role} | ${a.idle.samples} | ${fmt(a.idle.rssFirstMb, 1)} | ${fmt(a.idle.rssSettledMb, 1)} | ${fmt(a.idle.rssMaxMb, 1)} | ${fmt(a.idle.heapMb, 1)} | ${fmt(a.idle.handles)} | ${fmt(a.idle.fds)} |`,
    );

  const first = analyses[0];
  out.push(
    '',
    `## Measured window (${fmt(first?.measured.spanMin ?? Number.NaN, 1)} min after a ${human(S.warmupMs)} warm-up, ${first?.measured.samples ?? 0} samples per agent, a forced full GC ${S.gcEvery === 1 ? 'at every sample' : `every ${S.gcEvery} samples`}; start/end = medians of the first/last ${first?.measured.edge ?? 0} samples; growth per hour = least-squares slope)`,
    '',
  );
  if (snapshots.some((s) => s.which === 'start'))
    out.push(
      'With --snapshots: the RSS rows include what the start heap snapshot left in each agent (see the budgets); the other rows are unaffected.',
      '',
    );
  out.push('| agent | figure | start | end | growth per hour | min | max |');
  out.push('|---|---|---|---|---|---|---|');
  for (const a of analyses) {
    for (const [key, label, d] of FIGURES) {
      const f = a.measured.figures[key]!;
      out.push(
        `| ${a.role} | ${label} | ${fmt(f.start, d)} | ${fmt(f.end, d)} | ${signed(f.perHour, d + 1)} | ${fmt(f.min, d)} | ${fmt(f.max, d)} |`,
      );
    }
  }

  out.push('', '## Budgets', '');
  let budgetsFailed = 0;
  for (const a of analyses)
    for (const b of a.budgets) {
      if (!b.pass && b.valid) budgetsFailed++;
      const verdict = b.pass ? 'PASS' : '**FAIL**';
      out.push(`- ${b.valid ? verdict : `(not valid: ${verdict.replace(/\*/g, '')})`} ${b.line}`);
    }

  out.push('', '## Traffic and failures', '');
  const phases: Phase[] = ['setup', 'idle', 'warmup', 'measured', 'teardown'];
  const keys = new Set<string>();
  for (const p of phases) for (const k of Object.keys(phaseCounters[p] ?? {})) keys.add(k);
  const order = (k: string) => (k.startsWith('fail:') ? 1 : 0);
  const sorted = [...keys].sort((a, b) => order(a) - order(b) || a.localeCompare(b));
  out.push('| counter | setup | idle | warm-up | measured | teardown | total |');
  out.push('|---|---|---|---|---|---|---|');
  let failures = 0;
  for (const k of sorted) {
    const vals = phases.map((p) => phaseCounters[p]?.[k] ?? 0);
    const total = vals.reduce((s, v) => s + v, 0);
    if (k.startsWith('fail:')) failures += total;
    const shown = k.startsWith('bytes:') ? (v: number) => `${fmt(v / 1024 / 1024, 0)} MiB` : String;
    out.push(
      `| ${k.startsWith('fail:') ? `**${k}**` : k} | ${vals.map(shown).join(' | ')} | ${shown(total)} |`,
    );
  }
  out.push(
    '',
    failures === 0
      ? 'No failures.'
      : `**${failures} failures: the soak FAILED.** First events in the JSON (failureEvents) and on stderr.`,
  );

  if (snapshotDiffs.length) {
    out.push(
      '',
      '## Heap snapshots: constructors by count difference, start -> end of the measured window',
      '',
    );
    for (const d of snapshotDiffs) {
      const start = snapshots.find((s) => s.role === d.role && s.which === 'start');
      out.push(
        `### ${d.role} (heap used after GC ${fmt(d.heapStartMb, 1)} -> ${fmt(d.heapEndMb, 1)} MB; RSS around the start snapshot ${fmt(start?.rssBeforeMb ?? Number.NaN, 1)} -> ${fmt(start?.rssAfterMb ?? Number.NaN, 1)} MB)`,
        '',
        diffTable(d.rows, 20),
        '',
      );
    }
  }
  out.push(
    '',
    failures === 0 && budgetsFailed === 0
      ? '**Result: PASS** (no failures, every budget met).'
      : `**Result: FAIL** (${failures} failures, ${budgetsFailed} budgets failed).`,
  );
  return { text: out.join('\n'), failures, budgetsFailed };
}

// --- environment and teardown ------------------------------------------------------------------

function run(cmd: string, args: string[]): Promise<string> {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    p.stdout!.on('data', (c: Buffer) => {
      out += c.toString();
    });
    p.on('error', () => resolve(''));
    p.on('close', () => resolve(out.trim()));
  });
}

async function environment(): Promise<Record<string, string>> {
  return {
    date_utc: new Date().toISOString(),
    nproc: String(cpus().length),
    cpu: cpus()[0]?.model ?? '?',
    kernel: await run('uname', ['-r']),
    node: process.version,
    commit: await run('git', ['-C', REPO_ROOT, 'rev-parse', 'HEAD']),
    dirty_src: await run('git', ['-C', REPO_ROOT, 'status', '--porcelain', '--', 'src', 'native']),
    load_avg_start: loadavg()
      .map((x) => x.toFixed(2))
      .join(' '),
  };
}

let cleaning: Promise<void> | undefined;

function cleanup(): Promise<void> {
  cleaning ??= (async () => {
    phase = 'teardown';
    load?.kill('SIGKILL');
    for (const role of ROLES) {
      const a = agents[role];
      if (!a) continue;
      try {
        const code = await a.node.agent.stop('SIGTERM', 15_000);
        if (code !== 0) log(`${role} agent exited with ${code ?? a.node.agent.exitSignal} on SIGTERM`);
      } catch (err) {
        failure('secret_in_log', role, (err as Error).message);
      }
      try {
        mkdirSync(RAW, { recursive: true });
        writeFileSync(join(RAW, `agent-${role}.log`), a.node.agent.logs);
      } catch (err) {
        log(`saving the ${role} log: ${(err as Error).message}`);
      }
      rmSync(a.dataDir, { recursive: true, force: true });
    }
    server?.kill('SIGKILL');
    await topo?.down().catch((err: Error) => log(`topology down: ${err.message}`));
    if (workDir) rmSync(workDir, { recursive: true, force: true });
    if (vendor) rmSync(dirname(vendor.publicKeyFile), { recursive: true, force: true });
  })();
  return cleaning;
}

// --- main ------------------------------------------------------------------------------------

async function main(): Promise<number> {
  S = settings();
  V = VARIANTS[S.variant];
  if (process.getuid?.() !== 0) throw new Error('needs root (network namespaces, TUN, nftables)');
  for (const f of [PROBE_JS, LOAD_JS, APPS]) readFileSync(f); // built? (npm run build)
  let interrupts = 0;
  const hardStop = (sig: string) => {
    log(`${sig}: tearing down`);
    void cleanup().finally(() => process.exit(130));
  };
  process.on('SIGINT', () => {
    interrupts++;
    if (interrupts === 1 && (phase === 'warmup' || phase === 'measured')) {
      log('Ctrl-C: finishing early with the figures so far; a second Ctrl-C tears down at once');
      endSoak('interrupted (Ctrl-C)');
      return;
    }
    hardStop('SIGINT');
  });
  process.once('SIGTERM', () => hardStop('SIGTERM'));

  const envInfo = await environment();
  workDir = mkdtempSync(join(tmpdir(), 'mesh-soak-'));
  vendor = makeVendor();
  log(`setting up (${S.prefix}-* namespaces, management 10.254.${S.mgmtIndex}.0/28)`);
  const kcp = V.kcpWeight > 0;
  if (kcp) ROLES = ['ingress', 'exit', 'exit2'];
  topo = await topologyUp(S.prefix, S.mgmtIndex, { secondExit: kcp });
  await startServer();
  await startAgent('ingress', IP.ingressUl);
  await startAgent('exit', IP.exitUl);
  if (kcp) await startAgent('exit2', IP.exit2Ul);
  for (const address of [IP.exitUl, ...(kcp ? [IP.exit2Ul] : [])]) {
    const joined = await agents.ingress!.node.agent.client.post('/v1/peers', {
      token: agents.ingress!.node.token,
      json: { address: `${address}:${PORT}` },
    });
    if (joined.status !== 201) throw new Error(`join ${address}: ${joined.status} ${joined.text}`);
  }
  await createService('tcp', 'exit', DEST_NET);
  if (kcp) await createService('kcp', 'exit2', KCP_NET);
  await checkPath();

  // Idle.
  phase = 'idle';
  const idleStart = Date.now();
  loadStartMs = idleStart + S.idleMs;
  log(`idle for ${human(S.idleMs)}`);
  // No forced GC before the last idle sample: the idle RSS is the agent's own.
  await samplePhase(idleStart, idleStart + S.idleMs, false, true, (_i, last) => last);

  // Load: warm-up, then the measured window.
  const phaseCounters: Record<string, Record<string, number>> = {};
  let loadCounters = { warmup: {} as Record<string, number>, measured: {} as Record<string, number> };
  const loadEnd = new AbortController();
  let apiLoops: Promise<void>[] = [];
  if (!stopSoak.signal.aborted) {
    phase = 'warmup';
    loadStartMs = Date.now();
    log(`load on (${S.variant}); warm-up for ${human(S.warmupMs)}`);
    const loadProc = await startLoad();
    apiLoops = apiLoad(loadEnd.signal);
    const warmupEnd = loadStartMs + S.warmupMs;
    await samplePhase(loadStartMs, warmupEnd, false, false, (i) => i % S.gcEvery === 0);
    const atMeasured = await loadProc.report();
    loadCounters.warmup = atMeasured;
    let atEnd = atMeasured;
    if (!stopSoak.signal.aborted) {
      phase = 'measured';
      if (S.snapshots) await snapshotAll('start', loadProc);
      log(`measured window for ${human(S.durationMs - S.warmupMs)}`);
      await samplePhase(Date.now(), loadStartMs + S.durationMs, true, true, (i) => i % S.gcEvery === 0);
      if (S.snapshots) await snapshotAll('end', loadProc);
      atEnd = await loadProc.report();
    }
    const final = await loadProc.stop();
    loadEnd.abort();
    await Promise.all(apiLoops);
    loadCounters = { warmup: atMeasured, measured: diffCounters(atMeasured, atEnd) };
    // What finished after the last report (in flight at the stop) counts with the phase it ran in.
    const last = phase === 'measured' ? loadCounters.measured : loadCounters.warmup;
    for (const [k, v] of Object.entries(diffCounters(atEnd, final))) last[k] = (last[k] ?? 0) + v;
  }
  const envEnd = loadavg()
    .map((x) => x.toFixed(2))
    .join(' ');
  await cleanup();
  envInfo['load_avg_end'] = envEnd;

  for (const p of ['setup', 'idle', 'warmup', 'measured', 'teardown'] as const) {
    phaseCounters[p] = { ...(counters[p] ?? {}) };
    const fromLoad = p === 'warmup' ? loadCounters.warmup : p === 'measured' ? loadCounters.measured : {};
    for (const [k, v] of Object.entries(fromLoad)) phaseCounters[p][k] = (phaseCounters[p][k] ?? 0) + v;
  }

  const analyses = ROLES.map(analyse);
  const snapshotDiffs: { role: Role; rows: ConstructorDiff[]; heapStartMb: number; heapEndMb: number }[] = [];
  for (const role of ROLES) {
    const a = snapshots.find((s) => s.role === role && s.which === 'start');
    const b = snapshots.find((s) => s.role === role && s.which === 'end');
    if (!a || !b) continue;
    try {
      log(`reading the ${role} heap snapshots`);
      const rows = diffHeapSummaries(summarizeHeapSnapshot(a.file), summarizeHeapSnapshot(b.file));
      const f = analyses.find((x) => x.role === role)!.measured.figures['heapUsedMb']!;
      snapshotDiffs.push({ role, rows, heapStartMb: f.start, heapEndMb: f.end });
    } catch (err) {
      log(`reading the ${role} heap snapshots: ${(err as Error).message}`);
    }
  }
  const { text, failures, budgetsFailed } = report(analyses, phaseCounters, snapshotDiffs, envInfo);
  process.stdout.write(`${text}\n`);
  mkdirSync(RESULTS, { recursive: true });
  const file = join(RESULTS, `soak-${STAMP}.json`);
  writeFileSync(
    file,
    JSON.stringify(
      {
        settings: S,
        variant: V,
        budget: BUDGET,
        env: envInfo,
        stopReason: stopReason ?? null,
        agents: ROLES.map((r) => ({ role: r, pid: agents[r]?.node.agent.pid, ...agents[r]?.probeInfo })),
        services,
        analyses,
        counters: phaseCounters,
        failureEvents,
        snapshots,
        snapshotDiffs: snapshotDiffs.map((d) => ({ ...d, rows: d.rows.slice(0, 50) })),
        samples,
        summary: text,
      },
      null,
      1,
    ),
  );
  log(`results in ${file} (agent logs${S.snapshots ? ' and heap snapshots' : ''} in ${RAW})`);
  return failures === 0 && budgetsFailed === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  async (err: Error) => {
    log(err instanceof UsageError ? err.message : `FAILED: ${err.stack ?? err.message}`);
    await cleanup();
    process.exit(err instanceof UsageError ? 2 : 1);
  },
);
