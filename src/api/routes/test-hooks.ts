/**
 * Test hooks, registered only with `--test-hooks` (never in production): move the agent's clock
 * forward, and cut gossip to chosen peers or lose a share of messages. They let the cluster
 * tests cross a 24-hour grace period and partition agents without waiting or root.
 */
import { Type } from '@sinclair/typebox';
import type { FastifyInstance } from 'fastify';
import type { OffsetClock } from '../../domain/clock.js';
import type { AppDeps } from '../app.js';
import { errorResponses } from '../schemas.js';

export interface TestHooks {
  clock: OffsetClock;
  faults: { blocked: Set<string>; loss: number };
}

export function registerTestHookRoutes(app: FastifyInstance, deps: AppDeps): void {
  const hooks = deps.testHooks;
  if (!hooks) return;
  app.post(
    '/internal/v1/test/clock',
    {
      schema: {
        tags: ['internal'],
        summary: 'Test hook: move this agent’s clock forward',
        body: Type.Object({ advance_ms: Type.Integer({ minimum: 0 }) }),
        response: { 200: Type.Object({ offset_ms: Type.Integer() }), ...errorResponses(400, 401, 403) },
      },
    },
    async (request) => {
      hooks.clock.advance((request.body as { advance_ms: number }).advance_ms);
      request.log.warn({ offset_ms: hooks.clock.offset }, 'test hook: clock moved');
      return { offset_ms: hooks.clock.offset };
    },
  );
  app.put(
    '/internal/v1/test/faults',
    {
      schema: {
        tags: ['internal'],
        summary: 'Test hook: cut gossip to and from peers, or lose a share of gossip messages',
        body: Type.Object({
          blocked_peer_ids: Type.Array(Type.String(), { maxItems: 1000 }),
          loss: Type.Number({ minimum: 0, maximum: 1 }),
        }),
        response: { 200: Type.Object({ ok: Type.Boolean() }), ...errorResponses(400, 401, 403) },
      },
    },
    async (request) => {
      const body = request.body as { blocked_peer_ids: string[]; loss: number };
      hooks.faults.blocked.clear();
      for (const id of body.blocked_peer_ids) hooks.faults.blocked.add(id);
      hooks.faults.loss = body.loss;
      request.log.warn({ blocked: body.blocked_peer_ids.length, loss: body.loss }, 'test hook: faults set');
      return { ok: true };
    },
  );
}
