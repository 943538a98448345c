/**
 * Which scope guards which route: the one declarative table of the API document's Endpoints
 * part. `api/authorize.ts` enforces it for every request; `buildApp` refuses to start with a
 * route missing here, so a new route cannot ship unguarded by accident.
 */
import type { ScopeName } from '../domain/scopes.js';

/** `public`: no token. `any-read`: any *.read scope or admin (DECISIONS §7, /metrics). */
export type RouteGuard = ScopeName | 'public' | 'any-read';

export const ROUTE_SCOPES: Readonly<Record<string, RouteGuard>> = {
  'GET /livez': 'public',
  'GET /readyz': 'public',
  'GET /openapi.json': 'public',
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
};

export const routeKey = (method: string, url: string): string =>
  `${method === 'HEAD' ? 'GET' : method} ${url}`;
