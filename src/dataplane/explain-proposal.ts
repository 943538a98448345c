/**
 * Explain's `with`: a proposed change (a new service, routes added or changed, routes removed)
 * applied to a copy of the configuration, so that explain answers as if it were made, writing
 * nothing. The change is checked by the rules a real write is checked by (domain/service-rules.ts),
 * with the same errors. Pure; used by the API's explain (src/api/explain-local.ts).
 */
import { ApiError, invalidRequest, notFound } from '../domain/errors.js';
import {
  checkRoute,
  checkService,
  isServiceActive,
  type ServiceCreateFields,
  serviceShapeOf,
} from '../domain/service-rules.js';
import type { ExplainConfig } from './explain.js';
import type { PlanRoute, PlanService, TransportKind } from './plan.js';

/** The id a proposed service is shown with. */
export const PROPOSED_SERVICE_ID = 'proposed';

export interface ProposedService extends ServiceCreateFields {
  bandwidth_limit_mbps?: number;
}

export interface ProposedRoute {
  /** The service the route belongs to; absent: the proposed service. */
  service_id?: string;
  /** An existing route this replaces (the fields given change); absent: a new route. */
  route_id?: number;
  priority?: number;
  source_cidr?: string | null;
  dest_cidr?: string | null;
}

export interface Proposal {
  service?: ProposedService;
  routes?: ProposedRoute[];
  remove_routes?: number[];
}

export interface ProposalContext {
  /** Every peer of the cluster, and which are active. */
  peers: ReadonlyMap<string, { isActive: boolean }>;
}

/** The configuration with the proposal applied; throws the API's errors for what a write would refuse. */
export function applyProposal(
  config: ExplainConfig,
  proposal: Proposal,
  context: ProposalContext,
): ExplainConfig {
  const services = [...config.services];
  let routes = [...config.routes];
  const proposedIds = new Set<number>();
  if (proposal.service) {
    const p = proposal.service;
    const shape = serviceShapeOf(p, config.localPeerId);
    const cidrs = checkService(shape);
    for (const id of [shape.targetPeerId, shape.sourcePeerId]) {
      if (!context.peers.has(id)) throw notFound(`with.service: peer ${id} not found`);
    }
    if (
      services.some((s) => s.sourcePeerId === shape.sourcePeerId && s.targetPeerId === shape.targetPeerId)
    ) {
      throw new ApiError(
        'ALREADY_EXISTS',
        'with.service: a service from this source peer to this target peer already exists',
      );
    }
    const active = new Set([...context.peers].filter(([, p]) => p.isActive).map(([id]) => id));
    const service: PlanService = {
      id: PROPOSED_SERVICE_ID,
      sourcePeerId: shape.sourcePeerId,
      targetPeerId: shape.targetPeerId,
      isActive: isServiceActive(shape, active),
      requiresInterface: shape.requiresInterface,
      desiredIpv4Cidr: cidrs.desiredIpv4Cidr,
      desiredIpv6Cidr: cidrs.desiredIpv6Cidr,
      bandwidthLimitMbps: p.bandwidth_limit_mbps ?? 0,
      fullyTransparent: shape.fullyTransparent,
      transportType: shape.transportType as TransportKind,
      healthCheck: null,
    };
    services.push(service);
  }
  const serviceIds = new Set(services.map((s) => s.id));
  for (const id of proposal.remove_routes ?? []) {
    if (!routes.some((r) => r.id === id)) throw notFound(`with.remove_routes: no route ${id}`);
    routes = routes.filter((r) => r.id !== id);
  }
  let nextId = -1;
  (proposal.routes ?? []).forEach((p, i) => {
    const label = `with.routes[${i}]`;
    if (p.route_id !== undefined) {
      const current = routes.find((r) => r.id === p.route_id);
      if (!current || (p.service_id !== undefined && current.serviceId !== p.service_id)) {
        throw notFound(
          `${label}: no route ${p.route_id}${p.service_id ? ` in service ${p.service_id}` : ''}`,
        );
      }
      const shape = checkRoute(
        {
          priority: p.priority ?? current.priority,
          sourceCidr: p.source_cidr === undefined ? current.sourceCidr : p.source_cidr,
          destCidr: p.dest_cidr === undefined ? current.destCidr : p.dest_cidr,
        },
        label,
      );
      routes = routes.map((r) => (r === current ? { ...r, ...shape } : r));
      return;
    }
    if (p.priority === undefined) throw invalidRequest(`${label}: priority is required for a new route`);
    const shape = checkRoute(
      { priority: p.priority, sourceCidr: p.source_cidr ?? null, destCidr: p.dest_cidr ?? null },
      label,
    );
    const serviceId = p.service_id ?? (proposal.service ? PROPOSED_SERVICE_ID : undefined);
    if (serviceId === undefined)
      throw invalidRequest(`${label}: service_id is required (no with.service is proposed)`);
    if (!serviceIds.has(serviceId)) throw notFound(`${label}: no service with id ${serviceId}`);
    const route: PlanRoute = { id: nextId--, serviceId, ...shape };
    proposedIds.add(route.id);
    routes.push(route);
  });
  return { ...config, services, routes, proposedRouteIds: proposedIds };
}
