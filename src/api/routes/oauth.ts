/**
 * The OAuth2 token endpoint and discovery: `POST /v1/oauth/token`, the OIDC discovery document
 * and the JWKS. The grant logic lives in auth/token-endpoint.ts.
 */
import type { FastifyInstance, FastifyReply } from 'fastify';
import type { IssuedToken } from '../../auth/access-tokens.js';
import { parseTokenForm } from '../../auth/client-authentication.js';
import { OAuthError } from '../../domain/errors.js';
import { ALL_SCOPES } from '../../domain/scopes.js';
import type { AppDeps } from '../app.js';
import {
  errorResponses,
  Jwks,
  OAuthErrorBody,
  OpenIdConfiguration,
  TokenForm,
  TokenResponse,
} from '../schemas.js';

/** A token endpoint's answer (RFC 6749 §5.1), never cached, counted as issued. */
export function tokenAnswer(deps: AppDeps, reply: FastifyReply, issued: IssuedToken) {
  deps.metrics.tokensIssued.inc();
  reply.headers({ 'cache-control': 'no-store', pragma: 'no-cache' });
  return {
    access_token: issued.accessToken,
    token_type: 'Bearer' as const,
    expires_in: issued.expiresIn,
    scope: issued.scopes.join(' '),
  };
}

export function registerOAuthRoutes(app: FastifyInstance, deps: AppDeps): void {
  app.post(
    '/v1/oauth/token',
    {
      schema: {
        tags: ['oauth'],
        summary: 'Client credentials grant (RFC 6749 §4.4); client_secret_basic or client_secret_post',
        consumes: ['application/x-www-form-urlencoded'],
        body: TokenForm,
        response: {
          200: TokenResponse,
          400: OAuthErrorBody,
          401: OAuthErrorBody,
          429: OAuthErrorBody,
          ...errorResponses(413),
        },
      },
      // The form is read by parseTokenForm, which answers in RFC 6749 terms; the schema above
      // only documents it.
      validatorCompiler: () => () => true,
    },
    async (request, reply) => {
      if (typeof request.body !== 'string') {
        throw new OAuthError(
          'invalid_request',
          'the token request must be application/x-www-form-urlencoded',
        );
      }
      let issued: Awaited<ReturnType<typeof deps.tokenEndpoint.grant>>;
      try {
        issued = await deps.tokenEndpoint.grant({
          form: parseTokenForm(request.body),
          authorization: request.headers.authorization,
          remoteAddress: request.ip,
        });
      } catch (err) {
        if (err instanceof OAuthError) deps.metrics.tokenFailures.inc({ error: err.oauthCode });
        throw err;
      }
      return tokenAnswer(deps, reply, issued);
    },
  );

  app.get(
    '/.well-known/openid-configuration',
    {
      schema: { tags: ['oauth'], summary: 'OIDC discovery document', response: { 200: OpenIdConfiguration } },
    },
    async () => ({
      issuer: deps.publicUrl,
      token_endpoint: `${deps.publicUrl}/v1/oauth/token`,
      jwks_uri: `${deps.publicUrl}/.well-known/jwks.json`,
      grant_types_supported: ['client_credentials'],
      token_endpoint_auth_methods_supported: ['client_secret_basic', 'client_secret_post'],
      scopes_supported: ALL_SCOPES,
      response_types_supported: ['token'],
      id_token_signing_alg_values_supported: ['EdDSA'],
      subject_types_supported: ['public'],
    }),
  );

  app.get(
    '/.well-known/jwks.json',
    { schema: { tags: ['oauth'], summary: 'Public keys that sign access tokens', response: { 200: Jwks } } },
    async () => deps.tokens.jwks,
  );
}
