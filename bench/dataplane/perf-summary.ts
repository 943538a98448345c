/**
 * bench/dataplane/perf-summary: where the agents' CPU goes in a `perf record -g` file of a mesh
 * figure (written by `BENCH_PERF=1 node dist/bench/dataplane/run.js`). Each sample is put in one
 * bucket: kernel samples by the syscall or context they sit in (a TUN write() also carries the
 * forwarding of the written packet to the next hop, inline, and even its delivery to a local
 * socket there), user samples by their innermost frame (AES-GCM, memcpy, malloc, V8 GC, JS, other
 * node/V8/OpenSSL). It also counts the innermost agent JS function on each stack.
 *
 * Usage: node dist/bench/dataplane/perf-summary.js FILE.data [FILE.data...] (needs `perf`).
 */
import { spawnSync } from 'node:child_process';

const KERNEL: [string, string][] = [
  ['tun_chr_write_iter', 'kernel: TUN write() (with inline forwarding to the next hop)'],
  ['tun_chr_read_iter', 'kernel: TUN read()'],
  ['tun_do_read', 'kernel: TUN read()'],
  ['tcp_sendmsg', 'kernel: tunnel socket send'],
  ['tcp_recvmsg', 'kernel: tunnel socket receive'],
  ['do_epoll_wait', 'kernel: epoll'],
  ['futex', 'kernel: futex'],
  ['handle_softirqs', 'kernel: softirq (network receive, other)'],
  ['asm_exc_page_fault', 'kernel: page faults'],
  ['asm_sysvec', 'kernel: interrupts, IPIs'],
  ['exit_to_user_mode_loop', 'kernel: rescheduled on the way out of a syscall'],
  ['ksys_read', 'kernel: read(), entry and exit'],
  ['ksys_write', 'kernel: write(), entry and exit'],
];

function userBucket(top: string): string {
  if (/aesni|gcm|ghash/i.test(top)) return 'user: AES-GCM';
  if (/memmove|memcpy/.test(top)) return 'user: memcpy';
  if (/malloc|free|_int_|unlink_chunk|consolidate/.test(top)) return 'user: malloc/free';
  if (/Heap|Scaveng|MarkCompact|Sweep|Evacuat/.test(top)) return 'user: V8 GC';
  if (top.includes('JS:')) return 'user: JS (own frame)';
  if (top.includes('libc')) return 'user: libc, other';
  return 'user: node/V8/OpenSSL, other';
}

function summarise(file: string): string {
  const r = spawnSync('perf', ['script', '-i', file, '-F', 'comm,tid,ip,sym,dso'], {
    encoding: 'utf8',
    maxBuffer: 1 << 30,
  });
  if (r.status !== 0) throw new Error(`perf script -i ${file} failed: ${r.stderr}`);
  const buckets = new Map<string, number>();
  const js = new Map<string, number>();
  let total = 0;
  const add = (m: Map<string, number>, k: string) => m.set(k, (m.get(k) ?? 0) + 1);
  for (const sample of r.stdout.split('\n\n')) {
    const frames = sample
      .split('\n')
      .map((l) => l.trim())
      .filter(Boolean)
      .slice(1);
    if (frames.length === 0) continue;
    total++;
    const text = frames.join('\n');
    if (frames[0]!.includes('[kernel.kallsyms]'))
      add(buckets, KERNEL.find(([k]) => text.includes(k))?.[1] ?? 'kernel: other');
    else add(buckets, userBucket(frames[0]!));
    for (const f of frames) {
      const m = /JS:\S*?(\w+) file:\/\/\S*?\/dist\/src\/(\S+?):\d+/.exec(f);
      if (m) {
        add(js, `${m[2]} ${m[1]}`);
        break;
      }
    }
  }
  const pct = (n: number) => `${((100 * n) / total).toFixed(1).padStart(5)}%`;
  const rows = (m: Map<string, number>, top: number) =>
    [...m.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([k, n]) => `${pct(n)}  ${k}`);
  return [
    `${file}: ${total} samples`,
    ...rows(buckets, 20),
    'innermost agent JS function on the stack:',
    ...rows(js, 10),
  ].join('\n');
}

for (const file of process.argv.slice(2)) process.stdout.write(`${summarise(file)}\n\n`);
