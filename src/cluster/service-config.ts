/**
 * Services and routes: the replicated configuration that tells the data plane what to carry.
 * Create, update and delete with the checks of the API document in its order (400, then 404,
 * then 409/422); every write in one transaction. Every write carries a version key from the
 * replica, and a deletion leaves a tombstone, so gossip can replicate them (replica.ts). Ids are
 * made without coordination for that reason (docs/decisions.md §5). A new service is admitted by the
 * cluster's allocator first (allocator.ts): that is what holds max_services cluster-wide.
 */
import { type Clock, isoTime } from '../domain/clock.js';
import { ApiError, invalidRequest, notFound } from '../domain/errors.js';
import { type HealthCheck, parseHealthCheck, sameHealthCheck } from '../domain/health-check.js';
import { newRouteId, newServiceId } from '../domain/ids.js';
import {
  checkRoute,
  checkService,
  interfaceCidr,
  type RouteShape,
  routeCidr,
  type ServiceCreateFields,
  serviceShapeOf,
} from '../domain/service-rules.js';
import type { EventActor } from '../events/event-log.js';
import type { RouteRecord, ServiceRecord, TransportType } from '../store/records.js';
import type { ServiceFilter, Store } from '../store/store.js';
import type { Admission, ServiceClaim } from './allocator.js';
import type { Replica } from './replica.js';
import { DELETED_RANK, keyOf, LIVE_RANK, parseVkey } from './replicated-records.js';

export interface ServiceCreate extends ServiceCreateFields {
  bandwidth_limit_mbps?: number;
  /** Absent or null: no check. Checked here (domain/health-check.ts), whatever the caller checked. */
  health_check?: unknown;
}

export interface ServiceUpdate {
  requires_interface?: boolean;
  desired_ipv4_cidr?: string | null;
  desired_ipv6_cidr?: string | null;
  bandwidth_limit_mbps?: number;
  /** Absent: unchanged; null: removed; otherwise replaced whole. */
  health_check?: unknown;
  // Fields fixed at creation: accepted only with their current value, so that a request to
  // change them is refused instead of silently ignored.
  transport_type?: string;
  fully_transparent?: boolean;
  source_peer_id?: string;
  target_peer_id?: string;
}

export interface RouteInput {
  priority: number;
  source_cidr?: string | null;
  dest_cidr?: string | null;
}

export class ServiceConfig {
  constructor(
    private readonly store: Store,
    private readonly clock: Clock,
    private readonly replica: Pick<Replica, 'nextVkey' | 'change'>,
    private readonly admission: Admission,
  ) {}

  list(filter: ServiceFilter): { service: ServiceRecord; routeCount: number }[] {
    return this.store
      .services(filter)
      .map((service) => ({ service, routeCount: this.store.routeCount(service.id) }));
  }

  get(id: string): { service: ServiceRecord; routes: readonly RouteRecord[] } {
    const service = this.store.service(id);
    if (!service) throw notFound(`no service with id ${id}`);
    return { service, routes: this.store.routesOf(id) };
  }

  /** Every write takes its `actor`: who asked, for its config event (docs/events.md). */
  async create(input: ServiceCreate, actor: EventActor): Promise<ServiceRecord> {
    const state = this.store.agentState();
    if (!state) throw notFound('this agent is not bootstrapped');
    const shape = serviceShapeOf(input, state.localPeerId);
    const cidrs = checkService(shape);
    const healthCheck = healthCheckInput(input.health_check) ?? null;
    const now = isoTime(this.clock.now());
    const unstamped = {
      id: newServiceId(),
      ...shape,
      ...cidrs,
      transportType: shape.transportType as TransportType,
      bandwidthLimitMbps: input.bandwidth_limit_mbps ?? 0,
      healthCheck,
      version: 1,
      createdAt: now,
      updatedAt: now,
    };
    // The local checks first, so that what this agent can already refuse costs no round trip.
    this.checkCreate(unstamped, state.license.max_services);
    await this.admission.admitService(unstamped);
    // Stamped only after admission: the allocator's answer moved our hybrid clock past every
    // deletion it had seen, so this service sorts after any earlier holder of the pair.
    const vkey = this.replica.nextVkey(undefined, LIVE_RANK);
    const record: ServiceRecord = { ...unstamped, vkey, createdStamp: parseVkey(vkey)!.stamp };
    return this.store.transaction(() => {
      this.checkCreate(record, state.license.max_services);
      this.replica.change(keyOf('service', record.id), actor, () => this.store.insertService(record));
      return record;
    });
  }

  private checkCreate(record: ServiceClaim, maxServices: number): void {
    if (!this.store.peer(record.targetPeerId)) throw notFound(`target peer ${record.targetPeerId} not found`);
    if (!this.store.peer(record.sourcePeerId)) throw notFound(`source peer ${record.sourcePeerId} not found`);
    if (this.store.serviceIdForPair(record.sourcePeerId, record.targetPeerId)) {
      throw new ApiError(
        'ALREADY_EXISTS',
        'a service from this source peer to this target peer already exists',
      );
    }
    // Inactive services count too (docs/decisions.md §5).
    if (this.store.serviceCount() >= maxServices) {
      throw new ApiError(
        'SERVICE_LIMIT_EXCEEDED',
        `the license allows ${maxServices} services and the cluster has that many`,
      );
    }
  }

  update(id: string, input: ServiceUpdate, actor: EventActor): ServiceRecord {
    // What the body gets wrong on its own is a 400 before any lookup (docs/decisions.md §3 order).
    interfaceCidr(input.desired_ipv4_cidr ?? null, 4, 'desired_ipv4_cidr');
    interfaceCidr(input.desired_ipv6_cidr ?? null, 6, 'desired_ipv6_cidr');
    const healthCheck = healthCheckInput(input.health_check);
    return this.store.transaction(() => {
      const current = this.store.service(id);
      // Changing a fixed field is a 400 that needs the current value, so it follows the 404.
      if (!current) throw notFound(`no service with id ${id}`);
      const fixed: [keyof ServiceUpdate, unknown][] = [
        ['transport_type', current.transportType],
        ['fully_transparent', current.fullyTransparent],
        ['source_peer_id', current.sourcePeerId],
        ['target_peer_id', current.targetPeerId],
      ];
      for (const [field, value] of fixed) {
        if (input[field] !== undefined && input[field] !== value) {
          throw invalidRequest(`${field} cannot be changed; delete the service and create it again`);
        }
      }
      const next = {
        ...current,
        requiresInterface: input.requires_interface ?? current.requiresInterface,
        desiredIpv4Cidr:
          input.desired_ipv4_cidr === undefined ? current.desiredIpv4Cidr : input.desired_ipv4_cidr,
        desiredIpv6Cidr:
          input.desired_ipv6_cidr === undefined ? current.desiredIpv6Cidr : input.desired_ipv6_cidr,
        bandwidthLimitMbps: input.bandwidth_limit_mbps ?? current.bandwidthLimitMbps,
        healthCheck: healthCheck === undefined ? current.healthCheck : healthCheck,
      };
      // Turning the interface off clears addresses the request did not name, rather than refuse.
      if (input.requires_interface === false) {
        if (input.desired_ipv4_cidr === undefined) next.desiredIpv4Cidr = null;
        if (input.desired_ipv6_cidr === undefined) next.desiredIpv6Cidr = null;
      }
      const cidrs = checkService(next);
      const candidate = { ...next, ...cidrs };
      const changed =
        (['requiresInterface', 'desiredIpv4Cidr', 'desiredIpv6Cidr', 'bandwidthLimitMbps'] as const).some(
          (k) => candidate[k] !== current[k],
        ) || !sameHealthCheck(candidate.healthCheck, current.healthCheck);
      // An update that changes nothing writes nothing: no version bump, nothing to replicate.
      if (!changed) return current;
      const updated: ServiceRecord = {
        ...candidate,
        version: current.version + 1,
        updatedAt: isoTime(this.clock.now()),
        vkey: this.replica.nextVkey(current.vkey, LIVE_RANK),
      };
      this.replica.change(keyOf('service', id), actor, () => this.store.updateService(updated));
      return updated;
    });
  }

  /** Deletes the service (its routes go with it) and leaves a tombstone for gossip. */
  delete(id: string, actor: EventActor): void {
    this.store.transaction(() => {
      const current = this.store.service(id);
      if (!current) throw notFound(`no service with id ${id}`);
      this.replica.change(keyOf('service', id), actor, () => {
        this.store.deleteService(id);
        this.store.putTombstone({
          key: keyOf('service', id),
          vkey: this.replica.nextVkey(current.vkey, DELETED_RANK),
          arrivedAt: this.clock.now(),
        });
      });
    });
  }

  routes(serviceId: string): readonly RouteRecord[] {
    if (!this.store.service(serviceId)) throw notFound(`no service with id ${serviceId}`);
    return this.store.routesOf(serviceId);
  }

  /** All routes or none: every route is checked before anything is written. */
  addRoutes(serviceId: string, inputs: RouteInput[], actor: EventActor): number[] {
    if (inputs.length === 0) throw invalidRequest('routes must hold at least one route');
    const checked = inputs.map((r, i) => checkRoute(toShape(r), `routes[${i}]`));
    const now = isoTime(this.clock.now());
    return this.store.transaction(() => {
      if (!this.store.service(serviceId)) throw notFound(`no service with id ${serviceId}`);
      const ids: number[] = [];
      for (const shape of checked) {
        let id = newRouteId();
        // 2^53 ids make a collision all but impossible; checking costs one indexed read.
        while (this.store.route(id) || ids.includes(id)) id = newRouteId();
        ids.push(id);
        this.replica.change(keyOf('route', id), actor, () =>
          this.store.insertRoute({
            id,
            serviceId,
            ...shape,
            version: 1,
            createdAt: now,
            updatedAt: now,
            vkey: this.replica.nextVkey(undefined, LIVE_RANK),
          }),
        );
      }
      return ids;
    });
  }

  updateRoute(
    serviceId: string,
    routeId: number,
    input: Partial<RouteInput>,
    actor: EventActor,
  ): RouteRecord {
    routeCidr(input.source_cidr ?? null, 'source_cidr');
    routeCidr(input.dest_cidr ?? null, 'dest_cidr');
    return this.store.transaction(() => {
      const current = this.requireRoute(serviceId, routeId);
      const shape = checkRoute({
        priority: input.priority ?? current.priority,
        sourceCidr: input.source_cidr === undefined ? current.sourceCidr : input.source_cidr,
        destCidr: input.dest_cidr === undefined ? current.destCidr : input.dest_cidr,
      });
      const updated: RouteRecord = {
        ...current,
        ...shape,
        version: current.version + 1,
        updatedAt: isoTime(this.clock.now()),
        vkey: this.replica.nextVkey(current.vkey, LIVE_RANK),
      };
      this.replica.change(keyOf('route', routeId), actor, () => this.store.updateRoute(updated));
      return updated;
    });
  }

  deleteRoute(serviceId: string, routeId: number, actor: EventActor): void {
    this.store.transaction(() => {
      const current = this.requireRoute(serviceId, routeId);
      this.replica.change(keyOf('route', routeId), actor, () => {
        this.store.deleteRoute(routeId);
        this.store.putTombstone({
          key: keyOf('route', routeId),
          vkey: this.replica.nextVkey(current.vkey, DELETED_RANK),
          arrivedAt: this.clock.now(),
        });
      });
    });
  }

  /** The route, if it exists and belongs to the service; 404 when either is missing. */
  private requireRoute(serviceId: string, routeId: number): RouteRecord {
    if (!this.store.service(serviceId)) throw notFound(`no service with id ${serviceId}`);
    const route = this.store.route(routeId);
    if (!route || route.serviceId !== serviceId)
      throw notFound(`no route ${routeId} in service ${serviceId}`);
    return route;
  }
}

/** health_check of a request: undefined when absent, null when null, else its canonical form (or 400). */
function healthCheckInput(value: unknown): HealthCheck | null | undefined {
  return value === undefined || value === null ? value : parseHealthCheck(value);
}

const toShape = (r: RouteInput): RouteShape => ({
  priority: r.priority,
  sourceCidr: r.source_cidr ?? null,
  destCidr: r.dest_cidr ?? null,
});
