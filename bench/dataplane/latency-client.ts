/**
 * bench/dataplane/latency-client: small request/response latency through a data path, for
 * bench/dataplane/run (the kcp transport's latency figure). Sequential GETs, one at a time, on ONE keep-alive
 * HTTP/1.1 connection (an http.Agent with keepAlive and maxSockets 1), each timed with
 * process.hrtime.bigint() from the request's start to the response's end. Connection setup is
 * outside the figure: the first request (which opens the connection) is a warm-up and not counted.
 *
 *   ip netns exec NS node dist/bench/dataplane/latency-client.js HOST PORT [N=2000] [MAX_S=10]
 *
 * Stops after N timed requests or MAX_S seconds, whichever comes first (at 40 ms RTT, 2000
 * requests would take 80 s). Prints one JSON line: n, p50/p99/max/mean in ms, errors, and the
 * number of TCP connections used (must be 1: otherwise a reconnect's handshake is in the figures).
 * A request that fails or takes over 10 s counts as an error; after 20 errors it gives up.
 * Bench-only; nothing under src/ may use it.
 */
import { Agent, request } from 'node:http';

export interface LatencyResult {
  n: number;
  p50Ms: number | null;
  p99Ms: number | null;
  maxMs: number | null;
  meanMs: number | null;
  errors: number;
  connections: number;
  seconds: number;
}

function once(agent: Agent, host: string, port: number): Promise<bigint> {
  return new Promise((resolve, reject) => {
    const t0 = process.hrtime.bigint();
    const req = request({ host, port, path: '/', agent, timeout: 10_000 }, (res) => {
      res.on('data', () => {});
      res.on('end', () => {
        if (res.statusCode !== 200) reject(new Error(`status ${res.statusCode}`));
        else resolve(process.hrtime.bigint() - t0);
      });
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error('timeout after 10 s')));
    req.on('error', reject);
    req.end();
  });
}

/** The q-quantile (0..1) of sorted values: nearest rank. */
const quantile = (sorted: number[], q: number): number =>
  sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;

export async function measureLatency(
  host: string,
  port: number,
  n: number,
  maxSeconds: number,
): Promise<LatencyResult> {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  let connections = 0;
  // Each new socket the agent creates is a connection (and a handshake) the figure would include.
  const create = agent.createConnection.bind(agent);
  agent.createConnection = ((...args: Parameters<typeof create>) => {
    connections++;
    return create(...args);
  }) as typeof agent.createConnection;
  let errors = 0;
  const ns: number[] = [];
  const start = Date.now();
  try {
    await once(agent, host, port); // warm-up: opens the connection
    while (ns.length < n && Date.now() - start < maxSeconds * 1000 && errors < 20) {
      try {
        ns.push(Number(await once(agent, host, port)) / 1e6);
      } catch {
        errors++;
      }
    }
  } catch {
    errors++;
  } finally {
    agent.destroy();
  }
  const sorted = [...ns].sort((a, b) => a - b);
  const has = sorted.length > 0;
  return {
    n: sorted.length,
    p50Ms: has ? quantile(sorted, 0.5) : null,
    p99Ms: has ? quantile(sorted, 0.99) : null,
    maxMs: has ? sorted[sorted.length - 1]! : null,
    meanMs: has ? sorted.reduce((a, b) => a + b, 0) / sorted.length : null,
    errors,
    connections,
    seconds: (Date.now() - start) / 1000,
  };
}

if (process.argv[1] && /latency-client\.js$/.test(process.argv[1])) {
  const [host, port, n, max] = process.argv.slice(2);
  if (!host || !port) {
    process.stderr.write('usage: latency-client.js HOST PORT [N=2000] [MAX_S=10]\n');
    process.exit(2);
  }
  const r = await measureLatency(host, Number(port), Number(n ?? 2000), Number(max ?? 10));
  process.stdout.write(`${JSON.stringify(r)}\n`);
}
