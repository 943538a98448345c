/**
 * bench/soak/load: the soak bench's traffic, run inside the client namespace (`ip netns exec
 * CLIENT node dist/bench/soak/load.js CONFIG_JSON`) against the destination's server
 * (test/helpers/netns-apps.ts `serve`), so that every byte of it crosses the agents' services.
 * Open loop: work starts on its own clock whatever the answers do.
 * - Downloads: `downloadsPerSec` HTTP GETs of /bytes?n=`downloadBytes`, each on a new connection
 *   (one stream through the tunnel each), spread over `downloadTargets` by weight; each is checked
 *   for status 200, its length and its SHA-256 (the test stream of netns-apps.ts). More than
 *   `maxInFlight` unfinished downloads: the new one is not started and counts as a failure.
 * - Short connections: `shortPerSec` GETs of / (a tiny JSON answer), each on a new connection.
 * - UDP: every `udpEveryMs` one datagram from a new socket to the echo server, answered within
 *   2 s with the same text or lost. Targets taken in turn.
 * - Ping: `ping -O -i 1` per ping target, its replies and its "no answer yet" lines counted.
 * Output, one JSON object per line on stdout: {"counters":{...}} every second and in answer to a
 * `report` line on stdin (then with "reply":true); {"event":KIND,"label":...,"detail":...} for the
 * first failures of each kind and every 100th after; {"final":true,"counters":{...}} after a
 * `stop` line on stdin (new work stops, unfinished work gets up to 5 s, then the counts).
 * `pause` stops new work and answers {"paused":true} once the work in flight has ended (the bench
 * pauses the load while an agent writes a heap snapshot, which blocks it for seconds); `resume`
 * starts it again. Stdin closing (the bench gone) stops it.
 * Counter keys are `ok:<kind>@<label>` and `fail:<kind>@<label>` (label: the target's service).
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import dgram from 'node:dgram';
import http from 'node:http';
import { createInterface } from 'node:readline';
import { streamSha256 } from '../../test/helpers/netns-apps.js';

export interface Target {
  host: string;
  /** The service the target's route sends it through (tcp, kcp). */
  label: string;
  weight: number;
}

export interface LoadConfig {
  httpPort: number;
  udpPort: number;
  downloadsPerSec: number;
  downloadBytes: number;
  downloadTargets: Target[];
  shortPerSec: number;
  shortTargets: Target[];
  udpEveryMs: number;
  udpTargets: Target[];
  pingTargets: Target[];
  maxInFlight: number;
  downloadTimeoutMs: number;
}

const counters: Record<string, number> = {};
const failuresSeen: Record<string, number> = {};
const count = (key: string, n = 1) => {
  counters[key] = (counters[key] ?? 0) + n;
};
const emit = (o: unknown) => process.stdout.write(`${JSON.stringify(o)}\n`);

function fail(kind: string, label: string, detail: string): void {
  count(`fail:${kind}@${label}`);
  const seen = (failuresSeen[kind] ?? 0) + 1;
  failuresSeen[kind] = seen;
  if (seen <= 20 || seen % 100 === 0) emit({ event: kind, label, detail, seen, t: Date.now() });
}

/** Picks targets by weight, deterministically (a smooth weighted round robin). */
function picker(targets: Target[]): () => Target {
  const current = targets.map(() => 0);
  const total = targets.reduce((s, t) => s + t.weight, 0);
  return () => {
    let best = 0;
    for (let i = 0; i < targets.length; i++) {
      current[i]! += targets[i]!.weight;
      if (current[i]! > current[best]!) best = i;
    }
    current[best]! -= total;
    return targets[best]!;
  };
}

let inFlight = 0;
const pending = new Set<() => void>();

function download(cfg: LoadConfig, t: Target, expectedSha: string): void {
  if (inFlight >= cfg.maxInFlight) {
    fail('download_backlog', t.label, `${inFlight} downloads unfinished`);
    return;
  }
  inFlight++;
  let done = false;
  const finish = (kind: string | null, detail = '') => {
    if (done) return;
    done = true;
    inFlight--;
    clearTimeout(timer);
    pending.delete(abandon);
    if (kind) fail(kind, t.label, detail);
    else count(`ok:download@${t.label}`);
  };
  const abandon = () => {
    if (done) return;
    done = true;
    inFlight--;
    clearTimeout(timer);
    req.destroy();
    count(`abandoned:download@${t.label}`);
  };
  pending.add(abandon);
  const hash = createHash('sha256');
  let bytes = 0;
  const req = http.get(
    { host: t.host, port: cfg.httpPort, path: `/bytes?n=${cfg.downloadBytes}`, agent: false },
    (res) => {
      if (res.statusCode !== 200) {
        res.resume();
        finish('download_status', `status ${res.statusCode}`);
        return;
      }
      res.on('data', (c: Buffer) => {
        bytes += c.length;
        hash.update(c);
      });
      res.on('end', () => {
        count(`bytes:download@${t.label}`, bytes);
        if (bytes !== cfg.downloadBytes) finish('download_short', `${bytes} of ${cfg.downloadBytes} bytes`);
        else if (hash.digest('hex') !== expectedSha) finish('download_corrupt', 'SHA-256 differs');
        else finish(null);
      });
      res.on('error', (err: NodeJS.ErrnoException) =>
        finish('download_short', `${err.code ?? err.message} after ${bytes} bytes`),
      );
      res.on('aborted', () => finish('download_short', `aborted after ${bytes} bytes`));
    },
  );
  req.on('error', (err: NodeJS.ErrnoException) => finish('download_error', err.code ?? err.message));
  const timer = setTimeout(() => {
    finish('download_timeout', `${bytes} bytes after ${cfg.downloadTimeoutMs} ms`);
    req.destroy();
  }, cfg.downloadTimeoutMs);
}

function shortGet(cfg: LoadConfig, t: Target): void {
  let done = false;
  const finish = (kind: string | null, detail = '') => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    if (kind) fail(kind, t.label, detail);
    else count(`ok:short@${t.label}`);
  };
  const req = http.get({ host: t.host, port: cfg.httpPort, path: '/', agent: false }, (res) => {
    let text = '';
    res.setEncoding('utf8');
    res.on('data', (c: string) => {
      text += c;
    });
    res.on('end', () => {
      if (res.statusCode !== 200) finish('short_status', `status ${res.statusCode}`);
      else if (!text.includes('"remote"')) finish('short_body', text.slice(0, 100));
      else finish(null);
    });
    res.on('error', (err: NodeJS.ErrnoException) => finish('short_error', err.code ?? err.message));
  });
  req.on('error', (err: NodeJS.ErrnoException) => finish('short_error', err.code ?? err.message));
  const timer = setTimeout(() => {
    finish('short_timeout', '10 s');
    req.destroy();
  }, 10_000);
}

let udpSeq = 0;
function udpEcho(cfg: LoadConfig, t: Target): void {
  const text = `soak-udp-${process.pid}-${udpSeq++}`;
  const sock = dgram.createSocket('udp4');
  let done = false;
  const finish = (kind: string | null, detail = '') => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    sock.close();
    if (kind) fail(kind, t.label, detail);
    else count(`ok:udp@${t.label}`);
  };
  sock.on('message', (msg) => {
    if (msg.toString() === text) finish(null);
    else finish('udp_mismatch', msg.toString().slice(0, 60));
  });
  sock.on('error', (err: NodeJS.ErrnoException) => finish('udp_error', err.code ?? err.message));
  const timer = setTimeout(() => finish('udp_lost', text), 2000);
  sock.send(text, cfg.udpPort, t.host);
}

/** ping -O: one line per reply, a "no answer yet" line per request unanswered when the next goes. */
function startPing(t: Target): () => void {
  const p = spawn('stdbuf', ['-oL', 'ping', '-n', '-O', '-i', '1', '-W', '2', t.host], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const unanswered = new Set<number>();
  const lines = createInterface({ input: p.stdout! });
  lines.on('line', (line) => {
    const seq = Number(/icmp_seq=(\d+)/.exec(line)?.[1] ?? Number.NaN);
    if (!Number.isFinite(seq)) return;
    if (/no answer yet/.test(line)) {
      unanswered.add(seq);
      fail('ping_lost', t.label, line);
    } else if (/bytes from/.test(line)) {
      if (unanswered.delete(seq)) {
        // Counted lost when the next request left; it came back late after all.
        count(`fail:ping_lost@${t.label}`, -1);
        count(`late:ping@${t.label}`);
      }
      count(`ok:ping@${t.label}`);
    } else fail('ping_error', t.label, line);
  });
  p.stderr!.on('data', (c: Buffer) => fail('ping_error', t.label, c.toString().trim().slice(0, 200)));
  return () => p.kill('SIGINT');
}

function main(): void {
  const cfg = JSON.parse(process.argv[2] ?? '') as LoadConfig;
  const expectedSha = streamSha256(cfg.downloadBytes);
  let timers: NodeJS.Timeout[] = [];
  let stops: (() => void)[] = [];
  const pickDownload = picker(cfg.downloadTargets);
  const pickShort = picker(cfg.shortTargets);
  const pickUdp = picker(cfg.udpTargets);
  const run = () => {
    if (cfg.downloadsPerSec > 0 && cfg.downloadTargets.length)
      timers.push(setInterval(() => download(cfg, pickDownload(), expectedSha), 1000 / cfg.downloadsPerSec));
    if (cfg.shortPerSec > 0 && cfg.shortTargets.length)
      timers.push(setInterval(() => shortGet(cfg, pickShort()), 1000 / cfg.shortPerSec));
    if (cfg.udpEveryMs > 0 && cfg.udpTargets.length)
      timers.push(setInterval(() => udpEcho(cfg, pickUdp()), cfg.udpEveryMs));
    stops = cfg.pingTargets.map(startPing);
  };
  /** Starts no new work; calls done once the work in flight has ended (at most waitMs). */
  const quiesce = (waitMs: number, done: () => void) => {
    for (const t of timers) clearInterval(t);
    for (const s of stops) s();
    timers = [];
    stops = [];
    const deadline = Date.now() + waitMs;
    const wait = () => {
      if (inFlight > 0 && Date.now() < deadline) {
        setTimeout(wait, 50);
        return;
      }
      done();
    };
    // UDP echoes and ping replies in flight get their 2 s.
    setTimeout(wait, 2100);
  };
  run();
  setInterval(() => emit({ counters, inFlight, t: Date.now() }), 1000);

  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    quiesce(5000, () => {
      for (const abandon of [...pending]) abandon();
      emit({ final: true, counters, t: Date.now() });
      process.exit(0);
    });
  };
  let paused = false;
  createInterface({ input: process.stdin })
    .on('line', (line) => {
      if (line === 'report') emit({ reply: true, counters, inFlight, t: Date.now() });
      else if (line === 'stop') stop();
      else if (line === 'pause' && !paused && !stopping) {
        paused = true;
        quiesce(30_000, () => emit({ paused: true, inFlight, t: Date.now() }));
      } else if (line === 'resume' && paused && !stopping) {
        paused = false;
        run();
      }
    })
    .on('close', stop);
  process.on('SIGTERM', stop);
  emit({ started: true, expectedSha, t: Date.now() });
}

main();
