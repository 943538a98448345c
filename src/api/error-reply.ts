/**
 * The only place that turns errors into HTTP answers. Typed ApiErrors and OAuthErrors carry
 * their status and code; Fastify's own request errors (bad JSON, validation, body size) are
 * mapped to the documented codes; anything else is 500 INTERNAL with no detail for the caller
 * and the whole error in the log.
 */
import type { FastifyError, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError, type ErrorCode, OAuthError } from '../domain/errors.js';
import { closeInStages } from './staged-close.js';

/**
 * Routes may name a more specific code for a validation failure on one body field, as the API
 * document does for transport_type (INVALID_TRANSPORT) and route CIDRs (INVALID_CIDR).
 */
export interface ValidationCodes {
  validationCodes?: Record<string, ErrorCode>;
}

/**
 * Routes whose 400s are RFC 6749 §5.2 bodies (`{error, error_description, code}`, as their
 * response schema declares). Fastify's own request errors there (invalid JSON, empty JSON body,
 * unsupported media type) must take that shape too: in the plain `{error, code}` shape the
 * response serializer refuses them and the caller gets a 500.
 */
const OAUTH_ROUTES: ReadonlySet<string> = new Set(['/v1/oauth/token']);

export function replyWithError(error: unknown, request: FastifyRequest, reply: FastifyReply): FastifyReply {
  if (
    !(error instanceof OAuthError) &&
    !(error instanceof ApiError) &&
    OAUTH_ROUTES.has(request.routeOptions.url ?? '')
  ) {
    const fastifyError = error as FastifyError;
    const status = fastifyError.statusCode;
    const requestError =
      fastifyError.validation !== undefined ||
      (typeof status === 'number' &&
        status >= 400 &&
        status < 500 &&
        fastifyError.code?.startsWith('FST_') &&
        fastifyError.code !== 'FST_ERR_CTP_BODY_TOO_LARGE');
    if (requestError) error = new OAuthError('invalid_request', fastifyError.message);
  }
  if (error instanceof OAuthError) {
    reply.headers({ ...error.headers, 'cache-control': 'no-store', pragma: 'no-cache' });
    return reply
      .code(error.status)
      .send({ error: error.oauthCode, error_description: error.message, code: error.code });
  }
  if (error instanceof ApiError) {
    reply.headers(error.headers);
    return reply.code(error.status).send({ error: error.message, code: error.code });
  }
  const fastifyError = error as FastifyError;
  if (fastifyError.validation) {
    const code = validationCode(fastifyError, request);
    return reply.code(400).send({ error: fastifyError.message, code });
  }
  if (fastifyError.code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
    // Fastify answers with `connection: close` before the body is read.
    closeInStages(request.raw, reply.raw);
    return reply.code(413).send({ error: 'request body is larger than 1 MiB', code: 'PAYLOAD_TOO_LARGE' });
  }
  // Fastify's request errors (invalid JSON, empty JSON body, prototype poisoning, unsupported
  // media type) are all "the body is not what the endpoint reads": 400 INVALID_REQUEST.
  const status = fastifyError.statusCode;
  if (typeof status === 'number' && status >= 400 && status < 500 && fastifyError.code?.startsWith('FST_')) {
    return reply.code(400).send({ error: fastifyError.message, code: 'INVALID_REQUEST' });
  }
  request.log.error({ err: error }, 'unexpected error');
  return reply.code(500).send({ error: 'internal error', code: 'INTERNAL' });
}

function validationCode(error: FastifyError, request: FastifyRequest): ErrorCode {
  const codes = (request.routeOptions.config as ValidationCodes | undefined)?.validationCodes;
  if (!codes || error.validationContext !== 'body') return 'INVALID_REQUEST';
  for (const v of error.validation ?? []) {
    // instancePath is like /transport_type or /routes/0/source_cidr; match on the field names.
    const fields = v.instancePath.split('/').filter((p) => p !== '' && !/^\d+$/.test(p));
    const field = fields.at(-1);
    if (field && codes[field]) return codes[field];
  }
  return 'INVALID_REQUEST';
}

/**
 * Errors of Node's HTTP parser (malformed framing, oversized headers) never reach Fastify's
 * error handler; this answers them on the raw socket in the same `{error, code}` shape and
 * closes the connection, whose framing can no longer be trusted.
 */
export function replyToClientError(
  err: Error & { code?: string },
  socket: import('node:stream').Duplex,
): void {
  // A response already under way on this socket (the headers were complete, the body was not)
  // must not get a second one after it: close, as Node's own handler does.
  const inFlight = (socket as { _httpMessage?: { headersSent?: boolean } })._httpMessage;
  if (err.code === 'ECONNRESET' || !socket.writable || inFlight?.headersSent) {
    socket.destroy();
    return;
  }
  const [status, answer] =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? [
          '431 Request Header Fields Too Large',
          { error: 'the request headers are too large', code: 'HEADERS_TOO_LARGE' },
        ]
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? [
            '408 Request Timeout',
            { error: 'the request did not arrive whole in time', code: 'REQUEST_TIMEOUT' },
          ]
        : ['400 Bad Request', { error: 'malformed HTTP request', code: 'INVALID_REQUEST' }];
  const body = JSON.stringify(answer);
  socket.end(
    `HTTP/1.1 ${status}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
  );
}
