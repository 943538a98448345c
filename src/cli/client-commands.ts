/**
 * The client commands of the `mesh-agent` binary: `login`, `bootstrap`, `peers`, `services`,
 * `routes`, `credentials`, `cluster`, `webhooks`, `status` and `explain`, each mapped onto the
 * management API (docs/api.md, docs/decisions.md §7). Tables by default, `--json` for the API's
 * own JSON. Loaded by main.ts only when one of these commands is run. Reference: docs/cli.md.
 *
 * Exit codes: 0 ok, 1 the API answered 4xx, 2 usage error, 3 the agent cannot be reached or
 * answered 5xx, 4 not logged in (no credential, or the token endpoint refused it).
 *
 * Secrets: a client secret is printed only by `bootstrap` and `credentials create` (and by
 * `cluster rotate --show-secret`), and a webhook's signing secret only by `webhooks add`, each time
 * with a warning on stderr that it is not shown again.
 * Access tokens are never printed.
 */
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { HEALTH_CHECK_FAILURES, HEALTH_CHECK_INTERVAL_MS } from '../domain/health-check.js';
import { SCOPE_PREFIX } from '../domain/scopes.js';
import { ApiCallError, followStream, MeshClient, NotLoggedInError, UnreachableError } from './client-http.js';
import { configDir, normalizeUrl, profilePath, resolveProfile, saveProfile } from './client-profile.js';
import { bytes, cell, renderObject, renderTable } from './client-table.js';
import { CLIENT_USAGE } from './client-usage.js';
import { UsageError } from './serve-options.js';

export const EXIT = { OK: 0, API: 1, USAGE: 2, UNREACHABLE: 3, NOT_LOGGED_IN: 4 } as const;

const SECRET_WARNING =
  'mesh-agent: WARNING: the client_secret above is shown this once and cannot be retrieved again; store it now.';
const WEBHOOK_SECRET_WARNING =
  'mesh-agent: WARNING: the webhook secret above is shown this once and cannot be retrieved again; give it to the receiver now.';

type Obj = Record<string, unknown>;
type OptionSpec = Record<string, { type: 'string' | 'boolean'; multiple?: boolean }>;

interface Io {
  out(text: string): void;
  err(text: string): void;
}

const COMMON: OptionSpec = {
  json: { type: 'boolean' },
  profile: { type: 'string' },
  url: { type: 'string' },
};

interface Parsed {
  values: Record<string, string | boolean | string[] | undefined>;
  positionals: string[];
}

function parse(
  args: string[],
  options: OptionSpec,
  positionals: [min: number, max: number],
  what: string,
): Parsed {
  let parsed: Parsed;
  try {
    parsed = parseArgs({
      args,
      options: { ...COMMON, ...options },
      strict: true,
      allowPositionals: true,
    }) as Parsed;
  } catch (err) {
    throw new UsageError(`${what}: ${(err as Error).message}`);
  }
  const n = parsed.positionals.length;
  if (n < positionals[0] || n > positionals[1]) {
    throw new UsageError(
      `${what}: expected ${positionals[0]}${positionals[1] > positionals[0] ? ` to ${positionals[1]}` : ''} argument(s), got ${n}`,
    );
  }
  return parsed;
}

const str = (p: Parsed, k: string): string | undefined => p.values[k] as string | undefined;
const flag = (p: Parsed, k: string): boolean => p.values[k] === true;
const list = (p: Parsed, k: string): string[] => (p.values[k] as string[] | undefined) ?? [];

function integer(text: string, what: string, min: number, max: number): number {
  if (!/^-?\d{1,16}$/.test(text) || Number(text) < min || Number(text) > max) {
    throw new UsageError(`${what} must be an integer from ${min} to ${max}, not ${JSON.stringify(text)}`);
  }
  return Number(text);
}

/** `--ipv4 none` clears a field on update (the API takes null). */
const cidrOrNull = (text: string) => (text === 'none' ? null : text);

const enc = encodeURIComponent;

class Session {
  readonly json: boolean;
  private client?: MeshClient;

  constructor(
    readonly io: Io,
    readonly env: NodeJS.ProcessEnv,
    readonly parsed: Parsed,
  ) {
    this.json = flag(parsed, 'json');
  }

  get configDir(): string {
    return configDir(this.env);
  }

  /** The API client for the profile / environment; `needCredential` false for public calls. */
  api(needCredential = true): MeshClient {
    if (this.client) return this.client;
    const resolved = resolveProfile(this.configDir, this.env, str(this.parsed, 'profile'));
    const urlText = str(this.parsed, 'url') ?? resolved.url;
    if (!urlText) {
      throw new NotLoggedInError('no agent URL: run `mesh-agent login`, set MESH_URL, or pass --url');
    }
    if (needCredential && (!resolved.clientId || !resolved.clientSecret)) {
      throw new NotLoggedInError(
        `not logged in (profile ${resolved.name}): run \`mesh-agent login\` or set MESH_CLIENT_ID and MESH_CLIENT_SECRET`,
      );
    }
    this.client = new MeshClient({
      url: normalizeUrl(urlText),
      clientId: resolved.clientId,
      clientSecret: resolved.clientSecret,
      configDir: this.configDir,
      profile: resolved.name,
      timeoutMs: this.env.MESH_TIMEOUT_MS
        ? integer(this.env.MESH_TIMEOUT_MS, 'MESH_TIMEOUT_MS', 100, 600_000)
        : 15_000,
    });
    return this.client;
  }

  call<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
    return this.api().call<T>(method, path, body);
  }

  /** Prints the API's JSON with --json, else the table the caller renders. */
  print(body: unknown, table: () => string): void {
    this.io.out(this.json ? JSON.stringify(body, null, 2) : table());
  }
}

// ---- tables of each resource ----

const peerTable = (peers: Obj[]) =>
  renderTable(
    ['ID', 'NAME', 'ADDRESS', 'LOCAL', 'ACTIVE', 'REACHABLE', 'LAST SEEN'],
    peers.map((p) => [
      p.id,
      p.name,
      p.address,
      p.is_local,
      p.is_active,
      p.is_local ? '(self)' : p.reachable,
      p.last_seen_at,
    ]),
  );

const serviceTable = (services: Obj[]) =>
  renderTable(
    [
      'ID',
      'SOURCE',
      'TARGET',
      'TRANSPORT',
      'INTERFACE',
      'IPV4',
      'IPV6',
      'TRANSPARENT',
      'MBPS',
      'ROUTES',
      'ACTIVE',
    ],
    services.map((s) => [
      s.id,
      s.source_peer_id,
      s.target_peer_id,
      s.transport_type,
      s.requires_interface,
      s.interface_ipv4_cidr,
      s.interface_ipv6_cidr,
      s.fully_transparent,
      s.bandwidth_limit_mbps,
      s.route_count ?? (Array.isArray(s.routes) ? s.routes.length : undefined),
      s.is_active,
    ]),
  );

/** Where a route stands at its ingress (failover): `active`, `standby (reason)`; '' where not known. */
const routeStanding = (r: Obj): string =>
  r.active === undefined ? '' : r.active ? 'active' : `standby (${cell(r.standby_reason)})`;

const routeTable = (routes: Obj[]) =>
  routes.some((r) => r.active !== undefined)
    ? renderTable(
        ['ID', 'PRIORITY', 'SOURCE', 'DEST', 'NOW'],
        routes.map((r) => [r.id, r.priority, r.source_cidr, r.dest_cidr, routeStanding(r)]),
      )
    : renderTable(
        ['ID', 'PRIORITY', 'SOURCE', 'DEST'],
        routes.map((r) => [r.id, r.priority, r.source_cidr, r.dest_cidr]),
      );

/** A service's failover health in one line, as its ingress judges it (status and services get). */
function healthLine(h: Obj): string {
  const state = h.state === 'unhealthy' ? `unhealthy (${cell(h.reason)})` : cell(h.state);
  const carrying = h.carrying
    ? 'carrying its routes'
    : h.hold_down_until
      ? `standing aside until ${cell(h.hold_down_until)} (hold-down)`
      : 'standing aside: its routes yield to the next';
  return `${state} since ${cell(h.since)}, ${carrying}`;
}

const credentialTable = (creds: Obj[]) =>
  renderTable(
    ['CLIENT ID', 'SCOPES', 'LICENSE', 'CREATED', 'LAST USED'],
    creds.map((c) => [
      c.client_id,
      Array.isArray(c.scopes) ? c.scopes.map((s) => String(s).replace(SCOPE_PREFIX, '')) : c.scopes,
      c.license_id,
      c.created_at,
      c.last_used_at,
    ]),
  );

/** A service's data plane counters in one line (status and services get). */
function trafficLine(dp: Obj): string {
  const n = (k: string) => (typeof dp[k] === 'number' ? (dp[k] as number) : 0);
  return (
    `sent ${bytes(n('bytes_sent'))} (${n('packets_sent')} pkts), received ${bytes(n('bytes_received'))} ` +
    `(${n('packets_received')} pkts), dropped ${n('dropped')}, streams open ${n('streams_open')} ` +
    `of ${n('streams_opened')} opened`
  );
}

function serviceDetail(s: Obj): string {
  const { routes, dataplane, transparent_reasons, health, ...rest } = s;
  const parts = [
    renderObject({ ...rest, ...(transparent_reasons !== undefined ? { transparent_reasons } : {}) }),
  ];
  parts.push(
    '',
    'ROUTES',
    Array.isArray(routes) && routes.length > 0 ? routeTable(routes as Obj[]) : '(none)',
  );
  if (health && typeof health === 'object')
    parts.push('', 'HEALTH (at this ingress)', healthLine(health as Obj));
  if (dataplane && typeof dataplane === 'object') {
    parts.push('', 'DATA PLANE (this agent)', renderObject(dataplane as Obj));
  }
  return parts.join('\n');
}

/** Prints a freshly created secret, then the warning on stderr. */
function printSecret(s: Session, body: Obj, keys: string[], warning = SECRET_WARNING): void {
  s.print(body, () => renderObject(body, keys));
  s.io.err(warning);
}

/** Webhooks with how their deliveries stand (never a secret: the API lists none). */
const webhookTable = (hooks: Obj[]) =>
  renderTable(
    ['ID', 'URL', 'TYPES', 'PENDING', 'DELIVERED', 'GIVEN UP', 'FAILING SINCE', 'LAST ERROR'],
    hooks.map((w) => {
      const d = (w.delivery ?? {}) as Obj;
      const types = Array.isArray(w.types) && w.types.length > 0 ? w.types : '(all)';
      return [w.id, w.url, types, d.pending, d.delivered, d.given_up, d.failing_since, d.last_error];
    }),
  );

// ---- commands ----

async function login(args: string[], io: Io, env: NodeJS.ProcessEnv): Promise<void> {
  const p = parse(
    args,
    {
      'client-id': { type: 'string' },
      'client-secret': { type: 'string' },
      'client-secret-file': { type: 'string' },
    },
    [0, 0],
    'login',
  );
  // A file keeps the secret out of the process list and the shell history.
  const secretFile = str(p, 'client-secret-file');
  let fromFile: string | undefined;
  if (secretFile !== undefined) {
    if (str(p, 'client-secret') !== undefined) {
      throw new UsageError('login: --client-secret or --client-secret-file, not both');
    }
    try {
      fromFile = readFileSync(secretFile, 'utf8').trim();
    } catch (err) {
      throw new UsageError(`--client-secret-file: ${(err as Error).message}`);
    }
  }
  const name = str(p, 'profile') ?? env.MESH_PROFILE ?? 'default';
  const url = str(p, 'url') ?? env.MESH_URL;
  const clientId = str(p, 'client-id') ?? env.MESH_CLIENT_ID;
  const clientSecret = fromFile ?? str(p, 'client-secret') ?? env.MESH_CLIENT_SECRET;
  if (!url || !clientId || !clientSecret) {
    throw new UsageError(
      'login needs --url, --client-id and --client-secret (or MESH_URL, MESH_CLIENT_ID, MESH_CLIENT_SECRET)',
    );
  }
  const dir = configDir(env);
  profilePath(dir, name); // checks the name before anything is sent
  const client = new MeshClient({
    url: normalizeUrl(url),
    clientId,
    clientSecret,
    configDir: dir,
    profile: name,
    timeoutMs: 15_000,
  });
  // The profile is written only once the agent has accepted the credential.
  await client.fetchToken();
  const path = saveProfile(dir, name, {
    url: normalizeUrl(url),
    client_id: clientId,
    client_secret: clientSecret,
  });
  const result = { profile: name, path, url: normalizeUrl(url), client_id: clientId };
  io.out(
    flag(p, 'json')
      ? JSON.stringify(result, null, 2)
      : `logged in: profile ${name} (${path}), agent ${result.url}, client ${clientId}`,
  );
}

async function bootstrapCmd(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const p = parse(
    args,
    {
      license: { type: 'string' },
      name: { type: 'string' },
      description: { type: 'string' },
      login: { type: 'boolean' },
    },
    [0, 0],
    'bootstrap',
  );
  const file = str(p, 'license');
  if (!file) throw new UsageError('bootstrap needs --license FILE');
  let license: unknown;
  try {
    license = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new UsageError(`--license ${file}: ${(err as Error).message}`);
  }
  // Accept both what `license sign` prints and a whole bootstrap body.
  if (license && typeof license === 'object' && 'license' in license) license = (license as Obj).license;
  const s = new Session(s0.io, s0.env, p);
  const client = s.api(false);
  const body: Obj = { license };
  if (str(p, 'name') !== undefined) body.name = str(p, 'name');
  if (str(p, 'description') !== undefined) body.description = str(p, 'description');
  const res = await client.call<Obj>('POST', '/v1/bootstrap', body, false);
  printSecret(s, res, [
    'peer_id',
    'cluster_id',
    'license_id',
    'expires_at',
    'max_nodes',
    'max_services',
    'peer_public_key',
    'client_id',
    'client_secret',
  ]);
  if (flag(p, 'login')) {
    const resolved = resolveProfile(s.configDir, s.env, str(p, 'profile'));
    const url = normalizeUrl(str(p, 'url') ?? resolved.url ?? '');
    const path = saveProfile(s.configDir, resolved.name, {
      url,
      client_id: String(res.client_id),
      client_secret: String(res.client_secret),
    });
    s.io.err(`mesh-agent: saved this credential as profile ${resolved.name} (${path})`);
  }
}

async function peers(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const [sub, ...rest] = args;
  const io = s0.io;
  switch (sub) {
    case 'ls': {
      const p = parse(rest, { local: { type: 'boolean' }, remote: { type: 'boolean' } }, [0, 0], 'peers ls');
      if (flag(p, 'local') && flag(p, 'remote'))
        throw new UsageError('peers ls: --local or --remote, not both');
      const q = flag(p, 'local') ? '?is_local=true' : flag(p, 'remote') ? '?is_local=false' : '';
      const s = new Session(io, s0.env, p);
      const list = await s.call<Obj[]>('GET', `/v1/peers${q}`);
      return s.print(list, () => peerTable(list));
    }
    case 'get': {
      const p = parse(rest, {}, [1, 1], 'peers get ID');
      const s = new Session(io, s0.env, p);
      const peer = await s.call<Obj>('GET', `/v1/peers/${enc(p.positionals[0]!)}`);
      return s.print(peer, () => renderObject(peer));
    }
    case 'add': {
      const p = parse(rest, {}, [1, 1], 'peers add ADDRESS');
      const s = new Session(io, s0.env, p);
      const peer = await s.call<Obj>('POST', '/v1/peers', { address: p.positionals[0] });
      return s.print(peer, () => renderObject(peer));
    }
    case 'rename': {
      const p = parse(rest, {}, [2, 2], 'peers rename ID NAME');
      const s = new Session(io, s0.env, p);
      const peer = await s.call<Obj>('PUT', `/v1/peers/${enc(p.positionals[0]!)}`, {
        name: p.positionals[1],
      });
      return s.print(peer, () => renderObject(peer));
    }
    case 'rm': {
      const p = parse(rest, {}, [1, 1], 'peers rm ID');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('DELETE', `/v1/peers/${enc(p.positionals[0]!)}`);
      return s.print(res, () => `deleted peer ${p.positionals[0]}`);
    }
    case 'leave': {
      const p = parse(rest, { yes: { type: 'boolean' } }, [0, 0], 'peers leave');
      // Leaving deactivates this agent for the whole cluster: not something to do by a typo.
      if (!flag(p, 'yes'))
        throw new UsageError('peers leave deactivates this agent in the cluster; confirm with --yes');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('DELETE', '/v1/peers/self');
      return s.print(res, () => renderObject(res));
    }
    default:
      throw new UsageError(`peers: unknown subcommand ${sub ?? '(none)'}; ls|get|add|rename|rm|leave`);
  }
}

const SERVICE_FIELDS: OptionSpec = {
  interface: { type: 'boolean' },
  'no-interface': { type: 'boolean' },
  ipv4: { type: 'string' },
  ipv6: { type: 'string' },
  bandwidth: { type: 'string' },
  'health-check': { type: 'string' },
  'health-check-interval-ms': { type: 'string' },
  'health-check-failures': { type: 'string' },
};

/**
 * `--health-check tcp:ADDRESS:PORT|icmp:ADDRESS|none` with its two timing flags, as the API's
 * health_check: undefined when none of them is given, null for `none`. The check is sent whole,
 * so the timing flags need --health-check. The address is the API's to check.
 */
function healthCheckFlags(p: Parsed): Obj | null | undefined {
  const spec = str(p, 'health-check');
  const interval = str(p, 'health-check-interval-ms');
  const failures = str(p, 'health-check-failures');
  if (spec === undefined) {
    if (interval !== undefined || failures !== undefined) {
      throw new UsageError(
        '--health-check-interval-ms and --health-check-failures need --health-check (the check is set whole)',
      );
    }
    return undefined;
  }
  if (spec === 'none') {
    if (interval !== undefined || failures !== undefined) {
      throw new UsageError(
        '--health-check none takes no --health-check-interval-ms or --health-check-failures',
      );
    }
    return null;
  }
  const m = /^(tcp|icmp):(.+)$/.exec(spec);
  if (!m) throw new UsageError('--health-check must be tcp:ADDRESS:PORT, icmp:ADDRESS or none');
  const check: Obj = { [m[1]!]: m[2] };
  if (interval !== undefined) {
    const { min, max } = HEALTH_CHECK_INTERVAL_MS;
    check.interval_ms = integer(interval, '--health-check-interval-ms', min, max);
  }
  if (failures !== undefined) {
    const { min, max } = HEALTH_CHECK_FAILURES;
    check.failures = integer(failures, '--health-check-failures', min, max);
  }
  return check;
}

async function services(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const [sub, ...rest] = args;
  const io = s0.io;
  switch (sub) {
    case 'ls': {
      const p = parse(
        rest,
        {
          source: { type: 'string' },
          target: { type: 'string' },
          interface: { type: 'boolean' },
          'no-interface': { type: 'boolean' },
        },
        [0, 0],
        'services ls',
      );
      if (flag(p, 'interface') && flag(p, 'no-interface')) {
        throw new UsageError('services ls: --interface or --no-interface, not both');
      }
      const q = new URLSearchParams();
      if (flag(p, 'interface')) q.set('requires_interface', 'true');
      if (flag(p, 'no-interface')) q.set('requires_interface', 'false');
      if (str(p, 'source')) q.set('source_peer_id', str(p, 'source')!);
      if (str(p, 'target')) q.set('target_peer_id', str(p, 'target')!);
      const s = new Session(io, s0.env, p);
      const list = await s.call<Obj[]>('GET', `/v1/services${q.size > 0 ? `?${q}` : ''}`);
      return s.print(list, () => serviceTable(list));
    }
    case 'get': {
      const p = parse(rest, {}, [1, 1], 'services get ID');
      const s = new Session(io, s0.env, p);
      const svc = await s.call<Obj>('GET', `/v1/services/${enc(p.positionals[0]!)}`);
      return s.print(svc, () => serviceDetail(svc));
    }
    case 'create': {
      const p = parse(
        rest,
        {
          ...SERVICE_FIELDS,
          target: { type: 'string' },
          source: { type: 'string' },
          transport: { type: 'string' },
          transparent: { type: 'boolean' },
        },
        [0, 0],
        'services create',
      );
      if (!str(p, 'target')) throw new UsageError('services create needs --target PEER_ID');
      if (flag(p, 'no-interface')) throw new UsageError('services create: --no-interface is for update');
      const body: Obj = { target_peer_id: str(p, 'target') };
      if (str(p, 'source')) body.source_peer_id = str(p, 'source');
      const transport = str(p, 'transport');
      if (transport !== undefined) {
        if (transport !== 'tcp' && transport !== 'kcp')
          throw new UsageError('--transport must be tcp or kcp');
        body.transport_type = transport;
      }
      if (flag(p, 'interface')) body.requires_interface = true;
      if (str(p, 'ipv4') !== undefined) body.desired_ipv4_cidr = str(p, 'ipv4');
      if (str(p, 'ipv6') !== undefined) body.desired_ipv6_cidr = str(p, 'ipv6');
      if (flag(p, 'transparent')) body.fully_transparent = true;
      if (str(p, 'bandwidth') !== undefined) {
        body.bandwidth_limit_mbps = integer(str(p, 'bandwidth')!, '--bandwidth', 0, 1_000_000);
      }
      const healthCheck = healthCheckFlags(p);
      if (healthCheck) body.health_check = healthCheck;
      const s = new Session(io, s0.env, p);
      const svc = await s.call<Obj>('POST', '/v1/services', body);
      return s.print(svc, () => renderObject(svc));
    }
    case 'update': {
      const p = parse(rest, SERVICE_FIELDS, [1, 1], 'services update ID');
      if (flag(p, 'interface') && flag(p, 'no-interface')) {
        throw new UsageError('services update: --interface or --no-interface, not both');
      }
      const body: Obj = {};
      if (flag(p, 'interface')) body.requires_interface = true;
      if (flag(p, 'no-interface')) body.requires_interface = false;
      if (str(p, 'ipv4') !== undefined) body.desired_ipv4_cidr = cidrOrNull(str(p, 'ipv4')!);
      if (str(p, 'ipv6') !== undefined) body.desired_ipv6_cidr = cidrOrNull(str(p, 'ipv6')!);
      if (str(p, 'bandwidth') !== undefined) {
        body.bandwidth_limit_mbps = integer(str(p, 'bandwidth')!, '--bandwidth', 0, 1_000_000);
      }
      const healthCheck = healthCheckFlags(p);
      if (healthCheck !== undefined) body.health_check = healthCheck;
      if (Object.keys(body).length === 0) {
        throw new UsageError(
          'services update: nothing to change (--interface, --no-interface, --ipv4, --ipv6, --bandwidth, ' +
            '--health-check)',
        );
      }
      const s = new Session(io, s0.env, p);
      const svc = await s.call<Obj>('PUT', `/v1/services/${enc(p.positionals[0]!)}`, body);
      return s.print(svc, () => (Array.isArray(svc.routes) ? serviceDetail(svc) : renderObject(svc)));
    }
    case 'rm': {
      const p = parse(rest, {}, [1, 1], 'services rm ID');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('DELETE', `/v1/services/${enc(p.positionals[0]!)}`);
      return s.print(res, () => `deleted service ${p.positionals[0]}`);
    }
    default:
      throw new UsageError(`services: unknown subcommand ${sub ?? '(none)'}; ls|get|create|update|rm`);
  }
}

const DEFAULT_PRIORITY = 100;

/** `dest=CIDR,source=CIDR,priority=N` (any order, any subset but one CIDR). */
function routeSpec(text: string): Obj {
  const route: Obj = {};
  for (const part of text.split(',')) {
    const [k, v] = part.split('=', 2).map((x) => x.trim());
    if (!v) throw new UsageError(`--route ${JSON.stringify(text)}: expected key=value pairs`);
    if (k === 'dest') route.dest_cidr = v;
    else if (k === 'source') route.source_cidr = v;
    else if (k === 'priority') route.priority = integer(v, 'priority', -2_147_483_648, 2_147_483_647);
    else throw new UsageError(`--route: unknown key ${k}; dest, source, priority`);
  }
  route.priority ??= DEFAULT_PRIORITY;
  return route;
}

async function routes(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const [sub, ...rest] = args;
  const io = s0.io;
  const one: OptionSpec = {
    dest: { type: 'string' },
    source: { type: 'string' },
    priority: { type: 'string' },
  };
  const priority = (p: Parsed) =>
    str(p, 'priority') === undefined
      ? undefined
      : integer(str(p, 'priority')!, '--priority', -2_147_483_648, 2_147_483_647);
  switch (sub) {
    case 'ls': {
      const p = parse(rest, {}, [1, 1], 'routes ls SERVICE');
      const s = new Session(io, s0.env, p);
      const list = await s.call<Obj[]>('GET', `/v1/services/${enc(p.positionals[0]!)}/routes`);
      return s.print(list, () => routeTable(list));
    }
    case 'add': {
      const p = parse(
        rest,
        { ...one, route: { type: 'string', multiple: true }, file: { type: 'string' } },
        [1, 1],
        'routes add SERVICE',
      );
      const list: Obj[] = [];
      if (str(p, 'dest') !== undefined || str(p, 'source') !== undefined) {
        const r: Obj = { priority: priority(p) ?? DEFAULT_PRIORITY };
        if (str(p, 'source') !== undefined) r.source_cidr = str(p, 'source');
        if (str(p, 'dest') !== undefined) r.dest_cidr = str(p, 'dest');
        list.push(r);
      } else if (str(p, 'priority') !== undefined) {
        throw new UsageError('routes add: --priority goes with --dest and/or --source');
      }
      for (const spec of list_(p, 'route')) list.push(routeSpec(spec));
      const file = str(p, 'file');
      if (file !== undefined) {
        let fromFile: unknown;
        try {
          fromFile = JSON.parse(readFileSync(file, 'utf8'));
        } catch (err) {
          throw new UsageError(`--file ${file}: ${(err as Error).message}`);
        }
        if (fromFile && typeof fromFile === 'object' && !Array.isArray(fromFile))
          fromFile = (fromFile as Obj).routes;
        if (!Array.isArray(fromFile)) throw new UsageError(`--file ${file}: expected a JSON array of routes`);
        for (const r of fromFile as Obj[]) list.push({ priority: DEFAULT_PRIORITY, ...r });
      }
      if (list.length === 0) throw new UsageError('routes add needs --dest/--source, --route or --file');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('POST', `/v1/services/${enc(p.positionals[0]!)}/routes`, {
        routes: list,
      });
      return s.print(res, () => `added ${cell(res.count)} route(s): ${cell(res.route_ids)}`);
    }
    case 'update': {
      const p = parse(rest, one, [2, 2], 'routes update SERVICE ROUTE');
      const body: Obj = {};
      if (str(p, 'dest') !== undefined) body.dest_cidr = str(p, 'dest');
      if (str(p, 'source') !== undefined) body.source_cidr = str(p, 'source');
      if (priority(p) !== undefined) body.priority = priority(p);
      if (Object.keys(body).length === 0)
        throw new UsageError('routes update: nothing to change (--dest, --source, --priority)');
      const [svc, route] = p.positionals as [string, string];
      const routeId = integer(route, 'ROUTE', 0, Number.MAX_SAFE_INTEGER);
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('PUT', `/v1/services/${enc(svc)}/routes/${routeId}`, body);
      return s.print(res, () => routeTable([res]));
    }
    case 'rm': {
      const p = parse(rest, {}, [2, 2], 'routes rm SERVICE ROUTE');
      const [svc, route] = p.positionals as [string, string];
      const routeId = integer(route, 'ROUTE', 0, Number.MAX_SAFE_INTEGER);
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('DELETE', `/v1/services/${enc(svc)}/routes/${routeId}`);
      return s.print(res, () => `deleted route ${routeId} of service ${svc}`);
    }
    default:
      throw new UsageError(`routes: unknown subcommand ${sub ?? '(none)'}; ls|add|update|rm`);
  }
}

const list_ = list;

async function credentials(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const [sub, ...rest] = args;
  const io = s0.io;
  switch (sub) {
    case 'ls': {
      const p = parse(rest, {}, [0, 0], 'credentials ls');
      const s = new Session(io, s0.env, p);
      const creds = await s.call<Obj[]>('GET', '/v1/credentials');
      return s.print(creds, () => credentialTable(creds));
    }
    case 'create': {
      const p = parse(rest, { scope: { type: 'string', multiple: true } }, [0, 0], 'credentials create');
      // Short names (peers.read) are expanded; full URNs pass as they are.
      const scopes = list(p, 'scope').map((x) => (x.includes(':') ? x : `${SCOPE_PREFIX}${x}`));
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('POST', '/v1/credentials', scopes.length > 0 ? { scopes } : {});
      return printSecret(s, res, ['client_id', 'client_secret', 'scopes', 'created_at']);
    }
    case 'revoke': {
      const p = parse(rest, {}, [1, 1], 'credentials revoke CLIENT_ID');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('DELETE', `/v1/credentials/${enc(p.positionals[0]!)}`);
      return s.print(res, () => `revoked credential ${p.positionals[0]}`);
    }
    default:
      throw new UsageError(`credentials: unknown subcommand ${sub ?? '(none)'}; ls|create|revoke`);
  }
}

async function webhooks(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const [sub, ...rest] = args;
  const io = s0.io;
  switch (sub) {
    case 'ls': {
      const p = parse(rest, {}, [0, 0], 'webhooks ls');
      const s = new Session(io, s0.env, p);
      const hooks = await s.call<Obj[]>('GET', '/v1/webhooks');
      return s.print(hooks, () => webhookTable(hooks));
    }
    case 'add': {
      const p = parse(rest, { type: { type: 'string', multiple: true } }, [1, 1], 'webhooks add URL');
      const types = list(p, 'type');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('POST', '/v1/webhooks', { url: p.positionals[0], types });
      return printSecret(s, res, ['id', 'url', 'types', 'secret', 'created_at'], WEBHOOK_SECRET_WARNING);
    }
    case 'rm': {
      const p = parse(rest, {}, [1, 1], 'webhooks rm ID');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('DELETE', `/v1/webhooks/${enc(p.positionals[0]!)}`);
      return s.print(res, () => `deleted webhook ${p.positionals[0]}`);
    }
    case 'test': {
      const p = parse(rest, {}, [1, 1], 'webhooks test ID');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('POST', `/v1/webhooks/${enc(p.positionals[0]!)}/test`);
      s.print(res, () =>
        res.delivered
          ? `delivered: HTTP ${cell(res.status)} in ${cell(res.duration_ms)} ms`
          : `not delivered after ${cell(res.duration_ms)} ms: ${cell(res.error)}`,
      );
      // Exit 1, so that a script can tell; the line above says why.
      if (!res.delivered) throw new Error('the test delivery failed');
      return;
    }
    default:
      throw new UsageError(`webhooks: unknown subcommand ${sub ?? '(none)'}; ls|add|rm|test`);
  }
}

/** One event in one line: what the table of `events` and each line of `events --follow` show. */
const eventRow = (e: Obj): unknown[] => {
  const r = e.resource as Obj;
  const a = e.actor as Obj;
  return [e.seq, e.time, e.type, `${cell(r.kind)}/${cell(r.id)}`, `${cell(a.client_id)}@${cell(a.agent)}`];
};
const EVENT_HEADERS = ['SEQ', 'TIME', 'TYPE', 'RESOURCE', 'ACTOR'];

async function eventsCmd(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const p = parse(
    args,
    {
      since: { type: 'string' },
      type: { type: 'string' },
      resource: { type: 'string' },
      follow: { type: 'boolean' },
    },
    [0, 0],
    'events',
  );
  const s = new Session(s0.io, s0.env, p);
  const since = str(p, 'since');
  if (since !== undefined) integer(since, '--since', 0, Number.MAX_SAFE_INTEGER);
  const filters = new URLSearchParams();
  for (const k of ['type', 'resource'] as const) {
    const v = str(p, k);
    if (v !== undefined) filters.set(k, v);
  }
  // JSON lines with --json: one event a line, so a pipe can read them as they come.
  const line = (e: Obj) =>
    s.json ? JSON.stringify(e) : renderTable(EVENT_HEADERS, [eventRow(e)]).split('\n')[1]!;
  if (flag(p, 'follow')) {
    if (!s.json) s.io.out(EVENT_HEADERS.join('  '));
    const stop = new AbortController();
    process.once('SIGINT', () => stop.abort());
    const query = filters.toString();
    await followStream(
      s.api(),
      `/v1/events/stream${query ? `?${query}` : ''}`,
      (m) => {
        if (m.event === 'resync') {
          s.io.err(
            `mesh-agent: events before seq ${cell((JSON.parse(m.data) as Obj).oldest_seq)} are no longer kept`,
          );
          return;
        }
        s.io.out(line(JSON.parse(m.data) as Obj));
      },
      stop.signal,
      since,
    );
    return;
  }
  // Every kept event after --since, a page at a time.
  const all: Obj[] = [];
  let cursor = Number(since ?? 0);
  for (;;) {
    filters.set('since', String(cursor));
    filters.set('limit', '1000');
    const page = await s.call<{ events: Obj[]; next: number }>('GET', `/v1/events?${filters}`);
    all.push(...page.events);
    if (page.events.length < 1000) break;
    cursor = page.next;
  }
  if (s.json) for (const e of all) s.io.out(JSON.stringify(e));
  else s.io.out(renderTable(EVENT_HEADERS, all.map(eventRow)));
}

async function cluster(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const [sub, ...rest] = args;
  const io = s0.io;
  switch (sub) {
    case 'identity': {
      const p = parse(rest, {}, [0, 0], 'cluster identity');
      const s = new Session(io, s0.env, p);
      const res = await s.api(false).call<Obj>('GET', '/v1/cluster/identity', undefined, false);
      return s.print(res, () => renderObject(res));
    }
    case 'init': {
      const p = parse(rest, { force: { type: 'boolean' } }, [0, 0], 'cluster init');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('POST', '/v1/cluster/init', { force: flag(p, 'force') });
      return s.print(res, () => renderObject(res));
    }
    case 'sync': {
      const p = parse(rest, {}, [0, 0], 'cluster sync');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('POST', '/v1/cluster/sync');
      return s.print(res, () => renderObject(res));
    }
    case 'credentials': {
      const p = parse(rest, {}, [0, 0], 'cluster credentials');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('GET', '/v1/cluster/credentials');
      return s.print(res, () => renderObject(res));
    }
    case 'rotate': {
      const p = parse(rest, { 'show-secret': { type: 'boolean' } }, [0, 0], 'cluster rotate');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('POST', '/v1/cluster/credentials/rotate');
      // The cluster secret is for the agents, which get it by gossip; an operator rarely needs it.
      if (flag(p, 'show-secret')) return printSecret(s, res, Object.keys(res));
      const { client_secret: _hidden, ...shown } = res;
      return s.print(shown, () => renderObject(shown));
    }
    case 'license': {
      const p = parse(rest, {}, [0, 0], 'cluster license');
      const s = new Session(io, s0.env, p);
      const res = await s.call<Obj>('GET', '/v1/cluster/license');
      return s.print(res, () => renderObject(res));
    }
    default:
      throw new UsageError(
        `cluster: unknown subcommand ${sub ?? '(none)'}; identity|init|sync|credentials|rotate|license`,
      );
  }
}

async function status(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const p = parse(args, {}, [0, 0], 'status');
  const s = new Session(s0.io, s0.env, p);
  const api = s.api();
  const identity = await api.call<Obj>('GET', '/v1/cluster/identity', undefined, false);
  // The license needs admin; a narrower credential still gets the rest of the screen.
  let license: Obj | null = null;
  try {
    license = await api.call<Obj>('GET', '/v1/cluster/license');
  } catch (err) {
    if (!(err instanceof ApiCallError && (err.status === 403 || err.status === 404))) throw err;
  }
  const peerList = await api.call<Obj[]>('GET', '/v1/peers');
  const serviceList = await api.call<Obj[]>('GET', '/v1/services');
  const details: Obj[] = [];
  for (const svc of serviceList)
    details.push(await api.call<Obj>('GET', `/v1/services/${enc(String(svc.id))}`));
  const all = { identity, license, peers: peerList, services: details };
  s.print(all, () => renderStatus(all));
}

/**
 * `explain SOURCE DESTINATION`: GET /v1/explain, or POST with `--with` (a proposed change as JSON
 * text or a file holding it). Prints the ranking as a table and the verdict in one line.
 */
async function explainCmd(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const p = parse(
    args,
    {
      port: { type: 'string' },
      protocol: { type: 'string' },
      peer: { type: 'string' },
      with: { type: 'string' },
    },
    [2, 2],
    'explain SOURCE DESTINATION',
  );
  const [source, destination] = p.positionals as [string, string];
  const body: Obj = { source, destination };
  const protocol = str(p, 'protocol');
  if (protocol !== undefined) {
    if (protocol !== 'tcp' && protocol !== 'udp' && protocol !== 'icmp')
      throw new UsageError('--protocol must be tcp, udp or icmp');
    body.protocol = protocol;
  }
  if (str(p, 'port') !== undefined) body.port = integer(str(p, 'port')!, '--port', 1, 65535);
  if (str(p, 'peer') !== undefined) body.peer = str(p, 'peer');
  const proposal = str(p, 'with');
  if (proposal !== undefined) {
    const text = proposal.trimStart().startsWith('{') ? proposal : readWithFile(proposal);
    try {
      body.with = JSON.parse(text);
    } catch (err) {
      throw new UsageError(`--with: not JSON: ${(err as Error).message}`);
    }
  }
  const s = new Session(s0.io, s0.env, p);
  const res =
    proposal === undefined
      ? await s.call<Obj>('GET', `/v1/explain?${new URLSearchParams(body as Record<string, string>)}`)
      : await s.call<Obj>('POST', '/v1/explain', body);
  s.print(res, () => renderExplanation(res));
}

function readWithFile(path: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (err) {
    throw new UsageError(`--with ${path}: ${(err as Error).message}`);
  }
}

/** An explanation (GET /v1/explain) as a table of the ranking and the verdict line. Pure. */
export function renderExplanation(e: Obj): string {
  const ranking = Array.isArray(e.ranking) ? (e.ranking as Obj[]) : [];
  const lines: string[] = [];
  if (ranking.length > 0) {
    lines.push(
      renderTable(
        ['RANK', 'ROUTE', 'SERVICE', 'PRIORITY', 'SOURCE', 'DEST', 'OUTCOME', 'WHY'],
        ranking.map((r) => [
          r.rank,
          r.proposed ? '(proposed)' : r.route_id,
          r.service_id,
          r.priority,
          r.source_cidr,
          r.dest_cidr,
          r.standby_reason && r.outcome !== 'wins'
            ? `${cell(r.outcome)} (${cell(r.standby_reason)})`
            : r.outcome,
          r.reason,
        ]),
      ),
      '',
    );
  } else {
    lines.push('(no route selects it)', '');
  }
  lines.push(cell(e.verdict));
  return lines.join('\n');
}

export interface StatusData {
  identity: Obj;
  license: Obj | null;
  peers: Obj[];
  services: Obj[];
}

/** The `status` screen from the API's answers (services in their single form). Pure. */
export function renderStatus({ identity, license, peers: peerList, services: details }: StatusData): string {
  const lines = [
    `cluster   ${cell(identity.cluster_id)}`,
    `agent     peer ${cell(identity.peer_id)}, version ${cell(identity.version)}`,
  ];
  if (license) {
    lines.push(
      `license   ${cell(license.license_id)} expires ${cell(license.expires_at)}` +
        (license.days_to_expiry !== undefined ? ` (${cell(license.days_to_expiry)} days)` : '') +
        `, nodes ${cell(license.nodes_used)}/${cell(license.max_nodes)}, services ${cell(license.services_used)}/${cell(license.max_services)}`,
    );
  } else {
    lines.push(`license   ${cell(identity.license_id)}`);
  }
  lines.push('', `PEERS (${peerList.length})`, peerTable(peerList), '', `SERVICES (${details.length})`);
  if (details.length === 0) lines.push('(none)');
  for (const svc of details) {
    const dp = svc.dataplane as Obj | undefined;
    lines.push(
      `${cell(svc.id)}  ${cell(svc.source_peer_id)} -> ${cell(svc.target_peer_id)}  ${cell(svc.transport_type)}` +
        `  ${svc.is_active === false ? 'inactive' : 'active'}` +
        (dp
          ? `  state ${cell(dp.state)} (${cell(dp.role)})${dp.problem ? `: ${cell(dp.problem)}` : ''}`
          : '  state - (no data plane on this agent)'),
    );
    if (dp) lines.push(`    traffic  ${trafficLine(dp)}`);
    if (svc.health && typeof svc.health === 'object')
      lines.push(`    health   ${healthLine(svc.health as Obj)}`);
    if (dp?.can_forward === false || dp?.probe_passing === false)
      lines.push(`    exit     cannot forward: ${cell(dp.forward_problem)}`);
    const rs = Array.isArray(svc.routes) ? (svc.routes as Obj[]) : [];
    if (rs.length === 0) lines.push('    routes   (none)');
    for (const r of rs) {
      lines.push(
        `    route ${cell(r.id)}  priority ${cell(r.priority)}  ${cell(r.source_cidr)} -> ${cell(r.dest_cidr)}` +
          (r.active === undefined ? '' : `  ${routeStanding(r)}`),
      );
    }
  }
  return lines.join('\n');
}

/**
 * `mesh-agent ui`: a link to the web console that signs the browser in as this login, with its
 * scopes, once and within 60 s (docs/console.md). Built on the URL this client talks to, which
 * the browser can be expected to reach too; the code rides in the fragment, which no browser
 * sends to a server.
 */
async function uiCmd(args: string[], s0: { io: Io; env: NodeJS.ProcessEnv }): Promise<void> {
  const p = parse(args, {}, [0, 0], 'ui');
  const s = new Session(s0.io, s0.env, p);
  const res = await s.call<Obj>('POST', '/v1/console/codes');
  const link = `${s.api().url}/ui/#code=${res.code}`;
  s.print({ ...res, url: link }, () =>
    [link, `(signs the console in once, within ${res.expires_in} s; open it in your browser)`].join('\n'),
  );
}

/** Runs one client command; returns the exit code. Never throws. */
export async function runClientCommand(
  argv: string[],
  env: NodeJS.ProcessEnv = process.env,
  io?: Io,
): Promise<number> {
  const out: Io = io ?? {
    out: (t) => process.stdout.write(`${t}\n`),
    err: (t) => process.stderr.write(`${t}\n`),
  };
  const [command, ...rest] = argv;
  const s0 = { io: out, env };
  if (rest.includes('--help') || rest.includes('-h')) {
    out.out(CLIENT_USAGE);
    return EXIT.OK;
  }
  try {
    switch (command) {
      case 'login':
        await login(rest, out, env);
        break;
      case 'bootstrap':
        await bootstrapCmd(rest, s0);
        break;
      case 'peers':
        await peers(rest, s0);
        break;
      case 'services':
        await services(rest, s0);
        break;
      case 'routes':
        await routes(rest, s0);
        break;
      case 'credentials':
        await credentials(rest, s0);
        break;
      case 'cluster':
        await cluster(rest, s0);
        break;
      case 'webhooks':
        await webhooks(rest, s0);
        break;
      case 'events':
        await eventsCmd(rest, s0);
        break;
      case 'status':
        await status(rest, s0);
        break;
      case 'explain':
        await explainCmd(rest, s0);
        break;
      case 'ui':
        await uiCmd(rest, s0);
        break;
      default:
        throw new UsageError(`unknown command: ${command}`);
    }
    return EXIT.OK;
  } catch (err) {
    if (err instanceof UsageError) {
      out.err(`mesh-agent: ${err.message}\n${CLIENT_USAGE}`);
      return EXIT.USAGE;
    }
    if (err instanceof NotLoggedInError) {
      out.err(`mesh-agent: ${err.message}`);
      return EXIT.NOT_LOGGED_IN;
    }
    if (err instanceof UnreachableError) {
      out.err(`mesh-agent: ${err.message}`);
      return EXIT.UNREACHABLE;
    }
    if (err instanceof ApiCallError) {
      out.err(`mesh-agent: error ${err.status} ${err.code}: ${err.text}`);
      return err.status >= 500 ? EXIT.UNREACHABLE : EXIT.API;
    }
    // Local failures (a profile file that cannot be read or written): as an API error would.
    out.err(`mesh-agent: ${(err as Error).message}`);
    return EXIT.API;
  }
}
