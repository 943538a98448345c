/**
 * bench/cluster host process: runs some of the cluster's agents in-process (`startAgent`) for
 * bench/cluster/run.ts, which forks several of these so that the agents of one cluster use more
 * than one core and share an event loop with fewer others. It takes requests over the IPC
 * channel (HostRequest), answers each with a HostReply of the same id, and reports the moment
 * each of its agents first holds a watched change (a `seen` event) on its own.
 *
 * Times are milliseconds of the system's monotonic clock (process.hrtime), which every process
 * on the machine reads alike, so the coordinator can compare them with its own.
 */
import { createHash, createPublicKey } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { type RunningAgent, startAgent } from '../../src/agent.js';
import type { License } from '../../src/domain/license.js';
import { freePort } from '../api/measure.js';

/** Milliseconds of CLOCK_MONOTONIC: the same clock in every process of the machine. */
export const monoMs = (): number => Number(process.hrtime.bigint()) / 1e6;

export interface PhaseLoad {
  /** CPU time of the process (all threads) over the phase, 100 = one core. */
  cpuPct: number;
  /** Event-loop lag beyond the histogram's 10 ms period, ms. */
  lagP50Ms: number;
  lagP99Ms: number;
  lagMaxMs: number;
  loadAvg: [number, number];
}

export interface GossipCounters {
  bytesSent: number;
  /** mesh_gossip_http_bytes_total, both directions: every exchange's HTTP bytes, counted once. */
  httpBytes: number;
  /** The same, of probe exchanges only (ping and its answer). */
  pingHttpBytes: number;
  messagesSent: number;
  antiEntropy: number;
  /** Gauges: remote peers the agents hold suspect or dead right now. */
  suspect: number;
  dead: number;
  /** Messages sent by type (requests and replies). */
  byType: Record<string, number>;
}

export interface HostedAgent {
  index: number;
  peerId: string;
  /** host:port of its API and gossip endpoint. */
  address: string;
}

/** What the coordinator asks of a host; HostRequest adds the id its reply carries. */
export type HostOp =
  | {
      op: 'start';
      indices: number[];
      workDir: string;
      license: License;
      publicKeyPem: string;
      intervalMs: number;
    }
  | { op: 'call'; index: number; method: 'GET' | 'POST' | 'PUT' | 'DELETE'; url: string; payload?: unknown }
  | { op: 'state' }
  | { op: 'watch'; watchId: number; peerId: string; name: string }
  | { op: 'unwatch' }
  | { op: 'meter-start' }
  | { op: 'meter-stop' }
  | { op: 'counters' }
  | { op: 'stop' };

export type HostRequest = { id: number } & HostOp;

export type HostReply =
  | { id: number; ok: true; result: unknown }
  | { id: number; ok: false; error: string }
  | { op: 'seen'; watchId: number; index: number; at: number };

/** The answer to a `call`: the API's status and body, and when the request was handed to it. */
export interface CallResult {
  status: number;
  body: unknown;
  t0: number;
}

export interface StateEntry {
  index: number;
  activePeers: number;
  /** SHA-1 over every peer, service and route id with its vkey: equal digests, equal states. */
  fingerprint: string;
}

// --- the hosted agents -----------------------------------------------------------------------

interface Member {
  index: number;
  agent: RunningAgent;
  token: string;
}

const members = new Map<number, Member>();
let logStream: NodeJS.WritableStream | undefined;
let watch: { watchId: number; peerId: string; name: string; seen: Set<number> } | undefined;
let pollTimer: NodeJS.Timeout | undefined;

function send(msg: HostReply): void {
  process.send?.(msg);
}

function look(m: Member): void {
  const w = watch;
  if (!w || w.seen.has(m.index) || m.agent.store.peer(w.peerId)?.name !== w.name) return;
  w.seen.add(m.index);
  send({ op: 'seen', watchId: w.watchId, index: m.index, at: monoMs() });
}

async function inject(
  agent: RunningAgent,
  method: 'GET' | 'POST' | 'PUT' | 'DELETE',
  url: string,
  payload?: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: unknown }> {
  const res = await agent.app.inject({
    method,
    url,
    headers,
    ...(payload === undefined ? {} : { payload: payload as string | object }),
  });
  const json = String(res.headers['content-type'] ?? '').includes('json') && res.body !== '';
  return { status: res.statusCode, body: json ? res.json() : res.body };
}

async function ok(agent: RunningAgent, method: 'GET' | 'POST' | 'PUT', url: string, payload?: unknown) {
  const res = await inject(agent, method, url, payload);
  if (res.status >= 300) throw new Error(`${method} ${url}: ${res.status} ${JSON.stringify(res.body)}`);
  return res.body;
}

async function startOne(
  index: number,
  workDir: string,
  license: License,
  publicKeyPem: string,
  intervalMs: number,
): Promise<HostedAgent> {
  // The port must be known before start (it is the advertised address): bind port 0 first.
  const port = await freePort();
  const agent = await startAgent({
    listenHost: '127.0.0.1',
    listenPort: port,
    advertise: `127.0.0.1:${port}`,
    dataDir: join(workDir, `agent-${index}`),
    licenseKeys: [createPublicKey(publicKeyPem)],
    publicUrl: `http://127.0.0.1:${port}`,
    logLevel: 'warn',
    logDestination: logStream,
    metricsPublic: true,
    gossipIntervalMs: intervalMs,
  });
  const boot = (await ok(agent, 'POST', '/v1/bootstrap', { license, name: `agent-${index}` })) as {
    peer_id: string;
    client_id: string;
    client_secret: string;
  };
  const form = new URLSearchParams({
    grant_type: 'client_credentials',
    client_id: boot.client_id,
    client_secret: boot.client_secret,
  }).toString();
  const res = await inject(agent, 'POST', '/v1/oauth/token', form, {
    'content-type': 'application/x-www-form-urlencoded',
  });
  if (res.status !== 200) throw new Error(`token: ${res.status} ${JSON.stringify(res.body)}`);
  const member: Member = { index, agent, token: (res.body as { access_token: string }).access_token };
  agent.store.onWrite(() => look(member));
  members.set(index, member);
  return { index, peerId: boot.peer_id, address: `127.0.0.1:${port}` };
}

function fingerprint(m: Member): string {
  const s = m.agent.store;
  const hash = createHash('sha1');
  for (const p of s.peers()) hash.update(`${p.id}@${p.vkey},`);
  for (const svc of s.services()) {
    hash.update(`${svc.id}@${svc.vkey},`);
    for (const r of s.routesOf(svc.id)) hash.update(`${r.id}@${r.vkey},`);
  }
  return hash.digest('hex');
}

function parseCounters(text: string): GossipCounters {
  const sum = (re: RegExp) => {
    let total = 0;
    for (const m of text.matchAll(re)) total += Number(m[1]);
    return total;
  };
  return {
    bytesSent: sum(/^mesh_gossip_bytes_total\{direction="sent"\} (\S+)$/gm),
    httpBytes: sum(/^mesh_gossip_http_bytes_total\{[^}]*\} (\S+)$/gm),
    pingHttpBytes: sum(/^mesh_gossip_http_bytes_total\{type="ping",[^}]*\} (\S+)$/gm),
    messagesSent: sum(/^mesh_gossip_messages_total\{[^}]*direction="sent"[^}]*\} (\S+)$/gm),
    antiEntropy: sum(/^mesh_gossip_anti_entropy_total (\S+)$/gm),
    suspect: sum(/^mesh_gossip_peers\{state="suspect"\} (\S+)$/gm),
    dead: sum(/^mesh_gossip_peers\{state="dead"\} (\S+)$/gm),
    byType: Object.fromEntries(
      [...text.matchAll(/^mesh_gossip_messages_total\{type="([^"]+)",direction="sent"\} (\S+)$/gm)].map(
        (m) => [m[1]!, Number(m[2])],
      ),
    ),
  };
}

export function addCounters(all: readonly GossipCounters[]): GossipCounters {
  const total: GossipCounters = {
    bytesSent: 0,
    httpBytes: 0,
    pingHttpBytes: 0,
    messagesSent: 0,
    antiEntropy: 0,
    suspect: 0,
    dead: 0,
    byType: {},
  };
  for (const c of all) {
    total.bytesSent += c.bytesSent;
    total.httpBytes += c.httpBytes;
    total.pingHttpBytes += c.pingHttpBytes;
    total.messagesSent += c.messagesSent;
    total.antiEntropy += c.antiEntropy;
    total.suspect += c.suspect;
    total.dead += c.dead;
    for (const [type, n] of Object.entries(c.byType)) total.byType[type] = (total.byType[type] ?? 0) + n;
  }
  return total;
}

// --- the phase meter -------------------------------------------------------------------------

const LAG_RESOLUTION_MS = 10;
/** The histogram's values include its own timer period: lag is what exceeds it. */
const lagMs = (ns: number) => Math.max(0, ns / 1e6 - LAG_RESOLUTION_MS);

export function phaseMeter(): () => PhaseLoad {
  const lag = monitorEventLoopDelay({ resolution: LAG_RESOLUTION_MS });
  lag.enable();
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const load0 = loadavg()[0]!;
  return () => {
    lag.disable();
    const cpu = process.cpuUsage(cpu0);
    const wallUs = (performance.now() - t0) * 1000;
    return {
      cpuPct: (100 * (cpu.user + cpu.system)) / wallUs,
      lagP50Ms: lagMs(lag.percentile(50)),
      lagP99Ms: lagMs(lag.percentile(99)),
      lagMaxMs: lagMs(lag.max),
      loadAvg: [load0, loadavg()[0]!],
    };
  };
}
let meter: (() => PhaseLoad) | undefined;

// --- requests --------------------------------------------------------------------------------

function member(index: number): Member {
  const m = members.get(index);
  if (!m) throw new Error(`agent ${index} is not on this host`);
  return m;
}

async function serve(req: HostRequest): Promise<unknown> {
  switch (req.op) {
    case 'start': {
      logStream = createWriteStream(join(req.workDir, `host-${process.pid}.log`));
      const hosted: HostedAgent[] = [];
      for (const index of req.indices) {
        hosted.push(await startOne(index, req.workDir, req.license, req.publicKeyPem, req.intervalMs));
      }
      return hosted;
    }
    case 'call': {
      const m = member(req.index);
      const t0 = monoMs();
      const res = await inject(m.agent, req.method, req.url, req.payload, {
        authorization: `Bearer ${m.token}`,
      });
      return { ...res, t0 } satisfies CallResult;
    }
    case 'state':
      return [...members.values()].map(
        (m): StateEntry => ({
          index: m.index,
          activePeers: m.agent.store.activePeerIds().length,
          fingerprint: fingerprint(m),
        }),
      );
    case 'watch': {
      watch = { watchId: req.watchId, peerId: req.peerId, name: req.name, seen: new Set() };
      // The write listener sees merges as they land; the poll is a safety net.
      clearInterval(pollTimer);
      pollTimer = setInterval(() => {
        for (const m of members.values()) look(m);
      }, 5);
      return true;
    }
    case 'unwatch':
      watch = undefined;
      clearInterval(pollTimer);
      return true;
    case 'meter-start':
      meter = phaseMeter();
      return true;
    case 'meter-stop': {
      const load = meter?.();
      meter = undefined;
      return load;
    }
    case 'counters':
      return addCounters(
        await Promise.all(
          [...members.values()].map(async (m) =>
            parseCounters(String((await ok(m.agent, 'GET', '/metrics')) ?? '')),
          ),
        ),
      );
    case 'stop':
      clearInterval(pollTimer);
      await Promise.all([...members.values()].map((m) => m.agent.stop().catch(() => undefined)));
      members.clear();
      if (logStream) await new Promise<void>((done) => logStream!.end(done));
      return true;
  }
}

// Serves only when run as the forked host, not when run.ts imports the types and helpers above.
if (process.send && process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.on('message', (raw) => {
    const req = raw as HostRequest;
    serve(req).then(
      (result) => {
        send({ id: req.id, ok: true, result });
        if (req.op === 'stop') process.disconnect();
      },
      (err: unknown) => send({ id: req.id, ok: false, error: (err as Error).stack ?? String(err) }),
    );
  });
  // The coordinator went away: nothing left to serve.
  process.on('disconnect', () => {
    void Promise.all([...members.values()].map((m) => m.agent.stop().catch(() => undefined))).then(() =>
      process.exit(0),
    );
  });
}
