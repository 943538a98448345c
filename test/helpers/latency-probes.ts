/**
 * Latency beside a bulk flow, measured from a client namespace: pings, small HTTP requests each
 * on its own connection (a browser beside a download), and the bulk transfer itself (curl against
 * the netns apps' /bytes and /sink). Shared by the traffic suite's latency test and
 * bench/dataplane/shaping-latency.
 */
import type { Topology } from './netns-topology.js';

type Run = Topology['run'];

/** Round-trip times in ms of `count` pings `intervalS` apart; a lost one is missing from the list. */
export async function pingTimes(
  run: Run,
  ns: string,
  host: string,
  count: number,
  intervalS = 0.2,
): Promise<number[]> {
  const out = await run(
    ns,
    'ping',
    ['-c', String(count), '-i', String(intervalS), '-W', '2', host],
    (count * intervalS + 10) * 1000,
  ).catch((e: Error) => e.message);
  return [...out.matchAll(/time=([\d.]+) ms/g)].map((m) => Number(m[1]));
}

/**
 * Times in ms of `count` requests for 1,000 bytes, one at a time with `pauseS` between them; a
 * failure counts 5 s.
 */
export async function requestTimes(
  run: Run,
  ns: string,
  host: string,
  port: number,
  count: number,
  pauseS = 0.2,
): Promise<number[]> {
  const out = await run(
    ns,
    'sh',
    [
      '-c',
      `for i in $(seq 1 ${count}); do curl -sS -o /dev/null --max-time 5 -w '%{time_total}\\n' http://${host}:${port}/bytes?n=1000 || echo 5; sleep ${pauseS}; done`,
    ],
    (count * (5 + pauseS) + 10) * 1000,
  );
  return out
    .trim()
    .split('\n')
    .map((line) => Number(line) * 1000);
}

/**
 * A transfer of `bytes` up (to /sink) or down (from /bytes), cut at `seconds`; resolves when it
 * ends. With `senderMbps` the sending side keeps itself to that rate (curl's --limit-rate up, the
 * server's own pacing down), so no shaper between them needs to keep a queue.
 */
export function bulkTransfer(
  run: Run,
  ns: string,
  host: string,
  port: number,
  direction: 'up' | 'down',
  bytes: number,
  seconds: number,
  senderMbps?: number,
): Promise<string> {
  const cmd =
    direction === 'down'
      ? `curl -sS -o /dev/null --max-time ${seconds} 'http://${host}:${port}/bytes?n=${bytes}${senderMbps ? `&mbps=${senderMbps}` : ''}'`
      : `head -c ${bytes} /dev/zero | curl -sS -o /dev/null ${senderMbps ? `--limit-rate ${Math.round((senderMbps * 1e6) / 8)} ` : ''}--max-time ${seconds} -T - http://${host}:${port}/sink`;
  // curl exits 28 when --max-time ends it, as meant.
  return run(ns, 'sh', ['-c', `${cmd}; true`], (seconds + 10) * 1000);
}

export const p50 = (xs: number[]): number =>
  [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
export const p99 = (xs: number[]): number =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * 0.99))] ?? Number.NaN;
