/**
 * bench/dataplane/run: the agent's data plane (a `tcp` service between two real agent processes)
 * beside the reference paths and a bare Node TLS relay, in one run on the anchors' topology
 * (`node dist/bench/dataplane/run.js`, as root; not part of the tests). Since the stream path
 * (commit 8a00d30) the agent carries TCP as streams (TPROXY at the ingress, one stream per
 * connection over the peer tunnel, re-originated at the exit) and UDP/ICMP as packets (TUN), so
 * the iperf3 TCP and ab figures measure the stream path and the UDP figure the packet path.
 * Figures: iperf3 TCP 1 and 4 streams, iperf3 UDP, new connections per second (ab without
 * keep-alive), the ratio of the mesh to each other path, and the tunnel's CPU seconds per GB.
 * Targets printed as PASS/FAIL: the packet path, >= 1.0x wireguard-go (now UDP only); the stream
 * path, TCP 1 stream >= 1.0x stunnel and >= 0.9x nodetls, connections/s >= 1.0x wireguard-go;
 * transparency, a fully transparent service (path mesh-tp) >= 0.9x the same service without
 * transparency (mesh-mv: MACVLAN exit, requires_interface, same address) in TCP and conn/s.
 *
 * - Topology and anchors: the reference measurements (the bench-anchors: scripts measuring direct
 *   forwarding, wireguard-go, kcptun, stunnel and socat relays on this machine, found at
 *   $BENCH_SHARED/bench-anchors, by default beside the repository; docs/benchmarks.md): their
 *   topology.sh builds four namespaces client, ingress, exit, dest (BA_PREFIX, mdb) joined by
 *   veths, with plain forwarding as the `direct` path; paths.sh starts iperf3 and the tiny Node
 *   HTTP server in dest, and brings each anchor path (direct, wg, stunnel, socat) up and down.
 * - nodetls: node-tls-relay.js (this directory), placed as paths.sh places stunnel: a plain TCP
 *   listener in ingress on the relay ports, each connection piped into a TLS 1.3 connection to a
 *   TLS server in exit, piped on to dest (self-signed P-256 certificate made at run time). The
 *   Node ceiling for an encrypted relay, with Node's defaults throughout.
 * - Mesh: an agent (`dist/src/cli/main.js serve --dataplane on`) in the ingress and in the exit
 *   namespace, advertising their underlay addresses (10.91.0.1 / 10.91.0.2), reached from this
 *   process over a small management veth per namespace (10.254.MGMT_INDEX.0/29). Per rep the
 *   mesh is measured last: the bench creates a service ingress -> exit (transport tcp, route
 *   10.91.1.0/24 -> 10.91.2.0/24), measures, deletes it and checks the agent's policy rules are
 *   gone, so the other paths always measure their own path. Each mesh figure is checked to have
 *   crossed the tunnel: the ingress's packet bytes plus stream payload bytes grew by at least half
 *   the bytes the destination's veth saw, or (ab) its streams opened by at least 90 % of the
 *   requests ab completed. Each mesh figure also records both agents' V8 garbage collections by
 *   kind (prom-client's mesh_nodejs_gc_duration_seconds from /metrics): major GCs started by the
 *   external memory of relayed Buffers can take half an agent's CPU.
 * - Figures: iperf3 -t DURATION -O 1 (receiver Gbit/s) with -P 1 and -P 4; iperf3 -u -b UDP_RATE
 *   (0 = as fast as the sender can) -l UDP_LEN (1350: fits wireguard's 1420 MTU), received
 *   Gbit/s and loss % (TCP relays carry no UDP: n/a there); ab -c AB_C -t DURATION without -k.
 * - CPU per GB: utime+stime (/proc/<pid>/stat) of the tunnel's processes (both agents; both
 *   wireguard-go; both stunnel; both node-tls-relay; socat with its reaped per-connection
 *   children) over the measurement, divided by the bytes dest's veth (d0) received and sent.
 *   Kernel forwarding (direct) has no process: n/a.
 * Output: Markdown tables on stdout, JSON in bench/results/dataplane-<timestamp>.json and the raw
 * tool outputs and agent logs in bench/results/dataplane-<timestamp>-raw/ (git-ignored).
 * Settings (environment): REPS (3) DURATION (10) AB_C (32) BA_PREFIX (mdb) PATHS ("direct wg
 * stunnel socat nodetls mesh") UDP_RATE (0) UDP_LEN (1350) MGMT_INDEX (200) BENCH_SHARED (the
 * directory holding bench-anchors/; <repo>/../shared)
 * BENCH_PERF=1: each measurement of the paths in BENCH_PERF_PATHS ("mesh") runs under `perf
 * record -e cpu-clock -g`, one file per tunnel process (perf-r<rep>-<path>-<metric>-<process>.data
 * in the raw dir, with `perf report` by DSO and by symbol beside it; read them with
 * perf-summary.js). Agents and relays then start with --perf-basic-prof-only-functions, so JIT
 * frames have names (node 20 refuses --cpu-prof in NODE_OPTIONS).
 * Mesh variants: `mesh` (NAT exit), `mesh-mv` (a MACVLAN exit: requires_interface, 10.91.2.50/24
 * on the exit's e0) and `mesh-tp` (the same with fully_transparent: TCP leaves from the client's
 * own address; dest's default route already leads back through the exit). Not in the default
 * PATHS: PATHS="mesh-mv mesh-tp" measures the transparency ratio.
 * BENCH_TUN_TXQLEN=N (experiment, not what the agent does): sets both TUNs' txqueuelen to N once
 * the service is up (the kernel's default for a TUN is 500 packets).
 * The kcp transport: path `mesh-kcp` = the `mesh` service with transport_type kcp (checked
 * at the ingress: mesh_tunnel_up{transport="kcp"} 1); anchors beside it `kcp-aes-w` (paths.sh's
 * kcptun, tunnel CPU = its four kcp-* processes) and `mesh`. Figure `lat`: latency-client.js in the
 * client namespace, up to LAT_N (2000) sequential GETs on ONE keep-alive connection within DURATION
 * s, p50/p99/max (value = p50 ms). FIGURES ("tcp1 tcp4 udp cps lat") picks the figures.
 * LOSS=PCT (0): `paths.sh loss-on PCT` after each path is up, `loss-off` before it goes down; the
 * rule's counters are read around every figure (Sample.underlayLoss: the real drop rate).
 * DELAY=MS (0): test/helpers/udp-impair.js --delay-ms MS (each direction, so RTT + 2 MS) on the
 * UDP underlay of kcptun (its clients restarted pointing at one proxy per port in ingress) and of
 * mesh-kcp (the ingress agent's UDP DNATed to a proxy in ingress: see meshDelayUp). The `mesh`
 * (tcp transport) path is NOT delayed: the proxy is UDP only and there is no netem here. Each mesh
 * path's RTT is checked by ping through it (pathChecks in the JSON) and mesh-kcp's by its KCP RTT.
 * A/B against another build: MESH_BASELINE=DIR (a checkout with dist/ and build/Release/ built)
 * adds path `mesh-base`, the `mesh` service between agents of that build, and `mesh-kcp-base`,
 * the `mesh-kcp` one (the agents are restarted whenever the next path needs the other build). MESH_NODE_ARGS="..." gives this
 * build's agents Node options of their own (e.g. --initial-old-space-size=32).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { AgentProcess } from '../../test/helpers/agent-process.js';
import { ecdsaCertificate } from '../../test/helpers/ecdsa-certificate.js';
import { makeVendor } from '../../test/helpers/licenses.js';
import { bootstrapNode, type Node } from '../../test/helpers/nodes.js';
import { REPO_ROOT, sleep } from '../api/measure.js';
import type { LatencyResult } from './latency-client.js';

const env = process.env;
const int = (v: string | undefined, d: number) => (v && /^\d+$/.test(v) ? Number(v) : d);
const S = {
  reps: int(env['REPS'], 3),
  duration: int(env['DURATION'], 10),
  abC: int(env['AB_C'], 32),
  prefix: env['BA_PREFIX'] || 'mdb',
  shared: resolve(env['BENCH_SHARED'] || join(REPO_ROOT, '../shared')),
  paths: (env['PATHS'] || 'direct wg stunnel socat nodetls mesh').split(/\s+/).filter(Boolean),
  udpRate: env['UDP_RATE'] || '0',
  udpLen: int(env['UDP_LEN'], 1350),
  mgmtIndex: int(env['MGMT_INDEX'], 200),
  perf: env['BENCH_PERF'] === '1',
  tunTxqlen: int(env['BENCH_TUN_TXQLEN'], 0),
  /** Percent of the underlay's ingress -> exit packets dropped (paths.sh loss-on) around every path. */
  loss: int(env['LOSS'], 0),
  /** One-way delay (ms, each direction) the UDP impairment proxy adds to kcptun's and mesh-kcp's underlay. */
  delayMs: int(env['DELAY'], 0),
  /** The latency figure: at most LAT_N sequential requests, at most DURATION seconds. */
  latN: int(env['LAT_N'], 2000),
  /** Which figures to take (a subset of tcp1 tcp4 udp cps lat). */
  figures: (env['FIGURES'] || 'tcp1 tcp4 udp cps lat').split(/\s+/).filter(Boolean),
  /** A checkout of another build of the agent (built: dist/, build/Release/), measured as path `mesh-base`. */
  baseline: env['MESH_BASELINE'] ? resolve(env['MESH_BASELINE']) : undefined,
  /** Node options for this build's agents (not mesh-base's), e.g. another --initial-old-space-size. */
  nodeArgs: (env['MESH_NODE_ARGS'] || '').split(/\s+/).filter(Boolean),
};
const ANCHORS = join(S.shared, 'bench-anchors');
const TAG = S.prefix.replace(/[^a-zA-Z0-9]/g, '').slice(0, 8) || 'mdb';
const NS = {
  client: `${S.prefix}-client`,
  ingress: `${S.prefix}-ingress`,
  exit: `${S.prefix}-exit`,
  dest: `${S.prefix}-dest`,
};
const STATE_DIR = `/tmp/bench-anchors-${S.prefix}`;
const IP = { dest: '10.91.2.2', ingressUl: '10.91.0.1', exitUl: '10.91.0.2', ingressIn: '10.91.1.1' };
/** Ports as in the anchors' common.sh: dest's services, the relays' ingress and exit listeners. */
const PORT = {
  iperf: 5201,
  http: 8080,
  relayIperf: 15201,
  relayHttp: 18080,
  exitIperf: 25201,
  exitHttp: 28080,
};
const RELAY_JS = join(REPO_ROOT, 'dist/bench/dataplane/node-tls-relay.js');
const LATENCY_JS = join(REPO_ROOT, 'dist/bench/dataplane/latency-client.js');
const IMPAIR_JS = join(REPO_ROOT, 'dist/test/helpers/udp-impair.js');
const API_PORT = 7480;
const MGMT = {
  ingress: { host: `${TAG}m0`, hostIp: `10.254.${S.mgmtIndex}.1`, agentIp: `10.254.${S.mgmtIndex}.2` },
  exit: { host: `${TAG}m1`, hostIp: `10.254.${S.mgmtIndex}.5`, agentIp: `10.254.${S.mgmtIndex}.6` },
};
const METRICS = ['tcp1', 'tcp4', 'udp', 'cps', 'lat'] as const;
type Metric = (typeof METRICS)[number];
const STAMP = new Date()
  .toISOString()
  .replace(/[-:]/g, '')
  .replace(/\.\d+Z$/, 'Z');
const RESULTS = join(REPO_ROOT, 'bench/results');
const RAW = join(RESULTS, `dataplane-${STAMP}-raw`);

// --- processes -------------------------------------------------------------------------------

interface RunResult {
  code: number | null;
  out: string;
  err: string;
}

/** Runs a command to its end (killed after timeoutMs); never rejects on a non-zero exit. */
function run(cmd: string, args: string[], timeoutMs = 60_000, extraEnv: Record<string, string> = {}) {
  return new Promise<RunResult>((done) => {
    const p = spawn(cmd, args, { env: { ...env, ...extraEnv }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.on('data', (c: Buffer) => {
      out += c.toString();
    });
    p.stderr.on('data', (c: Buffer) => {
      err += c.toString();
    });
    const timer = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('error', (e) => {
      clearTimeout(timer);
      done({ code: -1, out, err: err + String(e) });
    });
    p.on('close', (code) => {
      clearTimeout(timer);
      done({ code, out, err });
    });
  });
}

/** Runs a command and throws with its output when it fails. */
async function must(cmd: string, args: string[], timeoutMs = 60_000): Promise<string> {
  const r = await run(cmd, args, timeoutMs, { BA_PREFIX: S.prefix });
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} failed (${r.code}): ${r.err || r.out}`);
  return r.out;
}
const anchors = (script: string, ...args: string[]) =>
  must('bash', [join(ANCHORS, script), ...args], 120_000);
const inNs = (ns: string, cmd: string, args: string[], timeoutMs?: number) =>
  run('ip', ['netns', 'exec', ns, cmd, ...args], timeoutMs);

function log(msg: string): void {
  process.stderr.write(`[${new Date().toISOString().slice(11, 19)}] ${msg}\n`);
}

// --- /proc and counters ----------------------------------------------------------------------

const CLOCK_TICKS = 100; // checked against getconf CLK_TCK in main()

/** CPU seconds of the processes (all threads); with `children`, also their reaped children. */
function cpuSeconds(pids: number[], children: boolean): number {
  let ticks = 0;
  for (const pid of pids) {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces) start at field 3; utime..cstime = 14..17.
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    ticks += Number(f[11]) + Number(f[12]);
    if (children) ticks += Number(f[13]) + Number(f[14]);
  }
  return ticks / CLOCK_TICKS;
}

interface Proc {
  name: string;
  pid: number;
}

/**
 * The agent's paths: `mesh` (NAT exit), `mesh-mv` (MACVLAN exit), `mesh-tp` (fully transparent),
 * `mesh-kcp` (the same service as `mesh` with transport_type kcp).
 */
const MESH_PATHS = ['mesh', 'mesh-mv', 'mesh-tp', 'mesh-kcp', 'mesh-base', 'mesh-kcp-base'];
const isMeshPath = (path: string): boolean => MESH_PATHS.includes(path);
/** Which build's agents a mesh path runs on: the `-base` paths on MESH_BASELINE's, the others on this one's. */
const buildOf = (path: string): string => (path.endsWith('-base') ? S.baseline! : REPO_ROOT);
/** The mesh paths whose service has transport_type kcp. */
const isKcpPath = (path: string): boolean => path === 'mesh-kcp' || path === 'mesh-kcp-base';

/** A path's tunnel processes: the agents, this bench's relays, or the daemons paths.sh started (its pids file: "tag pid" lines). */
function tunnelProcs(path: string): Proc[] {
  if (isMeshPath(path))
    return [
      { name: 'ingress', pid: ingress!.agent.proc.pid! },
      { name: 'exit', pid: exit!.agent.proc.pid! },
    ];
  if (path === 'nodetls') return nodeTls.map((r) => ({ name: r.name, pid: r.pid }));
  const tag =
    path === 'wg'
      ? /^wg-/
      : path === 'stunnel'
        ? /^stunnel-/
        : path === 'socat'
          ? /^socat-/
          : path.startsWith('kcp-')
            ? /^kcp-/
            : null;
  if (!tag) return [];
  return readFileSync(join(STATE_DIR, 'pids'), 'utf8')
    .split('\n')
    .map((l) => l.trim().split(/\s+/))
    .filter(([name]) => name && tag.test(name))
    .map(([name, pid]) => ({ name: name!, pid: Number(pid) }));
}

/** Bytes dest's veth received + sent: what crossed the path, same measure for every path. */
async function destBytes(): Promise<number> {
  const r = await must('ip', ['-n', NS.dest, '-j', '-s', 'link', 'show', 'd0']);
  const s = (JSON.parse(r) as { stats64: { rx: { bytes: number }; tx: { bytes: number } } }[])[0]!.stats64;
  return s.rx.bytes + s.tx.bytes;
}

// --- nodetls: the bare Node TLS relay ---------------------------------------------------------

/** A helper process of the bench (nodetls relay, udp-impair proxy) in a namespace. */
interface NsProcess {
  name: string;
  proc: ChildProcess;
  pid: number;
  output: string;
  exited: Promise<void>;
}

/**
 * Starts `node args` in namespace `ns` (`ip netns exec` execs: the pid is node's), adds it to
 * `list` at once (so a teardown finds it even if it never gets ready) and waits up to 10 s for
 * `ready` in its output.
 */
async function startInNs(
  what: string,
  name: string,
  ns: string,
  args: string[],
  ready: RegExp,
  list: NsProcess[],
): Promise<NsProcess> {
  const proc = spawn('ip', ['netns', 'exec', ns, process.execPath, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const child: NsProcess = {
    name,
    proc,
    pid: proc.pid!,
    output: '',
    exited: new Promise((r) => proc.once('close', () => r())),
  };
  list.push(child);
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${what} ${name}: not ready in 10 s: ${child.output}`)),
      10_000,
    );
    const onData = (c: Buffer) => {
      child.output += c.toString();
      if (ready.test(child.output)) {
        clearTimeout(timer);
        resolve();
      }
    };
    proc.stdout!.on('data', onData);
    proc.stderr!.on('data', onData);
    proc.once('close', (code) => {
      clearTimeout(timer);
      reject(new Error(`${what} ${name} exited (${code}): ${child.output}`));
    });
  });
  return child;
}

/** The two node-tls-relay processes while the nodetls path is up (named by side). */
let nodeTls: NsProcess[] = [];

/** Starts a relay and waits for its `ready` line. */
function startRelay(side: 'ingress' | 'exit', ns: string, args: string[]): Promise<NsProcess> {
  // Profiled like the agents: JIT frames named for perf.
  const nodeArgs = S.perf ? ['--perf-basic-prof-only-functions'] : [];
  return startInNs('nodetls', side, ns, [...nodeArgs, RELAY_JS, side, ...args], /^ready$/m, nodeTls);
}

async function nodeTlsUp(): Promise<void> {
  const dir = join(STATE_DIR, 'nodetls');
  mkdirSync(dir, { recursive: true });
  const cert = join(dir, 'cert.pem');
  const key = join(dir, 'key.pem');
  // The same kind of certificate paths.sh makes for stunnel: self-signed P-256.
  const made = ecdsaCertificate('bench-nodetls');
  writeFileSync(cert, made.cert);
  writeFileSync(key, made.key, { mode: 0o600 });
  const route = (from: string, fromPort: number, to: string, toPort: number) =>
    `${from}:${fromPort}=${to}:${toPort}`;
  await startRelay('exit', NS.exit, [
    '--cert',
    cert,
    '--key',
    key,
    route(IP.exitUl, PORT.exitIperf, IP.dest, PORT.iperf),
    route(IP.exitUl, PORT.exitHttp, IP.dest, PORT.http),
  ]);
  await startRelay('ingress', NS.ingress, [
    route(IP.ingressIn, PORT.relayIperf, IP.exitUl, PORT.exitIperf),
    route(IP.ingressIn, PORT.relayHttp, IP.exitUl, PORT.exitHttp),
  ]);
}

async function nodeTlsDown(): Promise<void> {
  const relays = nodeTls;
  nodeTls = [];
  for (const r of relays) {
    if (r.proc.exitCode === null && r.proc.signalCode === null) {
      r.proc.kill('SIGTERM');
      const timer = setTimeout(() => r.proc.kill('SIGKILL'), 5000);
      await r.exited;
      clearTimeout(timer);
    }
    mkdirSync(RAW, { recursive: true });
    writeFileSync(join(RAW, `nodetls-${r.name}-${Date.now()}.log`), r.output);
  }
}

const pathUp = (path: string) =>
  path === 'nodetls'
    ? nodeTlsUp()
    : S.delayMs && path.startsWith('kcp-')
      ? kcpDelayedUp(path)
      : anchors('paths.sh', 'up', path);
async function pathDown(path: string): Promise<void> {
  if (path === 'nodetls') return nodeTlsDown();
  await anchors('paths.sh', 'down', path);
  if (path.startsWith('kcp-')) await stopImpairs(/^kcp-/);
}

// --- DELAY: the UDP impairment proxy (test/helpers/udp-impair.ts) on the kcp underlays ----------

/** The impairment proxies running now (in the ingress namespace). */
let impairs: NsProcess[] = [];
/** Each stopped proxy's final counters (its SIGTERM line), for the JSON. */
const impairCounters: { name: string; counters: unknown }[] = [];

/** Starts `udp-impair --listen listen --to to --delay-ms DELAY` in ingress and waits for its `listening` line. */
function startImpair(name: string, listen: string, to: string): Promise<NsProcess> {
  const args = [
    IMPAIR_JS,
    '--listen',
    listen,
    '--to',
    to,
    '--delay-ms',
    String(S.delayMs),
    '--client-idle-ms',
    '0',
  ];
  return startInNs('udp-impair', name, NS.ingress, args, /"listening"/, impairs);
}

/** Stops the proxies whose name matches (SIGTERM: they print their counters and exit). */
async function stopImpairs(which: RegExp): Promise<void> {
  const stopping = impairs.filter((i) => which.test(i.name));
  impairs = impairs.filter((i) => !which.test(i.name));
  for (const im of stopping) {
    im.proc.kill('SIGTERM');
    const timer = setTimeout(() => im.proc.kill('SIGKILL'), 5000);
    await im.exited;
    clearTimeout(timer);
    const last = im.output
      .trim()
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .pop();
    let counters: unknown = null;
    try {
      counters = last ? JSON.parse(last) : null;
    } catch {
      counters = last ?? null;
    }
    impairCounters.push({ name: im.name, counters });
    log(`  udp-impair ${im.name} counters: ${last ?? '(none)'}`);
    mkdirSync(RAW, { recursive: true });
    writeFileSync(join(RAW, `impair-${im.name}-${Date.now()}.log`), im.output);
  }
}

/** kcptun ports (common.sh's KCP_*) and the proxies' ports in ingress in front of them. */
const KCP_UDP = { iperf: 29900, http: 29901 };
const KCP_PROXY = { iperf: 39900, http: 39901 };

/**
 * kcptun with DELAY: paths.sh brings the pair up as usual, then its two clients are replaced by the
 * same clients (paths.sh's options, same pids-file tags, so `paths.sh down` stops them) pointed at
 * one impairment proxy each in ingress (10.91.0.1:3990x -> exit's 10.91.0.2:2990x).
 */
async function kcpDelayedUp(path: string): Promise<void> {
  await anchors('paths.sh', 'up', path);
  for (const k of ['iperf', 'http'] as const)
    await startImpair(`kcp-${k}`, `${IP.ingressUl}:${KCP_PROXY[k]}`, `${IP.exitUl}:${KCP_UDP[k]}`);
  const crypt = path.startsWith('kcp-aes') ? 'aes' : 'none';
  const wide = path.endsWith('-w') ? '--sndwnd 1024 --rcvwnd 1024' : '';
  const script = `set -euo pipefail
. ${JSON.stringify(join(ANCHORS, 'common.sh'))}
stop_tag 'kcp-c-.*'
common="--key bench-$BA_TAG --crypt ${crypt} --mode fast --nocomp --quiet ${wide}"
bg kcp-c-iperf "$NS_INGRESS" kcptun-client -l $IP_INGRESS_IN:$RELAY_IPERF -r $IP_INGRESS_UL:${KCP_PROXY.iperf} $common
bg kcp-c-http "$NS_INGRESS" kcptun-client -l $IP_INGRESS_IN:$RELAY_HTTP -r $IP_INGRESS_UL:${KCP_PROXY.http} $common
wait_tcp "$NS_INGRESS" $IP_INGRESS_IN $RELAY_IPERF; wait_tcp "$NS_INGRESS" $IP_INGRESS_IN $RELAY_HTTP
`;
  await must('bash', ['-c', script], 60_000);
}

const DELAY_TABLE = `${TAG}dly`;
const MESH_PROXY_PORT = 17480;

/**
 * mesh-kcp with DELAY, set up once before the agents start (so no conntrack entry of their UDP
 * predates it) and kept for the whole run. In ingress: the agent's own UDP to the exit agent
 * (udp sport 7480 dport 7480 to 10.91.0.2) is DNATed to a proxy on 10.91.0.1:17480, which forwards
 * it from an ephemeral port to 10.91.0.2:7480. The exit's transport moves the link to the address
 * an authenticated DATA came from (roaming), so it answers the proxy, which delays the answers too
 * and sends them from 10.91.0.1:17480 to the agent; conntrack's reply mapping gives them the
 * source 10.91.0.2:7480 again. The exit's datagrams that come straight (e.g. an INIT when the exit
 * dials, before it has heard the proxy) are NOT tracked (raw notrack on i1): tracked, they would
 * create an entry whose replies leave the ingress un-NATed, around the proxy, for as long as the
 * entry lives.
 */
async function meshDelayUp(): Promise<void> {
  await startImpair('mesh-kcp', `${IP.ingressUl}:${MESH_PROXY_PORT}`, `${IP.exitUl}:${API_PORT}`);
  const rules = `table ip ${DELAY_TABLE} {
  chain out { type nat hook output priority -100; policy accept;
    ip daddr ${IP.exitUl} udp sport ${API_PORT} udp dport ${API_PORT} counter dnat to ${IP.ingressUl}:${MESH_PROXY_PORT}
  }
  chain raw { type filter hook prerouting priority raw; policy accept;
    iifname "i1" ip saddr ${IP.exitUl} udp sport ${API_PORT} udp dport ${API_PORT} counter notrack
  }
}
`;
  const dir = join(STATE_DIR, 'delay');
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'ingress.nft'), rules);
  await must('ip', ['netns', 'exec', NS.ingress, 'nft', '-f', join(dir, 'ingress.nft')]);
}

async function meshDelayDown(): Promise<void> {
  await run('ip', ['netns', 'exec', NS.ingress, 'nft', 'delete', 'table', 'ip', DELAY_TABLE]);
  await stopImpairs(/^mesh-kcp$/);
}

/** The proxies a path's traffic crosses (their CPU is recorded apart from the tunnel's). */
const impairsOf = (path: string): NsProcess[] =>
  isKcpPath(path)
    ? impairs.filter((i) => i.name === 'mesh-kcp')
    : path.startsWith('kcp-')
      ? impairs.filter((i) => i.name.startsWith('kcp-'))
      : [];

// --- LOSS: paths.sh loss-on around every path ----------------------------------------------------

/** The loss rule's counters in exit: packets seen on e1 and dropped (cumulative since loss-on). */
async function lossCounters(): Promise<{ seen: number; dropped: number } | null> {
  if (!S.loss) return null;
  const [seen, dropped] = (await anchors('paths.sh', 'loss-stats')).trim().split(/\s+/).map(Number);
  return { seen: seen ?? 0, dropped: dropped ?? 0 };
}

// --- the tools -------------------------------------------------------------------------------

interface Figure {
  value: number | null;
  lossPct?: number;
  /** UDP: 1 - received bytes / sent bytes, a cross-check of iperf3's own loss count. */
  bytesLossPct?: number;
  retransmits?: number;
  failed?: number;
  error?: string;
  /** lat: the latency client's figures (value = p50 ms). */
  latency?: LatencyResult;
}

interface IperfEnd {
  sum_received?: { bits_per_second: number; bytes: number; lost_percent?: number };
  sum_sent?: { retransmits?: number; bytes: number };
  sum?: { lost_percent?: number };
}

async function iperf(file: string, host: string, port: number, args: string[]): Promise<Figure> {
  const r = await inNs(
    NS.client,
    'iperf3',
    ['-c', host, '-p', String(port), '-t', String(S.duration), '-J', '--connect-timeout', '5000', ...args],
    (S.duration + 30) * 1000,
  );
  writeFileSync(file, r.out + r.err);
  try {
    const j = JSON.parse(r.out) as { end?: IperfEnd; error?: string };
    const recv = j.end?.sum_received;
    if (j.error || !recv) return { value: null, error: j.error ?? 'no receiver sum' };
    const fig: Figure = { value: recv.bits_per_second / 1e9 };
    if (j.end?.sum_sent?.retransmits !== undefined) fig.retransmits = j.end.sum_sent.retransmits;
    const loss = recv.lost_percent ?? j.end?.sum?.lost_percent;
    if (loss !== undefined) fig.lossPct = loss;
    const sent = j.end?.sum_sent?.bytes;
    if (loss !== undefined && sent) fig.bytesLossPct = 100 * (1 - recv.bytes / sent);
    return fig;
  } catch {
    return { value: null, error: `iperf3 exited ${r.code}: ${(r.err || r.out).slice(0, 200)}` };
  }
}

/** Sequential small requests on one keep-alive connection from the client namespace (latency-client.ts). */
async function latency(file: string, host: string, port: number): Promise<Figure> {
  const r = await inNs(
    NS.client,
    process.execPath,
    [LATENCY_JS, host, String(port), String(S.latN), String(S.duration)],
    (S.duration + 60) * 1000,
  );
  writeFileSync(file, r.out + r.err);
  try {
    const l = JSON.parse(r.out.trim().split('\n').pop() ?? '') as NonNullable<Figure['latency']>;
    if (l.n < 10 || l.p50Ms === null)
      return { value: null, latency: l, error: `only ${l.n} answers (${l.errors} errors)` };
    if (l.connections !== 1)
      return {
        value: null,
        latency: l,
        error: `${l.connections} connections: a reconnect is in the figures`,
      };
    return { value: l.p50Ms, latency: l };
  } catch {
    return { value: null, error: `latency-client exited ${r.code}: ${(r.err || r.out).slice(0, 200)}` };
  }
}

async function ab(file: string, host: string, port: number): Promise<Figure> {
  const r = await inNs(
    NS.client,
    'ab',
    [
      '-q',
      '-r',
      // Per-connection timeout. With 5 s, ab aborted the whole figure in 4 of 5 wireguard-go reps
      // (a SYN lost twice under load is retried after 3-7 s); a slow connection now only costs rate.
      '-s',
      '30',
      '-c',
      String(S.abC),
      '-t',
      String(S.duration),
      '-n',
      '10000000',
      `http://${host}:${port}/`,
    ],
    (S.duration + 60) * 1000,
  );
  writeFileSync(file, r.out + r.err);
  const rps = /^Requests per second:\s+([\d.]+)/m.exec(r.out);
  if (!rps) return { value: null, error: `ab exited ${r.code}: ${(r.err || r.out).slice(-200).trim()}` };
  const failed = /^Failed requests:\s+(\d+)/m.exec(r.out);
  return { value: Number(rps[1]), failed: failed ? Number(failed[1]) : 0 };
}

// --- the mesh ----------------------------------------------------------------------------------

let ingress: Node | undefined;
let exit: Node | undefined;
/** The checkout the running agents come from. */
let agentsBuild = REPO_ROOT;
let serviceId: string | undefined;
const agentDirs: string[] = [];

async function mgmtUp(): Promise<void> {
  // The agent insists on both families forwarding before it carries a service (its /readyz and
  // the service's dataplane.problem say so); topology.sh only turns on IPv4.
  for (const ns of [NS.ingress, NS.exit])
    await must('ip', ['netns', 'exec', ns, 'sysctl', '-qw', 'net.ipv6.conf.all.forwarding=1']);
  for (const [ns, m] of [
    [NS.ingress, MGMT.ingress],
    [NS.exit, MGMT.exit],
  ] as const) {
    await must('ip', ['link', 'add', m.host, 'type', 'veth', 'peer', 'name', 'mg0', 'netns', ns]);
    await must('ip', ['addr', 'add', `${m.hostIp}/30`, 'dev', m.host]);
    await must('ip', ['link', 'set', m.host, 'up']);
    await must('ip', ['-n', ns, 'addr', 'add', `${m.agentIp}/30`, 'dev', 'mg0']);
    await must('ip', ['-n', ns, 'link', 'set', 'mg0', 'up']);
  }
}

async function startAgents(build = REPO_ROOT): Promise<void> {
  agentsBuild = build;
  const vendor = makeVendor();
  const license = { max_nodes: 5, max_services: 10 };
  const start = async (ns: string, mgmtIp: string, advertise: string, extra: string[] = []) => {
    const dataDir = mkdtempSync(join(tmpdir(), 'mesh-bench-dp-'));
    agentDirs.push(dataDir);
    const agent = await AgentProcess.start({
      vendor,
      dataDir,
      netns: ns,
      port: API_PORT,
      listen: `0.0.0.0:${API_PORT}`,
      apiHost: mgmtIp,
      extraArgs: ['--advertise', `${advertise}:${API_PORT}`, '--dataplane', 'on', ...extra],
      env: S.perf ? { NODE_OPTIONS: '--perf-basic-prof-only-functions' } : {},
      mainJs: join(build, 'dist/src/cli/main.js'),
      nodeArgs: build === REPO_ROOT ? S.nodeArgs : [],
    });
    return bootstrapNode(agent, vendor, license);
  };
  ingress = await start(NS.ingress, MGMT.ingress.agentIp, IP.ingressUl);
  // The exit has no default route here: mesh-mv and mesh-tp put their MACVLAN on its dest side.
  exit = await start(NS.exit, MGMT.exit.agentIp, IP.exitUl, ['--macvlan-parent', 'e0']);
  const res = await ingress.agent.client.post('/v1/peers', {
    token: ingress.token,
    json: { address: `${IP.exitUl}:${API_PORT}` },
  });
  if (res.status !== 201) throw new Error(`join failed: ${res.status} ${res.text}`);
}

/** Stops both agents, keeping their logs in the raw directory (named after their build). */
async function stopAgents(): Promise<void> {
  const tag = agentsBuild === REPO_ROOT ? 'current' : 'baseline';
  for (const [name, n] of [
    ['ingress', ingress],
    ['exit', exit],
  ] as const) {
    if (!n) continue;
    await n.agent.stop('SIGTERM', 10_000);
    writeFileSync(join(RAW, `agent-${name}-${tag}.log`), n.agent.logs);
  }
  ingress = undefined;
  exit = undefined;
}

interface MeshCounters {
  bytes_sent: number;
  bytes_received: number;
  packets_sent: number;
  packets_received: number;
  dropped: number;
  state: string;
  interface: string | null;
  // The stream path (TCP): payload bytes and connections, beside the packet counters above.
  streams_opened: number;
  stream_bytes_up: number;
  stream_bytes_down: number;
  streams_reset: number;
  streams_refused: number;
}

/** Kernel counters of a TUN: tx = towards the agent (tx_dropped: the agent did not read in time). */
async function tunStats(ns: string, dev: string | null) {
  if (!dev) return { txPackets: 0, txDropped: 0, rxPackets: 0, rxDropped: 0 };
  const r = await must('ip', ['-n', ns, '-j', '-s', 'link', 'show', dev]);
  type Dir = { packets: number; dropped: number };
  const s = (JSON.parse(r) as { stats64: { rx: Dir; tx: Dir } }[])[0]!.stats64;
  return {
    txPackets: s.tx.packets,
    txDropped: s.tx.dropped,
    rxPackets: s.rx.packets,
    rxDropped: s.rx.dropped,
  };
}
type TunStats = Awaited<ReturnType<typeof tunStats>>;
const tunDelta = (a: TunStats, b: TunStats): TunStats => ({
  txPackets: b.txPackets - a.txPackets,
  txDropped: b.txDropped - a.txDropped,
  rxPackets: b.rxPackets - a.rxPackets,
  rxDropped: b.rxDropped - a.rxDropped,
});

type GcStats = Record<string, { count: number; seconds: number }>;

/**
 * V8 garbage collections by kind (major, minor, incremental, weakcb) and their seconds, from
 * prom-client's default metric the agent exports (mesh_nodejs_gc_duration_seconds). Major GCs
 * started by external memory (the Buffers of the relayed bytes) can take half an agent's CPU.
 */
async function gcStats(node: Node): Promise<GcStats> {
  const res = await node.agent.client.get('/metrics', { token: node.token });
  const out: GcStats = {};
  if (res.status !== 200) return out;
  for (const line of res.text.split('\n')) {
    const m = /^mesh_nodejs_gc_duration_seconds_(count|sum)\{kind="(\w+)"\} (\S+)$/.exec(line);
    if (!m) continue;
    const k = out[m[2]!] ?? { count: 0, seconds: 0 };
    out[m[2]!] = k;
    if (m[1] === 'count') k.count = Number(m[3]);
    else k.seconds = Number(m[3]);
  }
  return out;
}

const gcDelta = (a: GcStats, b: GcStats): GcStats =>
  Object.fromEntries(
    Object.entries(b).map(([kind, v]) => [
      kind,
      { count: v.count - (a[kind]?.count ?? 0), seconds: v.seconds - (a[kind]?.seconds ?? 0) },
    ]),
  );

/** The sum of a metric's samples in the agent's /metrics (all labels). */
async function metricSum(node: Node, name: string): Promise<number> {
  const res = await node.agent.client.get('/metrics', { token: node.token });
  let sum = 0;
  for (const line of (res.text as string).split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const v = Number(line.slice(line.lastIndexOf(' ') + 1));
    if (Number.isFinite(v)) sum += v;
  }
  return sum;
}
const kcpRetransmissions = (node: Node) => metricSum(node, 'mesh_kcp_retransmissions_total');

async function meshCounters(node: Node, id: string): Promise<MeshCounters> {
  const res = await node.agent.client.get(`/v1/services/${id}`, { token: node.token });
  if (res.status !== 200) throw new Error(`GET service: ${res.status} ${res.text}`);
  return res.body.dataplane as MeshCounters;
}

/** Polls `check` (true = done) for at most ms; throws `what` with the last reason. */
async function until(what: string, ms: number, check: () => Promise<string | true>): Promise<void> {
  const deadline = Date.now() + ms;
  let last = '';
  while (Date.now() < deadline) {
    const r = await check().catch((e: Error) => e.message);
    if (r === true) return;
    last = r;
    await sleep(200);
  }
  throw new Error(`${what} within ${ms} ms: ${last}`);
}

/** The agent's policy rules in ingress (pref 21000..31999): present while it carries a service. */
async function meshRules(): Promise<number> {
  const rules = JSON.parse(await must('ip', ['-n', NS.ingress, '-j', '-4', 'rule', 'show'])) as {
    priority: number;
  }[];
  return rules.filter((r) => r.priority >= 21000 && r.priority < 32000).length;
}

async function meshUp(path: string): Promise<void> {
  const a = ingress!;
  const b = exit!;
  const exitMode =
    path === 'mesh' || isKcpPath(path) || path === 'mesh-base'
      ? {}
      : {
          requires_interface: true,
          desired_ipv4_cidr: '10.91.2.50/24',
          fully_transparent: path === 'mesh-tp',
        };
  const res = await a.agent.client.post('/v1/services', {
    token: a.token,
    json: { target_peer_id: b.peerId, transport_type: isKcpPath(path) ? 'kcp' : 'tcp', ...exitMode },
  });
  if (res.status !== 201) throw new Error(`create service: ${res.status} ${res.text}`);
  const id = res.body.id as string;
  serviceId = id;
  const r = await a.agent.client.post(`/v1/services/${id}/routes`, {
    token: a.token,
    json: { routes: [{ priority: 100, source_cidr: '10.91.1.0/24', dest_cidr: '10.91.2.0/24' }] },
  });
  if (r.status !== 201) throw new Error(`add route: ${r.status} ${r.text}`);
  await a.agent.client.post('/v1/cluster/sync', { token: a.token });
  await until('service up on both agents', 30_000, async () => {
    for (const n of [a, b]) {
      const c = await meshCounters(n, id);
      if (c.state !== 'up') return `${n === a ? 'ingress' : 'exit'}: ${JSON.stringify(c)}`;
    }
    return true;
  });
  // The ingress's word that the tunnel to the exit is of the path's transport.
  const transport = isKcpPath(path) ? 'kcp' : 'tcp';
  await until(`tunnel over ${transport} up`, 30_000, async () => {
    const m = await a.agent.client.get('/metrics', { token: a.token });
    const line = m.text
      .split('\n')
      .find(
        (l: string) =>
          l.startsWith('mesh_tunnel_up{') &&
          l.includes(`peer_id="${b.peerId}"`) &&
          l.includes(`transport="${transport}"`),
      );
    return line?.endsWith(' 1') ? true : `no mesh_tunnel_up 1 for ${transport}: ${line ?? '(absent)'}`;
  });
  if (path === 'mesh-mv' || path === 'mesh-tp') {
    // The exit's own word that the mode took effect (and, transparent, that the host is ready).
    const want = path === 'mesh-tp' ? 'transparent' : 'macvlan';
    await until(`exit mode ${want}`, 10_000, async () => {
      const r = await b.agent.client.get(`/v1/services/${id}`, { token: b.token });
      const mode = (r.body.dataplane as { exit_mode?: string } | undefined)?.exit_mode;
      const ready = r.body.transparent_ready;
      return mode === want && (path !== 'mesh-tp' || ready === true)
        ? true
        : `exit_mode ${mode}, transparent_ready ${ready} ${JSON.stringify(r.body.transparent_reasons ?? [])}`;
    });
  }
  const ping = await inNs(NS.client, 'ping', ['-c', '1', '-W', '3', IP.dest], 10_000);
  if (ping.code !== 0) throw new Error(`mesh: client cannot reach dest: ${ping.out}${ping.err}`);
  const c = await meshCounters(a, id);
  if (S.tunTxqlen) {
    const x = await meshCounters(b, id);
    for (const [ns, dev] of [
      [NS.ingress, c.interface],
      [NS.exit, x.interface],
    ] as const)
      if (dev) await must('ip', ['-n', ns, 'link', 'set', dev, 'txqueuelen', String(S.tunTxqlen)]);
  }
  if (c.packets_sent < 1) throw new Error(`mesh: the ping did not enter the tunnel: ${JSON.stringify(c)}`);
}

async function meshDown(): Promise<void> {
  if (!serviceId || !ingress) return;
  const id = serviceId;
  const res = await ingress.agent.client.delete(`/v1/services/${id}`, { token: ingress.token });
  if (res.status !== 200) throw new Error(`delete service: ${res.status} ${res.text}`);
  serviceId = undefined;
  await ingress.agent.client.post('/v1/cluster/sync', { token: ingress.token });
  await until('mesh rules gone from ingress', 30_000, async () => {
    const n = await meshRules();
    return n === 0 ? true : `${n} rules left`;
  });
}

// --- profiling ---------------------------------------------------------------------------------

/** Samples one process (all its threads) into `file`: one file per process, so each side reads apart. */
function perfStart(file: string, pid: number) {
  const p = spawn(
    'perf',
    ['record', '-q', '-e', 'cpu-clock', '-F', '499', '-g', '-o', file, '-p', String(pid)],
    {
      stdio: 'ignore',
    },
  );
  return { p, file, done: new Promise<void>((r) => p.on('close', () => r())) };
}

async function perfStop(perf: ReturnType<typeof perfStart>): Promise<void> {
  perf.p.kill('SIGINT');
  const timer = setTimeout(() => perf.p.kill('SIGKILL'), 10_000);
  await perf.done;
  clearTimeout(timer);
}

async function perfReport(perf: ReturnType<typeof perfStart>): Promise<void> {
  for (const sort of ['comm,dso', 'dso,sym']) {
    const r = await run(
      'perf',
      [
        'report',
        '-i',
        perf.file,
        '--stdio',
        '--no-children',
        '-g',
        'none',
        '--percent-limit',
        '0.5',
        '--sort',
        sort,
      ],
      120_000,
    );
    writeFileSync(`${perf.file}.${sort.replace(',', '-')}.txt`, r.out + r.err);
  }
}

// --- one measurement ---------------------------------------------------------------------------

interface Sample extends Figure {
  rep: number;
  path: string;
  metric: Metric;
  /** Bytes dest's veth received + sent during the measurement. */
  destBytes: number;
  /** CPU seconds of the path's tunnel processes (null: kernel forwarding, no process). */
  tunnelCpuS: number | null;
  /** The same per process (mesh and nodetls: ingress, exit; anchors: paths.sh's tags). */
  cpuByProcess?: Record<string, number>;
  cpuSPerGB: number | null;
  cpuMsPerKConn: number | null;
  /** Mesh only: the ingress's tunnel counters over the measurement. */
  mesh?: {
    /** Packet path: IP bytes into and out of the tunnel. */
    bytesSent: number;
    bytesReceived: number;
    dropped: number;
    exitDropped: number;
    /** Stream path: payload bytes ingress -> exit and back, connections opened, reset, refused. */
    streamBytesUp: number;
    streamBytesDown: number;
    streamsOpened: number;
    streamsReset: number;
    streamsRefused: number;
    /** The TUNs' kernel counters over the measurement (tx = packets offered to the agent). */
    ingressTun: TunStats;
    exitTun: TunStats;
    /** Each agent's V8 garbage collections over the measurement, by kind. */
    gc: { ingress: GcStats; exit: GcStats };
  };
  /** Anchors only: CPU seconds the two idle agents used meanwhile (their disturbance). */
  agentIdleCpuS?: number;
  /** LOSS > 0: the loss rule's counters over the figure (packets on exit's e1, dropped, %). */
  underlayLoss?: { seen: number; dropped: number; pct: number };
  /** DELAY > 0: CPU seconds of the impairment proxies the path crosses (not in tunnelCpuS). */
  impairCpuS?: number;
  /** mesh-kcp: KCP segments sent again over the figure (mesh_kcp_retransmissions_total), per agent. */
  kcpRetransmissions?: { ingress: number; exit: number };
  load: [number, number];
  invalid?: string;
}

const samples: Sample[] = [];

function agentPids(): number[] {
  return [ingress, exit].filter((n): n is Node => !!n).map((n) => n.agent.proc.pid!);
}

/** BENCH_PERF_PATHS: whose tunnel processes BENCH_PERF=1 samples (default: the mesh only). */
const PERF_PATHS = (env['BENCH_PERF_PATHS'] || 'mesh').split(/\s+/).filter(Boolean);

async function measure(rep: number, path: string, metric: Metric, fn: () => Promise<Figure>) {
  const isMesh = isMeshPath(path);
  const procs = tunnelProcs(path);
  const pids = procs.map((p) => p.pid);
  const children = path === 'socat';
  const agents = agentPids();
  const cpu0 = cpuSeconds(pids, children);
  const cpuEach0 = procs.map((p) => cpuSeconds([p.pid], children));
  const idle0 = isMesh ? 0 : cpuSeconds(agents, false);
  const bytes0 = await destBytes();
  const m0 = isMesh ? await meshCounters(ingress!, serviceId!) : undefined;
  const x0 = isMesh ? await meshCounters(exit!, serviceId!) : undefined;
  const ti0 = isMesh ? await tunStats(NS.ingress, m0!.interface) : undefined;
  const te0 = isMesh ? await tunStats(NS.exit, x0!.interface) : undefined;
  const gi0 = isMesh ? await gcStats(ingress!) : undefined;
  const ge0 = isMesh ? await gcStats(exit!) : undefined;
  const imp = impairsOf(path);
  const imp0 = imp.length
    ? cpuSeconds(
        imp.map((i) => i.pid),
        false,
      )
    : 0;
  const loss0 = await lossCounters();
  const kcp = isKcpPath(path);
  const kr0 = kcp ? await Promise.all([kcpRetransmissions(ingress!), kcpRetransmissions(exit!)]) : undefined;
  const load0 = loadavg()[0]!;
  const perf =
    S.perf && PERF_PATHS.includes(path)
      ? procs.map((p) => perfStart(join(RAW, `perf-r${rep}-${path}-${metric}-${p.name}.data`), p.pid))
      : [];
  const fig = await fn();
  await Promise.all(perf.map(perfStop));
  const cpu = pids.length ? cpuSeconds(pids, children) - cpu0 : null;
  const cpuByProcess = Object.fromEntries(
    procs.map((p, i) => [p.name, cpuSeconds([p.pid], children) - cpuEach0[i]!]),
  );
  const bytes = (await destBytes()) - bytes0;
  const s: Sample = {
    rep,
    path,
    metric,
    ...fig,
    destBytes: bytes,
    tunnelCpuS: cpu,
    ...(procs.length ? { cpuByProcess } : {}),
    cpuSPerGB: cpu !== null && metric !== 'cps' && metric !== 'lat' && bytes > 0 ? cpu / (bytes / 1e9) : null,
    cpuMsPerKConn:
      cpu !== null && metric === 'cps' && fig.value ? (cpu * 1e6) / (fig.value * S.duration) : null,
    load: [load0, loadavg()[0]!],
  };
  if (!isMesh) s.agentIdleCpuS = cpuSeconds(agents, false) - idle0;
  if (imp.length)
    s.impairCpuS =
      cpuSeconds(
        imp.map((i) => i.pid),
        false,
      ) - imp0;
  const loss1 = await lossCounters();
  if (loss0 && loss1) {
    const seen = loss1.seen - loss0.seen;
    const dropped = loss1.dropped - loss0.dropped;
    s.underlayLoss = { seen, dropped, pct: seen > 0 ? (100 * dropped) / seen : 0 };
  }
  if (kr0) {
    const [i1, e1] = await Promise.all([kcpRetransmissions(ingress!), kcpRetransmissions(exit!)]);
    s.kcpRetransmissions = { ingress: i1 - kr0[0], exit: e1 - kr0[1] };
  }
  if (isMesh) {
    const m1 = await meshCounters(ingress!, serviceId!);
    const x1 = await meshCounters(exit!, serviceId!);
    s.mesh = {
      bytesSent: m1.bytes_sent - m0!.bytes_sent,
      bytesReceived: m1.bytes_received - m0!.bytes_received,
      dropped: m1.dropped - m0!.dropped,
      exitDropped: x1.dropped - x0!.dropped,
      streamBytesUp: m1.stream_bytes_up - m0!.stream_bytes_up,
      streamBytesDown: m1.stream_bytes_down - m0!.stream_bytes_down,
      streamsOpened: m1.streams_opened - m0!.streams_opened,
      streamsReset: m1.streams_reset - m0!.streams_reset,
      streamsRefused: m1.streams_refused - m0!.streams_refused,
      ingressTun: tunDelta(ti0!, await tunStats(NS.ingress, m1.interface)),
      exitTun: tunDelta(te0!, await tunStats(NS.exit, x1.interface)),
      gc: { ingress: gcDelta(gi0!, await gcStats(ingress!)), exit: gcDelta(ge0!, await gcStats(exit!)) },
    };
    // Half of what dest saw (its veth counts Ethernet headers, the tunnel IP bytes or stream
    // payload) is a loose but sure sign that the traffic crossed the tunnel rather than the
    // kernel's direct route. ab's connections carry a few hundred bytes of payload against more
    // in headers: there, the streams opened must cover the requests ab completed.
    const m = s.mesh;
    const carried = m.bytesSent + m.bytesReceived + m.streamBytesUp + m.streamBytesDown;
    if (metric === 'lat') {
      // A few hundred bytes per request against more in headers: the stream must carry >= 100 B each.
      const n = fig.latency?.n ?? 0;
      if (m.streamsOpened < 1 || m.streamBytesUp + m.streamBytesDown < 100 * n)
        s.invalid = `did not cross the mesh: ${m.streamsOpened} streams, ${m.streamBytesUp}+${m.streamBytesDown} B for ${n} requests`;
    } else if (metric === 'cps') {
      const requests = (fig.value ?? 0) * S.duration;
      if (m.streamsOpened < 0.9 * requests && carried < bytes / 2)
        s.invalid = `did not cross the mesh: ${m.streamsOpened} streams for ~${requests.toFixed(0)} requests`;
    } else if (carried < bytes / 2)
      s.invalid = `did not cross the mesh: tunnel ${m.bytesSent}+${m.bytesReceived} B, streams ${m.streamBytesUp}+${m.streamBytesDown} B, dest ${bytes} B`;
  }
  if (fig.value === null) s.invalid = fig.error ?? 'no figure';
  samples.push(s);
  const extra = [
    fig.latency
      ? `n ${fig.latency.n} p50 ${fig.latency.p50Ms?.toFixed(3)} p99 ${fig.latency.p99Ms?.toFixed(3)} max ${fig.latency.maxMs?.toFixed(1)} ms, ${fig.latency.errors} errors, ${fig.latency.connections} conn`
      : '',
    s.underlayLoss ? `underlay drop ${s.underlayLoss.pct.toFixed(2)}% of ${s.underlayLoss.seen}` : '',
    s.impairCpuS !== undefined ? `proxy CPU ${s.impairCpuS.toFixed(1)} s` : '',
    s.kcpRetransmissions
      ? `kcp retr ingress ${s.kcpRetransmissions.ingress} exit ${s.kcpRetransmissions.exit}`
      : '',
    fig.lossPct !== undefined ? `loss ${fig.lossPct.toFixed(2)}%` : '',
    fig.retransmits !== undefined ? `retr ${fig.retransmits}` : '',
    s.cpuSPerGB !== null ? `${s.cpuSPerGB.toFixed(2)} CPU s/GB` : '',
    procs.length > 1
      ? `CPU s ${Object.entries(cpuByProcess)
          .map(([n, c]) => `${n} ${c.toFixed(1)}`)
          .join(' ')}`
      : '',
    s.cpuMsPerKConn !== null ? `${s.cpuMsPerKConn.toFixed(0)} CPU ms/1k conn` : '',
    s.mesh
      ? `streams ${s.mesh.streamsOpened} opened (${s.mesh.streamsReset} reset, ${s.mesh.streamsRefused} refused), ${((s.mesh.streamBytesUp + s.mesh.streamBytesDown) / 1e6).toFixed(0)} MB stream, ${((s.mesh.bytesSent + s.mesh.bytesReceived) / 1e6).toFixed(0)} MB packets`
      : '',
    s.mesh
      ? `GC major ingress ${s.mesh.gc.ingress['major']?.count ?? 0} (${(s.mesh.gc.ingress['major']?.seconds ?? 0).toFixed(2)} s), exit ${s.mesh.gc.exit['major']?.count ?? 0} (${(s.mesh.gc.exit['major']?.seconds ?? 0).toFixed(2)} s)`
      : '',
    s.mesh
      ? `TUN drops ingress ${s.mesh.ingressTun.txDropped}/${s.mesh.ingressTun.txPackets}, exit ${s.mesh.exitTun.txDropped}/${s.mesh.exitTun.txPackets}`
      : '',
    s.invalid ? `INVALID: ${s.invalid}` : '',
  ]
    .filter(Boolean)
    .join(', ');
  log(`  rep ${rep} ${path} ${metric} = ${fig.value === null ? 'NA' : fig.value.toPrecision(4)} ${extra}`);
  // After the figure's counters: perf report takes a while and would otherwise count as idle time.
  for (const p of perf) await perfReport(p);
  await sleep(1000);
}

function target(path: string): { host: string; iperf: number; http: number } {
  return path === 'direct' || path === 'wg' || isMeshPath(path)
    ? { host: IP.dest, iperf: PORT.iperf, http: PORT.http }
    : { host: IP.ingressIn, iperf: PORT.relayIperf, http: PORT.relayHttp };
}

async function ensureServices(): Promise<void> {
  const ok = async (port: number) =>
    (await inNs(NS.dest, 'ss', ['-Hltn', `src ${IP.dest}:${port}`])).out.trim().length > 0;
  if (!(await ok(5201)) || !(await ok(8080))) {
    log('restarting dest services');
    await anchors('paths.sh', 'services-down').catch(() => '');
    await anchors('paths.sh', 'services-up');
  }
}

async function measurePath(rep: number, path: string): Promise<void> {
  const t = target(path);
  const udp = path === 'direct' || path === 'wg' || isMeshPath(path);
  const f = (m: string) => join(RAW, `r${rep}-${path}-${m}.${m === 'cps' ? 'txt' : 'json'}`);
  await sleep(1000);
  const want = (m: Metric) => S.figures.includes(m);
  if (isMeshPath(path)) await pathCheck(rep, path);
  // TCP omits its first second (slow start); UDP does not: iperf3 3.12 miscounts UDP loss with
  // --omit (99.7% "lost" while the receiver reported a quarter of the sent bytes).
  if (want('tcp1'))
    await measure(rep, path, 'tcp1', () => iperf(f('tcp1'), t.host, t.iperf, ['-O', '1', '-P', '1']));
  if (want('tcp4'))
    await measure(rep, path, 'tcp4', () => iperf(f('tcp4'), t.host, t.iperf, ['-O', '1', '-P', '4']));
  if (udp && want('udp'))
    await measure(rep, path, 'udp', () =>
      iperf(f('udp'), t.host, t.iperf, ['-u', '-b', S.udpRate, '-l', String(S.udpLen)]),
    );
  // After the UDP flood some paths need seconds before they carry a new connection again
  // (wireguard-go answered nothing for over 19 s in one rep, and ab aborted or counted 0): ab
  // starts once one request has crossed, so conn/s measures the path, not its recovery.
  const settled = await httpAnswers(t.host, t.http, 30_000);
  if (settled > 1000) log(`  rep ${rep} ${path}: first HTTP answer after the UDP figure took ${settled} ms`);
  if (want('lat')) await measure(rep, path, 'lat', () => latency(f('lat'), t.host, t.http));
  if (want('cps')) await measure(rep, path, 'cps', () => ab(f('cps'), t.host, t.http));
}

/** Per rep and mesh path: ping RTT client -> dest through the path (ICMP crosses the packet path), and mesh-kcp's KCP RTT. */
const pathChecks: { rep: number; path: string; pingRttMs: number | null; kcpRttMs?: number; out: string }[] =
  [];

async function pathCheck(rep: number, path: string): Promise<void> {
  const r = await inNs(NS.client, 'ping', ['-c', '5', '-i', '0.2', '-W', '3', IP.dest], 20_000);
  const m = /= [\d.]+\/([\d.]+)\//.exec(r.out);
  const c: (typeof pathChecks)[number] = { rep, path, pingRttMs: m ? Number(m[1]) : null, out: r.out.trim() };
  if (isKcpPath(path)) c.kcpRttMs = 1000 * (await metricSum(ingress!, 'mesh_kcp_rtt_seconds'));
  pathChecks.push(c);
  log(
    `  rep ${rep} ${path}: ping avg RTT ${c.pingRttMs ?? 'n/a'} ms${c.kcpRttMs !== undefined ? `, KCP RTT ${c.kcpRttMs.toFixed(1)} ms` : ''}`,
  );
}

/** Ms until one HTTP request from client to host:port succeeds (curl, 2 s each), at most limitMs. */
async function httpAnswers(host: string, port: number, limitMs: number): Promise<number> {
  const start = Date.now();
  while (Date.now() - start < limitMs) {
    const r = await inNs(
      NS.client,
      'curl',
      ['-s', '-o', '/dev/null', '-m', '2', `http://${host}:${port}/`],
      5000,
    );
    if (r.code === 0) break;
    await sleep(200);
  }
  return Date.now() - start;
}

// --- summary ---------------------------------------------------------------------------------

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};
const sig = (x: number) =>
  Math.abs(x) >= 100 ? x.toFixed(0) : Math.abs(x) >= 10 ? x.toFixed(1) : x.toPrecision(3);
const cell = (xs: number[]) =>
  xs.length === 0
    ? 'n/a'
    : xs.length === 1
      ? sig(xs[0]!)
      : `${sig(median(xs))} [${sig(Math.min(...xs))}-${sig(Math.max(...xs))}]`;

const valid = (path: string, metric: Metric) =>
  samples.filter((s) => s.path === path && s.metric === metric && !s.invalid && s.value !== null);
const values = (path: string, metric: Metric, key: 'value' | 'cpuSPerGB' | 'cpuMsPerKConn' | 'lossPct') =>
  valid(path, metric)
    .map((s) => s[key])
    .filter((v): v is number => typeof v === 'number');

/** Per-rep ratios of `num` over `den` (same rep, same metric), for a figure where more is better. */
function ratios(num: string, den: string, metric: Metric, key: 'value' | 'cpu'): number[] {
  const out: number[] = [];
  for (let rep = 1; rep <= S.reps; rep++) {
    const a = valid(num, metric).find((s) => s.rep === rep);
    const b = valid(den, metric).find((s) => s.rep === rep);
    if (!a || !b) continue;
    if (key === 'value') out.push(a.value! / b.value!);
    else {
      // CPU efficiency: the anchor's CPU cost over the mesh's (> 1 = the mesh is cheaper).
      const ca = metric === 'cps' ? a.cpuMsPerKConn : a.cpuSPerGB;
      const cb = metric === 'cps' ? b.cpuMsPerKConn : b.cpuSPerGB;
      if (ca && cb) out.push(cb / ca);
    }
  }
  return out;
}

const LABEL: Record<string, string> = {
  direct: 'direct (kernel)',
  wg: 'wg (wireguard-go)',
  stunnel: 'stunnel (TLS relay)',
  socat: 'socat (plain relay)',
  nodetls: 'nodetls (bare Node TLS relay)',
  mesh: '**mesh (agent, tcp service)**',
  'mesh-mv': 'mesh-mv (MACVLAN exit)',
  'mesh-tp': '**mesh-tp (fully transparent)**',
  'mesh-kcp': '**mesh-kcp (agent, kcp service)**',
  'kcp-aes-w': 'kcp-aes-w (kcptun AES, wnd 1024)',
  'kcp-none-w': 'kcp-none-w (kcptun no crypt, wnd 1024)',
};

function summary(): string {
  const lines: string[] = [];
  const paths = S.paths;
  lines.push(
    `Data plane, ${S.reps} rep(s) x ${S.duration} s, ${cpus().length} CPUs, ab -c ${S.abC}, UDP -b ${S.udpRate} -l ${S.udpLen}, LOSS ${S.loss} %, DELAY ${S.delayMs} ms each way (kcptun and mesh-kcp underlays only), figures ${S.figures.join(' ')}. Cells: median [min-max] over reps.`,
    '',
    '| path | TCP 1 stream Gbit/s | TCP 4 streams Gbit/s | UDP received Gbit/s | UDP loss % | new conn/s (ab) |',
    '|---|---|---|---|---|---|',
  );
  for (const p of paths)
    lines.push(
      `| ${LABEL[p] ?? p} | ${cell(values(p, 'tcp1', 'value'))} | ${cell(values(p, 'tcp4', 'value'))} | ${cell(values(p, 'udp', 'value'))} | ${cell(values(p, 'udp', 'lossPct'))} | ${cell(values(p, 'cps', 'value'))} |`,
    );
  lines.push(
    '',
    'Tunnel CPU (utime+stime of the tunnel processes; direct = kernel only, n/a):',
    '',
    '| path | CPU s/GB TCP 1 | CPU s/GB TCP 4 | CPU s/GB UDP | CPU ms per 1k conn |',
    '|---|---|---|---|---|',
  );
  for (const p of paths.filter((x) => x !== 'direct'))
    lines.push(
      `| ${LABEL[p] ?? p} | ${cell(values(p, 'tcp1', 'cpuSPerGB'))} | ${cell(values(p, 'tcp4', 'cpuSPerGB'))} | ${cell(values(p, 'udp', 'cpuSPerGB'))} | ${cell(values(p, 'cps', 'cpuMsPerKConn'))} |`,
    );
  if (paths.includes('mesh')) {
    lines.push(
      '',
      "Mesh ratios to each anchor (per rep, same rep; median [min-max]). CPU columns: the anchor's CPU per GB (per 1k conn) over the mesh's, > 1 = the mesh is cheaper.",
      '',
      // One column per METRICS entry, in its order, for the value and then for the CPU ratio.
      '| mesh x | TCP 1 | TCP 4 | UDP | conn/s | latency | CPU TCP 1 | CPU TCP 4 | CPU UDP | CPU conn | CPU latency |',
      '|---|---|---|---|---|---|---|---|---|---|---|',
    );
    for (const p of paths.filter((x) => x !== 'mesh')) {
      const v = METRICS.map((m) => cell(ratios('mesh', p, m, 'value')));
      const c = METRICS.map((m) => cell(ratios('mesh', p, m, 'cpu')));
      lines.push(`| ${LABEL[p] ?? p} | ${v.join(' | ')} | ${c.join(' | ')} |`);
    }
    const pf = (xs: number[], min: number) => (xs.length ? (median(xs) >= min ? 'PASS' : 'FAIL') : 'n/a');
    const med = (xs: number[]) => (xs.length ? sig(median(xs)) : 'n/a');
    if (paths.includes('wg')) {
      lines.push(
        '',
        'Packet path: mesh >= 1.0x wireguard-go (medians of the per-rep ratios). Since the stream path it applies to UDP only; TCP and conn/s are printed for reference (conn/s is a stream-path target below):',
        '',
      );
      for (const m of METRICS) {
        const r = ratios('mesh', 'wg', m, 'value');
        const c = ratios('mesh', 'wg', m, 'cpu');
        const scope = m === 'udp' ? '' : ' (reference)';
        lines.push(`- ${m}${scope}: ${med(r)}x ${pf(r, 1)}; CPU efficiency ${med(c)}x ${pf(c, 1)}`);
      }
    }
    const targets: [string, Metric, string, number][] = [
      ['stunnel', 'tcp1', 'TCP 1 stream >= 1.0x stunnel', 1],
      ['nodetls', 'tcp1', 'TCP 1 stream >= 0.9x nodetls', 0.9],
      ['wg', 'cps', 'conn/s >= 1.0x wireguard-go', 1],
    ];
    const present = targets.filter(([p]) => paths.includes(p));
    if (present.length) {
      lines.push('', 'Stream path, medians of the per-rep ratios:', '');
      for (const [p, m, what, min] of present) {
        const r = ratios('mesh', p, m, 'value');
        lines.push(`- ${what}: ${med(r)}x ${pf(r, min)}`);
      }
    }
  }
  if (paths.includes('mesh-tp') && paths.includes('mesh-mv')) {
    const pf = (xs: number[]) => (xs.length ? (median(xs) >= 0.9 ? 'PASS' : 'FAIL') : 'n/a');
    lines.push(
      '',
      'Transparency: fully transparent (mesh-tp) >= 0.9x the same MACVLAN service without transparency (mesh-mv), medians of the per-rep ratios:',
      '',
    );
    for (const m of ['tcp1', 'tcp4', 'cps'] as const) {
      const r = ratios('mesh-tp', 'mesh-mv', m, 'value');
      const c = ratios('mesh-tp', 'mesh-mv', m, 'cpu');
      lines.push(
        `- ${m}: ${r.length ? sig(median(r)) : 'n/a'}x ${pf(r)} [${cell(r)}]; CPU efficiency ${c.length ? sig(median(c)) : 'n/a'}x`,
      );
    }
  }
  const meshGc = samples.filter((s) => s.path === 'mesh' && s.mesh);
  if (meshGc.length) {
    const major = (s: Sample, side: 'ingress' | 'exit', k: 'count' | 'seconds') =>
      s.mesh!.gc[side]['major']?.[k] ?? 0;
    lines.push(
      '',
      "Mesh agents' V8 major GCs per measurement (prom-client's count and seconds; median [min-max] over reps):",
      '',
      '| figure | ingress count | ingress s | exit count | exit s |',
      '|---|---|---|---|---|',
    );
    for (const m of METRICS) {
      const xs = meshGc.filter((s) => s.metric === m);
      if (!xs.length) continue;
      const col = (side: 'ingress' | 'exit', k: 'count' | 'seconds') =>
        cell(xs.map((s) => major(s, side, k)));
      lines.push(
        `| ${m} | ${col('ingress', 'count')} | ${col('ingress', 'seconds')} | ${col('exit', 'count')} | ${col('exit', 'seconds')} |`,
      );
    }
  }
  lines.push(...kcpSummary(paths));
  const bad = samples.filter((s) => s.invalid);
  if (bad.length) {
    lines.push('', 'Invalid samples (left out of the tables):', '');
    for (const s of bad) lines.push(`- rep ${s.rep} ${s.path} ${s.metric}: ${s.invalid}`);
  }
  const idle = samples.filter((s) => s.agentIdleCpuS !== undefined);
  const idleS = idle.reduce((a, s) => a + s.agentIdleCpuS!, 0);
  const loads = samples.flatMap((s) => s.load);
  lines.push(
    '',
    `Idle agents during the anchors' measurements: ${idleS.toFixed(2)} CPU s in ${idle.length} measurements. 1-min load average around measurements: ${loads.length ? `${Math.min(...loads).toFixed(2)}-${Math.max(...loads).toFixed(2)}` : 'n/a'}.`,
  );
  return lines.join('\n');
}

/** Per-rep ratios of a latency quantile, num over den (< 1 = num is faster). */
function latRatios(num: string, den: string, key: 'p50Ms' | 'p99Ms' | 'maxMs'): number[] {
  const out: number[] = [];
  for (let rep = 1; rep <= S.reps; rep++) {
    const a = valid(num, 'lat').find((s) => s.rep === rep)?.latency?.[key];
    const b = valid(den, 'lat').find((s) => s.rep === rep)?.latency?.[key];
    if (a && b) out.push(a / b);
  }
  return out;
}

/** The latency table, the underlay's real drop rate, the delay checks and the kcp transport's targets. */
function kcpSummary(paths: string[]): string[] {
  const lines: string[] = [];
  const lat = (p: string, k: 'p50Ms' | 'p99Ms' | 'maxMs' | 'n') =>
    valid(p, 'lat')
      .map((s) => s.latency?.[k])
      .filter((v): v is number => typeof v === 'number');
  const drop = (p: string) =>
    samples.filter((s) => s.path === p && s.underlayLoss).map((s) => s.underlayLoss!.pct);
  if (S.figures.includes('lat') || S.loss) {
    lines.push(
      '',
      `Small request/response latency (sequential GETs on one keep-alive connection, <= ${S.latN} requests or ${S.duration} s) and the underlay's measured drop rate (every figure of the path):`,
      '',
      '| path | p50 ms | p99 ms | max ms | requests | underlay drop % |',
      '|---|---|---|---|---|---|',
    );
    for (const p of paths)
      lines.push(
        `| ${LABEL[p] ?? p} | ${cell(lat(p, 'p50Ms'))} | ${cell(lat(p, 'p99Ms'))} | ${cell(lat(p, 'maxMs'))} | ${cell(lat(p, 'n'))} | ${S.loss ? cell(drop(p)) : 'no loss rule'} |`,
      );
  }
  if (pathChecks.length) {
    lines.push(
      '',
      'Ping through the mesh paths (client -> dest, 5 pings, avg ms; ICMP crosses the packet path) and KCP RTT:',
      '',
    );
    for (const p of paths.filter(isMeshPath)) {
      const pc = pathChecks.filter((c) => c.path === p);
      const ping = pc.map((c) => c.pingRttMs).filter((v): v is number => v !== null);
      const k = pc.map((c) => c.kcpRttMs).filter((v): v is number => v !== undefined);
      lines.push(`- ${p}: ping ${cell(ping)} ms${k.length ? `, KCP smoothed RTT ${cell(k)} ms` : ''}`);
    }
  }
  if (!paths.includes('mesh-kcp')) return lines;
  const others = paths.filter((x) => x !== 'mesh-kcp');
  lines.push(
    '',
    "mesh-kcp ratios to each other path (per rep, same rep; median [min-max]). CPU: the other's CPU per GB over mesh-kcp's, > 1 = mesh-kcp is cheaper. Latency: mesh-kcp's over the other's, < 1 = mesh-kcp is faster.",
    '',
    '| mesh-kcp x | TCP 1 | TCP 4 | CPU TCP 1 | CPU TCP 4 | p50 | p99 |',
    '|---|---|---|---|---|---|---|',
  );
  for (const p of others)
    lines.push(
      `| ${LABEL[p] ?? p} | ${cell(ratios('mesh-kcp', p, 'tcp1', 'value'))} | ${cell(ratios('mesh-kcp', p, 'tcp4', 'value'))} | ${cell(ratios('mesh-kcp', p, 'tcp1', 'cpu'))} | ${cell(ratios('mesh-kcp', p, 'tcp4', 'cpu'))} | ${cell(latRatios('mesh-kcp', p, 'p50Ms'))} | ${cell(latRatios('mesh-kcp', p, 'p99Ms'))} |`,
    );
  const retr = samples.filter((s) => s.path === 'mesh-kcp' && s.kcpRetransmissions && s.metric === 'tcp1');
  if (retr.length)
    lines.push(
      '',
      `mesh-kcp KCP retransmissions during TCP 1 (ingress, the data sender): ${cell(retr.map((s) => s.kcpRetransmissions!.ingress))}`,
    );
  const proxy = samples.filter((s) => s.impairCpuS !== undefined && s.metric === 'tcp1');
  if (proxy.length) {
    lines.push('', 'Impairment proxy CPU s during TCP 1 (not in the tunnel CPU):', '');
    for (const p of paths) {
      const xs = proxy.filter((s) => s.path === p).map((s) => s.impairCpuS!);
      if (xs.length) lines.push(`- ${p}: ${cell(xs)}`);
    }
  }
  if (paths.includes('kcp-aes-w')) {
    const med = (xs: number[]) => (xs.length ? sig(median(xs)) : 'n/a');
    const tput = ratios('mesh-kcp', 'kcp-aes-w', 'tcp1', 'value');
    const tput4 = ratios('mesh-kcp', 'kcp-aes-w', 'tcp4', 'value');
    const p99 = latRatios('mesh-kcp', 'kcp-aes-w', 'p99Ms');
    const pass = (ok: boolean, n: number) => (n ? (ok ? 'PASS' : 'FAIL') : 'n/a');
    lines.push(
      '',
      `kcp transport at LOSS ${S.loss} %, DELAY ${S.delayMs} ms (medians of the per-rep ratios; the throughput target is set at 0 % and 5 % loss, the latency one at 5 %):`,
      '',
      `- throughput mesh-kcp >= 1.2x kcp-aes-w, TCP 1 stream: ${med(tput)}x ${pass(median(tput) >= 1.2, tput.length)} (TCP 4 streams: ${med(tput4)}x ${pass(median(tput4) >= 1.2, tput4.length)})`,
      `- p99 latency mesh-kcp <= kcp-aes-w: ${med(p99)}x ${pass(median(p99) <= 1, p99.length)}${S.loss === 5 ? '' : ' (reference: the target is at 5 % loss)'}`,
    );
  }
  return lines;
}

// --- main ------------------------------------------------------------------------------------

let cleaning: Promise<void> | undefined;
let currentPath: string | undefined;

function cleanup(): Promise<void> {
  cleaning ??= (async () => {
    if (serviceId) await meshDown().catch((e: Error) => log(`mesh down: ${e.message}`));
    for (const n of [ingress, exit]) {
      if (!n) continue;
      await n.agent.stop('SIGTERM', 10_000).catch((e: Error) => log(`agent stop: ${e.message}`));
    }
    mkdirSync(RAW, { recursive: true });
    if (ingress) writeFileSync(join(RAW, 'agent-ingress.log'), ingress.agent.logs);
    if (exit) writeFileSync(join(RAW, 'agent-exit.log'), exit.agent.logs);
    if (currentPath && !isMeshPath(currentPath))
      await pathDown(currentPath).catch((e: Error) => log(e.message));
    if (S.loss) await anchors('paths.sh', 'loss-off').catch(() => '');
    await meshDelayDown().catch((e: Error) => log(e.message));
    await stopImpairs(/./).catch((e: Error) => log(e.message));
    await anchors('paths.sh', 'services-down').catch(() => '');
    await anchors('topology.sh', 'down').catch((e: Error) => log(e.message));
    for (const m of [MGMT.ingress, MGMT.exit]) await run('ip', ['link', 'del', m.host]);
    for (const d of agentDirs) rmSync(d, { recursive: true, force: true });
  })();
  return cleaning;
}

async function environment(): Promise<Record<string, string>> {
  // dpkg-query's own format syntax, not a template.
  // biome-ignore lint/suspicious/noTemplateCurlyInString: see above
  const pkg = async (p: string) => (await run('dpkg-query', ['-W', '-f=${Version}', p])).out || '?';
  const git = async (...a: string[]) => (await run('git', ['-C', REPO_ROOT, ...a])).out.trim();
  return {
    date_utc: new Date().toISOString(),
    nproc: String(cpus().length),
    cpu: cpus()[0]?.model ?? '?',
    kernel: (await run('uname', ['-r'])).out.trim(),
    node: process.version,
    commit: await git('rev-parse', 'HEAD'),
    dirty_src: await git('status', '--porcelain', '--', 'src', 'native'),
    // The agents run dist/, which the working tree may have moved past since it was compiled.
    dist_dataplane_mtime: statSync(join(REPO_ROOT, 'dist/src/dataplane/dataplane.js')).mtime.toISOString(),
    iperf3: await pkg('iperf3'),
    'apache2-utils': await pkg('apache2-utils'),
    'wireguard-go': await pkg('wireguard-go'),
    stunnel4: await pkg('stunnel4'),
    socat: await pkg('socat'),
    kcptun: await pkg('kcptun'),
    load_avg_start: loadavg()
      .map((x) => x.toFixed(2))
      .join(' '),
  };
}

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('needs root (network namespaces, TUN, nftables)');
  const ticks = (await run('getconf', ['CLK_TCK'])).out.trim();
  if (Number(ticks) !== CLOCK_TICKS) throw new Error(`CLK_TCK is ${ticks}, the bench assumes ${CLOCK_TICKS}`);
  for (const b of ['iperf3', 'ab', 'socat', 'stunnel4', 'wireguard-go', 'wg', 'nft', 'ping']) {
    if ((await run('sh', ['-c', `command -v ${b}`])).code !== 0)
      throw new Error(`missing ${b}: run ${join(ANCHORS, 'install-deps.sh')}`);
  }
  for (const base of ['mesh-base', 'mesh-kcp-base'])
    if (S.paths.includes(base) && !S.baseline) throw new Error(`path ${base} needs MESH_BASELINE`);
  for (const p of S.paths)
    if (
      !['direct', 'wg', 'stunnel', 'socat', 'nodetls', 'kcp-aes-w', 'kcp-none-w', ...MESH_PATHS].includes(p)
    )
      throw new Error(`unknown path ${p}`);
  mkdirSync(RAW, { recursive: true });
  const envInfo = await environment();
  const stop = (sig: string) => {
    log(`${sig}: tearing down`);
    void cleanup().finally(() => process.exit(130));
  };
  process.once('SIGINT', () => stop('SIGINT'));
  process.once('SIGTERM', () => stop('SIGTERM'));
  try {
    await anchors('topology.sh', 'down').catch(() => '');
    for (const m of [MGMT.ingress, MGMT.exit]) await run('ip', ['link', 'del', m.host]);
    await anchors('topology.sh', 'up');
    await anchors('paths.sh', 'services-up');
    if (S.delayMs && S.paths.some(isKcpPath)) await meshDelayUp();
    if (S.paths.some(isMeshPath)) {
      await mgmtUp();
      await startAgents();
      log(`agents up: ingress ${ingress!.peerId}, exit ${exit!.peerId}`);
    }
    // The mesh goes last in each rep, so a service never exists while an anchor is measured.
    const meshOrder = S.paths.filter(isMeshPath);
    for (let rep = 1; rep <= S.reps; rep++) {
      // The mesh variants swap places every rep: the second of two paths measured back to back
      // came out slower in either order (mesh-tp 0.75x mesh-mv measured second, 1.2x first).
      const meshes = rep % 2 === 1 ? meshOrder : [...meshOrder].reverse();
      const order = [...S.paths.filter((p) => !isMeshPath(p)), ...meshes];
      for (const path of order) {
        log(`rep ${rep}/${S.reps} path ${path}`);
        await ensureServices();
        currentPath = path;
        try {
          if (isMeshPath(path) && buildOf(path) !== agentsBuild) {
            await stopAgents();
            await startAgents(buildOf(path));
            log(`agents of ${agentsBuild} up: ingress ${ingress!.peerId}, exit ${exit!.peerId}`);
          }
          if (isMeshPath(path)) await meshUp(path);
          else {
            if ((await meshRules()) !== 0) throw new Error('mesh rules present while measuring an anchor');
            await pathUp(path);
          }
          if (S.loss) await anchors('paths.sh', 'loss-on', String(S.loss));
          await measurePath(rep, path);
        } catch (err) {
          log(`  path ${path} failed: ${(err as Error).message}`);
          for (const m of METRICS) {
            if (!samples.some((s) => s.rep === rep && s.path === path && s.metric === m))
              samples.push({
                rep,
                path,
                metric: m,
                value: null,
                destBytes: 0,
                tunnelCpuS: null,
                cpuSPerGB: null,
                cpuMsPerKConn: null,
                load: [0, 0],
                invalid: `path failed: ${(err as Error).message.slice(0, 300)}`,
              });
          }
        } finally {
          if (S.loss) await anchors('paths.sh', 'loss-off').catch((e: Error) => log(e.message));
          if (isMeshPath(path)) await meshDown();
          else await pathDown(path).catch((e: Error) => log(e.message));
          currentPath = undefined;
        }
      }
    }
  } finally {
    await cleanup();
  }
  const text = summary();
  process.stdout.write(`${text}\n`);
  const file = join(RESULTS, `dataplane-${STAMP}.json`);
  writeFileSync(
    file,
    JSON.stringify(
      { settings: S, env: envInfo, samples, pathChecks, impairCounters, summary: text },
      null,
      1,
    ),
  );
  log(`results in ${file} (raw outputs in ${RAW})`);
}

main().catch(async (err: Error) => {
  log(`FAILED: ${err.stack ?? err.message}`);
  await cleanup();
  process.exit(1);
});
