/**
 * The management API as a Fastify app built from its dependencies (no globals, no I/O of its
 * own beyond HTTP), so tests build it on port 0 and the agent builds it once.
 */
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import { Ajv } from 'ajv';
import addFormats from 'ajv-formats';
import Fastify, { type FastifyInstance, type FastifyServerOptions, LogController } from 'fastify';
import type { Logger } from 'pino';
import type { AccessTokens } from '../auth/access-tokens.js';
import type { Credentials } from '../auth/credentials.js';
import type { ReportAuthFailure } from '../auth/failure-report.js';
import type { TokenEndpoint } from '../auth/token-endpoint.js';
import type { BootstrapDeps } from '../cluster/bootstrap.js';
import type { ClusterCredential } from '../cluster/cluster-credential.js';
import type { Identity } from '../cluster/identity.js';
import type { Peers } from '../cluster/peers.js';
import type { ServiceConfig } from '../cluster/service-config.js';
import type { ServiceDataPlaneStatus } from '../dataplane/dataplane.js';
import type { Clock } from '../domain/clock.js';
import { ApiError } from '../domain/errors.js';
import type { RecordObserved } from '../domain/observed-event.js';
import { ALL_SCOPES, SCOPE_PREFIX } from '../domain/scopes.js';
import type { EventLog } from '../events/event-log.js';
import type { Store } from '../store/store.js';
import type { Webhooks } from '../webhooks/webhooks.js';
import { makeAuthorizeHook } from './authorize.js';
import { replyToClientError, replyWithError } from './error-reply.js';
import type { ExplainRequest } from './explain-local.js';
import { limitRefusedEvent } from './limit-refusals.js';
import type { ApiMetrics } from './metrics.js';
import { guardFor, openApiSecurity } from './route-scopes.js';
import { registerBootstrapRoutes } from './routes/bootstrap.js';
import { registerClusterRoutes } from './routes/cluster.js';
import { registerConsoleRoutes } from './routes/console.js';
import { registerCredentialRoutes } from './routes/credentials.js';
import { registerDataPlaneRoutes } from './routes/dataplane.js';
import { registerEventRoutes } from './routes/events.js';
import { registerExplainRoutes } from './routes/explain.js';
import { registerGossipRoutes } from './routes/gossip.js';
import { registerHandshakeRoutes } from './routes/handshake.js';
import { registerHealthRoutes } from './routes/health.js';
import { registerOAuthRoutes } from './routes/oauth.js';
import { registerOperatorRoutes } from './routes/operator.js';
import { registerPeerRoutes } from './routes/peers.js';
import { registerServiceRoutes } from './routes/services.js';
import { registerWebhookRoutes } from './routes/webhooks.js';
import type { PeerLivenessView } from './views.js';

export interface HealthReport {
  /** Why the process cannot serve at all (empty when live). */
  liveReasons: string[];
  /** Why it should not take traffic now (empty when ready). */
  readyReasons: string[];
  /** What works less well than asked, though the agent is ready (/readyz `warnings`). */
  warnings: string[];
}

export interface AppDeps {
  store: Store;
  /** The agent's event log: GET /v1/events and its stream read it. */
  events: EventLog;
  /** `/v1/webhooks` (extension): signed deliveries of the event log. */
  webhooks: Webhooks;
  identity: Identity;
  tokens: AccessTokens;
  tokenEndpoint: TokenEndpoint;
  credentials: Credentials;
  clusterCredential: ClusterCredential;
  services: ServiceConfig;
  peers: Peers;
  /** POST /v1/cluster/sync: run heartbeats, anti-entropy and subsystems now; resolves when done. */
  sync: () => Promise<void>;
  /** GET /v1/services/{id}'s `dataplane` field: undefined where no data plane runs. */
  dataplaneStatus?: (serviceId: string) => ServiceDataPlaneStatus | undefined;
  /** GET /v1/dataplane (routes/dataplane.ts): the report, or why this agent runs no data plane. */
  dataplaneReport: () => Promise<unknown>;
  /** GET/POST /v1/explain at this agent (explain-local.ts). */
  explain: (request: ExplainRequest) => Promise<unknown>;
  /** The same asked of another agent over the gossip channel; rejects with the ApiError to answer. */
  explainAt: (peerId: string, request: ExplainRequest) => Promise<unknown>;
  /** A peer's liveness as this agent observes it (gossip failure detection). */
  liveness: (peerId: string) => PeerLivenessView;
  /** Answers POST /internal/v1/gossip (cluster/gossip.ts). */
  gossip: (envelope: unknown) => Promise<{ status: number; body: unknown }>;
  /** Counts a gossip request refused before its envelope could be read, as `malformed`. */
  gossipUnreadable: () => void;
  bootstrap: BootstrapDeps;
  clock: Clock;
  publicUrl: string;
  version: string;
  health: () => HealthReport;
  logger: Logger;
  metrics: ApiMetrics;
  /** `--metrics-public`: /metrics without a token. */
  metricsPublic: boolean;
  https?: { cert: Buffer; key: Buffer } | undefined;
  /** Runtime events the API observes (`license.limit_refused`); absent: none are recorded. */
  observed?: RecordObserved | undefined;
  /** Refused bearer tokens, counted into the aggregated `auth.failures` event. */
  reportAuthFailure?: ReportAuthFailure | undefined;
}

export const BODY_LIMIT_BYTES = 1024 * 1024;
/**
 * The most a request may take to arrive whole, body included: without it a client that sends
 * headers and then stalls holds a connection and what it sent for good. 1 MiB in 30 s is 35 KB/s.
 * Node checks every CONNECTION_CHECK_MS; a tunnel, once upgraded, is no longer a request.
 */
export const REQUEST_TIMEOUT_MS = 30_000;
const CONNECTION_CHECK_MS = 1000;
/** Fastify's own default: peers' gossip clients keep their connections longer than Node's 5 s. */
const KEEP_ALIVE_TIMEOUT_MS = 72_000;
/** Requests slower than this are logged at warn whatever their status. */
const SLOW_REQUEST_MS = 1000;
const ALL_METHODS = ['GET', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS'] as const;

export async function buildApp(deps: AppDeps): Promise<FastifyInstance> {
  const options: FastifyServerOptions = {
    loggerInstance: deps.logger,
    bodyLimit: BODY_LIMIT_BYTES,
    // A caller's request id is kept when it is short and plain, so it can be followed across
    // agents; anything else is replaced rather than written into the log.
    genReqId: (req) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && /^[A-Za-z0-9._-]{1,64}$/.test(given) ? given : randomUUID();
    },
    onProtoPoisoning: 'error',
    onConstructorPoisoning: 'error',
    return503OnClosing: true,
    clientErrorHandler: replyToClientError,
    forceCloseConnections: 'idle',
    // Fastify's own request lines log the raw URL, query string included, where a careless
    // client may put a token. One line per request is written below instead, without the query.
    logController: new LogController({ disableRequestLogging: true }),
    routerOptions: { ignoreTrailingSlash: false, maxParamLength: 10_000 },
  };
  // The server is made here for its timeouts: Node looks for stalled requests every 30 s unless
  // told otherwise at creation, and a request's time runs out only once the headers' own has.
  const timeouts = {
    requestTimeout: REQUEST_TIMEOUT_MS,
    headersTimeout: REQUEST_TIMEOUT_MS,
    connectionsCheckingInterval: CONNECTION_CHECK_MS,
  };
  const app = Fastify({
    ...options,
    // Fastify still reads it for its scheme (its listening origin); the server is ours.
    ...(deps.https ? { https: deps.https } : {}),
    serverFactory: (handler, fastifyOptions) => {
      const server = deps.https
        ? https.createServer({ ...deps.https, ...timeouts }, handler)
        : http.createServer(timeouts, handler);
      // What Fastify sets on a server it makes itself: idle kept-alive connections 72 s.
      server.keepAliveTimeout = Number(fastifyOptions.keepAliveTimeout ?? KEEP_ALIVE_TIMEOUT_MS);
      return server;
    },
  } as FastifyServerOptions) as unknown as FastifyInstance;

  // Bodies are validated exactly as sent: no type coercion ("1" is not 1) and no stripping of
  // unknown fields (a license's extra field must break its signature, not vanish). Query
  // strings and path parameters arrive as text, so there booleans and integers are coerced.
  const bodyAjv = addFormats.default(
    new Ajv({ coerceTypes: false, useDefaults: true, removeAdditional: false, strict: false }),
  );
  const textAjv = addFormats.default(
    new Ajv({ coerceTypes: true, useDefaults: true, removeAdditional: false, strict: false }),
  );
  app.setValidatorCompiler(({ schema, httpPart }) =>
    (httpPart === 'body' ? bodyAjv : textAjv).compile(schema),
  );

  // The token endpoint reads the raw form itself (repeated parameters are an error there).
  app.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string' }, (_req, body, done) =>
    done(null, body),
  );
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-request-id', request.id);
    done();
  });
  app.addHook('onResponse', (request, reply, done) => {
    const status = reply.statusCode;
    deps.metrics.observe(request.method, request.routeOptions.url, status, reply.elapsedTime / 1000);
    const ms = Math.round(reply.elapsedTime * 10) / 10;
    // Successes are debug: at info, a line per request cost a management read about a third of
    // its time (bench/api/ladder.ts). Refusals, faults and slow answers stay visible at info.
    const level = status >= 500 ? 'error' : ms >= SLOW_REQUEST_MS ? 'warn' : status >= 400 ? 'info' : 'debug';
    if ((request.log as Logger).isLevelEnabled(level)) {
      request.log[level](
        {
          method: request.method,
          path: request.url.split('?')[0],
          route: request.routeOptions.url,
          status,
          ms,
          remote: request.ip,
        },
        'request',
      );
    }
    done();
  });

  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info: {
        title: 'mesh-agent management API',
        version: deps.version,
        description: 'Follows docs/api.md and docs/decisions.md. Errors: {error, code}; see docs/errors.md.',
      },
      servers: [{ url: deps.publicUrl }],
      components: {
        securitySchemes: {
          oauth2: {
            type: 'oauth2',
            flows: {
              clientCredentials: {
                tokenUrl: '/v1/oauth/token',
                scopes: Object.fromEntries(ALL_SCOPES.map((s) => [s, s.slice(SCOPE_PREFIX.length)])),
              },
            },
          },
        },
      },
    },
  });

  app.setErrorHandler(replyWithError);
  const observed = deps.observed;
  if (observed) {
    app.addHook('onError', (request, _reply, error, done) => {
      const event = limitRefusedEvent(error, request, deps.store.agentState()?.license);
      if (event) observed(event);
      done();
    });
  }
  app.setNotFoundHandler(async () => {
    throw new ApiError('NOT_FOUND', 'no such path');
  });

  const methodsByUrl = new Map<string, Set<string>>();
  app.addHook('onRoute', (route) => {
    if ((route.config as { methodNotAllowed?: boolean } | undefined)?.methodNotAllowed) return;
    if (route.schema?.security !== undefined) {
      throw new Error(`route ${route.url} states its OpenAPI security; it is written from ROUTE_SCOPES`);
    }
    for (const method of [route.method].flat()) {
      if (method === 'HEAD') continue;
      const guard = guardFor(method, route.url);
      if (guard === undefined) {
        throw new Error(`route ${method} ${route.url} has no entry in ROUTE_SCOPES`);
      }
      // The document states the scope that authorize.ts enforces, from the same table.
      const security = openApiSecurity(guard);
      if (security && route.schema) route.schema = { ...route.schema, security };
      const set = methodsByUrl.get(route.url) ?? new Set<string>();
      set.add(method);
      methodsByUrl.set(route.url, set);
    }
  });
  app.addHook(
    'onRequest',
    makeAuthorizeHook(
      deps.tokens,
      deps.store,
      deps.metricsPublic ? { 'GET /metrics': 'public' } : {},
      deps.reportAuthFailure,
    ),
  );

  registerHealthRoutes(app, deps);
  registerBootstrapRoutes(app, deps);
  registerOAuthRoutes(app, deps);
  registerClusterRoutes(app, deps);
  registerCredentialRoutes(app, deps);
  registerPeerRoutes(app, deps);
  registerServiceRoutes(app, deps);
  registerExplainRoutes(app, deps);
  registerDataPlaneRoutes(app, deps);
  registerHandshakeRoutes(app, deps);
  registerGossipRoutes(app, deps);
  registerOperatorRoutes(app, deps);
  registerWebhookRoutes(app, deps);
  registerEventRoutes(app, deps);
  // The rendered API reference; Swagger UI's assets come from the npm package, not a CDN.
  await app.register(swaggerUi, { routePrefix: '/docs' });
  // The web console (docs/console.md): built files from disk, public like /docs.
  registerConsoleRoutes(app, deps);
  app.get(
    '/openapi.json',
    { schema: { tags: ['docs'], summary: 'This OpenAPI 3.1 document (public)' } },
    async () => app.swagger(),
  );

  // A known path with the wrong method is 405 with Allow (docs/decisions.md §3), not 404.
  for (const [url, methods] of methodsByUrl) {
    const missing = ALL_METHODS.filter((m) => !methods.has(m));
    if (missing.length === 0) continue;
    const allow = [...methods, ...(methods.has('GET') ? ['HEAD'] : [])].join(', ');
    app.route({
      method: missing,
      url,
      config: { methodNotAllowed: true },
      schema: { hide: true },
      handler: async () => {
        throw new ApiError('METHOD_NOT_ALLOWED', `method not allowed; use ${allow}`, { Allow: allow });
      },
    });
  }
  return app;
}
