/**
 * Measurement helpers shared by the API benches (run.ts, ladder.ts): drive a server with the
 * autocannon CLI (a discarded warm-up, then a measured run), read the server's CPU time and
 * RSS from /proc, the machine's load average, and small statistics for the tables.
 */
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import type { License } from '../../src/domain/license.js';
import { loadLicenseSigningKey, signLicense } from '../../src/license/sign.js';

export const REPO_ROOT = fileURLToPath(new URL('../../../', import.meta.url));
export const AUTOCANNON = join(REPO_ROOT, 'node_modules/.bin/autocannon');

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The one request autocannon repeats. */
export interface LoadRequest {
  method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  path: string;
  headers?: Record<string, string>;
  body?: string;
}

export interface LoadSettings {
  conns: number;
  warmupSeconds: number;
  durationSeconds: number;
}

export interface Measurement {
  reqPerSec: number;
  p50: number;
  p99: number;
  /** The server's CPU time (all threads) per answered request, in µs. */
  cpuUsPerReq?: number;
  /** The server's CPU use over the measured run, 100 = one core. */
  cpuPct?: number;
  /** 1-minute load average before and after the measured run. */
  load?: [number, number];
  /** Why the run does not count (errors, non-2xx answers, no output), if it does not. */
  invalid?: string;
}

interface AutocannonResult {
  requests: { average: number; total: number };
  latency: { p50: number; p99: number; max: number };
  errors: number;
  timeouts: number;
  non2xx: number;
  '2xx': number;
}

export async function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const srv = createServer();
    srv.once('error', fail);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      srv.close(() => done(port));
    });
  });
}

/** Polls `url` until it answers 2xx; false when `gone()` turns true or time runs out. */
export async function waitHttp(url: string, timeoutMs: number, gone: () => boolean = () => false) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline && !gone()) {
    try {
      if ((await fetch(url, { signal: AbortSignal.timeout(1000) })).ok) return true;
    } catch {
      // not listening yet
    }
    await sleep(50);
  }
  return false;
}

// --- /proc ---------------------------------------------------------------------------------

export function procStatusKb(pid: number, field: 'VmRSS' | 'VmHWM'): number | undefined {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

const CLOCK_TICKS = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout?.trim()) || 100;

/** User + system CPU time of a process (all its threads), in ms. */
export function cpuMs(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces) start at field 3; utime, stime = 14, 15.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS;
  } catch {
    return Number.NaN;
  }
}

/** The 1-minute load average: how busy the (shared) machine was around a measurement. */
export const loadAvg = (): number => Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[0]);

/** Samples VmRSS every 50 ms; `mark()` starts a new window and returns the last one's peak. */
export function rssSampler(pid: number) {
  let windowPeak = 0;
  const sample = () => {
    const kb = procStatusKb(pid, 'VmRSS');
    if (kb !== undefined && kb > windowPeak) windowPeak = kb;
  };
  const timer = setInterval(sample, 50);
  return {
    mark(): number {
      sample();
      const peak = windowPeak;
      windowPeak = 0;
      return peak;
    },
    stop: () => clearInterval(timer),
  };
}

// --- autocannon ----------------------------------------------------------------------------

function autocannonArgs(
  baseUrl: string,
  req: LoadRequest,
  conns: number,
  seconds: number,
  json: boolean,
): string[] {
  const args = ['-c', String(conns), '-d', String(seconds), '-m', req.method, json ? '-j' : '-n'];
  for (const [k, v] of Object.entries(req.headers ?? {})) args.push('-H', `${k}=${v}`);
  if (req.body !== undefined) args.push('-b', req.body);
  args.push(`${baseUrl}${req.path}`);
  return args;
}

function runAutocannon(args: string[], timeoutSeconds: number): Promise<string> {
  return new Promise((done, fail) => {
    const proc = spawn(AUTOCANNON, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    proc.stdout.on('data', (c: Buffer) => {
      out += c.toString();
    });
    proc.stderr.on('data', (c: Buffer) => {
      err += c.toString();
    });
    const timer = setTimeout(() => proc.kill('SIGKILL'), timeoutSeconds * 1000);
    proc.once('error', fail);
    proc.once('exit', (code) => {
      clearTimeout(timer);
      if (code === 0) done(out);
      else fail(new Error(`autocannon exited with ${code}: ${err.slice(-2000)}`));
    });
  });
}

function toMeasurement(r: AutocannonResult | undefined): Measurement {
  if (!r?.requests) return { reqPerSec: Number.NaN, p50: Number.NaN, p99: Number.NaN, invalid: 'no result' };
  const m: Measurement = { reqPerSec: r.requests.average, p50: r.latency.p50, p99: r.latency.p99 };
  const bad = [
    r.errors ? `${r.errors} errors` : '',
    r.timeouts ? `${r.timeouts} timeouts` : '',
    r.non2xx ? `${r.non2xx} non-2xx` : '',
    r['2xx'] ? '' : 'no 2xx answer',
  ].filter(Boolean);
  if (bad.length > 0) m.invalid = bad.join(', ');
  return m;
}

/**
 * One measurement of a server whose pid we know: a discarded warm-up, then the measured run
 * (raw JSON saved to `jsonFile`) with the server's CPU time and the load average around it.
 */
export async function measure(
  baseUrl: string,
  req: LoadRequest,
  pid: number,
  jsonFile: string,
  load: LoadSettings,
): Promise<Measurement> {
  const { conns, warmupSeconds, durationSeconds } = load;
  await runAutocannon(autocannonArgs(baseUrl, req, conns, warmupSeconds, false), warmupSeconds + 30);
  const load0 = loadAvg();
  const cpu0 = cpuMs(pid);
  const t0 = performance.now();
  const out = await runAutocannon(
    autocannonArgs(baseUrl, req, conns, durationSeconds, true),
    durationSeconds + 30,
  );
  const cpuUsed = cpuMs(pid) - cpu0;
  const elapsed = performance.now() - t0;
  writeFileSync(jsonFile, out);
  let parsed: AutocannonResult | undefined;
  try {
    parsed = JSON.parse(out) as AutocannonResult;
  } catch {
    parsed = undefined;
  }
  const m = toMeasurement(parsed);
  m.cpuUsPerReq = parsed?.requests?.total ? (cpuUsed * 1000) / parsed.requests.total : Number.NaN;
  m.cpuPct = (100 * cpuUsed) / elapsed;
  m.load = [load0, loadAvg()];
  return m;
}

// --- statistics and formatting -------------------------------------------------------------

export const median = (xs: number[]): number => {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  if (s.length === 0) return Number.NaN;
  const mid = Math.floor(s.length / 2);
  return s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
};
export const fmt = (x: number, digits = 0) => (Number.isFinite(x) ? x.toFixed(digits) : 'NA');
/** "median [min-max]" over the finite values, or just the value when there is one. */
export const range = (xs: number[], digits: number) => {
  const f = xs.filter(Number.isFinite);
  if (f.length < 2) return fmt(median(xs), digits);
  return `${fmt(median(f), digits)} [${fmt(Math.min(...f), digits)}-${fmt(Math.max(...f), digits)}]`;
};
export const mb = (kb: number) => kb / 1024;

export const describe = (m: Measurement) =>
  `${fmt(m.reqPerSec)} req/s, p50 ${m.p50} ms, p99 ${m.p99} ms, server CPU ${fmt(m.cpuPct ?? Number.NaN)}% = ${fmt(m.cpuUsPerReq ?? Number.NaN)} µs/req, load ${m.load?.join(' -> ')}${m.invalid ? ` INVALID: ${m.invalid}` : ''}`;

/** The license every benchmark bootstraps with: a day long, the same license_id every time. */
export function benchLicense(vendorKeyPem: string): License {
  const now = Date.now();
  return signLicense(
    {
      customer_id: 'customer-bench',
      license_id: 'license-bench',
      issued_at: new Date(now - 60_000).toISOString(),
      expires_at: new Date(now + 86_400_000).toISOString(),
      max_nodes: 16,
      max_services: 1000,
    },
    loadLicenseSigningKey(vendorKeyPem),
  );
}
