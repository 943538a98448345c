/**
 * bench/api: throughput and latency of the management API of a real agent process, as a ratio
 * to a bare Fastify "hello JSON" server measured in the same run (`npm run bench:api`).
 *
 * - Baseline: the reference measurements' fastify.sh (the bench-anchors: scripts measuring direct
 *   forwarding, wireguard-go, kcptun, stunnel and bare Fastify on this machine, found at
 *   $BENCH_SHARED/bench-anchors, by default beside the repository; docs/benchmarks.md). It runs
 *   bare Fastify and bare node:http under autocannon -c CONNS -d DURATION after a 2 s warm-up, on
 *   the loopback of its own namespace `${BA_PREFIX}-api`. It runs before the first rep and after
 *   every rep, and each scenario's ratio uses the mean of the two Fastify figures that bracket it.
 * - Agent: `node dist/src/cli/main.js serve` with a fresh data dir and a vendor key made here,
 *   bootstrapped over the API, driven by the same autocannon CLI with the same flags. As root it
 *   runs (with this process and autocannon) on the loopback of a namespace of its own,
 *   `${BA_PREFIX}-agent`, like the baseline; BENCH_NETNS=0 uses the host's loopback instead.
 * - Agent RSS comes from /proc/<pid>/status: VmRSS sampled every 50 ms, VmHWM at the end.
 * - For reading the figures on a shared, noisy machine: the server's CPU time per request
 *   (/proc/<pid>/stat), the 1-minute load average around each run, and a CPU-cost reference: a
 *   bare Fastify server run by this script next to the agent, whose pid (unlike fastify.sh's)
 *   we know. These are information; the targets use the fastify.sh ratio.
 *
 * Adding a scenario is one entry in SCENARIOS. Raw autocannon JSON, the anchors' own output and
 * summary.md go to bench/results/<timestamp>-api/ (git-ignored). Exit code 1 when a target fails.
 *
 * Environment: BENCH_REPS (2), BENCH_DURATION (10), BENCH_CONNS (50), BENCH_WARMUP (2),
 * BA_PREFIX (mabench), BENCH_SHARED (the directory holding bench-anchors/; <repo>/../shared),
 * BENCH_NETNS (1; 0 = host loopback), BENCH_BASELINE (1; 0 skips fastify.sh, e.g. while profiling), BENCH_SCENARIOS (comma-separated
 * substrings of scenario names), BENCH_AGENT_LOG_LEVEL (info, the agent's default),
 * BENCH_CPU_PROF (0; 1 runs the agent under --cpu-prof, profile under the results dir),
 * BENCH_CPU_REF (1; 0 skips the CPU-cost reference, a bare Fastify run by this script),
 * BENCH_AGENT_NODE_ARGS (extra node flags for the agent only, e.g. --trace-gc),
 * BENCH_KEEP_AGENT_LOG (0; 1 keeps the agent's stdout+stderr as agent.log in the results dir).
 */
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { generateLicenseKeyPair } from '../../src/license/sign.js';
import {
  AUTOCANNON,
  benchLicense,
  describe,
  fmt,
  freePort,
  type LoadRequest,
  type Measurement,
  mb,
  measure,
  median,
  procStatusKb,
  REPO_ROOT,
  range,
  rssSampler,
  sleep,
  waitHttp,
} from './measure.js';

export type { LoadRequest } from './measure.js';

// --- the scenario table --------------------------------------------------------------------

/** What a scenario may use: the bootstrapped agent and its admin credential. */
export interface ScenarioContext {
  baseUrl: string;
  clientId: string;
  clientSecret: string;
  /** An admin access token (valid for an hour). */
  accessToken: string;
  localPeerId: string;
  /** Authenticated JSON call for setup steps; throws on a non-2xx answer. */
  api(method: string, path: string, body?: unknown): Promise<unknown>;
  /**
   * Starts `count` more agents under the same license, bootstraps them and joins each to the
   * measured agent by the handshake (POST /v1/peers); returns their peer ids. They idle during
   * the measurements and stop with the measured agent.
   */
  addPeers(count: number): Promise<string[]>;
}

export interface Scenario {
  name: string;
  /** Target: req/s at least this fraction of bare Fastify's in the same run. */
  minRatio: number;
  /** Runs once, before any measurement (e.g. create the 100 services a listing reads). */
  setup?: (ctx: ScenarioContext) => Promise<void>;
  /** The one request autocannon repeats. */
  request: (ctx: ScenarioContext) => LoadRequest;
}

const bearer = (ctx: ScenarioContext) => ({ authorization: `Bearer ${ctx.accessToken}` });

export const SCENARIOS: readonly Scenario[] = [
  {
    name: 'POST /v1/oauth/token',
    minRatio: 0.3,
    request: (ctx) => ({
      method: 'POST',
      path: '/v1/oauth/token',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({
        grant_type: 'client_credentials',
        client_id: ctx.clientId,
        client_secret: ctx.clientSecret,
      }).toString(),
    }),
  },
  {
    name: 'GET /v1/credentials',
    minRatio: 0.6,
    request: (ctx) => ({ method: 'GET', path: '/v1/credentials', headers: bearer(ctx) }),
  },
  {
    name: 'GET /v1/services (100 services)',
    minRatio: 0.6,
    // 100 services need 100 distinct (source, target) pairs: 11 peers give 110.
    setup: async (ctx) => {
      const peers = [ctx.localPeerId, ...(await ctx.addPeers(10))];
      const pairs = peers.flatMap((source) =>
        peers.filter((t) => t !== source).map((target) => [source, target]),
      );
      for (const [i, [source, target]] of pairs.slice(0, 100).entries()) {
        const service = (await ctx.api('POST', '/v1/services', {
          source_peer_id: source,
          target_peer_id: target,
          bandwidth_limit_mbps: i,
        })) as { id: string };
        await ctx.api('POST', `/v1/services/${service.id}/routes`, {
          routes: [
            { priority: 10, dest_cidr: `10.${i}.0.0/16` },
            { priority: 20, source_cidr: `fd00:${i.toString(16)}::/32`, dest_cidr: '::/0' },
          ],
        });
      }
    },
    request: (ctx) => ({ method: 'GET', path: '/v1/services', headers: bearer(ctx) }),
  },
  {
    name: 'GET /v1/peers/{id}',
    minRatio: 0.6,
    request: (ctx) => ({ method: 'GET', path: `/v1/peers/${ctx.localPeerId}`, headers: bearer(ctx) }),
  },
];

/** Targets that hold for every scenario. */
const P99_MAX_MS = 20;
const RSS_MAX_MB = 120;

// --- settings ------------------------------------------------------------------------------

const AGENT_MAIN = join(REPO_ROOT, 'dist/src/cli/main.js');
const env = process.env;
const int = (name: string, fallback: number): number => {
  const v = env[name];
  if (v === undefined || v === '') return fallback;
  if (!/^\d+$/.test(v)) throw new Error(`${name} must be a whole number, got ${JSON.stringify(v)}`);
  return Number(v);
};
const settings = {
  reps: int('BENCH_REPS', 2),
  duration: int('BENCH_DURATION', 10),
  warmup: int('BENCH_WARMUP', 2),
  conns: int('BENCH_CONNS', 50),
  prefix: env.BA_PREFIX || 'mabench',
  sharedDir: resolve(env.BENCH_SHARED || join(REPO_ROOT, '../shared')),
  netns: env.BENCH_NETNS !== '0',
  baseline: env.BENCH_BASELINE !== '0',
  only: (env.BENCH_SCENARIOS ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean),
  logLevel: env.BENCH_AGENT_LOG_LEVEL || 'info',
  cpuProf: env.BENCH_CPU_PROF === '1',
  cpuRef: env.BENCH_CPU_REF !== '0',
  agentNodeArgs: (env.BENCH_AGENT_NODE_ARGS ?? '').split(' ').filter(Boolean),
  keepAgentLog: env.BENCH_KEEP_AGENT_LOG === '1',
};
const INSIDE_NETNS = env.BENCH_INSIDE_NETNS;
const loadSettings = {
  conns: settings.conns,
  warmupSeconds: settings.warmup,
  durationSeconds: settings.duration,
};

const log = (msg: string) =>
  process.stderr.write(`[bench:api ${new Date().toISOString().slice(11, 19)}] ${msg}\n`);

// --- network namespace wrapper -------------------------------------------------------------

/**
 * Creates `${prefix}-agent`, runs this same script inside it and deletes the namespace after.
 * Returns the exit code, or undefined when the bench should run right here instead.
 */
async function runInsideNamespace(): Promise<number | undefined> {
  if (INSIDE_NETNS || !settings.netns) return undefined;
  if (process.getuid?.() !== 0) {
    log('not root: running the agent on the host loopback (set BENCH_NETNS=0 to silence this)');
    return undefined;
  }
  const ns = `${settings.prefix}-agent`;
  const list = spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  if (list.status !== 0) throw new Error(`ip netns list failed: ${list.stderr}`);
  if (list.stdout.split('\n').some((l) => l.split(' ')[0] === ns)) {
    throw new Error(
      `namespace ${ns} exists (a stale run?): remove it with "ip netns del ${ns}" or set BA_PREFIX`,
    );
  }
  const run = (args: string[]) => {
    const r = spawnSync('ip', args, { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`ip ${args.join(' ')} failed: ${r.stderr}`);
  };
  run(['netns', 'add', ns]);
  try {
    run(['-n', ns, 'link', 'set', 'lo', 'up']);
    const child = spawn('ip', ['netns', 'exec', ns, process.execPath, fileURLToPath(import.meta.url)], {
      env: { ...env, BENCH_INSIDE_NETNS: ns },
      stdio: 'inherit',
    });
    const forward = (signal: NodeJS.Signals) => () => child.kill(signal);
    process.on('SIGINT', forward('SIGINT'));
    process.on('SIGTERM', forward('SIGTERM'));
    return await new Promise<number>((done) => child.once('exit', (code) => done(code ?? 1)));
  } finally {
    spawnSync('ip', ['netns', 'del', ns]);
  }
}

// --- agent process -------------------------------------------------------------------------

interface Agent {
  proc: ChildProcess;
  baseUrl: string;
  exited: Promise<void>;
}

async function startAgent(
  workDir: string,
  publicKeyFile: string,
  resultsDir: string,
  name = 'agent',
  fixedPort = 7480,
): Promise<Agent> {
  const profDir = join(resultsDir, 'cpu-prof');
  const measured = name === 'agent';
  const logPath = join(settings.keepAgentLog && measured ? resultsDir : workDir, `${name}.log`);
  const port = INSIDE_NETNS ? fixedPort : await freePort();
  const logFd = openSync(logPath, 'a');
  const nodeArgs = measured
    ? [...(settings.cpuProf ? ['--cpu-prof', `--cpu-prof-dir=${profDir}`] : []), ...settings.agentNodeArgs]
    : [];
  const proc = spawn(
    process.execPath,
    [
      ...nodeArgs,
      AGENT_MAIN,
      'serve',
      '--listen',
      `127.0.0.1:${port}`,
      '--data-dir',
      join(workDir, measured ? 'data' : `data-${name}`),
      '--license-public-key',
      publicKeyFile,
      '--log-level',
      settings.logLevel,
    ],
    { stdio: ['ignore', logFd, logFd] },
  );
  closeSync(logFd);
  let gone = false;
  const exited = new Promise<void>((done) =>
    proc.once('exit', () => {
      gone = true;
      done();
    }),
  );
  const baseUrl = `http://127.0.0.1:${port}`;
  if (await waitHttp(`${baseUrl}/readyz`, 20_000, () => gone)) return { proc, baseUrl, exited };
  proc.kill('SIGKILL');
  throw new Error(`the agent did not become ready; see ${logPath}`);
}

async function stopAgent(agent: Agent): Promise<void> {
  if (agent.proc.exitCode !== null || agent.proc.signalCode !== null) return;
  agent.proc.kill('SIGTERM');
  const timer = setTimeout(() => agent.proc.kill('SIGKILL'), 15_000);
  await agent.exited;
  clearTimeout(timer);
}

async function jsonCall(url: string, init: RequestInit): Promise<unknown> {
  const res = await fetch(url, { ...init, signal: AbortSignal.timeout(10_000) });
  const text = await res.text();
  if (!res.ok) throw new Error(`${init.method ?? 'GET'} ${url}: ${res.status} ${text}`);
  return text === '' ? undefined : JSON.parse(text);
}

/** Bootstraps an agent with a license of our own vendor key (the same license_id every time). */
async function bootstrapAgent(baseUrl: string, vendorKeyPem: string, name: string) {
  const license = benchLicense(vendorKeyPem);
  return (await jsonCall(`${baseUrl}/v1/bootstrap`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ license, name }),
  })) as { client_id: string; client_secret: string; peer_id: string };
}

/** Bootstraps the measured agent; returns the context scenarios use. */
async function prepareAgent(
  baseUrl: string,
  vendorKeyPem: string,
  addPeers: ScenarioContext['addPeers'],
): Promise<ScenarioContext> {
  const boot = await bootstrapAgent(baseUrl, vendorKeyPem, 'bench');
  const token = (await jsonCall(`${baseUrl}/v1/oauth/token`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({
      grant_type: 'client_credentials',
      client_id: boot.client_id,
      client_secret: boot.client_secret,
    }).toString(),
  })) as { access_token: string };
  const accessToken = token.access_token;
  return {
    baseUrl,
    clientId: boot.client_id,
    clientSecret: boot.client_secret,
    accessToken,
    localPeerId: boot.peer_id,
    addPeers,
    api: (method, path, body) =>
      jsonCall(`${baseUrl}${path}`, {
        method,
        headers: {
          authorization: `Bearer ${accessToken}`,
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      }),
  };
}

/**
 * fastify.sh does not expose its server's pid, so its CPU cost per request is unknown. This
 * runs the same bare Fastify hello-JSON server (the repo's Fastify) next to the agent and reads
 * its CPU time: on a shared, noisy machine CPU µs per request is steadier than req/s, and the
 * ratio of the two CPU costs is what the throughput ratio would be if both were CPU-bound.
 */
async function bareFastifyCpuRef(jsonFile: string): Promise<Measurement> {
  const port = INSIDE_NETNS ? 7481 : await freePort();
  const code = `const f = require(${JSON.stringify(join(REPO_ROOT, 'node_modules/fastify'))})({ logger: false });
f.get('/', async () => ({ hello: 'world' }));
f.listen({ host: '127.0.0.1', port: ${port} });`;
  const proc = spawn(process.execPath, ['-e', code], { stdio: 'ignore' });
  const exited = new Promise((done) => proc.once('exit', done));
  try {
    const url = `http://127.0.0.1:${port}`;
    if (!(await waitHttp(url, 10_000))) throw new Error('the bare Fastify reference did not start');
    return await measure(url, { method: 'GET', path: '/' }, proc.pid!, jsonFile, loadSettings);
  } finally {
    proc.kill('SIGKILL');
    await exited;
  }
}

// --- baseline (fastify.sh) -----------------------------------------------------------------

interface Anchor {
  fastify: Measurement;
  nodeHttp: Measurement;
}

/** Runs fastify.sh once (REPS=1) into its own directory and reads its samples.tsv. */
async function runAnchor(outDir: string, npmDir: string): Promise<Anchor> {
  const script = join(settings.sharedDir, 'bench-anchors/fastify.sh');
  await new Promise<void>((done, fail) => {
    const proc = spawn('bash', [script], {
      env: {
        ...env,
        REPS: '1',
        DURATION: String(settings.duration),
        CONNS: String(settings.conns),
        OUT: outDir,
        BA_PREFIX: settings.prefix,
        NPM_DIR: npmDir,
      },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    proc.once('error', fail);
    proc.once('exit', (code) => (code === 0 ? done() : fail(new Error(`fastify.sh exited with ${code}`))));
  });
  const rows = readFileSync(join(outDir, 'samples.tsv'), 'utf8')
    .trim()
    .split('\n')
    .slice(1)
    .map((l) => l.split('\t'));
  const pick = (path: string): Measurement => {
    const value = (metric: string) => {
      const v = rows.find((r) => r[1] === path && r[2] === metric)?.[3];
      return v === undefined || v === 'NA' ? Number.NaN : Number(v);
    };
    const m: Measurement = { reqPerSec: value('req_s'), p50: value('lat_p50_ms'), p99: value('lat_p99_ms') };
    if (!Number.isFinite(m.reqPerSec)) m.invalid = 'fastify.sh reported NA';
    return m;
  };
  return { fastify: pick('fastify'), nodeHttp: pick('node-http') };
}

/**
 * fastify.sh installs fastify and autocannon into NPM_DIR when they are missing. Pointing it at
 * a directory whose node_modules is this repo's means both sides use the same Fastify and
 * autocannon versions, with nothing downloaded. BENCH_NPM_DIR overrides.
 */
function anchorNpmDir(workDir: string): string {
  if (env.BENCH_NPM_DIR) return env.BENCH_NPM_DIR;
  const dir = join(workDir, 'anchor-npm');
  mkdirSync(dir, { recursive: true });
  symlinkSync(join(REPO_ROOT, 'node_modules'), join(dir, 'node_modules'));
  return dir;
}

// --- report --------------------------------------------------------------------------------

interface ScenarioRun {
  rep: number;
  m: Measurement;
  ratio: number;
  /** Bare Fastify's CPU µs per request over the agent's, same rep. */
  cpuRatio: number;
  rssPeakKb: number;
}

function report(
  scenarios: readonly Scenario[],
  runs: Map<string, ScenarioRun[]>,
  anchors: Anchor[],
  cpuRefs: Measurement[],
  rss: { idleKb: number; hwmKb: number; afterKb: number },
  where: string,
): string {
  const lines: string[] = [
    `Agent: ${where}; log level ${settings.logLevel}${settings.agentNodeArgs.length ? `, node flags ${settings.agentNodeArgs.join(' ')}` : ''}. autocannon -c ${settings.conns} -d ${settings.duration} after a ${settings.warmup} s warm-up; ${settings.reps} rep(s). Cells: median [min-max] over reps; a ratio divides by the mean of the bare-Fastify runs just before and after. Pass/fail uses the medians. CPU: the server's user+system time over the measured run (all threads; 100% = one core); the CPU ratio is a bare Fastify server's CPU µs/req (run by this script, same rep) over the agent's, i.e. the throughput ratio if both were CPU-bound, which is steadier than req/s on a shared machine (information only). Load: 1-min load average of the machine (${cpus().length} CPUs) before/after each run.`,
    '',
    '| scenario | req/s | p50 ms | p99 ms | x bare Fastify | target | pass | CPU µs/req | x bare Fastify by CPU | CPU % | load |',
    '|---|---|---|---|---|---|---|---|---|---|---|',
  ];
  let allPass = true;
  for (const s of scenarios) {
    const rs = runs.get(s.name) ?? [];
    const col = (pick: (r: ScenarioRun) => number, digits: number) => range(rs.map(pick), digits);
    const invalid = rs.filter((r) => r.m.invalid).map((r) => `rep ${r.rep}: ${r.m.invalid}`);
    const ratioOk = settings.baseline ? median(rs.map((r) => r.ratio)) >= s.minRatio : undefined;
    const p99Ok = median(rs.map((r) => r.m.p99)) < P99_MAX_MS;
    const ok = invalid.length === 0 && ratioOk !== false && p99Ok;
    allPass &&= ok;
    const why = [
      ratioOk === false ? 'ratio' : '',
      p99Ok ? '' : 'p99',
      ratioOk === undefined ? 'no baseline' : '',
      ...invalid,
    ].filter(Boolean);
    const loads = rs.map((r) => (r.m.load ? r.m.load.map((x) => x.toFixed(1)).join('/') : 'NA')).join(', ');
    lines.push(
      `| ${s.name} | ${col((r) => r.m.reqPerSec, 0)} | ${col((r) => r.m.p50, 0)} | ${col((r) => r.m.p99, 0)} | ${col((r) => r.ratio, 2)} | >= ${s.minRatio}x, p99 < ${P99_MAX_MS} ms | ${ok ? (ratioOk === undefined ? 'n/a' : 'pass') : 'FAIL'}${why.length ? ` (${why.join('; ')})` : ''} | ${col((r) => r.m.cpuUsPerReq ?? Number.NaN, 0)} | ${col((r) => r.cpuRatio, 2)} | ${col((r) => r.m.cpuPct ?? Number.NaN, 0)} | ${loads} |`,
    );
  }
  if (anchors.length > 0) {
    const col = (pick: (a: Anchor) => number, digits: number) => range(anchors.map(pick), digits);
    lines.push(
      `| (baseline, fastify.sh) bare Fastify | ${col((a) => a.fastify.reqPerSec, 0)} | ${col((a) => a.fastify.p50, 0)} | ${col((a) => a.fastify.p99, 0)} | 1.00 | | | | | | |`,
      `| (baseline, fastify.sh) bare node:http | ${col((a) => a.nodeHttp.reqPerSec, 0)} | ${col((a) => a.nodeHttp.p50, 0)} | ${col((a) => a.nodeHttp.p99, 0)} | ${col((a) => a.nodeHttp.reqPerSec / a.fastify.reqPerSec, 2)} | | | | | | |`,
    );
  }
  if (cpuRefs.length > 0) {
    const col = (pick: (m: Measurement) => number, digits: number) => range(cpuRefs.map(pick), digits);
    lines.push(
      `| (CPU reference) bare Fastify, next to the agent | ${col((m) => m.reqPerSec, 0)} | ${col((m) => m.p50, 0)} | ${col((m) => m.p99, 0)} | | | | ${col((m) => m.cpuUsPerReq ?? Number.NaN, 0)} | 1.00 | ${col((m) => m.cpuPct ?? Number.NaN, 0)} | ${cpuRefs.map((m) => m.load?.map((x) => x.toFixed(1)).join('/')).join(', ')} |`,
    );
  }
  if (anchors.length > 0) {
    lines.push(
      '',
      `Bare Fastify req/s per fastify.sh run, in order: ${anchors.map((a) => fmt(a.fastify.reqPerSec)).join(', ')}.`,
    );
  }
  const sampledPeak = (name: string) => Math.max(0, ...(runs.get(name) ?? []).map((r) => r.rssPeakKb));
  const peakKb = Math.max(rss.hwmKb, ...scenarios.map((s) => sampledPeak(s.name)));
  const rssOk = mb(peakKb) < RSS_MAX_MB;
  allPass &&= rssOk;
  lines.push(
    '',
    '| agent RSS | MB |',
    '|---|---|',
    `| idle after bootstrap | ${fmt(mb(rss.idleKb), 1)} |`,
    ...scenarios.map(
      (s) => `| peak during ${s.name} (VmRSS every 50 ms) | ${fmt(mb(sampledPeak(s.name)), 1)} |`,
    ),
    `| peak over the whole run (VmHWM) | ${fmt(mb(rss.hwmKb), 1)} |`,
    `| after the run (2 s idle) | ${fmt(mb(rss.afterKb), 1)} |`,
    '',
    `RSS target < ${RSS_MAX_MB} MB (peak ${fmt(mb(peakKb), 1)} MB): ${rssOk ? 'pass' : 'FAIL'}. Overall: ${allPass ? (settings.baseline ? 'pass' : 'n/a (no baseline, ratios not checked)') : 'FAIL'}.`,
  );
  return lines.join('\n');
}

// --- main ----------------------------------------------------------------------------------

async function bench(): Promise<number> {
  for (const [what, path] of [
    ['the agent (run npm run build)', AGENT_MAIN],
    ['autocannon (run npm install)', AUTOCANNON],
  ] as const) {
    if (!existsSync(path)) throw new Error(`missing ${what}: ${path}`);
  }
  if (settings.baseline && !existsSync(join(settings.sharedDir, 'bench-anchors/fastify.sh'))) {
    throw new Error(`no bench-anchors in ${settings.sharedDir} (set BENCH_SHARED, or BENCH_BASELINE=0)`);
  }
  const scenarios = SCENARIOS.filter(
    (s) => settings.only.length === 0 || settings.only.some((o) => s.name.includes(o)),
  );
  if (scenarios.length === 0) throw new Error(`BENCH_SCENARIOS matches no scenario`);

  const stamp = new Date()
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d+Z$/, 'Z');
  const resultsDir = join(REPO_ROOT, 'bench/results', `${stamp}-api`);
  mkdirSync(join(resultsDir, 'agent'), { recursive: true });
  mkdirSync(join(resultsDir, 'cpu-ref'), { recursive: true });
  const workDir = mkdtempSync(join(tmpdir(), 'mesh-bench-api-'));
  const where = INSIDE_NETNS
    ? `loopback of network namespace ${INSIDE_NETNS} (autocannon in the same namespace)`
    : 'host loopback 127.0.0.1';
  log(`results: ${resultsDir}; agent on ${where}`);

  const pair = generateLicenseKeyPair();
  const publicKeyFile = join(workDir, 'license-signing.pub');
  writeFileSync(publicKeyFile, pair.publicPem);

  const agent = await startAgent(workDir, publicKeyFile, resultsDir);
  const pid = agent.proc.pid!;
  const stopOnSignal = () => {
    agent.proc.kill('SIGKILL');
    process.exit(130);
  };
  process.once('SIGINT', stopOnSignal);
  process.once('SIGTERM', stopOnSignal);
  const sampler = rssSampler(pid);
  const extras: Agent[] = [];
  try {
    const addPeers = async (count: number): Promise<string[]> => {
      const ids: string[] = [];
      for (let i = 0; i < count; i++) {
        const name = `peer${extras.length + 1}`;
        // 7480 is the measured agent, 7481 the CPU reference.
        const extra = await startAgent(workDir, publicKeyFile, resultsDir, name, 7500 + extras.length);
        extras.push(extra);
        ids.push((await bootstrapAgent(extra.baseUrl, pair.privatePem, name)).peer_id);
        await ctx.api('POST', '/v1/peers', { address: extra.baseUrl.replace(/^http:\/\//, '') });
      }
      return ids;
    };
    const ctx: ScenarioContext = await prepareAgent(agent.baseUrl, pair.privatePem, addPeers);
    for (const s of scenarios) await s.setup?.(ctx);
    await sleep(1000);
    sampler.mark();
    const idleKb = procStatusKb(pid, 'VmRSS') ?? Number.NaN;

    const npmDir = settings.baseline ? anchorNpmDir(workDir) : '';
    const anchors: Anchor[] = [];
    const anchor = async (i: number) => {
      log(`baseline ${i}: fastify.sh`);
      anchors.push(await runAnchor(join(resultsDir, `anchor-${i}`), npmDir));
    };
    const runs = new Map<string, ScenarioRun[]>(scenarios.map((s) => [s.name, []]));
    const pending: { name: string; rep: number; m: Measurement; rssPeakKb: number }[] = [];
    const cpuRefs: Measurement[] = [];
    if (settings.baseline) await anchor(0);
    for (let rep = 1; rep <= settings.reps; rep++) {
      for (const [i, s] of scenarios.entries()) {
        log(`rep ${rep}: ${s.name}`);
        sampler.mark();
        const m = await measure(
          agent.baseUrl,
          s.request(ctx),
          pid,
          join(resultsDir, 'agent', `r${rep}-s${i + 1}-autocannon.json`),
          loadSettings,
        );
        const rssPeakKb = sampler.mark();
        log(`  ${describe(m)}, RSS peak ${fmt(mb(rssPeakKb), 1)} MB`);
        pending.push({ name: s.name, rep, m, rssPeakKb });
      }
      if (settings.cpuRef) {
        log(`rep ${rep}: CPU reference (bare Fastify run by this script)`);
        const m = await bareFastifyCpuRef(join(resultsDir, 'cpu-ref', `r${rep}-autocannon.json`));
        log(`  ${describe(m)}`);
        cpuRefs.push(m);
      }
      if (settings.baseline) await anchor(rep);
    }
    for (const p of pending) {
      const before = anchors[p.rep - 1]?.fastify.reqPerSec ?? Number.NaN;
      const after = anchors[p.rep]?.fastify.reqPerSec ?? Number.NaN;
      const ratio = p.m.invalid ? Number.NaN : p.m.reqPerSec / ((before + after) / 2);
      const ref = cpuRefs[p.rep - 1]?.cpuUsPerReq ?? Number.NaN;
      const cpuRatio = p.m.invalid ? Number.NaN : ref / (p.m.cpuUsPerReq ?? Number.NaN);
      runs.get(p.name)!.push({ rep: p.rep, m: p.m, ratio, cpuRatio, rssPeakKb: p.rssPeakKb });
    }
    await sleep(2000);
    const afterKb = procStatusKb(pid, 'VmRSS') ?? Number.NaN;
    const hwmKb = procStatusKb(pid, 'VmHWM') ?? Number.NaN;

    const table = report(scenarios, runs, anchors, cpuRefs, { idleKb, hwmKb, afterKb }, where);
    const header = `# bench:api ${stamp}\n\nNode ${process.version}, ${agent.baseUrl}, agent log ${settings.logLevel}${settings.cpuProf ? ', under --cpu-prof (slower)' : ''}${settings.agentNodeArgs.length ? `, agent node flags ${settings.agentNodeArgs.join(' ')}` : ''}.\n\n`;
    writeFileSync(join(resultsDir, 'summary.md'), `${header}${table}\n`);
    writeFileSync(
      join(resultsDir, 'results.json'),
      JSON.stringify(
        {
          settings,
          where,
          anchors,
          cpuRefs,
          runs: Object.fromEntries(runs),
          rss: { idleKb, hwmKb, afterKb },
        },
        null,
        2,
      ),
    );
    process.stdout.write(`${table}\n`);
    log(`wrote ${join(resultsDir, 'summary.md')}`);
    return table.includes('Overall: FAIL') ? 1 : 0;
  } finally {
    sampler.stop();
    await Promise.all(extras.map(stopAgent));
    await stopAgent(agent);
    rmSync(workDir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const wrapped = await runInsideNamespace();
  process.exitCode = wrapped ?? (await bench());
}

main().catch((err: unknown) => {
  process.stderr.write(`bench:api: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 2;
});
