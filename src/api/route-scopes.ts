/**
 * Which scope guards which route: the one declarative table of the API document's Endpoints
 * part. `api/authorize.ts` enforces it for every request; `buildApp` refuses to start with a
 * route missing here, so a new route cannot ship unguarded by accident, and writes each
 * operation's OpenAPI `security` from it (`openApiSecurity`), so route files do not restate it.
 */
import { ADMIN, ALL_SCOPES, type Scope, type ScopeName, scope } from '../domain/scopes.js';

/**
 * `public`: no token. `any-read`: any *.read scope or admin (docs/decisions.md §7, /metrics).
 * `peer-signed`: agent-to-agent, no token; the handler checks Ed25519 signatures.
 */
export type RouteGuard = ScopeName | 'public' | 'any-read' | 'peer-signed';

export const ROUTE_SCOPES: Readonly<Record<string, RouteGuard>> = {
  'GET /livez': 'public',
  'GET /readyz': 'public',
  'GET /openapi.json': 'public',
  'GET /metrics': 'any-read',
  'GET /v1/cluster/license': 'admin',
  'POST /v1/bootstrap': 'public',
  'POST /v1/oauth/token': 'public',
  'GET /.well-known/openid-configuration': 'public',
  'GET /.well-known/jwks.json': 'public',
  'GET /v1/cluster/identity': 'public',

  'GET /v1/credentials': 'credentials.read',
  'POST /v1/credentials': 'credentials.write',
  'DELETE /v1/credentials/:client_id': 'credentials.write',

  'GET /v1/cluster/credentials': 'admin',
  'POST /v1/cluster/credentials/rotate': 'credentials.write',

  'GET /v1/peers': 'peers.read',
  'GET /v1/peers/:id': 'peers.read',
  'POST /v1/peers': 'peers.write',
  'PUT /v1/peers/:id': 'peers.write',
  'DELETE /v1/peers/:id': 'peers.write',
  'DELETE /v1/peers/self': 'admin',

  'POST /v1/cluster/init': 'admin',
  'POST /v1/cluster/sync': 'admin',
  'POST /internal/v1/handshake/hello': 'peer-signed',
  'POST /internal/v1/handshake/confirm': 'peer-signed',
  'POST /internal/v1/gossip': 'peer-signed',

  'GET /v1/services': 'services.read',
  'GET /v1/services/:id': 'services.read',
  'POST /v1/services': 'services.write',
  'PUT /v1/services/:id': 'services.write',
  'DELETE /v1/services/:id': 'services.write',
  'GET /v1/services/:service_id/routes': 'services.read',
  'POST /v1/services/:service_id/routes': 'services.write',
  'PUT /v1/services/:service_id/routes/:route_id': 'services.write',
  'DELETE /v1/services/:service_id/routes/:route_id': 'services.write',
  // Extensions (docs/decisions.md §7): explain reads only, a proposed change included.
  'GET /v1/explain': 'services.read',
  'POST /v1/explain': 'services.read',
  'GET /v1/dataplane': 'services.read',

  // Extension (docs/events.md, "Webhooks"): a webhook receives every event, so admin only.
  'GET /v1/webhooks': 'admin',
  'POST /v1/webhooks': 'admin',
  'GET /v1/webhooks/:id': 'admin',
  'DELETE /v1/webhooks/:id': 'admin',
  'POST /v1/webhooks/:id/test': 'admin',

  // Extensions (docs/events.md): admin, or the extension scope events.read.
  'GET /v1/events': 'events.read',
  'GET /v1/events/stream': 'events.read',

  // Extensions (docs/console.md): `mesh-agent ui`'s one-time code, for any reading caller, and
  // its redemption, where the code itself is the proof.
  'POST /v1/console/codes': 'any-read',
  'POST /v1/console/session': 'public',
};

export const routeKey = (method: string, url: string): string =>
  `${method === 'HEAD' ? 'GET' : method} ${url}`;

/**
 * The guard of a route: its ROUTE_SCOPES entry, or public for the rendered API reference under
 * /docs, whose asset routes @fastify/swagger-ui registers (docs/decisions.md §7), and for the web
 * console under /ui. `overrides` come from the command line (`--metrics-public`).
 */
export function guardFor(
  method: string,
  url: string,
  overrides: Readonly<Record<string, RouteGuard>> = {},
): RouteGuard | undefined {
  const key = routeKey(method, url);
  if (key in overrides) return overrides[key];
  if (key in ROUTE_SCOPES) return ROUTE_SCOPES[key];
  const page = (prefix: string) => url === prefix || url.startsWith(`${prefix}/`);
  // The console's files (docs/console.md) hold no data: every call it makes takes a token.
  return page('/docs') || page('/ui') ? 'public' : undefined;
}

/** The tokenless guards: no bearer token, so no OpenAPI `security`. */
export const isTokenless = (guard: RouteGuard): guard is 'public' | 'peer-signed' =>
  guard === 'public' || guard === 'peer-signed';

/** The scopes of which a token needs one for a route with this guard (`any-read`: any *.read, or admin). */
export function scopesGranting(guard: Exclude<RouteGuard, 'public' | 'peer-signed'>): Scope[] {
  return guard === 'any-read' ? [...ALL_SCOPES.filter((s) => s.endsWith('.read')), ADMIN] : [scope(guard)];
}

/** The OpenAPI `security` of an operation with this guard, or undefined for the routes that take no token. */
export function openApiSecurity(guard: RouteGuard): { oauth2: Scope[] }[] | undefined {
  return isTokenless(guard) ? undefined : [{ oauth2: scopesGranting(guard) }];
}
