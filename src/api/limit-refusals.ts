/**
 * `license.limit_refused` (docs/events.md "Runtime events"): a client's write that a license
 * limit refused (422 NODE_LIMIT_EXCEEDED / SERVICE_LIMIT_EXCEEDED), recorded where the client's
 * request was refused, whichever check refused it (this agent's, the allocator's, or the other
 * side's of a join). The refused write itself changes nothing and records no config event.
 * Agent-to-agent requests (a join's handshake, gossip) are not counted: the operator's request
 * that caused them is, on the agent that took it. Used by app.ts's onError hook only.
 */
import type { FastifyRequest } from 'fastify';
import { ApiError } from '../domain/errors.js';
import type { License } from '../domain/license.js';
import type { ObservedEvent } from '../domain/observed-event.js';

const LIMITS = { NODE_LIMIT_EXCEEDED: 'max_nodes', SERVICE_LIMIT_EXCEEDED: 'max_services' } as const;

export function limitRefusedEvent(
  error: unknown,
  request: FastifyRequest,
  license: License | undefined,
): ObservedEvent | undefined {
  if (!(error instanceof ApiError) || !request.caller) return undefined;
  const limit = LIMITS[error.code as keyof typeof LIMITS];
  if (!limit) return undefined;
  return {
    type: 'license.limit_refused',
    resource: { kind: 'license', id: license?.license_id ?? '' },
    data: {
      limit,
      max: license?.[limit] ?? null,
      code: error.code,
      message: error.message,
      method: request.method,
      route: request.routeOptions.url ?? null,
      client_id: request.caller.clientId,
    },
  };
}
