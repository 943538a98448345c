/**
 * License lifecycle as the operator sees it (docs/decisions.md §7): the warnings `/readyz`
 * adds to its 200 body from 30 days before expiry, and the license gauges on /metrics. Used by the
 * health route and the agent's wiring only. Expiry is reported, never enforced here: the data
 * plane and the API keep serving after it (an expired license must not cut existing traffic).
 */
import { Gauge, type Registry } from 'prom-client';
import type { Clock } from '../domain/clock.js';
import type { Store } from '../store/store.js';

/** Warn this long before expiry: time to renew without a rush. */
export const LICENSE_WARNING_MS = 30 * 86_400_000;

/**
 * Warnings about the license at `now`: none before the window or before bootstrap. A warning, not
 * a readiness reason: readiness gates traffic in orchestrators and expiry must not stop traffic.
 */
export function licenseWarnings(store: Store, now: number): string[] {
  const state = store.agentState();
  if (!state) return [];
  const left = Date.parse(state.license.expires_at) - now;
  if (left <= 0) {
    return [`license ${state.license.license_id} expired at ${state.license.expires_at}: renew it`];
  }
  if (left <= LICENSE_WARNING_MS) {
    const days = Math.floor(left / 86_400_000);
    return [`license ${state.license.license_id} expires at ${state.license.expires_at} (${days} days left)`];
  }
  return [];
}

/**
 * The license gauges, read at scrape time from the store so they never go stale. Before bootstrap
 * there is no license: the gauges have no sample then (an absent series, not a made-up zero).
 */
export function registerLicenseMetrics(registry: Registry, store: Store, clock: Clock): void {
  const registers = [registry];
  const license = () => store.agentState()?.license;
  const gauge = (name: string, help: string, value: () => number | undefined) =>
    new Gauge({
      name,
      help,
      registers,
      collect() {
        const v = value();
        // reset() drops the sample, so a gauge stays absent rather than stale.
        if (v === undefined) this.reset();
        else this.set(v);
      },
    });
  gauge(
    'mesh_license_expiry_seconds',
    'Seconds until the license expires; negative once expired (expiry does not stop traffic).',
    () => {
      const l = license();
      return l && (Date.parse(l.expires_at) - clock.now()) / 1000;
    },
  );
  gauge('mesh_license_nodes_limit', 'Nodes the license allows (max_nodes).', () => license()?.max_nodes);
  gauge('mesh_license_nodes_used', 'Active peers of the cluster, counted against max_nodes.', () =>
    license() ? store.activePeerIds().length : undefined,
  );
  gauge(
    'mesh_license_services_limit',
    'Services the license allows (max_services).',
    () => license()?.max_services,
  );
  gauge(
    'mesh_license_services_used',
    'Services counted against max_services, inactive ones included (docs/decisions.md §5).',
    () => (license() ? store.serviceCount() : undefined),
  );
}
