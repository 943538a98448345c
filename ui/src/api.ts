/**
 * The console's only way to the agent: the public API on this origin, with the bearer token of
 * the signed-in user. The token lives in this tab's sessionStorage and nowhere else; the client
 * secret is sent once to the token endpoint and never kept.
 */
import { grants, type Scope, type ScopeName, scope } from '../../src/domain/scopes.js';

const TOKEN_KEY = 'mesh-console.token';
/** Where the user was when the session ended, so that signing in again goes back there. */
const RETURN_KEY = 'mesh-console.return';

export { SCOPE_NAMES, SCOPE_PREFIX } from '../../src/domain/scopes.js';

export interface Session {
  token: string;
  clientId: string;
  scopes: string[];
  /** Expiry, ms since the epoch. */
  expiresAt: number;
}

export class ApiFailure extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/**
 * The session of a token: its client and scopes from its claims, its expiry from `expires_in` as
 * this browser's clock counts, so a clock set differently from the agent's does not end it early.
 */
function sessionOf(token: string, expiresAt: number): Session | undefined {
  try {
    const part = token.split('.')[1] ?? '';
    const claims = JSON.parse(atob(part.replace(/-/g, '+').replace(/_/g, '/'))) as {
      scope?: string;
      client_id?: string;
    };
    return {
      token,
      clientId: claims.client_id ?? '',
      scopes: (claims.scope ?? '').split(' ').filter(Boolean),
      expiresAt,
    };
  } catch {
    return undefined;
  }
}

let current: Session | undefined;
let onEnded: (() => void) | undefined;
let expiryTimer: ReturnType<typeof setTimeout> | undefined;

export function session(): Session | undefined {
  return current;
}

function adopt(s: Session | undefined): void {
  current = s;
  clearTimeout(expiryTimer);
  if (s) expiryTimer = setTimeout(() => endSession(true), Math.max(0, s.expiresAt - Date.now()));
}

/** The session kept in this tab, if its token has not expired. */
export function restoreSession(ended: () => void): Session | undefined {
  onEnded = ended;
  let s: Session | undefined;
  try {
    const kept = JSON.parse(sessionStorage.getItem(TOKEN_KEY) ?? 'null') as {
      token: string;
      expiresAt: number;
    } | null;
    s = kept ? sessionOf(kept.token, kept.expiresAt) : undefined;
  } catch {
    s = undefined;
  }
  if (!s || s.expiresAt <= Date.now()) {
    sessionStorage.removeItem(TOKEN_KEY);
    adopt(undefined);
    return undefined;
  }
  adopt(s);
  return s;
}

function keepToken(answer: Record<string, unknown>): Session {
  const expiresIn = typeof answer.expires_in === 'number' ? answer.expires_in : 0;
  const s = sessionOf(String(answer.access_token), Date.now() + expiresIn * 1000);
  if (!s) throw new ApiFailure(0, 'BAD_TOKEN', 'the agent answered with a token the console cannot read');
  sessionStorage.setItem(TOKEN_KEY, JSON.stringify({ token: s.token, expiresAt: s.expiresAt }));
  adopt(s);
  return s;
}

export async function signIn(clientId: string, clientSecret: string): Promise<Session> {
  const form = new URLSearchParams({
    grant_type: 'client_credentials',
    client_id: clientId,
    client_secret: clientSecret,
  });
  const res = await fetch('/v1/oauth/token', {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: form,
    credentials: 'omit',
  });
  const body = (await res.json().catch(() => ({}))) as Record<string, string>;
  if (!res.ok || typeof body.access_token !== 'string') {
    throw new ApiFailure(
      res.status,
      body.code ?? body.error ?? `HTTP_${res.status}`,
      body.error_description ?? body.error ?? res.statusText,
    );
  }
  return keepToken(body);
}

/** Signs in with the one-time code of a `mesh-agent ui` link (docs/console.md). */
export async function signInWithCode(code: string): Promise<Session> {
  const res = await fetch('/v1/console/session', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ code }),
    credentials: 'omit',
  });
  const body = (await res.json().catch(() => ({}))) as Record<string, string>;
  if (!res.ok || typeof body.access_token !== 'string') {
    throw new ApiFailure(res.status, body.code ?? `HTTP_${res.status}`, body.error ?? res.statusText);
  }
  return keepToken(body);
}

/**
 * Drops the token. `expired`: the session ran out rather than the user leaving, so where they
 * were is kept for after the next sign-in.
 */
export function endSession(expired: boolean): void {
  if (expired) sessionStorage.setItem(RETURN_KEY, location.hash);
  else sessionStorage.removeItem(RETURN_KEY);
  sessionStorage.removeItem(TOKEN_KEY);
  adopt(undefined);
  onEnded?.();
}

/** Where to go after signing in: where the last session ended, once. */
export function takeReturn(): string | undefined {
  const where = sessionStorage.getItem(RETURN_KEY) ?? undefined;
  sessionStorage.removeItem(RETURN_KEY);
  return where;
}

/** Whether the session's token holds the scope (or admin): the agent's own rule, bundled. */
export function can(name: ScopeName): boolean {
  return grants((current?.scopes ?? []) as Scope[], scope(name));
}

function authorization(): Record<string, string> {
  return current ? { authorization: `Bearer ${current.token}` } : {};
}

async function failure(res: Response): Promise<ApiFailure> {
  const body = (await res.json().catch(() => ({}))) as { code?: string; error?: string };
  if (res.status === 401) endSession(true);
  return new ApiFailure(res.status, body.code ?? `HTTP_${res.status}`, body.error ?? res.statusText);
}

export async function call<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await fetch(path, {
    method,
    headers: { ...authorization(), ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? null : JSON.stringify(body),
    credentials: 'omit',
  });
  if (!res.ok) throw await failure(res);
  return (res.status === 204 ? null : await res.json()) as T;
}

export const get = <T = unknown>(path: string) => call<T>('GET', path);

/** A GET whose answer is text (GET /metrics). */
export async function getText(path: string): Promise<string> {
  const res = await fetch(path, { headers: authorization(), credentials: 'omit' });
  if (!res.ok) throw await failure(res);
  return res.text();
}

/** `path` with the given query fields, leaving out empty ones. */
export function withQuery(path: string, query: Record<string, string | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== '') q.set(k, v);
  const text = q.toString();
  return text ? `${path}?${text}` : path;
}

/**
 * Follows a Server-Sent Events stream with the bearer token (EventSource cannot send one):
 * calls `onOpen` once the agent has accepted it, then `onEvent` for each message until `signal`
 * aborts. Resolves when the stream ends; rejects when it cannot be opened or breaks.
 */
export async function follow(
  path: string,
  onEvent: (type: string, data: string, id: string) => void,
  signal: AbortSignal,
  onOpen?: () => void,
): Promise<void> {
  const res = await fetch(path, {
    headers: { ...authorization(), accept: 'text/event-stream' },
    signal,
    credentials: 'omit',
  });
  if (!res.ok || !res.body) throw await failure(res);
  onOpen?.();
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end = buffer.indexOf('\n\n');
    while (end >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let type = 'message';
      let id = '';
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) type = line.slice(7);
        else if (line.startsWith('id: ')) id = line.slice(4);
        else if (line.startsWith('data: ')) data.push(line.slice(6));
      }
      if (data.length > 0) onEvent(type, data.join('\n'), id);
      end = buffer.indexOf('\n\n');
    }
  }
}
