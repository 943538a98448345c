/**
 * `mesh-agent serve` options (DECISIONS §1): each flag also an environment variable MESH_<NAME>,
 * the flag winning. Pure: turns argv and env into a checked configuration or an error text.
 */
import { parseArgs } from 'node:util';

export interface ServeOptions {
  listenHost: string;
  listenPort: number;
  advertise: string;
  dataDir: string;
  licensePublicKeys: string[];
  tlsCert?: string | undefined;
  tlsKey?: string | undefined;
  publicUrl: string;
  dataplane: 'on' | 'off' | 'auto';
  macvlanParent?: string | undefined;
  dev: boolean;
  metricsPublic: boolean;
  logLevel: string;
  gossipIntervalMs: number;
  testHooks: boolean;
  /** --kcp: KCP engine parameters of the kcp transport (docs/kcp.md), checked again by the agent. */
  kcp: KcpTuning;
}

/** The KCP parameters an operator may set (`--kcp mtu=1350,nodelay=1,...`, kcptun's names). */
export interface KcpTuning {
  mtu?: number;
  interval?: number;
  nodelay?: boolean;
  resend?: number;
  noCongestionControl?: boolean;
  sndWnd?: number;
  rcvWnd?: number;
  minRtoMs?: number;
}

const KCP_KEYS: Record<string, [keyof KcpTuning, 'int' | 'bool']> = {
  mtu: ['mtu', 'int'],
  interval: ['interval', 'int'],
  nodelay: ['nodelay', 'bool'],
  resend: ['resend', 'int'],
  nc: ['noCongestionControl', 'bool'],
  sndwnd: ['sndWnd', 'int'],
  rcvwnd: ['rcvWnd', 'int'],
  minrto: ['minRtoMs', 'int'],
};

/** `key=value,...` of KCP_KEYS; ranges are the engine's to check (the agent does at start). */
export function parseKcpTuning(text: string | undefined): KcpTuning {
  const out: Record<string, number | boolean> = {};
  if (text === undefined || text.trim() === '') return {};
  for (const item of text.split(',')) {
    const m = /^\s*([a-z]+)\s*=\s*(\d{1,6})\s*$/.exec(item);
    const known = m ? KCP_KEYS[m[1]!] : undefined;
    if (!m || !known) {
      throw new UsageError(
        `--kcp takes key=value items of ${Object.keys(KCP_KEYS).join(', ')} (integers; nodelay and nc 0 or 1), got ${JSON.stringify(item)}`,
      );
    }
    const value = Number(m[2]);
    if (known[1] === 'bool' && value !== 0 && value !== 1)
      throw new UsageError(`--kcp ${m[1]} must be 0 or 1`);
    out[known[0]] = known[1] === 'bool' ? value === 1 : value;
  }
  return out as KcpTuning;
}

const FLAGS = {
  listen: { type: 'string' },
  advertise: { type: 'string' },
  'data-dir': { type: 'string' },
  'license-public-key': { type: 'string', multiple: true },
  'tls-cert': { type: 'string' },
  'tls-key': { type: 'string' },
  'public-url': { type: 'string' },
  dataplane: { type: 'string' },
  'macvlan-parent': { type: 'string' },
  dev: { type: 'boolean' },
  'metrics-public': { type: 'boolean' },
  'log-level': { type: 'string' },
  'gossip-interval-ms': { type: 'string' },
  'test-hooks': { type: 'boolean' },
  kcp: { type: 'string' },
} as const;

export class UsageError extends Error {}

const envName = (flag: string) => `MESH_${flag.toUpperCase().replace(/-/g, '_')}`;

/** Splits `host:port`, with IPv6 hosts in brackets; port 0 to 65535 (0 only for --listen). */
export function parseHostPort(text: string, what: string, allowZero = false): { host: string; port: number } {
  const m = /^(?:\[([0-9A-Fa-f:.]+)\]|([^:[\]\s]+)):(\d{1,5})$/.exec(text);
  const port = m ? Number(m[3]) : Number.NaN;
  if (!m || port > 65535 || (port === 0 && !allowZero)) {
    throw new UsageError(`${what} must be HOST:PORT (IPv6 in brackets), got ${JSON.stringify(text)}`);
  }
  return { host: (m[1] ?? m[2])!, port };
}

const formatHostPort = (host: string, port: number) =>
  host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;

export function parseServeOptions(argv: string[], env: NodeJS.ProcessEnv): ServeOptions {
  let values: Record<string, string | boolean | string[] | undefined>;
  try {
    ({ values } = parseArgs({ args: argv, options: FLAGS, strict: true, allowPositionals: false }));
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const str = (flag: keyof typeof FLAGS): string | undefined => {
    const v = values[flag];
    if (typeof v === 'string') return v;
    const e = env[envName(flag)];
    return e === undefined || e === '' ? undefined : e;
  };
  const bool = (flag: keyof typeof FLAGS): boolean => {
    if (values[flag] === true) return true;
    const e = env[envName(flag)];
    if (e === undefined || e === '') return false;
    if (['1', 'true', 'yes', 'on'].includes(e.toLowerCase())) return true;
    if (['0', 'false', 'no', 'off'].includes(e.toLowerCase())) return false;
    throw new UsageError(`${envName(flag)} must be true or false, got ${JSON.stringify(e)}`);
  };

  const listenText = str('listen') ?? '127.0.0.1:7480';
  const listen = parseHostPort(listenText, '--listen', true);
  const advertiseText = str('advertise');
  const wildcard = listen.host === '0.0.0.0' || listen.host === '::';
  if (wildcard && !advertiseText) {
    throw new UsageError(
      '--listen on a wildcard address needs --advertise HOST:PORT: peers must be told a reachable address',
    );
  }
  const advertised = advertiseText ? parseHostPort(advertiseText, '--advertise') : listen;
  const advertise = formatHostPort(advertised.host, advertised.port);

  const tlsCert = str('tls-cert');
  const tlsKey = str('tls-key');
  if ((tlsCert === undefined) !== (tlsKey === undefined))
    throw new UsageError('--tls-cert and --tls-key go together');

  const publicUrl = (str('public-url') ?? `${tlsCert ? 'https' : 'http'}://${advertise}`).replace(/\/+$/, '');
  try {
    const u = new URL(publicUrl);
    if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new Error();
  } catch {
    throw new UsageError(`--public-url must be an http(s) URL, got ${JSON.stringify(publicUrl)}`);
  }

  const dataplane = str('dataplane') ?? 'auto';
  if (dataplane !== 'on' && dataplane !== 'off' && dataplane !== 'auto') {
    throw new UsageError('--dataplane must be on, off or auto');
  }
  const intervalText = str('gossip-interval-ms') ?? '1000';
  const gossipIntervalMs = Number(intervalText);
  if (!/^\d+$/.test(intervalText) || gossipIntervalMs < 50 || gossipIntervalMs > 60_000) {
    throw new UsageError('--gossip-interval-ms must be an integer from 50 to 60000');
  }
  const keysFlag = values['license-public-key'];
  const keysEnv = env[envName('license-public-key')];
  const licensePublicKeys = Array.isArray(keysFlag)
    ? keysFlag
    : keysEnv
      ? keysEnv
          .split(',')
          .map((k) => k.trim())
          .filter(Boolean)
      : [];

  return {
    listenHost: listen.host,
    listenPort: listen.port,
    advertise,
    dataDir: str('data-dir') ?? './mesh-data',
    licensePublicKeys,
    tlsCert,
    tlsKey,
    publicUrl,
    dataplane,
    macvlanParent: str('macvlan-parent'),
    dev: bool('dev'),
    metricsPublic: bool('metrics-public'),
    logLevel: str('log-level') ?? 'info',
    gossipIntervalMs,
    testHooks: bool('test-hooks'),
    kcp: parseKcpTuning(str('kcp')),
  };
}
