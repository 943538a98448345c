/**
 * Where the `mesh-agent` client commands find the agent and their credential: a profile file
 * in `$XDG_CONFIG_HOME/mesh-agent/` (default `~/.config/mesh-agent/`), and the environment
 * variables MESH_URL, MESH_CLIENT_ID, MESH_CLIENT_SECRET, MESH_PROFILE. Also the cached access
 * token of each profile. Used by the client commands only (src/cli/client-*.ts).
 *
 * Files hold secrets: the directory is 0700 and every file 0600, written atomically.
 */
import { chmodSync, existsSync, mkdirSync, readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { writeFileAtomic } from '../store/key-files.js';
import { UsageError } from './serve-options.js';

export interface Profile {
  url: string;
  client_id: string;
  client_secret: string;
}

/** A cached access token; url and client id say which credential it belongs to. */
export interface CachedToken {
  url: string;
  client_id: string;
  access_token: string;
  /** Epoch milliseconds, from the token response's expires_in and the client's clock. */
  expires_at_ms: number;
  /** expires_in of the token response, in ms: sets the refresh margin. */
  lifetime_ms?: number;
}

export const DEFAULT_PROFILE = 'default';
const PROFILE_NAME = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$/;

export function configDir(env: NodeJS.ProcessEnv): string {
  const base =
    env.XDG_CONFIG_HOME && env.XDG_CONFIG_HOME !== '' ? env.XDG_CONFIG_HOME : join(homedir(), '.config');
  return join(base, 'mesh-agent');
}

export function checkProfileName(name: string): string {
  // The name becomes a file name: no separators, no dot files.
  if (!PROFILE_NAME.test(name)) throw new UsageError(`invalid profile name: ${JSON.stringify(name)}`);
  return name;
}

export const profilePath = (dir: string, name: string) => join(dir, `${checkProfileName(name)}.json`);
const tokenPath = (dir: string, name: string) => join(dir, `${checkProfileName(name)}.token.json`);

function ensureDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  // An existing directory made by someone else's umask is tightened: it holds secrets.
  chmodSync(dir, 0o700);
}

/** Checks an agent base URL: http(s) only, no trailing slash kept. */
export function normalizeUrl(text: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new UsageError(`not a URL: ${text}`);
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new UsageError(`the agent URL must be http:// or https://, not ${url.protocol}`);
  }
  return url.toString().replace(/\/+$/, '');
}

export function saveProfile(dir: string, name: string, profile: Profile): string {
  ensureDir(dir);
  const path = profilePath(dir, name);
  writeFileAtomic(path, `${JSON.stringify(profile, null, 2)}\n`, 0o600);
  return path;
}

export function loadProfile(dir: string, name: string): Profile | undefined {
  const path = profilePath(dir, name);
  if (!existsSync(path)) return undefined;
  let parsed: Partial<Profile>;
  try {
    parsed = JSON.parse(readFileSync(path, 'utf8')) as Partial<Profile>;
  } catch {
    // Not the parser's message: V8 quotes the text around the fault, which may be the secret.
    throw new Error(`${path}: not valid JSON; run \`mesh-agent login\` again`);
  }
  return {
    url: typeof parsed.url === 'string' ? parsed.url : '',
    client_id: typeof parsed.client_id === 'string' ? parsed.client_id : '',
    client_secret: typeof parsed.client_secret === 'string' ? parsed.client_secret : '',
  };
}

export interface ResolvedProfile {
  /** Profile name: where the token is cached. */
  name: string;
  url?: string;
  clientId?: string;
  clientSecret?: string;
}

/**
 * The rule (docs/cli.md): `--profile NAME` given: that profile file alone. Otherwise each of
 * MESH_URL, MESH_CLIENT_ID, MESH_CLIENT_SECRET that is set overrides the same field of the
 * profile named by MESH_PROFILE (default `default`), which need not exist. The environment wins
 * because it is what a script or a container sets for one run.
 */
export function resolveProfile(
  dir: string,
  env: NodeJS.ProcessEnv,
  explicitProfile: string | undefined,
): ResolvedProfile {
  if (explicitProfile !== undefined) {
    const p = loadProfile(dir, explicitProfile);
    return {
      name: explicitProfile,
      url: p?.url || undefined,
      clientId: p?.client_id || undefined,
      clientSecret: p?.client_secret || undefined,
    };
  }
  const name = checkProfileName(env.MESH_PROFILE || DEFAULT_PROFILE);
  const p = loadProfile(dir, name);
  return {
    name,
    url: env.MESH_URL || p?.url || undefined,
    clientId: env.MESH_CLIENT_ID || p?.client_id || undefined,
    clientSecret: env.MESH_CLIENT_SECRET || p?.client_secret || undefined,
  };
}

export function loadToken(dir: string, name: string): CachedToken | undefined {
  const path = tokenPath(dir, name);
  if (!existsSync(path)) return undefined;
  try {
    const t = JSON.parse(readFileSync(path, 'utf8')) as CachedToken;
    if (typeof t.access_token !== 'string' || typeof t.expires_at_ms !== 'number') return undefined;
    return t;
  } catch {
    // A damaged cache only costs one token request.
    return undefined;
  }
}

export function saveToken(dir: string, name: string, token: CachedToken): void {
  ensureDir(dir);
  writeFileAtomic(tokenPath(dir, name), `${JSON.stringify(token)}\n`, 0o600);
}

/**
 * Whether a cached token can still be sent: it belongs to this agent and credential and has
 * more than a margin left (a tenth of its life, at least 60 s), so a request never leaves with
 * a token that expires on the way or under a slightly fast agent clock.
 */
export function tokenUsable(
  token: CachedToken | undefined,
  url: string,
  clientId: string,
  nowMs: number,
  lifetimeMs = 3_600_000,
): token is CachedToken {
  if (!token || token.url !== url || token.client_id !== clientId) return false;
  const margin = Math.max(60_000, lifetimeMs / 10);
  return token.expires_at_ms - nowMs > margin;
}
