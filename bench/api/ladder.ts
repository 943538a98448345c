/**
 * Cost ladders of the two benchmarked API paths: where an authenticated GET /v1/credentials and a
 * POST /v1/oauth/token spend their CPU, piece by piece. Each step is a server process that adds
 * one piece of what the agent does per request to the step before it. The steps are built from
 * the agent's own modules (its logger, route-scope table, AccessTokens, TokenEndpoint, Store,
 * response schemas), and each ladder ends with the real agent (startAgent, the composition root
 * of `mesh-agent serve`) for comparison. Rows marked "alternative" try a cheaper variant of one
 * step. Every step is driven like bench/api/run.ts drives the agent (autocannon CLI, -c 50, 2 s
 * warm-up discarded) and scored by the server's CPU time per request, read from /proc, which
 * stays readable on a shared, noisy machine where req/s does not. The difference between two
 * steps is what that piece costs per request.
 *
 * Run: npm run build && node dist/bench/api/ladder.js   (host loopback; about 8 minutes)
 * Environment: BENCH_LADDER (read,token), BENCH_REPS (2), BENCH_DURATION (10), BENCH_CONNS (50),
 * BENCH_WARMUP (2). Raw autocannon JSON and summary.md go to bench/results/<timestamp>-ladder/.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createPrivateKey, randomBytes, randomUUID } from 'node:crypto';
import { mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Type } from '@sinclair/typebox';
import Fastify, { type FastifyInstance, type FastifyServerOptions } from 'fastify';
import pino from 'pino';
import { audienceFor, createLogger, startAgent } from '../../src/agent.js';
import { ROUTE_SCOPES, routeKey } from '../../src/api/route-scopes.js';
import { CredentialListItem, TokenResponse } from '../../src/api/schemas.js';
import { AccessTokens } from '../../src/auth/access-tokens.js';
import { parseTokenForm } from '../../src/auth/client-authentication.js';
import { FailureThrottle } from '../../src/auth/failure-throttle.js';
import { SecretHasher } from '../../src/auth/secret-hash.js';
import { TokenEndpoint } from '../../src/auth/token-endpoint.js';
import { systemClock } from '../../src/domain/clock.js';
import { ADMIN, grants, SCOPE_NAMES, type ScopeName, scope } from '../../src/domain/scopes.js';
import { generateLicenseKeyPair } from '../../src/license/sign.js';
import { parseLicensePublicKey } from '../../src/license/verify.js';
import type { CredentialRecord } from '../../src/store/records.js';
import { Store } from '../../src/store/store.js';
import { handBuiltSigner } from './alt-token-signer.js';
import {
  benchLicense,
  describe,
  fmt,
  freePort,
  type LoadRequest,
  type Measurement,
  measure,
  median,
  REPO_ROOT,
  range,
} from './measure.js';

type Ladder = 'read' | 'token';

interface Step {
  ladder: Ladder;
  name: string;
  /** The step (index in STEPS) this one is compared with; the one before it when absent. */
  vs?: number;
  logger?: 'warn' | 'info';
  /** genReqId and the async onSend hook that sets x-request-id, as buildApp has them. */
  reqId?: boolean;
  schema?: boolean;
  /** read: the authorize hook. */
  authorize?: boolean;
  /** Where credentials come from: SQLite as the agent reads it, with locking_mode=EXCLUSIVE, or a Map. */
  credentials?: 'sqlite' | 'sqlite-exclusive' | 'map';
  /** token: TokenEndpoint.grant with no signing (a fixed token), jose (the agent), or node:crypto. */
  grant?: 'fixed-token' | 'jose' | 'node-crypto';
  realAgent?: boolean;
}

const FASTIFY: Partial<Step> = { logger: 'warn', reqId: true, schema: true };
const READ: Partial<Step> = { ...FASTIFY, authorize: true };
const TOKEN: Partial<Step> = { ...FASTIFY, credentials: 'sqlite' };

const STEPS: readonly Step[] = [
  // 0-9: GET /v1/credentials
  { ladder: 'read', name: 'bare Fastify (logger off), same JSON body' },
  {
    ladder: 'read',
    name: '+ the agent logger (pino + redact) at warn: a child logger per request, no lines',
    logger: 'warn',
  },
  {
    ladder: 'read',
    name: '+ genReqId and the async onSend hook that sets x-request-id',
    logger: 'warn',
    reqId: true,
  },
  { ladder: 'read', name: '+ response schema (CredentialListItem[] via fast-json-stringify)', ...FASTIFY },
  {
    ladder: 'read',
    ...READ,
    name: '+ async onRequest authorize: route-scope lookup, Bearer regex, AccessTokens.verify (cached)',
  },
  {
    ladder: 'read',
    ...READ,
    name: '+ SQLite: Store.credential per request (revocation check), Store.credentials for the body',
    credentials: 'sqlite',
  },
  {
    ladder: 'read',
    ...READ,
    name: "+ log level info: Fastify's two lines per request (the agent's default)",
    credentials: 'sqlite',
    logger: 'info',
  },
  { ladder: 'read', name: 'the real agent (startAgent, log info)', realAgent: true, vs: 6 },
  {
    ladder: 'read',
    ...READ,
    name: 'alternative to step 5: SQLite with locking_mode=EXCLUSIVE',
    credentials: 'sqlite-exclusive',
    vs: 5,
  },
  {
    ladder: 'read',
    ...READ,
    name: 'alternative to step 5: credentials from an in-memory Map, no SQL',
    credentials: 'map',
    vs: 5,
  },
  // 10-17: POST /v1/oauth/token
  {
    ladder: 'token',
    name: 'bare Fastify (logger off): POST, form body read as text, fixed token-sized JSON',
  },
  {
    ladder: 'token',
    ...FASTIFY,
    name: "+ the agent's Fastify setup: logger at warn, request id hook, TokenResponse schema",
  },
  {
    ladder: 'token',
    ...TOKEN,
    name: '+ TokenEndpoint.grant without signing: form parse, throttle check, Store.credential, HMAC',
    grant: 'fixed-token',
  },
  {
    ladder: 'token',
    ...TOKEN,
    name: '+ signing with AccessTokens.issue (jose SignJWT over WebCrypto)',
    grant: 'jose',
  },
  {
    ladder: 'token',
    ...TOKEN,
    name: "+ log level info: Fastify's two lines per request (the agent's default)",
    grant: 'jose',
    logger: 'info',
  },
  { ladder: 'token', name: 'the real agent (startAgent, log info)', realAgent: true, vs: 14 },
  {
    ladder: 'token',
    ...TOKEN,
    name: 'alternative to step 13: hand-built JWT signed with node:crypto',
    grant: 'node-crypto',
    vs: 13,
  },
  {
    ladder: 'token',
    ...TOKEN,
    name: 'alternative to step 13: credentials from an in-memory Map, no SQL',
    grant: 'jose',
    credentials: 'map',
    vs: 13,
  },
];

// --- server side: one step per process -----------------------------------------------------

const READ_PATH = '/v1/credentials';
const TOKEN_PATH = '/v1/oauth/token';
const formHeaders = { 'content-type': 'application/x-www-form-urlencoded' };
const tokenForm = (clientId: string, clientSecret: string) =>
  new URLSearchParams({
    grant_type: 'client_credentials',
    client_id: clientId,
    client_secret: clientSecret,
  }).toString();

/** Tells the driver, on stdout, that the server listens and which request to repeat. */
function announce(req: LoadRequest): void {
  process.stdout.write(`${JSON.stringify(req)}\n`);
}

async function serveRealAgent(
  ladder: Ladder,
  url: string,
  port: number,
  workDir: string,
  log: pino.DestinationStream,
) {
  const pair = generateLicenseKeyPair();
  await startAgent({
    listenHost: '127.0.0.1',
    listenPort: port,
    advertise: `127.0.0.1:${port}`,
    dataDir: join(workDir, 'agent-data'),
    licenseKeys: [parseLicensePublicKey(pair.publicPem)],
    publicUrl: url,
    logLevel: 'info',
    logDestination: log as unknown as NodeJS.WritableStream,
  });
  const license = benchLicense(pair.privatePem);
  const boot = (await (
    await fetch(`${url}/v1/bootstrap`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ license, name: 'ladder' }),
    })
  ).json()) as { client_id: string; client_secret: string };
  const body = tokenForm(boot.client_id, boot.client_secret);
  if (ladder === 'token') return announce({ method: 'POST', path: TOKEN_PATH, headers: formHeaders, body });
  const token = (await (
    await fetch(`${url}${TOKEN_PATH}`, { method: 'POST', headers: formHeaders, body })
  ).json()) as {
    access_token: string;
  };
  if (!token.access_token) throw new Error('the real agent gave no token');
  announce({ method: 'GET', path: READ_PATH, headers: { authorization: `Bearer ${token.access_token}` } });
}

async function serveStep(index: number, port: number, workDir: string): Promise<void> {
  const step = STEPS[index]!;
  const log = (name: string) =>
    pino.destination({ dest: openSync(join(workDir, `${name}.log`), 'a'), sync: true });
  const url = `http://127.0.0.1:${port}`;
  if (step.realAgent) return serveRealAgent(step.ladder, url, port, workDir, log('agent'));

  // What the agent would hold: one admin credential, its token key and hash key.
  const clientId = 'mc_ladder';
  const clientSecret = randomBytes(32).toString('base64url');
  const hasher = new SecretHasher(randomBytes(32));
  const record: CredentialRecord = {
    clientId,
    secretHash: hasher.hash(clientSecret),
    scopes: [ADMIN],
    licenseId: 'license-bench',
    createdAt: new Date().toISOString(),
    lastUsedAt: new Date().toISOString(), // touched just now: no last_used_at write during the run
  };
  const sqlite = step.credentials?.startsWith('sqlite') ? new Store(join(workDir, 'ladder.db')) : undefined;
  if (step.credentials === 'sqlite-exclusive') sqlite?.db.pragma('locking_mode = EXCLUSIVE');
  sqlite?.insertCredential(record);
  const memory = new Map(step.credentials === 'map' ? [[clientId, record]] : []);
  const credential = (id: string) => (sqlite ? sqlite.credential(id) : memory.get(id));
  const listItems = () =>
    (sqlite ? sqlite.credentials() : step.credentials === 'map' ? [...memory.values()] : [record]).map(
      (c) => ({
        client_id: c.clientId,
        scopes: c.scopes,
        license_id: c.licenseId,
        created_at: c.createdAt,
        last_used_at: c.lastUsedAt,
      }),
    );
  const tokenKey = createPrivateKey(generateLicenseKeyPair().privatePem);
  const audience = audienceFor('ladder');
  const tokens = await AccessTokens.create(tokenKey, url, audience, systemClock);
  const fixedToken = (await tokens.issue(clientId, [ADMIN])).accessToken;

  const options: FastifyServerOptions = step.logger ? {} : { logger: false };
  if (step.logger) options.loggerInstance = createLogger(step.logger, log(`step${index}`) as never);
  if (step.reqId) {
    options.genReqId = (req) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && /^[A-Za-z0-9._-]{1,64}$/.test(given) ? given : randomUUID();
    };
  }
  const app = Fastify(options) as FastifyInstance;
  if (step.reqId) {
    app.addHook('onSend', async (request, reply) => {
      reply.header('x-request-id', request.id);
    });
  }

  if (step.ladder === 'read') {
    if (step.authorize) {
      app.addHook('onRequest', async (request) => {
        const guard = ROUTE_SCOPES[routeKey(request.method, request.routeOptions.url ?? '')];
        if (guard === undefined || guard === 'public') return;
        const header = request.headers.authorization;
        const match = header === undefined ? null : /^Bearer ([A-Za-z0-9._~+/-]+=*)$/.exec(header);
        if (!match) throw new Error('unauthorized');
        const verified = await tokens.verify(match[1]!);
        if (!verified) throw new Error('unauthorized');
        if (step.credentials && !credential(verified.clientId)) throw new Error('revoked');
        const name = (SCOPE_NAMES as readonly string[]).includes(guard) ? (guard as ScopeName) : undefined;
        if (name && !grants(verified.scopes, scope(name))) throw new Error('forbidden');
      });
    }
    const schema = step.schema ? { response: { 200: Type.Array(CredentialListItem) } } : {};
    app.get(READ_PATH, { schema }, async () => listItems());
    await app.listen({ host: '127.0.0.1', port });
    return announce({ method: 'GET', path: READ_PATH, headers: { authorization: `Bearer ${fixedToken}` } });
  }

  // token ladder
  const signer =
    step.grant === 'node-crypto'
      ? handBuiltSigner(tokenKey, tokens.keyId, url, audience)
      : step.grant === 'fixed-token'
        ? {
            issue: async (_id: string, scopes: readonly string[]) => ({
              accessToken: fixedToken,
              expiresIn: 3600,
              scopes: [...scopes],
            }),
          }
        : tokens;
  const store = { credential, touchCredential: (id: string, at: string) => sqlite?.touchCredential(id, at) };
  const endpoint = new TokenEndpoint(
    store as unknown as Store,
    hasher,
    signer as unknown as AccessTokens,
    new FailureThrottle(systemClock),
    systemClock,
  );
  app.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string' }, (_req, body, done) =>
    done(null, body),
  );
  const schema = step.schema ? { response: { 200: TokenResponse } } : {};
  app.post(TOKEN_PATH, { schema }, async (request, reply) => {
    if (!step.grant) {
      return { access_token: fixedToken, token_type: 'Bearer', expires_in: 3600, scope: ADMIN };
    }
    const issued = await endpoint.grant({
      form: parseTokenForm(request.body as string),
      authorization: request.headers.authorization,
      remoteAddress: request.ip,
    });
    reply.headers({ 'cache-control': 'no-store', pragma: 'no-cache' });
    return {
      access_token: issued.accessToken,
      token_type: 'Bearer',
      expires_in: issued.expiresIn,
      scope: issued.scopes.join(' '),
    };
  });
  await app.listen({ host: '127.0.0.1', port });
  announce({
    method: 'POST',
    path: TOKEN_PATH,
    headers: formHeaders,
    body: tokenForm(clientId, clientSecret),
  });
}

// --- driver ----------------------------------------------------------------------------------

const int = (name: string, fallback: number): number => {
  const v = process.env[name];
  return v && /^\d+$/.test(v) ? Number(v) : fallback;
};

async function startStep(step: number, workDir: string) {
  const port = await freePort();
  const proc: ChildProcess = spawn(
    process.execPath,
    [fileURLToPath(import.meta.url), '--serve', String(step), String(port), workDir],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  const line = await new Promise<string>((done, fail) => {
    const rl = createInterface({ input: proc.stdout! });
    const timer = setTimeout(() => fail(new Error(`step ${step} did not start`)), 30_000);
    rl.once('line', (l) => {
      clearTimeout(timer);
      done(l);
    });
    proc.once('exit', (code) => fail(new Error(`step ${step} exited with ${code}`)));
  });
  return { proc, baseUrl: `http://127.0.0.1:${port}`, request: JSON.parse(line) as LoadRequest };
}

async function drive(): Promise<void> {
  const reps = int('BENCH_REPS', 2);
  const ladders = (process.env.BENCH_LADDER || 'read,token').split(',');
  const load = {
    conns: int('BENCH_CONNS', 50),
    warmupSeconds: int('BENCH_WARMUP', 2),
    durationSeconds: int('BENCH_DURATION', 10),
  };
  const stamp = new Date()
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d+Z$/, 'Z');
  const outDir = join(REPO_ROOT, 'bench/results', `${stamp}-ladder`);
  mkdirSync(outDir, { recursive: true });
  const chosen = [...STEPS.entries()].filter(([, s]) => ladders.includes(s.ladder));
  const results = new Map<number, Measurement[]>(chosen.map(([i]) => [i, []]));
  for (let rep = 1; rep <= reps; rep++) {
    for (const [i, step] of chosen) {
      const workDir = mkdtempSync(join(tmpdir(), 'mesh-ladder-'));
      const server = await startStep(i, workDir);
      try {
        const m = await measure(
          server.baseUrl,
          server.request,
          server.proc.pid!,
          join(outDir, `r${rep}-step${i}-autocannon.json`),
          load,
        );
        process.stderr.write(`[ladder] rep ${rep} step ${i} (${step.name}): ${describe(m)}\n`);
        results.get(i)!.push(m);
      } finally {
        server.proc.kill('SIGKILL');
        rmSync(workDir, { recursive: true, force: true });
      }
    }
  }
  const cpu = (i: number) => median((results.get(i) ?? []).map((m) => m.cpuUsPerReq ?? Number.NaN));
  const lines = [
    `Node ${process.version}, host loopback, autocannon -c ${load.conns} -d ${load.durationSeconds} after a ${load.warmupSeconds} s warm-up, ${reps} rep(s); cells are median [min-max]. CPU µs/req: the server's user+system time (all threads) over the run divided by the requests answered.`,
  ];
  for (const ladder of ladders) {
    lines.push(
      '',
      ladder === 'read' ? `GET ${READ_PATH} (authenticated):` : `POST ${TOKEN_PATH}:`,
      '',
      '| step | CPU µs/req | + µs/req (vs previous step unless named) | req/s | p99 ms | invalid runs |',
      '|---|---|---|---|---|---|',
    );
    for (const [i, step] of chosen.filter(([, s]) => s.ladder === ladder)) {
      const ms = results.get(i)!;
      const first = STEPS.findIndex((s) => s.ladder === ladder) === i;
      const vs = step.vs ?? i - 1;
      const delta = first
        ? ''
        : `${fmt(cpu(i) - cpu(vs), 1)}${step.vs === undefined ? '' : ` (vs step ${vs})`}`;
      const col = (pick: (m: Measurement) => number, digits: number) => range(ms.map(pick), digits);
      const invalid = ms.flatMap((m) => (m.invalid ? [m.invalid] : [])).join('; ');
      lines.push(
        `| ${i}. ${step.name} | ${col((m) => m.cpuUsPerReq ?? Number.NaN, 1)} | ${delta} | ${col((m) => m.reqPerSec, 0)} | ${col((m) => m.p99, 0)} | ${invalid} |`,
      );
    }
  }
  const table = lines.join('\n');
  writeFileSync(join(outDir, 'summary.md'), `# bench:api ladder ${stamp}\n\n${table}\n`);
  writeFileSync(
    join(outDir, 'results.json'),
    JSON.stringify({ steps: STEPS, load, reps, results: Object.fromEntries(results) }, null, 2),
  );
  process.stdout.write(`${table}\n`);
}

const args = process.argv.slice(2);
(args[0] === '--serve' ? serveStep(Number(args[1]), Number(args[2]), args[3]!) : drive()).catch(
  (err: unknown) => {
    process.stderr.write(`ladder: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  },
);
