/**
 * The web console (docs/console.md): the files `npm run build` writes to dist/ui, served from
 * disk at /ui on the API's own origin. Public like /docs: the page holds no data, and every call
 * it makes goes through the API with the user's token. A strict Content-Security-Policy keeps
 * scripts to the console's own file (no inline script, no eval) and every request to this origin.
 *
 * Also the two extension endpoints of `mesh-agent ui` (docs/console.md, "One-time sign-in"): a
 * signed-in caller gets a code, and the browser that opens the link trades it for a token.
 */
import { readFile } from 'node:fs/promises';
import { Type } from '@sinclair/typebox';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError } from '../../domain/errors.js';
import type { AppDeps } from '../app.js';
import { ConsoleCodes } from '../console-codes.js';
import { errorResponses, TokenResponse } from '../schemas.js';
import { tokenAnswer } from './oauth.js';

/** The built console; compiled, this file runs from dist/src/api/routes/. */
const UI_DIR = new URL('../../../ui/', import.meta.url);

export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

const TYPES: Record<string, string> = {
  html: 'text/html; charset=utf-8',
  js: 'text/javascript; charset=utf-8',
  css: 'text/css; charset=utf-8',
  svg: 'image/svg+xml',
};

/** Only the flat names the build writes: no path can reach outside dist/ui. */
const FILE_NAME = /^[a-z0-9-]+\.(html|js|css|svg)$/;

async function serveFile(name: string, request: FastifyRequest, reply: FastifyReply) {
  const match = FILE_NAME.exec(name);
  if (!match) throw new ApiError('NOT_FOUND', 'no such file in the console');
  const accepts = String(request.headers['accept-encoding'] ?? '');
  // The build writes a Brotli and a gzip copy beside each file; the smallest the client takes.
  const encodings: [string, string][] = [
    ['br', '.br'],
    ['gzip', '.gz'],
  ];
  let body: Buffer | undefined;
  for (const [encoding, suffix] of encodings) {
    if (!new RegExp(`\\b${encoding}\\b`).test(accepts)) continue;
    body = await readFile(new URL(name + suffix, UI_DIR)).catch(() => undefined);
    if (body) {
      reply.header('content-encoding', encoding);
      break;
    }
  }
  body ??= await readFile(new URL(name, UI_DIR)).catch(() => undefined);
  if (!body) {
    throw new ApiError(
      'NOT_FOUND',
      name === 'index.html' ? 'the console is not built: run npm run build' : 'no such file in the console',
    );
  }
  return reply
    .header('content-type', TYPES[match[1]!]!)
    .header('vary', 'accept-encoding')
    .header('content-security-policy', CONSOLE_CSP)
    .header('x-content-type-options', 'nosniff')
    .header('referrer-policy', 'no-referrer')
    .header('cache-control', 'no-cache')
    .send(body);
}

export function registerConsoleRoutes(app: FastifyInstance, deps: AppDeps): void {
  const codes = new ConsoleCodes(deps.clock);
  app.post(
    '/v1/console/codes',
    {
      schema: {
        tags: ['console'],
        summary:
          'Extension: a one-time code (60 s, one use) that signs the web console in as the caller, with the caller’s scopes',
        response: {
          201: Type.Object({
            code: Type.String(),
            expires_in: Type.Integer({ description: 'seconds' }),
            url: Type.String({ description: 'the console link that uses the code' }),
          }),
          ...errorResponses(401, 403),
        },
      },
    },
    async (request, reply) => {
      const caller = request.caller!;
      const issued = codes.issue({ clientId: caller.clientId, scopes: caller.scopes });
      reply.header('cache-control', 'no-store');
      return reply.code(201).send({
        code: issued.code,
        expires_in: issued.expiresInSeconds,
        // In the fragment: a browser sends it to no server and puts it in no Referer.
        url: `${deps.publicUrl}/ui/#code=${issued.code}`,
      });
    },
  );
  app.post(
    '/v1/console/session',
    {
      schema: {
        tags: ['console'],
        summary:
          'Extension: trades a one-time console code for an access token (public; the code is the proof)',
        body: Type.Object({ code: Type.String({ minLength: 1, maxLength: 128 }) }),
        response: { 200: TokenResponse, ...errorResponses(400, 401) },
      },
    },
    async (request, reply) => {
      const grant = codes.redeem((request.body as { code: string }).code);
      // Revoked since the code was given: its holder may no longer sign anyone in.
      if (!grant || !deps.store.credential(grant.clientId)) {
        throw new ApiError('UNAUTHORIZED', 'the code is unknown, used or expired: run mesh-agent ui again');
      }
      return tokenAnswer(deps, reply, deps.tokens.issue(grant.clientId, grant.scopes));
    },
  );

  const hide = { schema: { hide: true } };
  app.get('/ui', hide, async (_request, reply) => reply.redirect('/ui/', 302));
  app.get('/ui/', hide, async (request, reply) => serveFile('index.html', request, reply));
  app.get<{ Params: { file: string } }>('/ui/:file', hide, async (request, reply) =>
    serveFile(request.params.file, request, reply),
  );
}
