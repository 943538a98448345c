/**
 * Micro-costs of the pieces that the CPU profile of bench/api puts on the two hot API paths,
 * each next to a cheaper alternative, so that a suggested change comes with its measured gain:
 *
 * - token issuance: the agent's AccessTokens.issue (jose SignJWT over WebCrypto) against the
 *   same JWT built by hand and signed with node:crypto's one-shot Ed25519 sign; the hand-built
 *   token is checked with AccessTokens.verify, so the alternative is wire-compatible;
 * - the rest of a token request: form parsing, the failure throttle's check, and
 *   SecretHasher.hash (HMAC-SHA-256);
 * - the revocation check under every authenticated request: Store.credential (one SQLite point
 *   read) with the default locking mode, with locking_mode=EXCLUSIVE, and a Map lookup;
 * - request logging: the two lines Fastify writes per request at level info, through the
 *   agent's own logger (createLogger: pino with its redact paths) and through plain pino, both
 *   to a file with a synchronous write per line (like the agent's stdout sent to a file).
 *
 * Single-threaded, in-process, no network. Run: node dist/bench/api/hot-path-costs.js
 * (BENCH_ITER scales the iteration counts, default 1).
 */
import { createPrivateKey, randomBytes, randomUUID, sign } from 'node:crypto';
import { mkdtempSync, openSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pino from 'pino';
import { createLogger } from '../../src/agent.js';
import { AccessTokens } from '../../src/auth/access-tokens.js';
import { parseTokenForm, readClientCredentials } from '../../src/auth/client-authentication.js';
import { FailureThrottle } from '../../src/auth/failure-throttle.js';
import { SecretHasher } from '../../src/auth/secret-hash.js';
import { systemClock } from '../../src/domain/clock.js';
import { ADMIN } from '../../src/domain/scopes.js';
import { generateLicenseKeyPair } from '../../src/license/sign.js';
import { Store } from '../../src/store/store.js';
import { handBuiltSigner } from './alt-token-signer.js';

const REPO_ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const SCALE = Number(process.env.BENCH_ITER ?? '1') || 1;

/**
 * Median over 5 batches (after a warm-up batch) of the process CPU time per call, in µs: user +
 * system time of all threads (jose's WebCrypto signing runs on the libuv pool), which other
 * load on a shared machine disturbs less than wall time.
 */
async function perCall(n: number, fn: () => unknown | Promise<unknown>): Promise<number> {
  const iterations = Math.max(10, Math.round(n * SCALE));
  const batch = async () => {
    const c0 = process.cpuUsage();
    for (let i = 0; i < iterations; i++) await fn();
    const c = process.cpuUsage(c0);
    return (c.user + c.system) / iterations;
  };
  await batch();
  const runs: number[] = [];
  for (let i = 0; i < 5; i++) runs.push(await batch());
  return runs.sort((a, b) => a - b)[2]!;
}

const rows: [string, string, number][] = [];
const record = (group: string, name: string, us: number) => {
  rows.push([group, name, us]);
  process.stderr.write(`  ${group}: ${name}: ${us.toFixed(1)} µs\n`);
};

async function tokenSigning(): Promise<void> {
  const key = createPrivateKey(generateLicenseKeyPair().privatePem);
  const issuer = 'http://127.0.0.1:7480';
  const audience = 'urn:mesh-agent:peer:bench';
  const tokens = await AccessTokens.create(key, issuer, audience, systemClock);
  const signer = handBuiltSigner(key, tokens.keyId, issuer, audience);
  const handBuilt = (clientId: string) => signer.issue(clientId, [ADMIN]).accessToken;
  const check = await tokens.verify(handBuilt('mc_bench'));
  if (check?.clientId !== 'mc_bench') throw new Error('the hand-built token does not verify');
  record(
    'token issuance',
    'AccessTokens.issue (jose SignJWT, WebCrypto)',
    await perCall(2000, () => tokens.issue('mc_bench', [ADMIN])),
  );
  record(
    'token issuance',
    'hand-built JWT + node:crypto sign (verifies)',
    await perCall(2000, () => handBuilt('mc_bench')),
  );
  record(
    'token issuance',
    'node:crypto Ed25519 sign alone',
    await perCall(2000, () => sign(null, Buffer.from('x'.repeat(400)), key)),
  );
  const form = new URLSearchParams({
    grant_type: 'client_credentials',
    client_id: `mc_${randomBytes(16).toString('hex')}`,
    client_secret: randomBytes(32).toString('base64url'),
  }).toString();
  record(
    'token request',
    'parseTokenForm + readClientCredentials',
    await perCall(50000, () => readClientCredentials(undefined, parseTokenForm(form))),
  );
  const throttle = new FailureThrottle(systemClock);
  record(
    'token request',
    'FailureThrottle.check',
    await perCall(50000, () => throttle.check('127.0.0.1', 'mc_x')),
  );
  const hasher = new SecretHasher(randomBytes(32));
  const secret = randomBytes(32).toString('base64url');
  record(
    'client authentication',
    'SecretHasher.hash (HMAC-SHA-256)',
    await perCall(20000, () => hasher.hash(secret)),
  );
}

async function revocationCheck(dir: string): Promise<void> {
  for (const exclusive of [false, true]) {
    const store = new Store(join(dir, `read-${exclusive}.db`));
    try {
      if (exclusive) store.db.pragma('locking_mode = EXCLUSIVE');
      store.insertCredential({
        clientId: 'mc_bench',
        secretHash: randomBytes(32),
        scopes: [ADMIN],
        licenseId: 'license-bench',
        createdAt: new Date().toISOString(),
        lastUsedAt: null,
      });
      const mode = exclusive ? 'locking_mode=EXCLUSIVE' : 'default locking (as the agent)';
      record(
        'store read',
        `Store.credential, ${mode}`,
        await perCall(50000, () => store.credential('mc_bench')),
      );
      record(
        'store read',
        `Store.credentials (list), ${mode}`,
        await perCall(50000, () => store.credentials()),
      );
      if (!exclusive) {
        const cache = new Map([['mc_bench', store.credential('mc_bench')]]);
        record(
          'store read',
          'Map.get (an in-memory credential cache)',
          await perCall(50000, () => cache.get('mc_bench')),
        );
      }
    } finally {
      store.close();
    }
  }
}

async function requestLogging(dir: string): Promise<void> {
  // What Fastify logs for each request at info: a child logger with the request id, then
  // "incoming request" with the serialized request and "request completed" with the response.
  const req = {
    method: 'GET',
    url: '/v1/credentials',
    host: '127.0.0.1:7480',
    remoteAddress: '127.0.0.1',
    remotePort: 41234,
  };
  const res = { statusCode: 200 };
  const variants: [string, (dest: pino.DestinationStream) => pino.Logger][] = [
    [
      'agent logger (createLogger, with redact)',
      (dest) => createLogger('info', dest as unknown as NodeJS.WritableStream),
    ],
    ['plain pino, no redact', (dest) => pino({ level: 'info' }, dest)],
  ];
  for (const [name, make] of variants) {
    // Like the agent's stdout redirected to a file: a synchronous write per line.
    const dest = pino.destination({ dest: openSync(join(dir, `${name.length}.log`), 'a'), sync: true });
    const logger = make(dest);
    record(
      'request logging',
      `2 lines per request, ${name}, to a file`,
      await perCall(20000, () => {
        const child = logger.child({ reqId: randomUUID() });
        child.info({ req }, 'incoming request');
        child.info({ res, responseTime: 1.234 }, 'request completed');
      }),
    );
  }
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'mesh-hot-path-'));
  try {
    process.stderr.write(`hot-path-costs (${REPO_ROOT}):\n`);
    await tokenSigning();
    await revocationCheck(dir);
    await requestLogging(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  process.stdout.write(
    [
      `Node ${process.version}; process CPU time (user + system, all threads) per call, median of 5 batches.`,
      '',
      '| hot-path piece | variant | CPU µs per call |',
      '|---|---|---|',
      ...rows.map(([g, n, us]) => `| ${g} | ${n} | ${us.toFixed(us < 1 ? 2 : 1)} |`),
      '',
    ].join('\n'),
  );
}

main().catch((err: unknown) => {
  process.stderr.write(`hot-path-costs: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
});
