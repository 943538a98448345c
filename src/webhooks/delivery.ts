/**
 * One delivery attempt of one event to one endpoint, signed as the Standard Webhooks
 * specification says (`webhook-id`, `webhook-timestamp`, `webhook-signature`: HMAC-SHA256 over
 * `id.timestamp.body`, by the `standardwebhooks` package, the specification's own reference
 * code). Used by the dispatcher and by the test delivery; knows nothing of queues.
 *
 * Node's http client rather than fetch: fetch refuses the Fetch standard's "bad ports" (6000,
 * 6665-6669, ...), which an operator's receiver may well listen on. It follows no redirect by
 * itself: a 3xx is an answer like any other that is not 2xx, a failure. One timer bounds the
 * whole attempt, name lookup and connect included.
 */
import http from 'node:http';
import https from 'node:https';
import { Webhook } from 'standardwebhooks';

/** The most one attempt may take, from the start of the connection to the status line. */
export const ATTEMPT_TIMEOUT_MS = 10_000;

export interface AttemptOutcome {
  /** A 2xx answer arrived in time. */
  delivered: boolean;
  /** The answer's status, when one arrived. */
  status: number | null;
  /** Why it failed, for the operator (`HTTP 503`, `connect ECONNREFUSED ...`); null when delivered. */
  error: string | null;
  /** How long the attempt took. */
  ms: number;
}

export interface DeliveryTarget {
  url: string;
  secret: string;
}

/** Keep-alive connections per dispatcher; destroyed when it stops. */
export class DeliveryAgents {
  readonly http = new http.Agent({ keepAlive: true });
  readonly https = new https.Agent({ keepAlive: true });
  destroy(): void {
    this.http.destroy();
    this.https.destroy();
  }
}

/** The Standard Webhooks headers of a body sent at `at` with the message id `id`. */
export function signedHeaders(secret: string, id: string, at: Date, body: string): Record<string, string> {
  return {
    'webhook-id': id,
    'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
    'webhook-signature': new Webhook(secret).sign(id, at, body),
  };
}

/**
 * POSTs `body` (a JSON event) to the target, signed with `id` (the event's id, so that
 * receivers deduplicate retries). `signal` aborts it (the agent stopping, the webhook deleted).
 * Never throws: every failure is an outcome.
 */
export function attemptDelivery(
  target: DeliveryTarget,
  id: string,
  body: string,
  opts: { agents: DeliveryAgents; userAgent: string; signal?: AbortSignal; timeoutMs?: number },
): Promise<AttemptOutcome> {
  const started = performance.now();
  const timeoutMs = opts.timeoutMs ?? ATTEMPT_TIMEOUT_MS;
  const outcome = (status: number | null, error: string | null): AttemptOutcome => ({
    delivered: error === null,
    status,
    error,
    ms: Math.round(performance.now() - started),
  });
  return new Promise((resolve) => {
    let url: URL;
    try {
      url = new URL(target.url);
    } catch {
      resolve(outcome(null, 'the URL cannot be parsed'));
      return;
    }
    const secure = url.protocol === 'https:';
    const payload = Buffer.from(body);
    let settled = false;
    const finish = (o: AttemptOutcome) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      resolve(o);
    };
    const req = (secure ? https : http).request(url, {
      method: 'POST',
      agent: secure ? opts.agents.https : opts.agents.http,
      headers: {
        'content-type': 'application/json',
        'content-length': String(payload.length),
        'user-agent': opts.userAgent,
        ...signedHeaders(target.secret, id, new Date(), body),
      },
    });
    const timer = setTimeout(() => {
      finish(outcome(null, `no answer within ${timeoutMs / 1000} s`));
      req.destroy();
    }, timeoutMs);
    const onAbort = () => {
      finish(outcome(null, 'aborted'));
      req.destroy();
    };
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    req.on('response', (res) => {
      const status = res.statusCode ?? 0;
      if (status >= 200 && status < 300) finish(outcome(status, null));
      else if (status >= 300 && status < 400) {
        finish(outcome(status, `HTTP ${status} (redirects are not followed)`));
      } else finish(outcome(status, `HTTP ${status}`));
      // The body is read and dropped, so that the connection can carry the next delivery; one
      // that trickles in forever loses the connection at the attempt's deadline.
      const drain = setTimeout(() => req.destroy(), Math.max(0, timeoutMs - (performance.now() - started)));
      res.once('close', () => clearTimeout(drain));
      res.on('error', () => {});
      res.resume();
    });
    req.on('error', (err: NodeJS.ErrnoException) => {
      finish(outcome(null, err.message || err.code || 'connection failed'));
    });
    if (opts.signal?.aborted) onAbort();
    else req.end(payload);
  });
}
