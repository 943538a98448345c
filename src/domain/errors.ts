/**
 * Every error the API can answer with, as typed values: the codes of the Errors table of
 * docs/api.md and those docs/decisions.md §3 adds, each with its status (`ERROR_STATUS`); one
 * `ApiError` that carries a code, and `OAuthError` for the token endpoint, which answers in
 * RFC 6749's shape as well. Anything in the agent that rejects a request throws one of these;
 * `api/error-reply.ts` is the only place that turns them into an HTTP status and body. Imports
 * nothing.
 */

/** Status of every code the API can return. Keep in step with docs/errors.md (a test checks). */
export const ERROR_STATUS = {
  INVALID_REQUEST: 400,
  INVALID_TRANSPORT: 400,
  INVALID_CIDR: 400,
  UNAUTHORIZED: 401,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  METHOD_NOT_ALLOWED: 405,
  ALREADY_EXISTS: 409,
  ALREADY_BOOTSTRAPPED: 409,
  REQUEST_TIMEOUT: 408,
  PAYLOAD_TOO_LARGE: 413,
  HEADERS_TOO_LARGE: 431,
  HANDSHAKE_FAILED: 422,
  NODE_LIMIT_EXCEEDED: 422,
  LICENSE_MISMATCH: 422,
  CANNOT_DELETE_LOCAL: 422,
  SERVICE_LIMIT_EXCEEDED: 422,
  LICENSE_EXPIRED: 422,
  LICENSE_INVALID: 422,
  CANNOT_REVOKE_CURRENT: 422,
  WEBHOOK_LIMIT_EXCEEDED: 422,
  TOO_MANY_REQUESTS: 429,
  INTERNAL: 500,
  UNAVAILABLE: 503,
} as const;

export type ErrorCode = keyof typeof ERROR_STATUS;

/** An error whose text is safe to show to the API caller. */
export class ApiError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  /** Extra response headers, e.g. Retry-After for 429. */
  readonly headers: Readonly<Record<string, string>>;

  constructor(code: ErrorCode, message: string, headers: Record<string, string> = {}) {
    super(message);
    this.name = 'ApiError';
    this.code = code;
    this.status = ERROR_STATUS[code];
    this.headers = headers;
  }
}

export const invalidRequest = (message: string) => new ApiError('INVALID_REQUEST', message);
export const notFound = (message: string) => new ApiError('NOT_FOUND', message);
export const unauthorized = (message: string) => new ApiError('UNAUTHORIZED', message);
export const forbidden = (message: string) => new ApiError('FORBIDDEN', message);

/**
 * Errors of the OAuth2 token endpoint (RFC 6749 §5.2). They carry the OAuth error code beside
 * our own code, because OAuth clients read `error` and our tooling reads `code`.
 */
export type OAuthErrorCode =
  | 'invalid_request'
  | 'invalid_client'
  | 'unsupported_grant_type'
  | 'invalid_scope'
  | 'too_many_requests';

const OAUTH_STATUS: Record<OAuthErrorCode, { status: number; code: ErrorCode }> = {
  invalid_request: { status: 400, code: 'INVALID_REQUEST' },
  unsupported_grant_type: { status: 400, code: 'INVALID_REQUEST' },
  invalid_scope: { status: 400, code: 'INVALID_REQUEST' },
  invalid_client: { status: 401, code: 'UNAUTHORIZED' },
  too_many_requests: { status: 429, code: 'TOO_MANY_REQUESTS' },
};

export class OAuthError extends Error {
  readonly oauthCode: OAuthErrorCode;
  readonly status: number;
  readonly code: ErrorCode;
  readonly headers: Readonly<Record<string, string>>;

  constructor(oauthCode: OAuthErrorCode, description: string, headers: Record<string, string> = {}) {
    super(description);
    this.name = 'OAuthError';
    this.oauthCode = oauthCode;
    this.status = OAUTH_STATUS[oauthCode].status;
    this.code = OAUTH_STATUS[oauthCode].code;
    this.headers = headers;
  }
}
