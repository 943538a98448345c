/**
 * Reads the client's credentials from a token request: client_secret_basic (RFC 6749 §2.3.1:
 * id and secret form-urlencoded, then base64) or client_secret_post. Pure.
 */
import { OAuthError } from '../domain/errors.js';

export interface ClientCredentials {
  clientId: string;
  clientSecret: string;
  method: 'client_secret_basic' | 'client_secret_post';
}

const formDecode = (s: string): string => decodeURIComponent(s.replace(/\+/g, ' '));

/** Throws invalid_client for a malformed Basic header, invalid_request for two methods at once. */
export function readClientCredentials(
  authorization: string | undefined,
  form: ReadonlyMap<string, string>,
): ClientCredentials | undefined {
  const postId = form.get('client_id');
  const postSecret = form.get('client_secret');
  let basic: ClientCredentials | undefined;
  if (authorization !== undefined) {
    const match = /^Basic[ ]+([A-Za-z0-9+/]+={0,2})[ ]*$/i.exec(authorization);
    if (!match) throw new OAuthError('invalid_client', 'malformed Authorization header', wwwAuthenticate());
    const decoded = Buffer.from(match[1]!, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    if (colon < 1) throw new OAuthError('invalid_client', 'malformed Basic credentials', wwwAuthenticate());
    try {
      basic = {
        clientId: formDecode(decoded.slice(0, colon)),
        clientSecret: formDecode(decoded.slice(colon + 1)),
        method: 'client_secret_basic',
      };
    } catch {
      throw new OAuthError('invalid_client', 'malformed Basic credentials', wwwAuthenticate());
    }
  }
  if (basic && (postId !== undefined || postSecret !== undefined)) {
    throw new OAuthError(
      'invalid_request',
      'use one client authentication method: Basic or form fields, not both',
    );
  }
  if (basic) return basic;
  if (postId === undefined && postSecret === undefined) return undefined;
  if (postId === undefined || postSecret === undefined) {
    throw new OAuthError('invalid_request', 'client_id and client_secret must be given together');
  }
  return { clientId: postId, clientSecret: postSecret, method: 'client_secret_post' };
}

export const wwwAuthenticate = (): Record<string, string> => ({
  'WWW-Authenticate': 'Basic realm="mesh-agent", charset="UTF-8"',
});

/**
 * Parses an application/x-www-form-urlencoded body. RFC 6749 §3.2 forbids repeating a
 * parameter, and §3.1 treats a parameter without a value as omitted.
 */
export function parseTokenForm(body: string): Map<string, string> {
  const form = new Map<string, string>();
  for (const [key, value] of new URLSearchParams(body)) {
    if (form.has(key)) throw new OAuthError('invalid_request', `parameter ${key} is repeated`);
    form.set(key, value);
  }
  for (const [key, value] of form) if (value === '') form.delete(key);
  return form;
}
