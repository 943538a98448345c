/**
 * Access tokens: JWTs after RFC 9068, signed with the agent's Ed25519 token key (EdDSA), whose
 * public half is served in the JWKS with its RFC 7638 thumbprint as `kid` (docs/decisions.md §4).
 *
 * Issuing encodes the compact JWS by hand and signs with node:crypto's one-shot Ed25519 sign:
 * jose's SignJWT goes through WebCrypto, whose hand-off to the threadpool cost 35 to 50 µs more
 * per token (bench/api/ladder.ts), at a rate where the signature itself is the largest cost.
 * Verification, where mistakes are dangerous, stays with jose.
 *
 * Verification accepts only EdDSA, our `kid`, `typ` at+jwt, our `iss` and `aud`, and a current
 * `exp`/`nbf`. Verified tokens are cached by their whole text until `exp`; revocation is checked
 * by the caller on every request, after the cache, so it takes effect at once.
 */
import { createPublicKey, type KeyObject, randomUUID, sign } from 'node:crypto';
import { calculateJwkThumbprint, exportJWK, type JWK, jwtVerify } from 'jose';
import type { Clock } from '../domain/clock.js';
import { isScope, type Scope } from '../domain/scopes.js';

export const TOKEN_LIFETIME_SECONDS = 3600;
const MAX_CACHED_TOKENS = 10_000;

export interface VerifiedToken {
  clientId: string;
  scopes: Scope[];
  expiresAtMs: number;
}

export interface IssuedToken {
  accessToken: string;
  expiresIn: number;
  scopes: Scope[];
}

export class AccessTokens {
  private readonly publicKey: KeyObject;
  private readonly cache = new Map<string, VerifiedToken>();
  private publicJwk!: JWK;
  private kid!: string;
  /** The protected header never changes: encoded once. */
  private encodedHeader!: string;

  private constructor(
    private readonly privateKey: KeyObject,
    private readonly issuer: string,
    private readonly audience: string,
    private readonly clock: Clock,
  ) {
    this.publicKey = createPublicKey(privateKey);
  }

  static async create(
    privateKey: KeyObject,
    issuer: string,
    audience: string,
    clock: Clock,
  ): Promise<AccessTokens> {
    if (privateKey.asymmetricKeyType !== 'ed25519') throw new Error('token signing key must be Ed25519');
    const tokens = new AccessTokens(privateKey, issuer, audience, clock);
    const jwk = await exportJWK(tokens.publicKey);
    tokens.kid = await calculateJwkThumbprint(jwk);
    tokens.publicJwk = { ...jwk, kid: tokens.kid, alg: 'EdDSA', use: 'sig' };
    tokens.encodedHeader = base64url({ alg: 'EdDSA', typ: 'at+jwt', kid: tokens.kid });
    return tokens;
  }

  get jwks(): { keys: JWK[] } {
    return { keys: [this.publicJwk] };
  }

  get keyId(): string {
    return this.kid;
  }

  issue(clientId: string, scopes: readonly Scope[]): IssuedToken {
    const nowSeconds = Math.floor(this.clock.now() / 1000);
    const claims = {
      client_id: clientId,
      scope: scopes.join(' '),
      iss: this.issuer,
      aud: this.audience,
      sub: clientId,
      iat: nowSeconds,
      exp: nowSeconds + TOKEN_LIFETIME_SECONDS,
      jti: randomUUID(),
    };
    const signingInput = `${this.encodedHeader}.${base64url(claims)}`;
    const signature = sign(null, Buffer.from(signingInput), this.privateKey).toString('base64url');
    return {
      accessToken: `${signingInput}.${signature}`,
      expiresIn: TOKEN_LIFETIME_SECONDS,
      scopes: [...scopes],
    };
  }

  /** Returns the token's subject and scopes, or undefined for any token we did not issue or that expired. */
  /**
   * The answer for a token verified before, without waiting: the token's claims while it is
   * unexpired, `expired` once it is not, or `unknown` when it must go through verify().
   */
  cached(token: string): VerifiedToken | 'expired' | 'unknown' {
    const cached = this.cache.get(token);
    if (!cached) return 'unknown';
    if (cached.expiresAtMs > this.clock.now()) return cached;
    this.cache.delete(token);
    return 'expired';
  }

  async verify(token: string): Promise<VerifiedToken | undefined> {
    const known = this.cached(token);
    if (known === 'expired') return undefined;
    if (known !== 'unknown') return known;
    const now = this.clock.now();
    let verified: VerifiedToken;
    try {
      const { payload, protectedHeader } = await jwtVerify(token, this.keyFor, {
        algorithms: ['EdDSA'],
        typ: 'at+jwt',
        issuer: this.issuer,
        audience: this.audience,
        currentDate: new Date(now),
        requiredClaims: ['exp', 'iat', 'jti', 'sub', 'client_id', 'scope'],
        clockTolerance: 0,
      });
      if (protectedHeader.kid !== this.kid) return undefined;
      if (typeof payload.client_id !== 'string' || payload.client_id !== payload.sub) return undefined;
      if (typeof payload.scope !== 'string') return undefined;
      const scopes = payload.scope.split(' ');
      if (scopes.length === 0 || !scopes.every(isScope)) return undefined;
      verified = { clientId: payload.client_id, scopes: scopes as Scope[], expiresAtMs: payload.exp! * 1000 };
    } catch {
      return undefined;
    }
    if (this.cache.size >= MAX_CACHED_TOKENS) this.cache.clear();
    this.cache.set(token, verified);
    return verified;
  }

  /** Resolves the verification key by `kid`; an unknown or missing kid matches nothing. */
  private readonly keyFor = (header: { kid?: string | undefined; alg?: string | undefined }): KeyObject => {
    if (header.kid !== this.kid || header.alg !== 'EdDSA') throw new Error('unknown key');
    return this.publicKey;
  };
}

const base64url = (value: unknown): string => Buffer.from(JSON.stringify(value)).toString('base64url');
