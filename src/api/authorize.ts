/**
 * The one hook that enforces ROUTE_SCOPES: 401 for a missing, invalid, expired or revoked
 * token, then 403 for a scope the token lacks (docs/decisions.md §3 order: 401, 403, then validation).
 * It runs in onRequest, before the body is read, so unauthenticated callers cannot make the
 * agent parse large bodies.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { AccessTokens, VerifiedToken } from '../auth/access-tokens.js';
import type { Caller } from '../auth/credentials.js';
import type { ReportAuthFailure } from '../auth/failure-report.js';
import { ApiError, forbidden } from '../domain/errors.js';
import { grants, scope } from '../domain/scopes.js';
import type { EventActor, EventLog } from '../events/event-log.js';
import type { Store } from '../store/store.js';
import { guardFor, isTokenless, type RouteGuard, scopesGranting } from './route-scopes.js';

declare module 'fastify' {
  interface FastifyRequest {
    caller?: Caller;
  }
}

/**
 * RFC 6750 §3: every 401 names the Bearer scheme in WWW-Authenticate; a request that presented
 * a token we refuse also gets error="invalid_token" (one with no token gets no error code).
 */
const INVALID_TOKEN = 'Bearer realm="mesh-agent", error="invalid_token"';
const unauthorized = (message: string, invalidToken: boolean) =>
  new ApiError('UNAUTHORIZED', message, {
    'WWW-Authenticate': invalidToken ? INVALID_TOKEN : 'Bearer realm="mesh-agent"',
  });

/** The guards that need a token. */
type Guarded = Exclude<RouteGuard, 'public' | 'peer-signed'>;

export function makeAuthorizeHook(
  tokens: AccessTokens,
  store: Store,
  overrides: Readonly<Record<string, RouteGuard>> = {},
  reportFailure: ReportAuthFailure = () => {},
) {
  /** Everything after the token's verification: revocation, then scope. */
  const admit = (request: FastifyRequest, guard: Guarded, verified: VerifiedToken) => {
    // Checked on every request, after the verification cache: revocation takes effect at once.
    if (!store.credential(verified.clientId)) {
      throw unauthorized('the access token belongs to a revoked credential', true);
    }
    if (!scopesGranting(guard).some((s) => grants(verified.scopes, s))) {
      throw forbidden(`this operation needs the scope ${guard === 'any-read' ? 'any *.read' : scope(guard)}`);
    }
    request.caller = { clientId: verified.clientId, scopes: verified.scopes };
  };

  /** Checks a request as far as it can without waiting: an error, nothing (admitted), or a token for jose. */
  const check = (request: FastifyRequest): { error?: Error; pending?: { guard: Guarded; token: string } } => {
    const guard = guardFor(request.method, request.routeOptions.url ?? '', overrides);
    // Unknown routes (404/405 answers), public ones and signed agent-to-agent ones need no token.
    if (guard === undefined || isTokenless(guard)) return {};
    const header = request.headers.authorization;
    // The scheme name is case-insensitive (RFC 9110 §11.1); RFC 6750 allows one or more spaces.
    const match = header === undefined ? null : /^Bearer +([A-Za-z0-9._~+/-]+=*) *$/i.exec(header);
    if (!match) return { error: unauthorized('a bearer access token is required', false) };
    const token = match[1]!;
    const known = tokens.cached(token);
    if (known === 'unknown') return { pending: { guard, token } };
    if (known === 'expired') return { error: invalidToken() };
    try {
      admit(request, guard, known);
      return {};
    } catch (err) {
      return { error: err as Error };
    }
  };

  /** A token presented and refused counts towards `auth.failures`; a request with none does not. */
  const refused = (request: FastifyRequest, err: Error | undefined): Error | undefined => {
    if (
      err instanceof ApiError &&
      err.code === 'UNAUTHORIZED' &&
      err.headers['WWW-Authenticate'] === INVALID_TOKEN
    ) {
      reportFailure({ clientId: null, source: request.ip, reason: 'invalid_token' });
    }
    return err;
  };

  // A callback hook, not an async one: a token seen before is answered from the verification
  // cache without a promise; only a new token waits for jose.
  return function authorize(
    request: FastifyRequest,
    _reply: FastifyReply,
    done: (err?: Error) => void,
  ): void {
    const { error, pending } = check(request);
    if (!pending) {
      done(error && refused(request, error));
      return;
    }
    tokens.verify(pending.token).then(
      (verified) => {
        if (!verified) {
          done(refused(request, invalidToken()));
          return;
        }
        try {
          admit(request, pending.guard, verified);
          done();
        } catch (err) {
          done(refused(request, err as Error));
        }
      },
      (err: Error) => done(err),
    );
  };
}

/** Who made a write, for its config event: the token's client and this agent. */
export const requestActor = (events: EventLog, request: FastifyRequest): EventActor =>
  events.actorFor(request.caller?.clientId ?? null);

const invalidToken = () => unauthorized('the access token is invalid or expired', true);
