/** `/v1/services` and `/v1/services/{service_id}/routes`: the replicated service configuration. */
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { ServiceCreate, ServiceUpdate } from '../../cluster/service-config.js';
import { invalidRequest } from '../../domain/errors.js';
import { isServiceActive } from '../../domain/service-rules.js';
import type { AppDeps } from '../app.js';
import { requestActor } from '../authorize.js';
import type { ValidationCodes } from '../error-reply.js';
import {
  Deleted,
  errorResponses,
  IdParam,
  Route,
  RouteIdParam,
  RoutesCreateBody,
  RoutesCreated,
  RouteUpdateBody,
  ServiceCreateBody,
  ServiceCreated,
  ServiceListItem,
  ServiceSingle,
  ServiceUpdateBody,
} from '../schemas.js';
import {
  dataplaneView,
  failoverView,
  routeView,
  serviceCreatedView,
  serviceListView,
  serviceSingleView,
  transparentReadinessView,
} from '../views.js';

const serviceParams = Type.Object({ id: IdParam });
const routeParams = Type.Object({ service_id: IdParam, route_id: RouteIdParam });
/**
 * The route id in a path is plain decimal digits. Path parameters are coerced to their schema
 * type, and that coercion alone would take `1e3`, `0x10`, ` 5`, `+5`, `007` or `12.0` as route
 * ids; this check runs first (preValidation), so they are 400 like any other malformed value.
 * The schema still bounds the value to [1, 2^53 - 1].
 */
const ROUTE_ID_TEXT = /^[1-9][0-9]*$/;
async function strictRouteId(request: Pick<FastifyRequest, 'params'>): Promise<void> {
  const raw = (request.params as { route_id?: unknown }).route_id;
  if (typeof raw === 'string' && !ROUTE_ID_TEXT.test(raw)) {
    throw invalidRequest(
      `route_id must be a positive decimal integer, not ${JSON.stringify(raw.slice(0, 40))}`,
    );
  }
}

const transportCodes: ValidationCodes = { validationCodes: { transport_type: 'INVALID_TRANSPORT' } };
const cidrCodes: ValidationCodes = {
  validationCodes: { source_cidr: 'INVALID_CIDR', dest_cidr: 'INVALID_CIDR' },
};

/** Filter combinations whose rendered list is kept; more are rendered on each request. */
const MAX_RENDERED_LISTS = 64;

export function registerServiceRoutes(app: FastifyInstance, deps: AppDeps): void {
  const { services, store } = deps;
  // The list is rendered (with the route's own response schema) once per store generation and
  // filter: a hundred services make a 40 KB body that changes only when something is written.
  const renderedLists = new Map<string, string>();
  let renderedGeneration = -1;

  app.get(
    '/v1/services',
    {
      schema: {
        tags: ['services'],
        summary: 'List services (list form), filtered by any of the query fields',
        querystring: Type.Object({
          source_peer_id: Type.Optional(IdParam),
          target_peer_id: Type.Optional(IdParam),
          requires_interface: Type.Optional(Type.Boolean()),
        }),
        response: { 200: Type.Array(ServiceListItem), ...errorResponses(400, 401, 403) },
      },
    },
    async (request, reply) => {
      const q = request.query as {
        source_peer_id?: string;
        target_peer_id?: string;
        requires_interface?: boolean;
      };
      if (renderedGeneration !== store.generation) {
        renderedLists.clear();
        renderedGeneration = store.generation;
      }
      const key = `${q.source_peer_id ?? ''} ${q.target_peer_id ?? ''} ${q.requires_interface ?? ''}`;
      let body = renderedLists.get(key);
      if (body === undefined) {
        const active = new Set(store.activePeerIds());
        const list = services
          .list({
            sourcePeerId: q.source_peer_id,
            targetPeerId: q.target_peer_id,
            requiresInterface: q.requires_interface,
          })
          .map(({ service, routeCount }) =>
            serviceListView(service, routeCount, isServiceActive(service, active)),
          );
        // The typings take only objects; the serializer of the 200 schema takes the array as it is.
        body = reply.serializeInput(list as unknown as Record<string, unknown>, '200') as string;
        if (renderedLists.size < MAX_RENDERED_LISTS) renderedLists.set(key, body);
      }
      return reply.type('application/json; charset=utf-8').send(body);
    },
  );

  app.get(
    '/v1/services/:id',
    {
      schema: {
        tags: ['services'],
        summary: 'One service (single form, with its routes)',
        params: serviceParams,
        response: { 200: ServiceSingle, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const { service, routes } = services.get((request.params as { id: string }).id);
      const single = serviceSingleView(
        service,
        routes,
        isServiceActive(service, new Set(store.activePeerIds())),
      );
      // The extra fields exist only where a data plane runs (an agent with --dataplane off has none).
      const status = deps.dataplaneStatus?.(service.id);
      if (!status) return single;
      return {
        ...single,
        ...failoverView(status, single.routes),
        ...transparentReadinessView(service, status),
        dataplane: dataplaneView(status),
      };
    },
  );

  app.post(
    '/v1/services',
    {
      config: transportCodes,
      schema: {
        tags: ['services'],
        summary: 'Create a service (create form); unique per (source, target) pair',
        body: ServiceCreateBody,
        response: { 201: ServiceCreated, ...errorResponses(400, 401, 403, 404, 409, 413, 422, 503) },
      },
    },
    async (request, reply) => {
      const created = await services.create(
        request.body as ServiceCreate,
        requestActor(deps.events, request),
      );
      request.log.info({ service_id: created.id }, 'service created');
      return reply.code(201).send(serviceCreatedView(created));
    },
  );

  app.put(
    '/v1/services/:id',
    {
      config: transportCodes,
      schema: {
        tags: ['services'],
        summary: 'Change a service; only the fields given change; answers with the single form',
        params: serviceParams,
        body: ServiceUpdateBody,
        response: { 200: ServiceSingle, ...errorResponses(400, 401, 403, 404, 413) },
      },
    },
    async (request) => {
      const id = (request.params as { id: string }).id;
      const updated = services.update(
        id,
        request.body as ServiceUpdate & Static<typeof ServiceUpdateBody>,
        requestActor(deps.events, request),
      );
      request.log.info({ service_id: id, version: updated.version }, 'service updated');
      return serviceSingleView(
        updated,
        store.routesOf(id),
        isServiceActive(updated, new Set(store.activePeerIds())),
      );
    },
  );

  app.delete(
    '/v1/services/:id',
    {
      schema: {
        tags: ['services'],
        summary: 'Delete a service and all its routes',
        params: serviceParams,
        response: { 200: Deleted, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const id = (request.params as { id: string }).id;
      services.delete(id, requestActor(deps.events, request));
      request.log.info({ service_id: id }, 'service deleted');
      return { deleted: true as const };
    },
  );

  app.get(
    '/v1/services/:service_id/routes',
    {
      schema: {
        tags: ['routes'],
        summary: "A service's routes",
        params: Type.Object({ service_id: IdParam }),
        response: { 200: Type.Array(Route), ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => services.routes((request.params as { service_id: string }).service_id).map(routeView),
  );

  app.post(
    '/v1/services/:service_id/routes',
    {
      config: cidrCodes,
      schema: {
        tags: ['routes'],
        summary: 'Add routes: all of them or none',
        params: Type.Object({ service_id: IdParam }),
        body: RoutesCreateBody,
        response: { 201: RoutesCreated, ...errorResponses(400, 401, 403, 404, 413) },
      },
    },
    async (request, reply) => {
      const serviceId = (request.params as { service_id: string }).service_id;
      const ids = services.addRoutes(
        serviceId,
        (request.body as Static<typeof RoutesCreateBody>).routes,
        requestActor(deps.events, request),
      );
      request.log.info({ service_id: serviceId, count: ids.length }, 'routes added');
      return reply.code(201).send({ route_ids: ids, count: ids.length });
    },
  );

  app.put(
    '/v1/services/:service_id/routes/:route_id',
    {
      config: cidrCodes,
      preValidation: strictRouteId,
      schema: {
        tags: ['routes'],
        summary: 'Change a route; only the fields given change',
        params: routeParams,
        body: RouteUpdateBody,
        response: { 200: Route, ...errorResponses(400, 401, 403, 404, 413) },
      },
    },
    async (request) => {
      const { service_id, route_id } = request.params as { service_id: string; route_id: number };
      return routeView(
        services.updateRoute(
          service_id,
          route_id,
          request.body as Static<typeof RouteUpdateBody>,
          requestActor(deps.events, request),
        ),
      );
    },
  );

  app.delete(
    '/v1/services/:service_id/routes/:route_id',
    {
      preValidation: strictRouteId,
      schema: {
        tags: ['routes'],
        summary: 'Delete a route',
        params: routeParams,
        response: { 200: Deleted, ...errorResponses(400, 401, 403, 404) },
      },
    },
    async (request) => {
      const { service_id, route_id } = request.params as { service_id: string; route_id: number };
      services.deleteRoute(service_id, route_id, requestActor(deps.events, request));
      return { deleted: true as const };
    },
  );
}
