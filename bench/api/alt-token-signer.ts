/**
 * A cheaper way to issue the agent's access tokens, for the benchmarks that weigh it against
 * AccessTokens.issue (jose's SignJWT over WebCrypto): the same RFC 9068 JWT (EdDSA, `typ`
 * at+jwt, our `kid`, the same claims) with its protected header encoded once and its signature
 * made by node:crypto's one-shot, synchronous Ed25519 sign. The tokens it makes pass
 * AccessTokens.verify; hot-path-costs.ts checks that before it times anything.
 */
import { type KeyObject, randomUUID, sign } from 'node:crypto';
import { TOKEN_LIFETIME_SECONDS } from '../../src/auth/access-tokens.js';
import type { Scope } from '../../src/domain/scopes.js';

const b64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');

export function handBuiltSigner(key: KeyObject, kid: string, issuer: string, audience: string) {
  const header = b64({ alg: 'EdDSA', typ: 'at+jwt', kid });
  return {
    issue(clientId: string, scopes: readonly Scope[]) {
      const now = Math.floor(Date.now() / 1000);
      const input = `${header}.${b64({
        client_id: clientId,
        scope: scopes.join(' '),
        iss: issuer,
        aud: audience,
        sub: clientId,
        iat: now,
        exp: now + TOKEN_LIFETIME_SECONDS,
        jti: randomUUID(),
      })}`;
      const accessToken = `${input}.${sign(null, Buffer.from(input), key).toString('base64url')}`;
      return { accessToken, expiresIn: TOKEN_LIFETIME_SECONDS, scopes: [...scopes] };
    },
  };
}
