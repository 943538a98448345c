/**
 * The client credentials grant (RFC 6749 §4.4) as the agent answers it: request checks,
 * throttling, client authentication against the stored keyed hashes, scope narrowing, and the
 * `last_used_at` bookkeeping of docs/decisions.md §4. The HTTP route only moves bytes in and out.
 */
import { type Clock, isoTime } from '../domain/clock.js';
import { OAuthError } from '../domain/errors.js';
import { grantsAll, parseScopeParam } from '../domain/scopes.js';
import type { Store } from '../store/store.js';
import type { AccessTokens, IssuedToken } from './access-tokens.js';
import { type ClientCredentials, readClientCredentials, wwwAuthenticate } from './client-authentication.js';
import type { ReportAuthFailure } from './failure-report.js';
import type { FailureThrottle } from './failure-throttle.js';
import type { SecretHasher } from './secret-hash.js';

const LAST_USED_RESOLUTION_MS = 60_000;

export interface TokenRequest {
  form: ReadonlyMap<string, string>;
  authorization: string | undefined;
  remoteAddress: string;
}

export class TokenEndpoint {
  /** Compared against when the client is unknown, so both failures cost the same. */
  private readonly decoyHash: Buffer;

  constructor(
    private readonly store: Store,
    private readonly hasher: SecretHasher,
    private readonly tokens: AccessTokens,
    private readonly throttle: FailureThrottle,
    private readonly clock: Clock,
    /** Refused client authentications, for the aggregated `auth.failures` event. */
    private readonly reportFailure: ReportAuthFailure = () => {},
  ) {
    this.decoyHash = hasher.hash('decoy secret for unknown clients');
  }

  async grant(req: TokenRequest): Promise<IssuedToken> {
    const grantType = req.form.get('grant_type');
    if (grantType === undefined) throw new OAuthError('invalid_request', 'grant_type is required');
    if (grantType !== 'client_credentials') {
      throw new OAuthError('unsupported_grant_type', 'only grant_type=client_credentials is supported');
    }
    const client = this.readClient(req);
    if (!client)
      throw new OAuthError('invalid_client', 'client authentication is required', wwwAuthenticate());

    const verdict = this.throttle.check(req.remoteAddress, client.clientId);
    if (verdict.limited) {
      this.reportFailure({ clientId: client.clientId, source: req.remoteAddress, reason: 'throttled' });
      throw new OAuthError('too_many_requests', 'too many failed client authentications; slow down', {
        'Retry-After': String(verdict.retryAfterSeconds),
      });
    }

    const credential = this.store.credential(client.clientId);
    const ok =
      this.hasher.matches(client.clientSecret, credential?.secretHash ?? this.decoyHash) && credential;
    if (!ok) {
      this.throttle.recordFailure(req.remoteAddress, client.clientId);
      this.reportFailure({
        clientId: client.clientId,
        source: req.remoteAddress,
        reason: credential ? 'wrong_secret' : 'unknown_client',
      });
      // One text for an unknown client and a wrong secret: the answer must not reveal which ids exist.
      throw new OAuthError('invalid_client', 'client authentication failed', wwwAuthenticate());
    }

    let scopes = credential.scopes;
    const scopeParam = req.form.get('scope');
    if (scopeParam !== undefined) {
      const wanted = parseScopeParam(scopeParam);
      if (!wanted) throw new OAuthError('invalid_scope', 'scope holds an unknown value');
      if (!grantsAll(credential.scopes, wanted)) {
        throw new OAuthError('invalid_scope', 'scope asks for more than the credential holds');
      }
      scopes = wanted;
    }

    const issued = this.tokens.issue(credential.clientId, scopes);
    const now = this.clock.now();
    const lastUsed = credential.lastUsedAt === null ? undefined : Date.parse(credential.lastUsedAt);
    if (lastUsed === undefined || now - lastUsed >= LAST_USED_RESOLUTION_MS) {
      this.store.touchCredential(credential.clientId, isoTime(now));
    }
    return issued;
  }

  /** The presented credentials; a malformed Basic header is a refused authentication too. */
  private readClient(req: TokenRequest): ClientCredentials | undefined {
    try {
      return readClientCredentials(req.authorization, req.form);
    } catch (err) {
      if (err instanceof OAuthError && err.oauthCode === 'invalid_client') {
        this.reportFailure({ clientId: null, source: req.remoteAddress, reason: 'malformed_credentials' });
      }
      throw err;
    }
  }
}
