/**
 * bench/store: what one committed write costs the agent, and how long it stalls the event loop.
 *
 * better-sqlite3 is synchronous, so a commit runs on the main thread: with WAL and
 * synchronous=FULL (what src/store/database.ts sets) every commit waits for an fsync of the
 * WAL; with NORMAL it does not (the WAL is synced at checkpoints only). This script opens
 * databases with the repo's own openDatabase() in a temp dir on the repo's disk, and commits one
 * small credential-like row per transaction, spaced 2 ms apart, under FULL and under NORMAL
 * (rounds alternate between the two so that disk noise hits both). Meanwhile a 1 ms
 * setInterval and perf_hooks.monitorEventLoopDelay watch the event loop. A third mode commits
 * 100 rows per transaction under FULL, the batching a replication writer would use. A control
 * phase runs the same loop without writing, for the VM's own timer jitter.
 *
 * Run: npm run build && node dist/bench/store/commit-cost.js
 * Environment: BENCH_COMMITS (2000 per mode), BENCH_ROUNDS (4), BENCH_GAP_MS (2),
 * BENCH_DIR (parent of the temp dir; default <repo>/bench/results, i.e. the repo's disk).
 * Writes summary.md and raw latencies to bench/results/<timestamp>-store/.
 */
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { type Db, openDatabase } from '../../src/store/database.js';

const REPO_ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const int = (name: string, fallback: number): number => {
  const v = process.env[name];
  if (v === undefined || v === '') return fallback;
  if (!/^\d+$/.test(v) || Number(v) < 1) throw new Error(`${name} must be a positive whole number`);
  return Number(v);
};
const COMMITS = int('BENCH_COMMITS', 2000);
const ROUNDS = int('BENCH_ROUNDS', 4);
const GAP_MS = int('BENCH_GAP_MS', 2);
const BATCH_ROWS = 100;
const PARENT = resolve(process.env.BENCH_DIR || join(REPO_ROOT, 'bench/results'));

interface Mode {
  name: string;
  synchronous: 'FULL' | 'NORMAL' | null; // null: no write at all (control)
  rowsPerCommit: number;
  commits: number;
}

const MODES: Mode[] = [
  { name: 'WAL + synchronous=FULL (the agent)', synchronous: 'FULL', rowsPerCommit: 1, commits: COMMITS },
  { name: 'WAL + synchronous=NORMAL', synchronous: 'NORMAL', rowsPerCommit: 1, commits: COMMITS },
  {
    name: `WAL + FULL, ${BATCH_ROWS} rows per commit`,
    synchronous: 'FULL',
    rowsPerCommit: BATCH_ROWS,
    commits: Math.max(ROUNDS, Math.round(COMMITS / 10)),
  },
  { name: 'control: same loop, no write', synchronous: null, rowsPerCommit: 0, commits: COMMITS },
];

interface Samples {
  commitMs: number[];
  /** How late each tick of the 1 ms interval was, in ms. */
  timerLateMs: number[];
  /** monitorEventLoopDelay samples are kept as a histogram; we keep its percentiles per round. */
  eld: { p50: number; p99: number; max: number }[];
}

/** One credential-shaped row, like the store's insertCredential writes. */
function writer(db: Db, rows: number): () => void {
  const insert = db.prepare(
    `INSERT INTO credentials (client_id, secret_hash, scopes, license_id, created_at, last_used_at)
     VALUES (?, ?, ?, ?, ?, NULL)`,
  );
  const scopes = JSON.stringify(['urn:vendor:service:admin']);
  const tx = db.transaction(() => {
    for (let i = 0; i < rows; i++) {
      insert.run(
        `mc_${randomBytes(16).toString('hex')}`,
        randomBytes(32),
        scopes,
        'license-bench',
        new Date().toISOString(),
      );
    }
  });
  return () => tx();
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function measure(commits: number, write: (() => void) | undefined, into: Samples): Promise<void> {
  const eld = monitorEventLoopDelay({ resolution: 1 });
  let last = performance.now();
  const interval = setInterval(() => {
    const now = performance.now();
    into.timerLateMs.push(Math.max(0, now - last - 1));
    last = now;
  }, 1);
  eld.enable();
  for (let i = 0; i < commits; i++) {
    await sleep(GAP_MS);
    const t0 = performance.now();
    write?.();
    into.commitMs.push(performance.now() - t0);
  }
  eld.disable();
  clearInterval(interval);
  // The histogram is in ns and includes the 1 ms resolution itself; report the excess.
  const excess = (ns: number) => Math.max(0, ns / 1e6 - 1);
  into.eld.push({ p50: excess(eld.percentile(50)), p99: excess(eld.percentile(99)), max: excess(eld.max) });
}

const pct = (xs: number[], p: number): number => {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
};
const f = (x: number, d = 2) => (Number.isFinite(x) ? x.toFixed(d) : 'NA');

function filesystemOf(dir: string): string {
  const r = spawnSync('df', ['-T', dir], { encoding: 'utf8' });
  const line = r.stdout?.trim().split('\n')[1]?.split(/\s+/);
  return line ? `${line[0]} (${line[1]}, mounted on ${line[6]})` : 'unknown';
}

async function main(): Promise<void> {
  mkdirSync(PARENT, { recursive: true });
  const dir = mkdtempSync(join(PARENT, '.commit-cost-'));
  const stamp = new Date()
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d+Z$/, 'Z');
  const outDir = join(REPO_ROOT, 'bench/results', `${stamp}-store`);
  const dbs: Db[] = [];
  try {
    const writers = MODES.map((mode, i) => {
      if (mode.synchronous === null) return undefined;
      const db = openDatabase(join(dir, `mode${i}.db`));
      dbs.push(db);
      if (mode.synchronous !== 'FULL') db.pragma(`synchronous = ${mode.synchronous}`);
      const journal = db.pragma('journal_mode', { simple: true });
      const sync = db.pragma('synchronous', { simple: true });
      if (journal !== 'wal' || sync !== (mode.synchronous === 'FULL' ? 2 : 1)) {
        throw new Error(`${mode.name}: got journal_mode=${journal} synchronous=${sync}`);
      }
      return writer(db, mode.rowsPerCommit);
    });
    const samples: Samples[] = MODES.map(() => ({ commitMs: [], timerLateMs: [], eld: [] }));
    process.stderr.write(
      `commit-cost: ${COMMITS} commits per mode in ${ROUNDS} alternating rounds, ${GAP_MS} ms apart, in ${dir} on ${filesystemOf(dir)}\n`,
    );
    // Warm-up: a few commits each, not counted (first pages, WAL file creation).
    for (const w of writers) for (let i = 0; i < 20; i++) w?.();
    for (let round = 0; round < ROUNDS; round++) {
      for (const [i, mode] of MODES.entries()) {
        const n = Math.ceil(mode.commits / ROUNDS);
        await measure(n, writers[i], samples[i]!);
      }
      process.stderr.write(`  round ${round + 1}/${ROUNDS} done\n`);
    }

    const lines = [
      `Node ${process.version}, better-sqlite3, WAL; temp dir on ${filesystemOf(dir)}. One commit = one transaction inserting credential-shaped row(s); commits ${GAP_MS} ms apart, ${ROUNDS} alternating rounds. Event loop: lateness of a 1 ms setInterval and monitorEventLoopDelay (resolution 1 ms, excess over it), both during the same loop.`,
      '',
      '| mode | commits | commit p50 ms | p99 ms | p99.9 ms | max ms | mean ms | 1 ms timer late p99 / max ms | loop delay p99 / max ms |',
      '|---|---|---|---|---|---|---|---|---|',
    ];
    for (const [i, mode] of MODES.entries()) {
      const s = samples[i]!;
      const c = s.commitMs;
      const mean = c.reduce((a, b) => a + b, 0) / c.length;
      const eldP99 = Math.max(...s.eld.map((e) => e.p99));
      const eldMax = Math.max(...s.eld.map((e) => e.max));
      const rows = mode.rowsPerCommit > 1 ? ` (x${mode.rowsPerCommit} rows)` : '';
      lines.push(
        `| ${mode.name} | ${c.length}${rows} | ${f(pct(c, 50), 3)} | ${f(pct(c, 99), 3)} | ${f(pct(c, 99.9), 3)} | ${f(Math.max(...c), 3)} | ${f(mean, 3)} | ${f(pct(s.timerLateMs, 99))} / ${f(Math.max(...s.timerLateMs))} | ${f(eldP99)} / ${f(eldMax)} |`,
      );
    }
    const batched = samples[2]!.commitMs;
    lines.push(
      '',
      `Batched: ${f(pct(batched, 50) / BATCH_ROWS, 4)} ms per row at p50 (${BATCH_ROWS} rows per commit). Loop-delay columns take the worst round.`,
    );
    const table = lines.join('\n');
    mkdirSync(outDir, { recursive: true });
    writeFileSync(join(outDir, 'summary.md'), `# bench:store commit-cost ${stamp}\n\n${table}\n`);
    writeFileSync(
      join(outDir, 'samples.json'),
      JSON.stringify(
        MODES.map((m, i) => ({ mode: m, ...samples[i] })),
        null,
        1,
      ),
    );
    process.stdout.write(`${table}\n`);
    process.stderr.write(`wrote ${join(outDir, 'summary.md')}\n`);
  } finally {
    for (const db of dbs) db.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`commit-cost: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
});
