#!/usr/bin/env node
/**
 * The `mesh-agent` command: `serve`, `license keygen`, `license sign`, `version`, and the
 * client commands of client-commands.ts (login, bootstrap, peers, services, routes,
 * credentials, cluster, status, explain), which have exit codes of their own (docs/cli.md).
 * Exit codes here: 0 success, 1 runtime failure, 2 usage error.
 */
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { systemClock } from '../domain/clock.js';
import { generateLicenseKeyPair, loadLicenseSigningKey, signLicense } from '../license/sign.js';
import { parseLicensePublicKey } from '../license/verify.js';
import { writeFileAtomic } from '../store/key-files.js';
import { CLIENT_COMMAND_NAMES, CLIENT_USAGE } from './client-usage.js';
import { devBanner, prepareDevMode } from './dev-mode.js';
import { parseServeOptions, SERVE_USAGE, UsageError } from './serve-options.js';
import { restartWithV8Flags } from './v8-flags.js';

const USAGE = `usage:
${SERVE_USAGE}
  mesh-agent license keygen --out DIR [--force]
  mesh-agent license sign --key FILE --customer-id C --license-id L --max-nodes N
                   --max-services M --expires-at ISO [--issued-at ISO]
  mesh-agent version
Every serve flag is also an environment variable MESH_<FLAG> (e.g. MESH_DATA_DIR).

${CLIENT_USAGE}`;

async function serve(argv: string[]): Promise<void> {
  const opts = parseServeOptions(argv, process.env);
  // Before anything is opened or written: the process may be replaced by itself here.
  restartWithV8Flags();
  const keyTexts = opts.licensePublicKeys.map((k) => (existsSync(k) ? readFileSync(k, 'utf8') : k));
  let banner: string | undefined;
  if (opts.dev) {
    const dev = prepareDevMode(opts.dataDir, systemClock.now());
    keyTexts.push(dev.publicPem);
    banner = devBanner(opts.publicUrl, dev.bootstrapBodyFile);
  }
  const licenseKeys = keyTexts.map((text, i) => {
    try {
      return parseLicensePublicKey(text);
    } catch (err) {
      // A path that existsSync cannot see (missing, or a directory the service user may not
      // enter) arrives here as its own text: say so, or the operator hunts a bad key.
      const given = opts.licensePublicKeys[i];
      const hint =
        given !== undefined && text === given && given.includes('/')
          ? ` (if ${given} is a file: it is missing or this user cannot read it)`
          : '';
      throw new UsageError(`--license-public-key: ${(err as Error).message}${hint}`);
    }
  });
  // Loaded here, not at the top: the license commands need none of the agent (Fastify, SQLite).
  const { startAgent } = await import('../agent.js');
  const agent = await startAgent({
    listenHost: opts.listenHost,
    listenPort: opts.listenPort,
    advertise: opts.advertise,
    dataDir: opts.dataDir,
    licenseKeys,
    publicUrl: opts.publicUrl,
    tls:
      opts.tlsCert && opts.tlsKey
        ? { cert: readFileSync(opts.tlsCert), key: readFileSync(opts.tlsKey) }
        : undefined,
    logLevel: opts.logLevel,
    metricsPublic: opts.metricsPublic,
    gossipIntervalMs: opts.gossipIntervalMs,
    failover: {
      intervalMs: opts.healthIntervalMs,
      misses: opts.healthMisses,
      holdDownMs: opts.failoverHoldDownMs,
    },
    eventRetention: { maxAgeMs: opts.eventsMaxAgeDays * 86_400_000, maxCount: opts.eventsMaxCount },
    dataplane: opts.dataplane,
    macvlanParent: opts.macvlanParent,
    kcp: opts.kcp,
  });
  if (banner) process.stderr.write(`${banner}\n`);

  const shutdown = (signal: string) => {
    agent.logger.info({ signal }, 'stopping');
    agent.stop().then(
      () => process.exit(0),
      (err: unknown) => {
        agent.logger.error({ err }, 'error while stopping');
        process.exit(1);
      },
    );
  };
  process.once('SIGTERM', () => shutdown('SIGTERM'));
  process.once('SIGINT', () => shutdown('SIGINT'));
}

/** parseArgs rejects unknown flags and missing values: usage errors (exit 2), as for serve. */
function parseFlags<T>(parse: () => T): T {
  try {
    return parse();
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

function licenseKeygen(argv: string[]): void {
  const { values } = parseFlags(() =>
    parseArgs({ args: argv, options: { out: { type: 'string' }, force: { type: 'boolean' } }, strict: true }),
  );
  if (!values.out) throw new UsageError('license keygen needs --out DIR');
  // An overwritten vendor signing key is gone for good, and so is the power to sign for its licenses.
  if (!values.force && existsSync(join(values.out, 'license-signing.key'))) {
    throw new UsageError(
      `${join(values.out, 'license-signing.key')} exists; refusing to overwrite it without --force`,
    );
  }
  mkdirSync(values.out, { recursive: true, mode: 0o700 });
  const pair = generateLicenseKeyPair();
  writeFileAtomic(join(values.out, 'license-signing.key'), pair.privatePem, 0o600);
  writeFileAtomic(join(values.out, 'license-signing.pub'), pair.publicPem, 0o644);
  process.stdout.write(
    `wrote ${join(values.out, 'license-signing.key')} and ${join(values.out, 'license-signing.pub')}\n`,
  );
}

function licenseSign(argv: string[]): void {
  const { values } = parseFlags(() =>
    parseArgs({
      args: argv,
      strict: true,
      options: {
        key: { type: 'string' },
        'customer-id': { type: 'string' },
        'license-id': { type: 'string' },
        'max-nodes': { type: 'string' },
        'max-services': { type: 'string' },
        'expires-at': { type: 'string' },
        'issued-at': { type: 'string' },
      },
    }),
  );
  const required = ['key', 'customer-id', 'license-id', 'max-nodes', 'max-services', 'expires-at'] as const;
  const missing = required.filter((k) => values[k] === undefined);
  if (missing.length > 0)
    throw new UsageError(`license sign needs ${missing.map((k) => `--${k}`).join(', ')}`);
  const integer = (flag: 'max-nodes' | 'max-services', min: number) => {
    const text = values[flag]!;
    if (!/^\d{1,7}$/.test(text) || Number(text) < min)
      throw new UsageError(`--${flag} must be an integer >= ${min}`);
    return Number(text);
  };
  const timestamp = (flag: 'expires-at' | 'issued-at', fallback?: string) => {
    const text = values[flag] ?? fallback!;
    const ms = Date.parse(text);
    if (!Number.isFinite(ms) || !/T/.test(text))
      throw new UsageError(`--${flag} must be an ISO 8601 date-time`);
    return new Date(ms).toISOString();
  };
  const license = signLicense(
    {
      customer_id: values['customer-id']!,
      license_id: values['license-id']!,
      issued_at: timestamp('issued-at', new Date().toISOString()),
      expires_at: timestamp('expires-at'),
      max_nodes: integer('max-nodes', 1),
      max_services: integer('max-services', 0),
    },
    loadLicenseSigningKey(readFileSync(values.key!, 'utf8')),
  );
  process.stdout.write(`${JSON.stringify(license, null, 2)}\n`);
}

async function main(argv: string[]): Promise<void> {
  const [command, sub, ...rest] = argv;
  if (command === 'serve') return serve(argv.slice(1));
  if (command !== undefined && CLIENT_COMMAND_NAMES.has(command)) {
    // Loaded on demand like the agent: the client needs none of the server's modules.
    const { runClientCommand } = await import('./client-commands.js');
    process.exitCode = await runClientCommand(argv);
    return;
  }
  if (command === 'license' && sub === 'keygen') return licenseKeygen(rest);
  if (command === 'license' && sub === 'sign') return licenseSign(rest);
  if (command === 'version' || command === '--version') {
    const { AGENT_VERSION } = await import('../agent.js');
    process.stdout.write(`${AGENT_VERSION}\n`);
    return;
  }
  if (command === 'help' || command === '--help' || command === undefined) {
    process.stdout.write(`${USAGE}\n`);
    return;
  }
  throw new UsageError(`unknown command: ${argv.join(' ')}`);
}

main(process.argv.slice(2)).catch((err: unknown) => {
  if (err instanceof UsageError) {
    process.stderr.write(`mesh-agent: ${err.message}\n${USAGE}\n`);
    process.exit(2);
  }
  process.stderr.write(`mesh-agent: ${(err as Error).message}\n`);
  process.exit(1);
});
