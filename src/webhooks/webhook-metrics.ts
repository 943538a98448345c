/**
 * Prometheus series of webhook deliveries (docs/metrics.md, "Webhooks"): attempts by outcome and
 * each endpoint's pending events, read from the store at scrape time so they never go stale.
 */
import { Counter, Gauge, type Registry } from 'prom-client';

/** What one attempt came to, or `given_up` for each event abandoned after its last attempt. */
export type DeliveryOutcome = 'delivered' | 'failed' | 'given_up';

export class WebhookMetrics {
  private readonly deliveries: Counter<'outcome'>;

  /** `pending()`: each webhook's id and how many events wait for it. */
  constructor(registry: Registry, pending: () => { id: string; count: number }[]) {
    const registers = [registry];
    this.deliveries = new Counter({
      name: 'mesh_webhook_deliveries_total',
      help: 'Webhook delivery attempts by outcome (delivered, failed), and events given up after their last attempt (given_up).',
      labelNames: ['outcome'] as const,
      registers,
    });
    for (const o of ['delivered', 'failed', 'given_up'] as const) this.deliveries.labels(o).inc(0);
    new Gauge({
      name: 'mesh_webhook_pending_events',
      help: 'Events recorded for a webhook and not yet delivered or given up, by webhook id.',
      labelNames: ['webhook_id'] as const,
      registers,
      collect() {
        // Rebuilt each scrape: a deleted webhook's series goes with it.
        this.reset();
        for (const p of pending()) this.labels(p.id).set(p.count);
      },
    });
  }

  count(outcome: DeliveryOutcome, n = 1): void {
    this.deliveries.labels(outcome).inc(n);
  }
}
