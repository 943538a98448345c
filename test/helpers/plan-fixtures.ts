/**
 * Services and routes as the data plane's planner takes them (src/dataplane/plan.ts), for the
 * unit tests of the planner and of the data plane. Test-only.
 */
import type { PlanRoute, PlanService } from '../../src/dataplane/plan.js';

export const S1 = '11111111-1111-4111-8111-111111111111';
export const S2 = '22222222-2222-4222-8222-222222222222';
export const S3 = '33333333-3333-4333-8333-333333333333';

/** An active service without MACVLAN; `extra` overrides any field. */
export const planService = (
  id: string,
  source: string,
  target: string,
  extra: Partial<PlanService> = {},
): PlanService => ({
  id,
  sourcePeerId: source,
  targetPeerId: target,
  isActive: true,
  requiresInterface: false,
  desiredIpv4Cidr: null,
  desiredIpv6Cidr: null,
  ...extra,
});

export const planRoute = (
  id: number,
  serviceId: string,
  priority: number,
  sourceCidr: string | null,
  destCidr: string | null,
): PlanRoute => ({ id, serviceId, priority, sourceCidr, destCidr });
