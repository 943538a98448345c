/**
 * bench/soak/probe: the soak bench's eyes inside an agent process. Not part of the agent: the
 * bench starts the agent as `node --expose-gc --import <this module> dist/src/cli/main.js serve
 * ...`, with SOAK_PROBE_SOCKET naming a unix socket path. Without that variable this module does
 * nothing. With it, in the main thread only, it watches the event loop's delay
 * (perf_hooks.monitorEventLoopDelay) and serves one JSON command per connection on the socket,
 * answering one JSON line:
 * - {"cmd":"sample","gc":true}: the loop delay since the previous sample (p50, p99, max, in ms
 *   above the monitor's resolution; the histogram is reset), the V8 heap as it is, then a full
 *   garbage collection (`gc()`, which --expose-gc provides; its duration is `gcMs`; skipped with
 *   "gc":false), then process.memoryUsage(), a few fields of v8.getHeapStatistics() and the
 *   active resources (process.getActiveResourcesInfo(): the count and the count per kind).
 * - {"cmd":"info"}: pid, execArgv and whether gc() is exposed; touches nothing.
 * - {"cmd":"snapshot","path":FILE}: v8.writeHeapSnapshot(FILE); the loop delay it caused is
 *   dropped from the next sample.
 * The agent restarts itself once in place with its V8 flags (src/cli/v8-flags.ts), keeping
 * process.execArgv, so this module is loaded again in the restarted process: a socket file left by
 * the first one is removed before listening. The server is unref'd (it never keeps the agent
 * alive) and counts in no figure it reports.
 */
import { rmSync } from 'node:fs';
import net from 'node:net';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import v8 from 'node:v8';
import { isMainThread } from 'node:worker_threads';

/** Milliseconds between the monitor's timer ticks; the histogram's values include it. */
const RESOLUTION_MS = 10;

export interface ProbeSample {
  pid: number;
  gcExposed: boolean;
  execArgv: string[];
  /** Whether this sample ran a full GC before measuring (heapUsed is then the live heap). */
  gcForced: boolean;
  gcMs: number;
  heapUsedBeforeGc: number;
  heapTotalBeforeGc: number;
  heapUsed: number;
  heapTotal: number;
  external: number;
  arrayBuffers: number;
  rss: number;
  mallocedMemory: number;
  nativeContexts: number;
  detachedContexts: number;
  handles: number;
  handlesByType: Record<string, number>;
  loopDelayP50Ms: number;
  loopDelayP99Ms: number;
  loopDelayMaxMs: number;
}

function start(path: string): void {
  const eld = monitorEventLoopDelay({ resolution: RESOLUTION_MS });
  eld.enable();
  const excessMs = (ns: number) => (Number.isFinite(ns) ? Math.max(0, ns / 1e6 - RESOLUTION_MS) : 0);
  /** Resets the histogram after the timer has recorded the pause we caused ourselves. */
  const resetSoon = () => setTimeout(() => eld.reset(), 3 * RESOLUTION_MS).unref();

  const sample = (forceGc: boolean): ProbeSample => {
    const loop = {
      loopDelayP50Ms: excessMs(eld.percentile(50)),
      loopDelayP99Ms: excessMs(eld.percentile(99)),
      loopDelayMaxMs: excessMs(eld.max),
    };
    eld.reset();
    const before = process.memoryUsage();
    const gc = (globalThis as { gc?: () => void }).gc;
    const t0 = performance.now();
    if (forceGc) gc?.();
    const gcMs = performance.now() - t0;
    if (forceGc) resetSoon();
    const mem = process.memoryUsage();
    const heap = v8.getHeapStatistics();
    const resources = process.getActiveResourcesInfo();
    const handlesByType: Record<string, number> = {};
    for (const r of resources) handlesByType[r] = (handlesByType[r] ?? 0) + 1;
    return {
      pid: process.pid,
      gcExposed: typeof gc === 'function',
      execArgv: process.execArgv,
      gcForced: forceGc && typeof gc === 'function',
      gcMs,
      heapUsedBeforeGc: before.heapUsed,
      heapTotalBeforeGc: before.heapTotal,
      heapUsed: mem.heapUsed,
      heapTotal: mem.heapTotal,
      external: mem.external,
      arrayBuffers: mem.arrayBuffers,
      rss: mem.rss,
      mallocedMemory: heap.malloced_memory,
      nativeContexts: heap.number_of_native_contexts,
      detachedContexts: heap.number_of_detached_contexts,
      handles: resources.length,
      handlesByType,
      ...loop,
    };
  };

  const answer = (line: string): unknown => {
    const cmd = JSON.parse(line) as { cmd?: string; path?: string; gc?: boolean };
    if (cmd.cmd === 'sample') return sample(cmd.gc !== false);
    if (cmd.cmd === 'info')
      return {
        pid: process.pid,
        execArgv: process.execArgv,
        gcExposed: typeof (globalThis as { gc?: unknown }).gc === 'function',
      };
    if (cmd.cmd === 'snapshot' && typeof cmd.path === 'string') {
      const t0 = performance.now();
      const file = v8.writeHeapSnapshot(cmd.path);
      resetSoon();
      return { file, ms: performance.now() - t0 };
    }
    return { error: `unknown command ${line.slice(0, 100)}` };
  };

  rmSync(path, { force: true });
  const server = net.createServer((socket) => {
    let buf = '';
    socket.setEncoding('utf8');
    socket.on('error', () => {});
    socket.on('data', (chunk: string) => {
      buf += chunk;
      const nl = buf.indexOf('\n');
      if (nl < 0) {
        if (buf.length > 4096) socket.destroy();
        return;
      }
      let reply: unknown;
      try {
        reply = answer(buf.slice(0, nl));
      } catch (err) {
        reply = { error: (err as Error).message };
      }
      socket.end(`${JSON.stringify(reply)}\n`);
    });
  });
  server.on('error', (err) => process.stderr.write(`soak probe: ${err.message}\n`));
  server.listen(path);
  server.unref();
}

const path = process.env['SOAK_PROBE_SOCKET'];
if (path && isMainThread) start(path);
