/**
 * `GET /v1/dataplane` (extension, services.read; docs/decisions.md §7, docs/dataplane.md
 * "Drift"): what this agent owns in the kernel against what it wants, what the next reconcile
 * would change, the last reconcile, and the drift repaired since start. An agent that runs no
 * data plane answers 200 and says so.
 */
import { Type } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import type { DriftReport } from '../../dataplane/dataplane.js';
import type { AppDeps } from '../app.js';
import { errorResponses } from '../schemas.js';

const Counts = Type.Object({
  links: Type.Integer(),
  addresses: Type.Integer(),
  rules: Type.Integer(),
  routes: Type.Integer(),
  nft: Type.Boolean({ description: "the agent's nftables table exists (wanted: is wanted)" }),
});

const Nullable = (type: string, description?: string) =>
  Type.Unsafe<unknown>({ type: [type, 'null'], ...(description ? { description } : {}) });

export const DataPlaneReport = Type.Object({
  running: Type.Boolean({ description: 'whether this agent runs a data plane' }),
  reason: Nullable('string', 'why not, when it does not'),
  wanted: Type.Union([Counts, Type.Null()], {
    description: 'what the last plan wants in the kernel (null before the first reconcile, or no data plane)',
  }),
  owned: Type.Union([Counts, Type.Null()], { description: 'what the agent owns in the kernel now' }),
  in_step: Type.Boolean({ description: 'owned is what is wanted (nothing for a reconcile to change)' }),
  differences: Type.Array(Type.String(), {
    description: 'what the next reconcile would change, as the commands it would run (the first 50)',
  }),
  difference_count: Type.Integer(),
  last_reconcile: Type.Union([
    Type.Object({
      at: Type.String({ format: 'date-time' }),
      duration_ms: Type.Number(),
      changes: Type.Integer({ description: 'kernel changes it applied' }),
      drift: Type.Boolean({ description: 'its changes repaired drift' }),
      error: Nullable('string'),
    }),
    Type.Null(),
  ]),
  reconciles: Type.Integer({ description: 'reconciles since start' }),
  repairs: Type.Integer({
    description: 'reconciles since start that put back kernel state changed behind the agent',
  }),
  recent_repairs: Type.Array(
    Type.Object({
      at: Type.String({ format: 'date-time' }),
      changes: Type.Integer(),
      repaired: Type.Array(Type.String(), { description: 'the changes made, as commands (the first 20)' }),
    }),
    { description: 'the last 20 repairs, oldest first' },
  ),
  tun_failures: Type.Integer({ description: 'TUN devices deleted under the agent and made again' }),
  problems: Type.Array(Type.String(), { description: 'why the data plane cannot carry what it should' }),
});

/** The report as the API shows it: snake_case, times in ISO 8601. */
export function dataplaneReportView(r: DriftReport) {
  const iso = (ms: number) => new Date(ms).toISOString();
  return {
    running: true,
    reason: null,
    wanted: r.wanted,
    owned: r.owned,
    in_step: r.wanted !== null && r.differenceCount === 0,
    differences: r.differences,
    difference_count: r.differenceCount,
    last_reconcile: r.lastReconcile && {
      at: iso(r.lastReconcile.at),
      duration_ms: r.lastReconcile.durationMs,
      changes: r.lastReconcile.changes,
      drift: r.lastReconcile.drift,
      error: r.lastReconcile.error,
    },
    reconciles: r.reconciles,
    repairs: r.repairs,
    recent_repairs: r.recentRepairs.map((x) => ({ at: iso(x.at), changes: x.changes, repaired: x.repaired })),
    tun_failures: r.tunFailures,
    problems: r.problems,
  };
}

/** The answer of an agent without a data plane. */
export const noDataPlane = (reason: string) => ({
  running: false,
  reason,
  wanted: null,
  owned: null,
  in_step: false,
  differences: [],
  difference_count: 0,
  last_reconcile: null,
  reconciles: 0,
  repairs: 0,
  recent_repairs: [],
  tun_failures: 0,
  problems: [],
});

export function registerDataPlaneRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.get(
    '/v1/dataplane',
    {
      schema: {
        tags: ['dataplane'],
        summary:
          'Extension: kernel state owned against wanted, the last reconcile, drift repaired since start',
        response: { 200: DataPlaneReport, ...errorResponses(401, 403) },
      },
    },
    async () => deps.dataplaneReport(),
  );
}
