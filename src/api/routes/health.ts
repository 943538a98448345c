/**
 * `/livez` and `/readyz`: public probes in the health shape, 503 with reasons when not ok. `/readyz`
 * may add `warnings` (license near or past expiry, limited services not paced) to its body: they
 * never make the agent unready.
 */
import type { FastifyInstance } from 'fastify';
import { isoTime } from '../../domain/clock.js';
import type { AppDeps } from '../app.js';
import { licenseWarnings } from '../license-status.js';
import { Health } from '../schemas.js';

export function registerHealthRoutes(app: FastifyInstance, deps: AppDeps): void {
  const probe = (which: 'live' | 'ready') => async (_req: unknown, reply: import('fastify').FastifyReply) => {
    const report = deps.health();
    const reasons = which === 'live' ? report.liveReasons : [...report.liveReasons, ...report.readyReasons];
    const now = deps.clock.now();
    const body = {
      status: reasons.length === 0 ? 'ok' : 'unavailable',
      timestamp: isoTime(now),
    };
    const warnings = which === 'ready' ? [...licenseWarnings(deps.store, now), ...report.warnings] : [];
    const extra = warnings.length > 0 ? { warnings } : {};
    if (reasons.length === 0) return reply.code(200).send({ ...body, ...extra });
    return reply.code(503).send({ ...body, reasons, ...extra });
  };
  const schema = (summary: string) => ({
    tags: ['health'],
    summary,
    response: { 200: Health, 503: Health },
  });
  app.get('/livez', { schema: schema('Liveness: 200 while the process can serve') }, probe('live'));
  app.get(
    '/readyz',
    { schema: schema('Readiness: 200 when ready, 503 with reasons when not') },
    probe('ready'),
  );
}
