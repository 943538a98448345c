/**
 * The V8 flags `mesh-agent serve` runs with, and the restart in place that applies them.
 *
 * Why: the data plane relays tens of thousands of 16-64 KiB buffers a second. Each is a fresh
 * ArrayBuffer whose memory V8 counts as external; with the agent's 20-25 MB old generation (API,
 * store, cluster state) and V8's default heap sizing, that allocation rate set off back-to-back
 * incremental markings and mark-compacts ("major GC storms": 47-183 per 11 s benchmark figure,
 * about half of each agent's CPU, docs/benchmarks.md). Old-generation headroom stops them: with
 * --initial-old-space-size=128 the same figures ran with 0-2 major GCs and 2-2.5x the
 * throughput. Since the relay makes less garbage, 32 MB does as well (A/B in one bench run, 4
 * reps: TCP 1 stream 0.99x, 4 streams 1.03x the 128 MB build, no major GC), and keeps an agent
 * under steady load near 105 MB RSS instead of climbing toward 200 (docs/benchmarks.md, "Memory
 * under load"). The cost is memory: the old generation grows to about 32 MB before V8 first
 * collects it. The risk: with the cores taken by other work, more buffers are in flight at each
 * scavenge and storms came back at an exit in one run; an operator who would rather spend memory
 * gives a bigger value on the node command line.
 *
 * NODE_OPTIONS refuses this flag, and V8 reads it only when the heap is created, so the agent
 * restarts itself once, in place (execv: same pid), with the flag added, unless it is already on
 * the command line (an operator's own value wins) or MESH_V8_FLAGS=off.
 */
import { execInPlace } from '../native/exec.js';

export const AGENT_V8_FLAGS: readonly string[] = ['--initial-old-space-size=32'];

/** The flags of AGENT_V8_FLAGS that `execArgv` lacks (matched by name, whatever the value). */
export function missingV8Flags(execArgv: readonly string[]): string[] {
  const name = (flag: string) => flag.split('=')[0]!.replaceAll('_', '-');
  const given = new Set(execArgv.map(name));
  return AGENT_V8_FLAGS.filter((f) => !given.has(name(f)));
}

/**
 * Restarts this process in place with the missing flags, keeping everything else of its command
 * line. Returns when nothing is missing, when turned off, or when the restart failed (then the
 * agent runs on without the flags and says so on stderr: slower, not broken).
 */
export function restartWithV8Flags(env: NodeJS.ProcessEnv = process.env): void {
  if (env['MESH_V8_FLAGS'] === 'off') return;
  const missing = missingV8Flags(process.execArgv);
  if (missing.length === 0) return;
  const argv = [process.execPath, ...process.execArgv, ...missing, ...process.argv.slice(1)];
  try {
    execInPlace(process.execPath, argv);
  } catch (err) {
    process.stderr.write(
      `mesh-agent: could not restart with ${missing.join(' ')} (${(err as Error).message}); running without them\n`,
    );
  }
}
