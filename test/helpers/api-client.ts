/**
 * A small HTTP client for tests over node:http (so a test can pick its source address, send
 * raw or malformed bodies and repeated headers). Every answer to a documented operation is
 * checked against the OpenAPI document the agent serves: an undocumented status or a body that
 * does not match its schema fails the test that caused it.
 */
import http from 'node:http';
import { Ajv2020, type ValidateFunction } from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

export interface ApiResponse {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  // biome-ignore lint/suspicious/noExplicitAny: test code reads arbitrary JSON answers
  body: any;
}

export interface RequestOptions {
  json?: unknown;
  form?: Record<string, string> | string;
  /** Raw body, sent as is. */
  body?: string | Buffer;
  headers?: Record<string, string>;
  token?: string;
  timeoutMs?: number;
}

interface OpenApiOperation {
  responses?: Record<string, { content?: Record<string, { schema?: unknown }> }>;
}
interface OpenApiDoc {
  paths: Record<string, Record<string, OpenApiOperation>>;
}

const openApiCache = new Map<string, Promise<Conformance>>();

/** Compiled response validators of one agent's OpenAPI document. */
export class Conformance {
  private readonly ajv = addFormats.default(new Ajv2020({ strict: false, allErrors: true }));
  private readonly routes: { pattern: RegExp; path: string }[];
  private readonly validators = new Map<string, ValidateFunction>();

  constructor(readonly doc: OpenApiDoc) {
    // Static paths first, as the router matches them: /v1/peers/self before /v1/peers/{id}.
    const params = (p: string) => (p.match(/\{/g) ?? []).length;
    const paths = Object.keys(doc.paths).sort((a, b) => params(a) - params(b));
    this.routes = paths.map((path) => ({
      path,
      pattern: new RegExp(
        `^${path.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\\?\{[^}]+\\?\}/g, '[^/]+')}$`,
      ),
    }));
  }

  /** Throws when a documented operation answered with an undocumented status or shape. */
  check(method: string, urlPath: string, res: ApiResponse): void {
    const pathOnly = urlPath.split('?')[0]!;
    const route = this.routes.find((r) => r.pattern.test(pathOnly));
    const operation = route && this.doc.paths[route.path]?.[method.toLowerCase()];
    if (!route || !operation) return; // unknown path or method: 404/405, not an operation
    const documented = operation.responses?.[String(res.status)];
    if (!documented) {
      throw new Error(
        `${method} ${route.path} answered ${res.status}, which the OpenAPI document does not list: ${res.text}`,
      );
    }
    const schema = documented.content?.['application/json']?.schema;
    if (!schema) return;
    const key = `${method} ${route.path} ${res.status}`;
    let validate = this.validators.get(key);
    if (!validate) {
      validate = this.ajv.compile(schema as object);
      this.validators.set(key, validate);
    }
    if (!validate(res.body)) {
      throw new Error(
        `${key}: body does not match the OpenAPI schema: ${this.ajv.errorsText(validate.errors)}; body ${res.text}`,
      );
    }
  }
}

export class ApiClient {
  /** Every secret and token this client has seen, so log checks know what to look for. */
  readonly secretsSeen = new Set<string>();

  constructor(
    readonly baseUrl: string,
    private readonly options: { localAddress?: string; conformance?: boolean } = {},
  ) {}

  withLocalAddress(localAddress: string): ApiClient {
    const c = new ApiClient(this.baseUrl, { ...this.options, localAddress });
    // Shares the secret registry with the client it came from.
    (c as { secretsSeen: Set<string> }).secretsSeen = this.secretsSeen;
    return c;
  }

  conformance(): Promise<Conformance> {
    let c = openApiCache.get(this.baseUrl);
    if (!c) {
      c = this.raw('GET', '/openapi.json').then((r) => {
        if (r.status !== 200) throw new Error(`GET /openapi.json answered ${r.status}`);
        return new Conformance(r.body as OpenApiDoc);
      });
      openApiCache.set(this.baseUrl, c);
    }
    return c;
  }

  async request(method: string, path: string, opts: RequestOptions = {}): Promise<ApiResponse> {
    const res = await this.raw(method, path, opts);
    if (this.options.conformance !== false) (await this.conformance()).check(method, path, res);
    return res;
  }

  get = (path: string, opts?: RequestOptions) => this.request('GET', path, opts);
  post = (path: string, opts?: RequestOptions) => this.request('POST', path, opts);
  put = (path: string, opts?: RequestOptions) => this.request('PUT', path, opts);
  delete = (path: string, opts?: RequestOptions) => this.request('DELETE', path, opts);

  /** Client credentials grant with client_secret_post; returns the whole answer. */
  tokenResponse(clientId: string, clientSecret: string, scope?: string): Promise<ApiResponse> {
    const form: Record<string, string> = {
      grant_type: 'client_credentials',
      client_id: clientId,
      client_secret: clientSecret,
    };
    if (scope !== undefined) form.scope = scope;
    return this.post('/v1/oauth/token', { form });
  }

  async token(clientId: string, clientSecret: string, scope?: string): Promise<string> {
    const res = await this.tokenResponse(clientId, clientSecret, scope);
    if (res.status !== 200) throw new Error(`token request failed: ${res.status} ${res.text}`);
    return res.body.access_token as string;
  }

  raw(method: string, path: string, opts: RequestOptions = {}): Promise<ApiResponse> {
    const url = new URL(path, this.baseUrl);
    const headers: Record<string, string> = { ...opts.headers };
    let payload: Buffer | undefined;
    if (opts.json !== undefined) {
      payload = Buffer.from(JSON.stringify(opts.json));
      headers['content-type'] ??= 'application/json';
    } else if (opts.form !== undefined) {
      const text = typeof opts.form === 'string' ? opts.form : new URLSearchParams(opts.form).toString();
      payload = Buffer.from(text);
      headers['content-type'] ??= 'application/x-www-form-urlencoded';
      if (typeof opts.form === 'object' && opts.form.client_secret)
        this.secretsSeen.add(opts.form.client_secret);
    } else if (opts.body !== undefined) {
      payload = Buffer.isBuffer(opts.body) ? opts.body : Buffer.from(opts.body);
    }
    if (opts.token) headers.authorization = `Bearer ${opts.token}`;
    if (payload) headers['content-length'] = String(payload.length);
    return new Promise((resolve, reject) => {
      const req = http.request(
        {
          method,
          hostname: url.hostname.replace(/^\[|\]$/g, ''),
          port: url.port,
          path: url.pathname + url.search,
          headers,
          localAddress: this.options.localAddress,
          agent: false,
          timeout: opts.timeoutMs ?? 15_000,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            let body: unknown;
            try {
              body = text ? JSON.parse(text) : undefined;
            } catch {
              body = undefined;
            }
            this.remember(body);
            resolve({ status: res.statusCode ?? 0, headers: res.headers, text, body });
          });
          res.on('error', reject);
        },
      );
      req.on('timeout', () => req.destroy(new Error(`${method} ${path} timed out`)));
      req.on('error', reject);
      req.end(payload);
    });
  }

  private remember(body: unknown): void {
    if (!body || typeof body !== 'object') return;
    // `secret`: a webhook's signing secret (POST /v1/webhooks).
    for (const key of ['client_secret', 'access_token', 'secret'] as const) {
      const v = (body as Record<string, unknown>)[key];
      if (typeof v === 'string') this.secretsSeen.add(v);
    }
  }
}
