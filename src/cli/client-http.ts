/**
 * The HTTP side of the `mesh-agent` client commands: requests to the management API with a
 * bearer token from the OAuth2 client credentials grant (POST /v1/oauth/token), cached per
 * profile and fetched again before it expires. Errors are sorted into the classes that become
 * the command's exit code (docs/cli.md). Used by src/cli/client-commands.ts only.
 */
import { type CachedToken, loadToken, saveToken, tokenUsable } from './client-profile.js';

/** The agent answered 4xx (exit 1), or 5xx (exit 3). */
export class ApiCallError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    readonly text: string,
  ) {
    super(`${status} ${code}: ${text}`);
  }
}

/** No answer: connection refused, DNS, TLS, timeout (exit 3). */
export class UnreachableError extends Error {}

/** No credential, or the agent refused it at the token endpoint (exit 4). */
export class NotLoggedInError extends Error {}

export interface ClientOptions {
  url: string;
  clientId?: string;
  clientSecret?: string;
  /** Profile directory and name: where the token is cached. */
  configDir: string;
  profile: string;
  timeoutMs: number;
  now?: () => number;
}

type Json = unknown;

export class MeshClient {
  private readonly now: () => number;

  constructor(private readonly opts: ClientOptions) {
    this.now = opts.now ?? Date.now;
  }

  get url(): string {
    return this.opts.url;
  }

  /** One HTTP exchange; the body parsed as JSON when it is JSON. */
  private async exchange(
    method: string,
    path: string,
    init: { headers?: Record<string, string>; body?: string },
  ): Promise<{ status: number; body: Json; text: string }> {
    let res: Response;
    try {
      res = await fetch(`${this.opts.url}${path}`, {
        method,
        headers: init.headers,
        body: init.body,
        signal: AbortSignal.timeout(this.opts.timeoutMs),
        redirect: 'error',
      });
    } catch (err) {
      const e = err as Error & { cause?: { code?: string; message?: string } };
      const why =
        e.name === 'TimeoutError'
          ? `no answer in ${this.opts.timeoutMs} ms`
          : (e.cause?.code ?? e.cause?.message ?? e.message);
      throw new UnreachableError(`cannot reach the agent at ${this.opts.url}: ${why}`);
    }
    let text: string;
    try {
      text = await res.text();
    } catch (err) {
      throw new UnreachableError(
        `the agent at ${this.opts.url} broke off its answer: ${(err as Error).message}`,
      );
    }
    let body: Json = text;
    if ((res.headers.get('content-type') ?? '').includes('json') && text !== '') {
      try {
        body = JSON.parse(text) as Json;
      } catch {
        body = text;
      }
    }
    return { status: res.status, body, text };
  }

  /** Fetches a token from the agent and caches it; a refusal means the credential is not good. */
  async fetchToken(): Promise<CachedToken> {
    const { clientId, clientSecret } = this.opts;
    if (!clientId || !clientSecret) {
      throw new NotLoggedInError(
        'not logged in: run `mesh-agent login` or set MESH_URL, MESH_CLIENT_ID and MESH_CLIENT_SECRET',
      );
    }
    const started = this.now();
    const form = new URLSearchParams({
      grant_type: 'client_credentials',
      client_id: clientId,
      client_secret: clientSecret,
    });
    const res = await this.exchange('POST', '/v1/oauth/token', {
      headers: { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' },
      body: form.toString(),
    });
    if (res.status >= 500) throw errorOf(res.status, res.body, res.text);
    if (res.status !== 200) {
      const e = errorOf(res.status, res.body, res.text);
      if (res.status === 400 || res.status === 401) {
        throw new NotLoggedInError(`the agent refused the credential ${clientId}: ${e.message}`);
      }
      throw e;
    }
    const body = res.body as { access_token?: unknown; expires_in?: unknown };
    if (typeof body.access_token !== 'string' || typeof body.expires_in !== 'number') {
      throw new ApiCallError(res.status, 'BAD_TOKEN_RESPONSE', 'the token response has no access_token');
    }
    const token: CachedToken = {
      url: this.opts.url,
      client_id: clientId,
      access_token: body.access_token,
      // Counted from before the request: the token cannot outlive this estimate.
      expires_at_ms: started + body.expires_in * 1000,
      lifetime_ms: body.expires_in * 1000,
    };
    saveToken(this.opts.configDir, this.opts.profile, token);
    return token;
  }

  private async token(): Promise<string> {
    const cached = loadToken(this.opts.configDir, this.opts.profile);
    if (tokenUsable(cached, this.opts.url, this.opts.clientId ?? '', this.now(), cached?.lifetime_ms)) {
      return cached.access_token;
    }
    return (await this.fetchToken()).access_token;
  }

  /**
   * An API call. `auth: false` for the public endpoints. With a token, a 401 answer once gets
   * a fresh token and a second try: the agent may have been restarted with new signing keys,
   * or its clock may run ahead of ours.
   */
  async call<T = Json>(method: string, path: string, json?: unknown, auth = true): Promise<T> {
    const send = async (token?: string) =>
      this.exchange(method, path, {
        headers: {
          accept: 'application/json',
          ...(json !== undefined ? { 'content-type': 'application/json' } : {}),
          ...(token ? { authorization: `Bearer ${token}` } : {}),
        },
        body: json !== undefined ? JSON.stringify(json) : undefined,
      });
    let res = await send(auth ? await this.token() : undefined);
    if (auth && res.status === 401) res = await send((await this.fetchToken()).access_token);
    if (res.status >= 200 && res.status < 300) return res.body as T;
    throw errorOf(res.status, res.body, res.text);
  }
}

/**
 * Follows a Server-Sent Events endpoint (GET /v1/events/stream): calls `onMessage` for each
 * message with its id, event and data, resumes with Last-Event-ID after a cut (a restart of the
 * agent, or its cut-off of a slow reader) and returns only when `signal` aborts. A refusal (4xx)
 * throws as call() does.
 */
export async function followStream(
  client: MeshClient,
  path: string,
  onMessage: (m: { id: string | undefined; event: string; data: string }) => void,
  signal: AbortSignal,
  lastEventId?: string,
): Promise<void> {
  let last = lastEventId;
  let token = await client.fetchToken();
  while (!signal.aborted) {
    let res: Response;
    try {
      res = await fetch(`${client.url}${path}`, {
        headers: {
          accept: 'text/event-stream',
          authorization: `Bearer ${token.access_token}`,
          ...(last !== undefined ? { 'last-event-id': last } : {}),
        },
        signal,
        redirect: 'error',
      });
    } catch {
      if (signal.aborted) return;
      await new Promise((r) => setTimeout(r, 1000));
      continue;
    }
    if (res.status === 401) {
      token = await client.fetchToken();
      continue;
    }
    if (res.status !== 200 || !res.body) {
      const text = await res.text();
      let body: Json = text;
      try {
        body = JSON.parse(text) as Json;
      } catch {}
      throw errorOf(res.status, body, text);
    }
    let pending = '';
    try {
      for await (const chunk of res.body.pipeThrough(new TextDecoderStream())) {
        pending += chunk;
        for (let cut = pending.indexOf('\n\n'); cut >= 0; cut = pending.indexOf('\n\n')) {
          const m = { id: undefined as string | undefined, event: 'message', data: '' };
          for (const line of pending.slice(0, cut).split('\n')) {
            if (line.startsWith('id: ')) m.id = line.slice(4);
            else if (line.startsWith('event: ')) m.event = line.slice(7);
            else if (line.startsWith('data: ')) m.data += line.slice(6);
          }
          pending = pending.slice(cut + 2);
          if (m.id !== undefined) last = m.id;
          if (m.data !== '') onMessage(m);
        }
      }
    } catch {
      // Cut off: resume after the last message received.
    }
    if (!signal.aborted) await new Promise((r) => setTimeout(r, 500));
  }
}

/** The API's error body: `{error, code}`, or RFC 6749 `{error, error_description, code}`. */
function errorOf(status: number, body: Json, text: string): ApiCallError {
  if (body && typeof body === 'object') {
    const b = body as { error?: unknown; error_description?: unknown; code?: unknown };
    const code = typeof b.code === 'string' ? b.code : typeof b.error === 'string' ? b.error : 'ERROR';
    const message =
      typeof b.error_description === 'string'
        ? b.error_description
        : typeof b.error === 'string'
          ? b.error
          : JSON.stringify(body);
    return new ApiCallError(status, code, message);
  }
  return new ApiCallError(
    status,
    status >= 500 ? 'SERVER_ERROR' : 'ERROR',
    text.slice(0, 500) || '(no body)',
  );
}
