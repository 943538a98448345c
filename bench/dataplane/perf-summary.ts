/**
 * bench/dataplane/perf-summary: where a tunnel process's CPU goes in a `perf record -g` file of
 * a figure (written by `BENCH_PERF=1 node dist/bench/dataplane/run.js`, one file per agent or
 * relay). Reports:
 * - CPU use: samples over (sample rate x the file's time span), in cores, for the main thread
 *   (the event loop: tid = pid) and the other threads (in node: V8's platform workers, which run
 *   the concurrent GC marking and sweeping, and libuv's pool);
 * - self buckets, each sample in one: kernel samples by the syscall or context they sit in (a
 *   TUN write() also carries the forwarding of the written packet to the next hop, inline, and a
 *   TCP send over a veth the delivery to the receiving socket), user samples by their innermost
 *   frame (AES-GCM, memcpy, malloc, V8 GC, JS, other node/V8/OpenSSL);
 * - inclusive markers: the share of samples with a given frame anywhere on the stack (these
 *   overlap: a TLS write contains its socket send);
 * - the innermost agent JS function on each stack, and the innermost JS function of any kind
 *   (Node's own stream machinery included).
 *
 * Usage: node dist/bench/dataplane/perf-summary.js FILE.data [FILE.data...] (needs `perf`).
 */
import { spawnSync } from 'node:child_process';

const KERNEL: [string, string][] = [
  ['tun_chr_write_iter', 'kernel: TUN write() (with inline forwarding to the next hop)'],
  ['tun_chr_read_iter', 'kernel: TUN read()'],
  ['tun_do_read', 'kernel: TUN read()'],
  ['tcp_sendmsg', 'kernel: TCP send (with inline delivery over the veth)'],
  ['tcp_recvmsg', 'kernel: TCP receive'],
  ['do_epoll_ctl', 'kernel: epoll_ctl (a socket read paused or resumed)'],
  ['do_epoll_wait', 'kernel: epoll_wait'],
  ['futex', 'kernel: futex'],
  ['__sys_accept', 'kernel: accept'],
  ['__sys_connect', 'kernel: connect'],
  ['__x64_sys_close', 'kernel: close'],
  ['__x64_sys_shutdown', 'kernel: shutdown'],
  ['__sys_setsockopt', 'kernel: setsockopt'],
  ['handle_softirqs', 'kernel: softirq (network receive, other)'],
  ['asm_exc_page_fault', 'kernel: page faults'],
  ['asm_sysvec', 'kernel: interrupts, IPIs'],
  ['exit_to_user_mode_loop', 'kernel: rescheduled on the way out of a syscall'],
  ['ksys_read', 'kernel: read(), entry and exit'],
  ['ksys_write', 'kernel: write(), entry and exit'],
];

/** V8's garbage collector, on the main thread or its helper threads (frames anywhere on the stack). */
const GC =
  /Heap::|Scaveng|MarkCompact|Sweep|Evacuat|ConcurrentMarking|IncrementalMarking|MarkingVisitor|MinorMC|MarkingBarrier|GCTracer/;

/** Frames looked for anywhere on a sample's stack (overlapping shares). */
const MARKERS: [RegExp, string][] = [
  [/SSL_write|ssl3_write/, 'OpenSSL SSL_write (encrypt, into the TLS socket buffer)'],
  [/SSL_read|ssl3_read/, 'OpenSSL SSL_read (decrypt)'],
  [/TLSWrap::/, 'node TLSWrap (all TLS socket work, incl. its JS callbacks)'],
  [/tcp_sendmsg/, 'kernel TCP send (every socket)'],
  [/tcp_recvmsg/, 'kernel TCP receive (every socket)'],
  [/do_epoll_ctl/, 'kernel epoll_ctl'],
  [/memmove|memcpy/, 'memcpy / memmove (user and kernel)'],
  [GC, 'V8 GC (main thread and helpers)'],
  [/dist\/src\/dataplane\/streams\.js/, 'JS: StreamMux (streams.js, incl. what it calls)'],
  [/dist\/src\/transports\/frames\.js/, 'JS: tunnel framing (frames.js, incl. what it calls)'],
  [/dist\/src\/dataplane\/stream-frames\.js/, 'JS: stream frames (stream-frames.js, incl.)'],
  [/dist\/src\/dataplane\/shaper\.js/, 'JS: shaper (shaper.js, incl.)'],
];

function userBucket(top: string, stack: string): string {
  if (/aesni|gcm|ghash|aes_gcm|AES_/i.test(top)) return 'user: AES-GCM';
  if (GC.test(stack)) return 'user: V8 GC';
  if (/memmove|memcpy/.test(top)) return 'user: memcpy';
  if (/malloc|free|_int_|unlink_chunk|consolidate/.test(top)) return 'user: malloc/free';
  if (top.includes('JS:')) return 'user: JS (own frame)';
  if (top.includes('libc')) return 'user: libc, other';
  if (top.includes('libcrypto') || top.includes('libssl')) return 'user: OpenSSL, other';
  return 'user: node/V8, other';
}

function sampleRate(file: string): number {
  const r = spawnSync('perf', ['evlist', '-i', file, '-F'], { encoding: 'utf8' });
  const m = /sample_freq=(\d+)/.exec(r.stdout);
  return m ? Number(m[1]) : 0;
}

function summarise(file: string): string {
  const r = spawnSync('perf', ['script', '-i', file, '-F', 'comm,pid,tid,time,ip,sym,dso'], {
    encoding: 'utf8',
    maxBuffer: 1 << 30,
  });
  if (r.status !== 0) throw new Error(`perf script -i ${file} failed: ${r.stderr}`);
  const buckets = new Map<string, number>();
  const markers = new Map<string, number>();
  const agentJs = new Map<string, number>();
  const anyJs = new Map<string, number>();
  const threads = new Map<string, number>();
  let total = 0;
  let first = Number.POSITIVE_INFINITY;
  let last = 0;
  const add = (m: Map<string, number>, k: string) => m.set(k, (m.get(k) ?? 0) + 1);
  for (const sample of r.stdout.split('\n\n')) {
    const lines = sample
      .split('\n')
      .map((l) => l.trim())
      .filter(Boolean);
    const head = lines[0];
    const frames = lines.slice(1);
    if (!head || frames.length === 0) continue;
    total++;
    // "node 15215/15216 12345.678901:" (comm may hold spaces: the fields are read from the end).
    const hm = /^(.*?)\s+(\d+)\/(\d+)\s+([\d.]+):?$/.exec(head);
    if (hm) {
      add(threads, `${hm[1]} ${hm[2] === hm[3] ? 'main thread' : 'other threads'}`);
      const t = Number(hm[4]);
      first = Math.min(first, t);
      last = Math.max(last, t);
    }
    const text = frames.join('\n');
    if (frames[0]!.includes('[kernel.kallsyms]'))
      add(buckets, KERNEL.find(([k]) => text.includes(k))?.[1] ?? 'kernel: other');
    else add(buckets, userBucket(frames[0]!, text));
    for (const [re, label] of MARKERS) if (re.test(text)) add(markers, label);
    const agent = frames
      .map((f) => /JS:\S*?(\w+) file:\/\/\S*?\/dist\/src\/(\S+?):\d+/.exec(f))
      .find(Boolean);
    if (agent) add(agentJs, `${agent[2]} ${agent[1]}`);
    const js = frames.map((f) => /JS:\S*?([\w$]*) (\S+?):\d+:\d+ /.exec(f)).find(Boolean);
    if (js) add(anyJs, `${js[2]!.replace(/^file:\/\/\S*?\/dist\//, '')} ${js[1] || '(anonymous)'}`);
  }
  const rate = sampleRate(file);
  const span = last > first ? last - first : 0;
  const cores = (n: number) => (rate && span ? (n / (rate * span)).toFixed(2) : '?');
  const pct = (n: number) => `${((100 * n) / total).toFixed(1).padStart(5)}%`;
  const rows = (m: Map<string, number>, top: number) =>
    [...m.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([k, n]) => `${pct(n)}  ${k}`);
  return [
    `${file}: ${total} samples at ${rate} Hz over ${span.toFixed(1)} s = ${cores(total)} cores`,
    'by thread (cores):',
    ...[...threads.entries()].sort((a, b) => b[1] - a[1]).map(([k, n]) => `  ${cores(n)}  ${k}`),
    'self, by bucket:',
    ...rows(buckets, 25),
    'stack contains (overlapping):',
    ...rows(markers, 20),
    'innermost agent JS function on the stack (inclusive of what it calls):',
    ...rows(agentJs, 15),
    'innermost JS function of any kind (inclusive of the native code it calls):',
    ...rows(anyJs, 15),
  ].join('\n');
}

for (const file of process.argv.slice(2)) process.stdout.write(`${summarise(file)}\n\n`);
