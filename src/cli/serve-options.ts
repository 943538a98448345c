/**
 * `mesh-agent serve` options (docs/decisions.md §1): each flag also an environment variable MESH_<NAME>,
 * the flag winning. Pure: turns argv and env into a checked configuration or an error text.
 */
import { type ParseArgsConfig, parseArgs } from 'node:util';

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
  /** Failover (docs/dataplane.md): health interval, misses before a tunnel is silent, hold-down. */
  healthIntervalMs: number;
  healthMisses: number;
  failoverHoldDownMs: number;
  /** Event log retention (docs/events.md): whichever limit comes first. */
  eventsMaxAgeDays: number;
  eventsMaxCount: number;
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

/** One flag of `mesh-agent serve`, as SERVE_FLAGS declares it. */
export interface ServeFlag {
  /** The name of its value in the help; a flag without one is a switch (on when given). */
  readonly value?: string;
  /** May be given more than once; its environment variable then holds a comma-separated list. */
  readonly multiple?: true;
  /** What an unset flag means; absent: nothing, or what the other flags make of it. */
  readonly default?: string;
  /** In the help, inside the brackets of the flag before it: the two go together. */
  readonly withPrevious?: true;
  /** In the help, after the flag in parentheses, on a line of its own; `\n` wraps it. */
  readonly note?: string;
}

/**
 * The flags of `mesh-agent serve`, in the order of the help: the one place a flag is declared.
 * Parsing (parseArgs), its environment variable (envName) and the help (SERVE_USAGE) follow
 * from here, so a flag cannot be parsed but missing from the help, or the other way round.
 */
export const SERVE_FLAGS = {
  listen: { value: 'HOST:PORT', default: '127.0.0.1:7480' },
  advertise: { value: 'HOST:PORT' },
  'data-dir': { value: 'DIR', default: './mesh-data' },
  'license-public-key': { value: 'FILE-or-BASE64', multiple: true },
  'tls-cert': { value: 'FILE' },
  'tls-key': { value: 'FILE', withPrevious: true },
  'public-url': { value: 'URL' },
  dataplane: { value: 'on|off|auto', default: 'auto' },
  'macvlan-parent': { value: 'IFACE' },
  dev: {},
  'metrics-public': {},
  'log-level': { value: 'LEVEL', default: 'info' },
  'gossip-interval-ms': { value: 'MS', default: '1000' },
  'health-interval-ms': { value: 'MS', default: '500' },
  'health-misses': { value: 'N', default: '3' },
  'failover-hold-down-ms': { value: 'MS', default: '30000' },
  'events-max-age-days': { value: 'DAYS', default: '30', note: 'event log retention; docs/events.md' },
  'events-max-count': { value: 'N', default: '1000000', withPrevious: true },
  kcp: {
    value: 'KEY=N,...',
    note: 'KCP engine: mtu, interval, nodelay, resend, nc, sndwnd,\nrcvwnd, minrto; docs/kcp.md',
  },
} as const satisfies Record<string, ServeFlag>;

export type ServeFlagName = keyof typeof SERVE_FLAGS;
/** The flags with a default. */
type DefaultedFlag = {
  [K in ServeFlagName]: (typeof SERVE_FLAGS)[K] extends { default: string } ? K : never;
}[ServeFlagName];

const flagEntries = () => Object.entries(SERVE_FLAGS) as [ServeFlagName, ServeFlag][];

const PARSE_OPTIONS: ParseArgsConfig['options'] = Object.fromEntries(
  flagEntries().map(([name, flag]) => [
    name,
    flag.value === undefined ? { type: 'boolean' } : { type: 'string', multiple: flag.multiple === true },
  ]),
);

/** The environment variable of a flag: `--data-dir` is MESH_DATA_DIR. */
export const envName = (flag: string) => `MESH_${flag.toUpperCase().replace(/-/g, '_')}`;

const USAGE_HEAD = '  mesh-agent serve ';
/** Flags are added to a line of the help while it stays this wide. */
const USAGE_WIDTH = 92;

/** The `mesh-agent serve` lines of `mesh-agent help`, written from SERVE_FLAGS. */
export const SERVE_USAGE = ((): string => {
  const groups: { words: string[]; multiple: boolean; note?: string }[] = [];
  for (const [name, flag] of flagEntries()) {
    const words = flag.value === undefined ? `--${name}` : `--${name} ${flag.value}`;
    const previous = groups[groups.length - 1];
    if (flag.withPrevious && previous) previous.words.push(words);
    else groups.push({ words: [words], multiple: flag.multiple === true, note: flag.note });
  }
  const indent = ' '.repeat(USAGE_HEAD.length);
  const lines: string[] = [];
  let line = '';
  const endLine = () => {
    if (line) lines.push(`${lines.length === 0 ? USAGE_HEAD : indent}${line}`);
    line = '';
  };
  for (const group of groups) {
    const item = `[${group.words.join(' ')}]${group.multiple ? '...' : ''}`;
    if (group.note !== undefined) {
      endLine();
      const noteIndent = ' '.repeat(indent.length + item.length + '   ('.length);
      line = `${item}   (${group.note.replace(/\n/g, `\n${noteIndent}`)})`;
      endLine();
    } else if (line && indent.length + line.length + 1 + item.length > USAGE_WIDTH) {
      endLine();
      line = item;
    } else {
      line = line ? `${line} ${item}` : item;
    }
  }
  endLine();
  return lines.join('\n');
})();

export class UsageError extends Error {}

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
    ({ values } = parseArgs({ args: argv, options: PARSE_OPTIONS, strict: true, allowPositionals: false }));
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const str = (flag: ServeFlagName): string | undefined => {
    const v = values[flag];
    if (typeof v === 'string') return v;
    const e = env[envName(flag)];
    return e === undefined || e === '' ? undefined : e;
  };
  /** A flag with a default: its value, else its variable, else the default. */
  const orDefault = (flag: DefaultedFlag): string => str(flag) ?? SERVE_FLAGS[flag].default;
  const bool = (flag: ServeFlagName): boolean => {
    if (values[flag] === true) return true;
    const e = env[envName(flag)];
    if (e === undefined || e === '') return false;
    if (['1', 'true', 'yes', 'on'].includes(e.toLowerCase())) return true;
    if (['0', 'false', 'no', 'off'].includes(e.toLowerCase())) return false;
    throw new UsageError(`${envName(flag)} must be true or false, got ${JSON.stringify(e)}`);
  };

  const listenText = orDefault('listen');
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

  const dataplane = orDefault('dataplane');
  if (dataplane !== 'on' && dataplane !== 'off' && dataplane !== 'auto') {
    throw new UsageError('--dataplane must be on, off or auto');
  }
  const intervalText = orDefault('gossip-interval-ms');
  const gossipIntervalMs = Number(intervalText);
  if (!/^\d+$/.test(intervalText) || gossipIntervalMs < 50 || gossipIntervalMs > 60_000) {
    throw new UsageError('--gossip-interval-ms must be an integer from 50 to 60000');
  }
  /** A whole number of a flag with a default, within its bounds. */
  const wholeNumber = (flag: DefaultedFlag, min: number, max: number): number => {
    const text = orDefault(flag);
    const n = Number(text);
    if (!/^\d+$/.test(text) || n < min || n > max)
      throw new UsageError(`--${flag} must be an integer from ${min} to ${max}`);
    return n;
  };
  const healthIntervalMs = wholeNumber('health-interval-ms', 50, 60_000);
  const healthMisses = wholeNumber('health-misses', 2, 100);
  const failoverHoldDownMs = wholeNumber('failover-hold-down-ms', 0, 3_600_000);
  const eventsMaxAgeDays = wholeNumber('events-max-age-days', 1, 3650);
  const eventsMaxCount = wholeNumber('events-max-count', 1000, 100_000_000);
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
    dataDir: orDefault('data-dir'),
    licensePublicKeys,
    tlsCert,
    tlsKey,
    publicUrl,
    dataplane,
    macvlanParent: str('macvlan-parent'),
    dev: bool('dev'),
    metricsPublic: bool('metrics-public'),
    logLevel: orDefault('log-level'),
    gossipIntervalMs,
    healthIntervalMs,
    healthMisses,
    failoverHoldDownMs,
    eventsMaxAgeDays,
    eventsMaxCount,
    kcp: parseKcpTuning(str('kcp')),
  };
}
