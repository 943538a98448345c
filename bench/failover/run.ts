/**
 * bench/failover/run: how fast traffic leaves a failed exit, and whether a lossy underlay makes it
 * leave a healthy one. `node dist/bench/failover/run.js [--trials 20] [--faults "kill9 sigstop
 * underlay lan-down"] [--transport tcp|kcp] [--loss-duration 600] [--loss-pct 5] [--hold-down-ms 0]
 * [--interval-ms 100] [--timeout-ms 1000] [--fault-timeout-ms 15000] [--prefix mbfo] [--index 71]`
 * as root, after `npx tsc -p tsconfig.json`; each flag also an environment variable (TRIALS,
 * FAULTS, TRANSPORT, DURATION, LOSS_PCT, HOLD_DOWN_MS, INTERVAL_MS, TIMEOUT_MS, FAULT_TIMEOUT_MS,
 * PREFIX, MGMT_INDEX), the flag winning. Not part of the tests.
 *
 * - Topology: test/helpers/mesh-netns.ts (client, ingress, exit, exit2, dest; the two exits on
 *   the same destination LAN), brought up once, agents started with --failover-hold-down-ms
 *   HOLD_DOWN_MS (0: traffic returns to the exit as soon as it is healthy, so trials follow each
 *   other quickly; the hold-down does not enter the failover time) and --metrics-public (polled
 *   for the whole run, longer than a token lives). It takes the data-plane tests' lock
 *   (test/helpers/exclusive.ts): it waits for a traffic suite to finish and holds the cores.
 * - Services: ingress -> exit, route 10.91.1.0/24 -> 10.91.2.0/24 priority 10, and ingress ->
 *   exit2, the same route, priority 20; both TRANSPORT.
 * - Traffic, from the client namespace (client-loop.ts): a new TCP connection every INTERVAL_MS
 *   (a GET whose answer names the exit it left by; timeout TIMEOUT_MS), and per trial one held-open
 *   connection (hold-server.ts in dest, which names the exit too).
 * - A trial (faults.ts, one entry per kind; the default run takes every kind the agent can
 *   fail over on, a kind marked `notYet` is refused): new connections through exit (5 in a row) and the
 *   held connection through exit, the fault, then (a) fault -> the answer of the first new
 *   connection through exit2, (b) fault -> the end of the held connection (the ingress resets the
 *   streams of a service that stands aside; a dead exit's tunnel closes them). A trial without
 *   either within FAULT_TIMEOUT_MS failed. Then the fault is undone and the trial waits for 5 new
 *   connections in a row through exit again (`back`: from the start of the recovery, which for
 *   kill9 includes the agent's start). Also recorded: fault -> the ingress's `service stands
 *   aside` log line, new connections that failed before the switch, the ingress's health changes.
 *   The fault's time: just before the signal (kill9, sigstop), just after the nft or ip command
 *   returned (underlay, lan-down: the fault is surely in effect then).
 * - Loss (DURATION s, 0: none): LOSS_PCT % random loss on both exits' underlay links, each
 *   direction (test/helpers/underlay-rules.ts, numgen, with counters for the real drop rate). Counted: the
 *   ingress's health changes (/metrics mesh_dataplane_service_health_changes_total{to}, and its
 *   log lines per service), /metrics mesh_dataplane_service_carrying polled every 500 ms, new
 *   connections not answered through exit. Every switch there is a false one: both exits work.
 * - Figures: per fault kind p50/p99/max of (a) and (b) in ms (nearest rank: with 20 trials p99 is
 *   the max), each p99 as a ratio of the target, p99 <= 2000 ms. There is no baseline to run
 *   beside it: the reference points are other products' (Tailscale's exit-node failover about
 *   15 s, Headscale's 60-75 s), so the target is the reference.
 * Output: tables on stdout, progress on stderr, JSON in bench/results/failover-<timestamp>.json,
 * agent logs in bench/results/failover-<timestamp>-raw/ (git-ignored). Exits 1 when a trial
 * failed, a p99 is over the target or the loss run switched. Namespaces, agents and helpers are
 * removed on every exit, Ctrl-C included (a second Ctrl-C leaves at once; the next run with the
 * same prefix removes what is left).
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { existsSync, mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs, promisify } from 'node:util';
import {
  APPS,
  createService,
  HTTP,
  type MeshNetns,
  meshNetnsUp,
  waitUp,
} from '../../test/helpers/mesh-netns.js';
import { IP, requireNetnsSupport } from '../../test/helpers/netns-topology.js';
import { type LossCounters, lossCounters, lossUp, tableDown } from '../../test/helpers/underlay-rules.js';
import { REPO_ROOT } from '../api/measure.js';
import { FAULTS, type FaultContext, type FaultKind, now } from './faults.js';

const exec = promisify(execFile);

// --- settings --------------------------------------------------------------------------------

const USAGE =
  'usage: node dist/bench/failover/run.js [--trials 20] [--faults "kill9 sigstop underlay lan-down"] ' +
  '[--transport tcp|kcp] ' +
  '[--loss-duration 600] [--loss-pct 5] [--hold-down-ms 0] [--interval-ms 100] [--timeout-ms 1000] ' +
  '[--fault-timeout-ms 15000] [--prefix mbfo] [--index 71]';

class UsageError extends Error {}

/** Flag name -> its environment variable and default. */
const FLAGS = {
  trials: ['TRIALS', '20'],
  faults: [
    'FAULTS',
    FAULTS.filter((f) => !f.notYet)
      .map((f) => f.name)
      .join(' '),
  ],
  transport: ['TRANSPORT', 'tcp'],
  'loss-duration': ['DURATION', '600'],
  'loss-pct': ['LOSS_PCT', '5'],
  'hold-down-ms': ['HOLD_DOWN_MS', '0'],
  'interval-ms': ['INTERVAL_MS', '100'],
  'timeout-ms': ['TIMEOUT_MS', '1000'],
  'fault-timeout-ms': ['FAULT_TIMEOUT_MS', '15000'],
  prefix: ['PREFIX', 'mbfo'],
  index: ['MGMT_INDEX', '71'],
} as const;
type Flag = keyof typeof FLAGS;

/** "600", "600s", "10m": seconds. */
function seconds(text: string, flag: string): number {
  const m = /^(\d+)(s|m)?$/.exec(text.trim());
  if (!m) throw new UsageError(`--${flag}: seconds (600, 600s or 10m), not ${text}`);
  return Number(m[1]) * (m[2] === 'm' ? 60 : 1);
}

function settings() {
  let values: Partial<Record<Flag | 'help', string | boolean>>;
  try {
    values = parseArgs({
      options: {
        ...Object.fromEntries(Object.keys(FLAGS).map((k) => [k, { type: 'string' as const }])),
        help: { type: 'boolean' },
      },
      strict: true,
    }).values;
  } catch (err) {
    throw new UsageError(`${(err as Error).message}\n${USAGE}`);
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  const get = (f: Flag) => (values[f] as string | undefined) ?? process.env[FLAGS[f][0]] ?? FLAGS[f][1];
  const int = (f: Flag, min: number, max: number) => {
    const v = get(f);
    if (!/^\d+$/.test(v) || Number(v) < min || Number(v) > max)
      throw new UsageError(`--${f} (${FLAGS[f][0]}): a whole number ${min}..${max}, not ${v}`);
    return Number(v);
  };
  const transport = get('transport');
  if (transport !== 'tcp' && transport !== 'kcp')
    throw new UsageError(`--transport: tcp or kcp, not ${transport}`);
  const faults = get('faults')
    .split(/[\s,]+/)
    .filter(Boolean);
  for (const name of faults) {
    const kind = FAULTS.find((f) => f.name === name);
    if (!kind)
      throw new UsageError(`--faults: unknown kind ${name} (${FAULTS.map((f) => f.name).join(', ')})`);
    if (kind.notYet) throw new UsageError(`--faults: ${name} cannot run yet: ${kind.notYet}`);
  }
  const prefix = get('prefix');
  if (!/^[a-z][a-z0-9]{0,7}$/.test(prefix))
    throw new UsageError('--prefix: 1 to 8 lowercase letters and digits');
  return {
    trials: int('trials', 1, 10_000),
    faults,
    transport: transport as 'tcp' | 'kcp',
    lossSeconds: seconds(get('loss-duration'), 'loss-duration'),
    lossPct: int('loss-pct', 1, 99),
    holdDownMs: int('hold-down-ms', 0, 3_600_000),
    intervalMs: int('interval-ms', 10, 10_000),
    timeoutMs: int('timeout-ms', 50, 60_000),
    faultTimeoutMs: int('fault-timeout-ms', 1000, 600_000),
    /** How long a recovered exit may take to carry the traffic again before the trial fails. */
    recoverTimeoutMs: 60_000,
    prefix,
    index: int('index', 1, 250),
  };
}

type Settings = ReturnType<typeof settings>;

// --- constants and state ---------------------------------------------------------------------

/** p99 target of both figures, ms. */
const TARGET_MS = 2000;
const HOLD_PORT = 8097;
/** New connections in a row through one exit that say the traffic goes by it. */
const IN_A_ROW = 5;
const CLIENT_JS = join(REPO_ROOT, 'dist/bench/failover/client-loop.js');
const HOLD_JS = join(REPO_ROOT, 'dist/bench/failover/hold-server.js');
/** The run's UTC start, 20261126T153116Z, as the other benches name their results. */
const STAMP = new Date().toISOString().replace(/[-:]|\.\d+/g, '');
const RESULTS = join(REPO_ROOT, 'bench/results');
const RAW = join(RESULTS, `failover-${STAMP}-raw`);

function log(msg: string): void {
  process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${msg}\n`);
}

// --- the client loop's lines -----------------------------------------------------------------

interface Conn {
  start: number;
  end: number;
  remote?: string;
  err?: string;
}

/** client-loop.ts in the client namespace, and what it printed so far. */
class ClientLoop {
  readonly conns: Conn[] = [];
  readonly holds: { t: number; remote: string }[] = [];
  readonly holdEnds: { t: number; how: string }[] = [];
  stderr = '';

  constructor(private readonly proc: ChildProcess) {
    createInterface({ input: proc.stdout! }).on('line', (line) => {
      const o = JSON.parse(line) as { e: string } & Conn & { t: number; remote: string; how: string };
      if (o.e === 'conn') this.conns.push(o);
      else if (o.e === 'hold') this.holds.push(o);
      else if (o.e === 'hold-end') this.holdEnds.push(o);
    });
    proc.stderr!.on('data', (c: Buffer) => {
      this.stderr += c.toString();
    });
  }

  send(cmd: 'hold' | 'release'): void {
    this.proc.stdin!.write(`${cmd}\n`);
  }

  /** The first of IN_A_ROW connections in a row (by start) answered through `remote`, started at `since` or later. */
  inARow(remote: string, since: number): Conn | undefined {
    const xs = this.conns.filter((c) => c.start >= since).sort((a, b) => a.start - b.start);
    let run = 0;
    for (const [i, c] of xs.entries()) {
      run = c.remote === remote ? run + 1 : 0;
      if (run === IN_A_ROW) return xs[i - IN_A_ROW + 1];
    }
    return undefined;
  }

  /** The first connection (by its answer) through `remote` answered after `since`. */
  firstVia(remote: string, since: number): Conn | undefined {
    let first: Conn | undefined;
    for (const c of this.conns)
      if (c.remote === remote && c.end >= since && (!first || c.end < first.end)) first = c;
    return first;
  }
}

/** Polls fn every 20 ms until it returns something, for at most ms; undefined on time-out. */
async function waitFor<T>(fn: () => T | undefined, ms: number): Promise<T | undefined> {
  const end = Date.now() + ms;
  for (;;) {
    const v = fn();
    if (v !== undefined) return v;
    if (Date.now() > end) return undefined;
    await sleep(20);
  }
}

// --- the ingress: metrics and log ------------------------------------------------------------

interface IngressMetrics {
  /** mesh_dataplane_service_health_changes_total by `to`. */
  changes: Record<string, number>;
  /** mesh_dataplane_service_carrying by service id. */
  carrying: Record<string, number>;
}

async function ingressMetrics(mesh: MeshNetns): Promise<IngressMetrics> {
  const res = await mesh.ingress.agent.client.get('/metrics', { timeoutMs: 5000 });
  if (res.status !== 200) throw new Error(`GET /metrics: ${res.status} ${res.text}`);
  const read = (name: string, label: string) => {
    const out: Record<string, number> = {};
    const re = new RegExp(`^${name}\\{${label}="([^"]+)"\\} (\\S+)$`, 'gm');
    for (const m of res.text.matchAll(re)) out[m[1]!] = Number(m[2]);
    return out;
  };
  return {
    changes: read('mesh_dataplane_service_health_changes_total', 'to'),
    carrying: read('mesh_dataplane_service_carrying', 'service_id'),
  };
}

const delta = (a: Record<string, number>, b: Record<string, number>) =>
  Object.fromEntries(
    Object.keys(b)
      .map((k) => [k, b[k]! - (a[k] ?? 0)] as const)
      .filter(([, v]) => v !== 0),
  );

interface FailoverEvent {
  /** Epoch ms (pino's `time`). */
  time: number;
  service: string;
  kind: 'stands-aside' | 'carries-again' | 'health' | 'reconciled';
  /** The health's state and reason, the reason it stands aside, or the kernel changes made. */
  detail: string;
}

/**
 * The ingress's failover log lines written after `mark` (a length of its log), and its kernel
 * reconciles (service ''): a switch reaches new connections only once the routes are redone.
 */
function failoverEvents(mesh: MeshNetns, mark: number): FailoverEvent[] {
  const out: FailoverEvent[] = [];
  for (const line of mesh.ingress.agent.logs.slice(mark).split('\n')) {
    if (!line.includes('"service') && !line.includes('reconciled')) continue;
    let o: {
      time?: number;
      msg?: string;
      service?: string;
      state?: string;
      reason?: string | null;
      changes?: number;
    };
    try {
      o = JSON.parse(line);
    } catch {
      continue;
    }
    if (typeof o.time !== 'number' || typeof o.msg !== 'string') continue;
    if (o.msg === 'data plane kernel state reconciled')
      out.push({ time: o.time, service: '', kind: 'reconciled', detail: `${o.changes} changes` });
    if (typeof o.service !== 'string') continue;
    const base = { time: o.time, service: o.service };
    if (o.msg.startsWith('service stands aside'))
      out.push({ ...base, kind: 'stands-aside', detail: o.reason ?? '' });
    else if (o.msg.startsWith('service carries its routes again'))
      out.push({ ...base, kind: 'carries-again', detail: '' });
    else if (o.msg.startsWith('service health changed'))
      out.push({ ...base, kind: 'health', detail: `${o.state}${o.reason ? ` ${o.reason}` : ''}` });
  }
  return out;
}

// --- trials ----------------------------------------------------------------------------------

interface Trial {
  fault: string;
  trial: number;
  /** When the fault was in effect (epoch ms); null: the trial failed before it. */
  faultAt: number | null;
  /** (a) ms from the fault to the answer of the first new connection through exit2. */
  switchMs: number | null;
  /** (b) ms from the fault to the end of the held connection through exit, and how it ended. */
  heldEndMs: number | null;
  heldEndHow: string | null;
  /** ms from the fault to the ingress's `service stands aside` line for exit's service. */
  standAsideMs: number | null;
  /** ms from the fault to each kernel reconcile of the ingress up to the switch (a). */
  reconcilesMs: number[];
  /** New connections started after the fault and failed (not answered) before the switch. */
  failedConns: number;
  /** ms from the start of the recovery to the answer of the first of IN_A_ROW through exit. */
  backMs: number | null;
  /** The ingress's health changes over the trial, by `to`. */
  healthChanges: Record<string, number>;
  /** Why the trial does not count, if it does not. */
  error: string | null;
}

interface Run {
  s: Settings;
  mesh: MeshNetns;
  client: ClientLoop;
  ctx: FaultContext;
  first: string;
  second: string;
}

async function trial(r: Run, kind: FaultKind, n: number): Promise<Trial> {
  const { client, mesh, s } = r;
  const t: Trial = {
    fault: kind.name,
    trial: n,
    faultAt: null,
    switchMs: null,
    heldEndMs: null,
    heldEndHow: null,
    standAsideMs: null,
    reconcilesMs: [],
    failedConns: 0,
    backMs: null,
    healthChanges: {},
    error: null,
  };
  const since = now();
  if (!(await waitFor(() => client.inARow(IP.exitOut, since), 30_000))) {
    t.error = `new connections not through exit (${IP.exitOut}) before the fault`;
    return t;
  }
  client.send('hold');
  const held = await waitFor(() => client.holds.find((h) => h.t >= since), 5000);
  if (held?.remote !== IP.exitOut) {
    client.send('release');
    t.error = `the held connection did not go through exit: ${held ? held.remote : 'no answer in 5 s'}`;
    return t;
  }
  const m0 = await ingressMetrics(mesh);
  const mark = mesh.ingress.agent.logs.length;
  const heldEnd = () => client.holdEnds.find((e) => e.t >= held.t);
  if (heldEnd()) {
    t.error = `the held connection ended before the fault (${heldEnd()!.how})`;
    return t;
  }
  const faultAt = await kind.inject!(r.ctx);
  t.faultAt = faultAt;
  let recoverAt: number;
  try {
    await waitFor(
      () => (client.firstVia(IP.exit2Out, faultAt) && heldEnd() ? true : undefined),
      faultAt + s.faultTimeoutMs - now(),
    );
    const sw = client.firstVia(IP.exit2Out, faultAt);
    const end = heldEnd();
    if (sw) t.switchMs = sw.end - faultAt;
    if (end) {
      t.heldEndMs = end.t - faultAt;
      t.heldEndHow = end.how;
    }
    t.failedConns = client.conns.filter(
      (c) => c.err && c.start >= faultAt && (!sw || c.start < sw.start),
    ).length;
    const events = failoverEvents(mesh, mark);
    const aside = events.find((e) => e.kind === 'stands-aside' && e.service === r.first);
    if (aside) t.standAsideMs = aside.time - faultAt;
    t.reconcilesMs = events
      .filter((e) => e.kind === 'reconciled' && e.time >= faultAt && (!sw || e.time <= sw.end))
      .map((e) => Math.round(e.time - faultAt));
    const missing = [
      ...(sw ? [] : ['no new connection through exit2']),
      ...(end ? [] : ['the held connection still open']),
    ];
    if (missing.length) t.error = `${missing.join(', ')} after ${s.faultTimeoutMs} ms`;
  } finally {
    recoverAt = now();
    await kind.recover!(r.ctx);
  }
  const back = await waitFor(() => client.inARow(IP.exitOut, recoverAt), s.recoverTimeoutMs);
  client.send('release');
  if (back) t.backMs = back.end - recoverAt;
  else
    t.error = `${t.error ? `${t.error}; ` : ''}not back through exit ${s.recoverTimeoutMs} ms after the recovery`;
  t.healthChanges = delta(m0.changes, (await ingressMetrics(mesh)).changes);
  return t;
}

// --- the loss run ----------------------------------------------------------------------------

interface LossRun {
  pct: number;
  seconds: number;
  /** The rules' counters on each exit's underlay link. */
  drops: { exit: LossCounters; exit2: LossCounters };
  /** The ingress's health changes over the run, by `to` (both services). */
  healthChanges: Record<string, number>;
  /** The ingress's failover log lines over the run, by service (exit, exit2), seconds from its start. */
  events: { exit: (FailoverEvent & { atS: number })[]; exit2: (FailoverEvent & { atS: number })[] };
  /** Times each service stood aside (a switch; exit's moves the traffic): false switches, all of them. */
  falseSwitches: { exit: number; exit2: number };
  /** /metrics polls (every 500 ms) that saw a service not carrying. */
  pollsNotCarrying: { exit: number; exit2: number; polls: number };
  conns: { total: number; viaExit: number; viaExit2: number; failed: Record<string, number> };
  /** Any new connection answered through exit2, or exit's service seen not carrying. */
  trafficLeftExit: boolean;
}

async function lossRun(r: Run): Promise<LossRun> {
  const { mesh, client, s } = r;
  const table = `${s.prefix}_loss`;
  const links = [
    [mesh.topo.ns.exit, 'e1'],
    [mesh.topo.ns.exit2!, 'f1'],
  ] as const;
  const since = now();
  if (!(await waitFor(() => client.inARow(IP.exitOut, since), 30_000)))
    throw new Error('loss run: new connections not through exit before it');
  const m0 = await ingressMetrics(mesh);
  const mark = mesh.ingress.agent.logs.length;
  for (const [ns, dev] of links) await lossUp(mesh.topo, ns, dev, table, s.lossPct);
  const start = now();
  const polls = { exit: 0, exit2: 0, polls: 0 };
  let drops: LossRun['drops'];
  try {
    let nextLog = start + 60_000;
    while (now() < start + s.lossSeconds * 1000) {
      const m = await ingressMetrics(mesh);
      polls.polls++;
      if (m.carrying[r.first] !== 1) polls.exit++;
      if (m.carrying[r.second] !== 1) polls.exit2++;
      if (now() > nextLog) {
        log(`  loss: ${Math.round((now() - start) / 1000)} s of ${s.lossSeconds}`);
        nextLog += 60_000;
      }
      await sleep(500);
    }
    drops = {
      exit: await lossCounters(mesh.topo, links[0][0], table),
      exit2: await lossCounters(mesh.topo, links[1][0], table),
    };
  } finally {
    for (const [ns] of links) await tableDown(mesh.topo, ns, table);
  }
  const end = now();
  const events = failoverEvents(mesh, mark)
    .filter((e) => e.kind !== 'reconciled')
    .map((e) => ({ ...e, atS: Math.round(e.time - start) / 1000 }));
  const of = (id: string) => events.filter((e) => e.service === id);
  const conns = client.conns.filter((c) => c.start >= start && c.start < end);
  const failed: Record<string, number> = {};
  for (const c of conns) if (c.err) failed[c.err] = (failed[c.err] ?? 0) + 1;
  const viaExit2 = conns.filter((c) => c.remote === IP.exit2Out).length;
  const aside = (id: string) => of(id).filter((e) => e.kind === 'stands-aside').length;
  return {
    pct: s.lossPct,
    seconds: Math.round(end - start) / 1000,
    drops,
    healthChanges: delta(m0.changes, (await ingressMetrics(mesh)).changes),
    events: { exit: of(r.first), exit2: of(r.second) },
    falseSwitches: { exit: aside(r.first), exit2: aside(r.second) },
    pollsNotCarrying: polls,
    conns: {
      total: conns.length,
      viaExit: conns.filter((c) => c.remote === IP.exitOut).length,
      viaExit2,
      failed,
    },
    trafficLeftExit: viaExit2 > 0 || polls.exit > 0 || aside(r.first) > 0,
  };
}

// --- figures ---------------------------------------------------------------------------------

/** Nearest-rank quantile; null for no values. */
function quantile(xs: number[], q: number): number | null {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
}

interface Stats {
  n: number;
  p50: number | null;
  p99: number | null;
  max: number | null;
}

const stats = (xs: number[]): Stats => ({
  n: xs.length,
  p50: quantile(xs, 0.5),
  p99: quantile(xs, 0.99),
  max: quantile(xs, 1),
});

interface FaultSummary {
  fault: string;
  what: string;
  trials: number;
  ok: number;
  switchMs: Stats;
  heldEndMs: Stats;
  standAsideMs: Stats;
  backMs: Stats;
  failedConnsMedian: number | null;
  /** Both p99s within the target, and every trial ok. */
  pass: boolean;
}

function summarize(kind: FaultKind, trials: Trial[]): FaultSummary {
  const pick = (f: (t: Trial) => number | null) => trials.map(f).filter((v): v is number => v !== null);
  const sw = stats(pick((t) => t.switchMs));
  const held = stats(pick((t) => t.heldEndMs));
  const ok = trials.filter((t) => !t.error).length;
  return {
    fault: kind.name,
    what: kind.what,
    trials: trials.length,
    ok,
    switchMs: sw,
    heldEndMs: held,
    standAsideMs: stats(pick((t) => t.standAsideMs)),
    backMs: stats(pick((t) => t.backMs)),
    failedConnsMedian: quantile(
      trials.map((t) => t.failedConns),
      0.5,
    ),
    pass:
      ok === trials.length &&
      sw.p99 !== null &&
      sw.p99 <= TARGET_MS &&
      held.p99 !== null &&
      held.p99 <= TARGET_MS,
  };
}

const ms = (v: number | null) => (v === null ? 'n/a' : v.toFixed(0));
const triple = (x: Stats) => `${ms(x.p50)} / ${ms(x.p99)} / ${ms(x.max)}`;
const ratio = (x: Stats) => (x.p99 === null ? 'n/a' : `${(x.p99 / TARGET_MS).toFixed(2)}x`);

function report(s: Settings, faults: FaultSummary[], trials: Trial[], loss: LossRun | null): string {
  const lines = [
    `Failover, transport ${s.transport}, hold-down ${s.holdDownMs} ms, ${s.trials} trials per fault, a new connection every ${s.intervalMs} ms (timeout ${s.timeoutMs} ms).`,
    `Target: p99 <= ${TARGET_MS} ms for both figures; "x target" = p99 / ${TARGET_MS} ms (references, not run here: Tailscale's exit-node failover ~15 s, Headscale's 60-75 s).`,
    '',
    '| fault | trials ok | (a) new conn via exit2, ms p50 / p99 / max | (a) p99 x target | (b) held conn ended, ms p50 / p99 / max | (b) p99 x target | stands aside, ms p50 / p99 / max | failed new conns (median) | back via exit, ms p50 / p99 / max | verdict |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ];
  for (const f of faults)
    lines.push(
      `| ${f.fault} | ${f.ok}/${f.trials} | ${triple(f.switchMs)} | ${ratio(f.switchMs)} | ${triple(f.heldEndMs)} | ${ratio(f.heldEndMs)} | ${triple(f.standAsideMs)} | ${f.failedConnsMedian ?? 'n/a'} | ${triple(f.backMs)} | ${f.pass ? 'PASS' : 'FAIL'} |`,
    );
  const bad = trials.filter((t) => t.error);
  if (bad.length) {
    lines.push('', 'Failed trials:', '');
    for (const t of bad) lines.push(`- ${t.fault} #${t.trial}: ${t.error}`);
  }
  if (loss) {
    const rate = (c: LossCounters) =>
      `in ${((100 * c.in.dropped) / Math.max(1, c.in.seen)).toFixed(1)} % of ${c.in.seen}, out ${((100 * c.out.dropped) / Math.max(1, c.out.seen)).toFixed(1)} % of ${c.out.seen}`;
    const failed = Object.entries(loss.conns.failed)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ');
    lines.push(
      '',
      `Loss: ${loss.pct} % random loss on both exits' underlay links for ${loss.seconds} s (target: no switch).`,
      '',
      `- measured drops: exit (e1) ${rate(loss.drops.exit)} packets; exit2 (f1) ${rate(loss.drops.exit2)} packets`,
      `- false switches (ingress: service stands aside): exit's service ${loss.falseSwitches.exit}, exit2's ${loss.falseSwitches.exit2}; health changes ${JSON.stringify(loss.healthChanges)}`,
      `- /metrics polls with the service not carrying: exit's ${loss.pollsNotCarrying.exit}, exit2's ${loss.pollsNotCarrying.exit2} of ${loss.pollsNotCarrying.polls}`,
      `- new connections: ${loss.conns.total}, through exit ${loss.conns.viaExit}, through exit2 ${loss.conns.viaExit2}, failed ${failed || '0'}`,
      `- traffic left exit: ${loss.trafficLeftExit ? 'yes' : 'no'}; verdict ${loss.falseSwitches.exit + loss.falseSwitches.exit2 === 0 && !loss.trafficLeftExit ? 'PASS' : 'FAIL'}`,
    );
    for (const [svc, evs] of Object.entries(loss.events))
      for (const e of evs) lines.push(`  - ${svc} at ${e.atS} s: ${e.kind} ${e.detail}`);
  }
  return lines.join('\n');
}

// --- setup, cleanup, main --------------------------------------------------------------------

/** What the figures depend on besides the agent: the machine, its load, the build the agents run. */
async function environment(s: Settings): Promise<Record<string, string>> {
  const git = async (...a: string[]) =>
    (
      await exec('git', ['-C', REPO_ROOT, ...a]).catch(() => ({ stdout: '? (not a git checkout)' }))
    ).stdout.trim();
  const [commit, dirty] = await Promise.all([
    git('rev-parse', 'HEAD'),
    git('status', '--porcelain', '--', 'src', 'native'),
  ]);
  return {
    date_utc: new Date().toISOString(),
    machine: `${cpus().length} x ${cpus()[0]?.model ?? '?'}, Linux ${release()}, Node ${process.version}`,
    load_avg_start: loadavg()
      .map((x) => x.toFixed(2))
      .join(' '),
    commit,
    // The agents run dist/, compiled from the working tree: what differs from the commit, and when.
    dirty_src: dirty,
    dist_dataplane_mtime: statSync(join(REPO_ROOT, 'dist/src/dataplane/dataplane.js')).mtime.toISOString(),
    topology: `${s.prefix}-* namespaces, management 10.254.${s.index}.0/28`,
  };
}

/** Starts a node script in a namespace with all three pipes (the tests' spawnIn has no stdin). */
const nodeIn = (ns: string, script: string, args: string[]) =>
  spawn('ip', ['netns', 'exec', ns, process.execPath, script, ...args], { stdio: ['pipe', 'pipe', 'pipe'] });

let meshUp: Promise<MeshNetns> | undefined;
let cleaning: Promise<void> | undefined;

/** Agents, helpers and namespaces away; agent logs into RAW. Safe to call twice, and mid-setup. */
function cleanup(): Promise<void> {
  cleaning ??= (async () => {
    const mesh = await meshUp?.catch(() => undefined);
    if (!mesh) return;
    try {
      // A trial interrupted during `sigstop`: a stopped agent would not hear SIGTERM.
      process.kill(mesh.exit.agent.pid, 'SIGCONT');
    } catch {
      // not running
    }
    await mesh.down().catch((e: Error) => log(`mesh down: ${e.message}`));
    // down() skips the namespaces when an agent's stop throws; removing them twice is harmless.
    await mesh.topo.down().catch((e: Error) => log(`namespaces down: ${e.message}`));
    mkdirSync(RAW, { recursive: true });
    for (const role of ['ingress', 'exit', 'exit2'] as const) {
      writeFileSync(join(RAW, `agent-${role}.log`), mesh[role].agent.logs);
      rmSync(mesh[role].agent.dataDir, { recursive: true, force: true });
    }
  })();
  return cleaning;
}

/** What the run measured so far: written out at its end, also when it fails half-way. */
const results: {
  settings?: Settings;
  env?: Record<string, string>;
  services?: { first: string; second: string };
  trials: Trial[];
  loss: LossRun | null;
  error?: string;
} = { trials: [], loss: null };

/** Prints the tables and writes the JSON; the exit code the figures call for (0: all passed). */
function writeResults(): number {
  const s = results.settings;
  if (!s || (!results.trials.length && !results.loss)) return 1;
  const faults = s.faults
    .map(
      (name) =>
        [FAULTS.find((f) => f.name === name)!, results.trials.filter((t) => t.fault === name)] as const,
    )
    .filter(([, ts]) => ts.length)
    .map(([kind, ts]) => summarize(kind, ts));
  const text = `${report(s, faults, results.trials, results.loss)}${results.error ? `\n\nThe run failed: ${results.error}` : ''}`;
  process.stdout.write(`${text}\n`);
  mkdirSync(RESULTS, { recursive: true });
  const file = join(RESULTS, `failover-${STAMP}.json`);
  writeFileSync(file, JSON.stringify({ ...results, faults, summary: text }, null, 1));
  log(`results in ${file} (agent logs in ${RAW})`);
  const { loss } = results;
  const switched =
    loss !== null && (loss.trafficLeftExit || loss.falseSwitches.exit + loss.falseSwitches.exit2 > 0);
  return results.error === undefined && faults.every((f) => f.pass) && !switched ? 0 : 1;
}

async function main(): Promise<void> {
  const s = settings();
  await requireNetnsSupport();
  for (const f of [CLIENT_JS, HOLD_JS, APPS])
    if (!existsSync(f)) throw new Error(`${f} is missing: build first (npx tsc -p tsconfig.json)`);
  results.settings = s;
  results.env = await environment(s);
  let interrupted = false;
  const stop = (sig: string) => {
    if (interrupted) process.exit(130);
    interrupted = true;
    log(`${sig}: tearing down (again to leave at once)`);
    void cleanup().finally(() => process.exit(130));
  };
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));

  log(`topology ${s.prefix} up (waits for the data-plane tests' lock)`);
  meshUp = meshNetnsUp(s.prefix, s.index, {
    agentArgs: ['--failover-hold-down-ms', String(s.holdDownMs), '--metrics-public'],
  });
  const mesh = await meshUp;
  const { ingress, exit, exit2, topo } = mesh;
  const server = nodeIn(topo.ns.dest, HOLD_JS, [String(HOLD_PORT)]);
  let serverOut = '';
  server.stdout.on('data', (c: Buffer) => {
    serverOut += c.toString();
  });
  if (!(await waitFor(() => (serverOut.includes('listening') ? true : undefined), 10_000)))
    throw new Error('the hold server did not start');

  const route = { source_cidr: '10.91.1.0/24', dest_cidr: '10.91.2.0/24' };
  const first = await createService(ingress, { target_peer_id: exit.peerId, transport_type: s.transport }, [
    { priority: 10, ...route },
  ]);
  const second = await createService(ingress, { target_peer_id: exit2.peerId, transport_type: s.transport }, [
    { priority: 20, ...route },
  ]);
  await waitUp(first, ingress, exit);
  await waitUp(second, ingress, exit2);
  results.services = { first, second };
  log(`services up: ${first} (exit, priority 10), ${second} (exit2, priority 20), ${s.transport}`);
  const client = new ClientLoop(
    nodeIn(topo.ns.client, CLIENT_JS, [
      IP.dest,
      String(HTTP),
      String(HOLD_PORT),
      String(s.intervalMs),
      String(s.timeoutMs),
    ]),
  );
  const r: Run = { s, mesh, client, ctx: { mesh, cutTable: `${s.prefix}_cut`, first }, first, second };

  for (const name of s.faults) {
    const kind = FAULTS.find((f) => f.name === name)!;
    await kind.setUp?.(r.ctx);
    for (let n = 1; n <= s.trials; n++) {
      const t = await trial(r, kind, n);
      results.trials.push(t);
      log(
        `${name} #${n}: (a) ${ms(t.switchMs)} ms, (b) ${ms(t.heldEndMs)} ms (${t.heldEndHow ?? '-'}), stands aside ${ms(t.standAsideMs)} ms, reconciled at [${t.reconcilesMs.join(', ')}] ms, back ${ms(t.backMs)} ms${t.error ? `; FAILED: ${t.error}` : ''}`,
      );
      // Not back through exit: the next trials would measure nothing.
      if (t.faultAt !== null && t.backMs === null) {
        log(`${name}: traffic did not come back to exit; the kind's other trials are skipped`);
        break;
      }
    }
    await kind.tearDown?.(r.ctx);
  }
  if (s.lossSeconds > 0) {
    log(`loss ${s.lossPct} % on both underlays for ${s.lossSeconds} s`);
    results.loss = await lossRun(r);
  }
  if (client.stderr) log(`client loop stderr: ${client.stderr.slice(0, 2000)}`);
}

main()
  .then(async () => {
    await cleanup();
    process.exit(writeResults());
  })
  .catch(async (err: Error) => {
    log(`FAILED: ${err instanceof UsageError ? err.message : (err.stack ?? err.message)}`);
    if (err instanceof UsageError) process.exit(2);
    results.error = err.message;
    await cleanup();
    writeResults();
    process.exit(1);
  });
