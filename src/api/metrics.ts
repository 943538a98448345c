/**
 * Prometheus metrics of the management API (docs/decisions.md §7): requests by route and status with a
 * latency histogram, and token issuance and failures. One registry per agent (not prom-client's
 * global one), so several agents in one test process never mix their counts.
 */
import { Counter, collectDefaultMetrics, Histogram, Registry } from 'prom-client';

export class ApiMetrics {
  readonly registry = new Registry();
  readonly requests = new Counter({
    name: 'mesh_http_requests_total',
    help: 'HTTP requests answered, by method, route pattern and status.',
    labelNames: ['method', 'route', 'status'] as const,
    registers: [this.registry],
  });
  readonly requestSeconds = new Histogram({
    name: 'mesh_http_request_duration_seconds',
    help: 'Time from request to response, by method and route pattern.',
    labelNames: ['method', 'route'] as const,
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [this.registry],
  });
  readonly tokensIssued = new Counter({
    name: 'mesh_oauth_tokens_issued_total',
    help: 'Access tokens issued by the token endpoint.',
    registers: [this.registry],
  });
  readonly tokenFailures = new Counter({
    name: 'mesh_oauth_token_failures_total',
    help: 'Token requests refused, by OAuth error code.',
    labelNames: ['error'] as const,
    registers: [this.registry],
  });

  constructor() {
    collectDefaultMetrics({ register: this.registry, prefix: 'mesh_' });
  }

  /**
   * Series already bound to their labels. prom-client hashes the label set on every inc() and
   * observe(), which cost 8 to 18 µs per request (bench/api); the bound children are direct.
   * The key space is bounded: methods x route patterns x statuses.
   */
  private readonly bound = new Map<string, { count: Counter.Internal; time: { observe(v: number): void } }>();

  /** Counts one answered request. `route` is the pattern (bounded), never the raw path. */
  observe(method: string, route: string | undefined, status: number, seconds: number): void {
    const pattern = route ?? 'unmatched';
    const key = `${method} ${pattern} ${status}`;
    let series = this.bound.get(key);
    if (!series) {
      series = {
        count: this.requests.labels(method, pattern, String(status)),
        time: this.requestSeconds.labels(method, pattern),
      };
      this.bound.set(key, series);
    }
    series.count.inc();
    series.time.observe(seconds);
  }
}
