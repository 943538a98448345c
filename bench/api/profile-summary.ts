/**
 * Summarises a V8 .cpuprofile (from `BENCH_CPU_PROF=1 npm run bench:api`, which runs the agent
 * under `node --cpu-prof`) into where the agent's busy time goes: self time by package or
 * source file, the top functions by self time, and inclusive time of the top frames by package
 * (every frame counted once per sample). Idle time is left out of the percentages.
 *
 * Usage: node dist/bench/api/profile-summary.js FILE.cpuprofile [TOP]
 */
import { readFileSync } from 'node:fs';

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

/** Which package, Node subsystem or agent file a frame belongs to. */
export function bucketOf(frame: CallFrame): string {
  const { url, functionName } = frame;
  if (url === '') return functionName.startsWith('(') ? functionName : '(native)';
  if (url.startsWith('node:')) return `node:${url.slice(5).split('/').slice(0, 2).join('/')}`;
  const nm = url.lastIndexOf('/node_modules/');
  if (nm >= 0) {
    const rest = url.slice(nm + '/node_modules/'.length).split('/');
    return rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]!;
  }
  const src = url.indexOf('/dist/');
  return src >= 0 ? `agent:${url.slice(src + '/dist/'.length)}` : url;
}

const frameKey = (f: CallFrame): string => {
  const file = f.url.split('/').slice(-2).join('/');
  return `${f.functionName || '(anonymous)'} ${file}${f.url ? `:${f.lineNumber + 1}` : ''}`;
};

function summarise(profile: CpuProfile, top: number): string {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);

  const selfByBucket = new Map<string, number>();
  const selfByFrame = new Map<string, number>();
  const inclusiveByFrame = new Map<string, number>();
  let busy = 0;
  let idle = 0;
  const add = (m: Map<string, number>, k: string, v: number) => m.set(k, (m.get(k) ?? 0) + v);

  profile.samples.forEach((id, i) => {
    const dt = (profile.timeDeltas[i + 1] ?? profile.timeDeltas[i] ?? 0) / 1000; // µs -> ms
    const node = byId.get(id)!;
    if (node.callFrame.functionName === '(idle)') {
      idle += dt;
      return;
    }
    busy += dt;
    add(selfByBucket, bucketOf(node.callFrame), dt);
    add(selfByFrame, `${frameKey(node.callFrame)}  [${bucketOf(node.callFrame)}]`, dt);
    const seen = new Set<string>();
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      const f = byId.get(cur)!.callFrame;
      if (f.functionName === '(root)') continue;
      const k = `${frameKey(f)}  [${bucketOf(f)}]`;
      if (!seen.has(k)) {
        seen.add(k);
        add(inclusiveByFrame, k, dt);
      }
    }
  });

  const pct = (v: number) => `${((100 * v) / busy).toFixed(1)}%`;
  const table = (title: string, m: Map<string, number>, n: number) => {
    const rows = [...m.entries()].sort((a, b) => b[1] - a[1]).slice(0, n);
    return [
      `| ${title} | ms | % of busy |`,
      '|---|---|---|',
      ...rows.map(([k, v]) => `| \`${k}\` | ${v.toFixed(0)} | ${pct(v)} |`),
    ].join('\n');
  };
  return [
    `busy ${busy.toFixed(0)} ms, idle ${idle.toFixed(0)} ms`,
    '',
    table('self time by package / file', selfByBucket, top),
    '',
    table('self time by function', selfByFrame, top),
    '',
    table('inclusive time by function', inclusiveByFrame, top * 2),
  ].join('\n');
}

const [file, topArg] = process.argv.slice(2);
if (!file) {
  process.stderr.write('usage: node dist/bench/api/profile-summary.js FILE.cpuprofile [TOP]\n');
  process.exit(2);
}
process.stdout.write(
  `${summarise(JSON.parse(readFileSync(file, 'utf8')) as CpuProfile, Number(topArg ?? 25))}\n`,
);
