/**
 * The kernel port on the real Linux kernel: changes go through `ip -batch -` and `nft -f -` (as
 * few processes as the order allows); observation and route lookups read netlink in this process
 * (rtnetlink.ts, the netlink addon, libnftables for the nft table; docs/architecture.md, "Reading
 * the kernel") into the canonical form of canonical.ts. Everything can run inside a named network
 * namespace (`ip -n NS`, `ip netns exec NS nft`, setns for netlink), which is how the tests drive it. TUN devices come from the
 * caller's openTun (the native addon); this module only sets them up and removes them.
 * Used by the agent's data plane (src/dataplane) and its root tests.
 */
import { spawn } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import { NETLINK_ROUTE, netlinkRequest, nftCommand } from '../../native/netlink.js';
import {
  canonicalCidr,
  canonicalDst,
  canonicalIp,
  canonicalNft,
  canonicalSelector,
  MAIN_TABLE,
} from './canonical.js';
import {
  isOwnedPref,
  isOwnedTable,
  isPacerName,
  isPacerPeerName,
  LINK_PREFIX,
  NFT_TABLE,
  pacerPeerName,
} from './ownership.js';
import {
  type AddressSpec,
  type Family,
  type KernelChange,
  KernelError,
  type KernelPort,
  type KernelState,
  type LinkSpec,
  type RouteAnswer,
  type RouteQuery,
  type RouteSpec,
  type RuleSpec,
  type Tun,
  type Uplink,
} from './port.js';
import { PACER_ALIAS, type Rendered, renderChange, renderNft, type Tool } from './render.js';
import {
  decodeLinks,
  decodeRoutes,
  decodeRules,
  dumpAddressesRequest,
  dumpLinksRequest,
  dumpRoutesRequest,
  dumpRulesRequest,
  type NlRule as IpRule,
  NetlinkError,
  routeGetRequest,
  withAddresses,
} from './rtnetlink.js';

export interface LinuxKernelOptions {
  /** Run every command inside this named network namespace (`ip netns add NAME`). */
  netns?: string;
  /** Opens a TUN device held by this process (the native addon); without it openTun throws. */
  openTun?: (name: string) => Tun;
  /** Longest a single `ip`/`nft` process may run before it is killed (ms). */
  commandTimeoutMs?: number;
}

interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** What `ip -j -d addr show` prints per link (the fields used here). */
interface IpLink {
  ifindex: number;
  ifname: string;
  mtu: number;
  link?: string;
  link_index?: number;
  link_netnsid?: number;
  /** The hardware address. */
  address?: string;
  linkinfo?: { info_kind?: string };
  ifalias?: string;
  addr_info?: { family: string; local: string; prefixlen: number }[];
}

/** What `ip -N -j route show table all` prints per route. */
interface IpRoute {
  type?: string;
  dst: string;
  gateway?: string;
  dev?: string;
  table?: string;
  protocol?: string;
  metric?: number;
  nexthops?: { gateway?: string; dev?: string }[];
}

/** The raw owned state, as flush() needs it (including what observe() cannot express). */
interface Raw {
  links: IpLink[];
  rules: Record<Family, IpRule[]>;
  routes: Record<Family, IpRoute[]>;
  nft: string | null;
}

const FAMILY_TOOL: Record<Family, Tool> = { 4: 'ip -4', 6: 'ip -6' };

const ipprotoName = (p: string | undefined): 'tcp' | 'udp' | undefined =>
  p === 'tcp' || p === 'ipproto-6' || p === '6'
    ? 'tcp'
    : p === 'udp' || p === 'ipproto-17' || p === '17'
      ? 'udp'
      : undefined;

/** A rule of `ip -N -j rule show` in canonical form, or undefined when it looks nothing up. */
export function parseRule(family: Family, r: IpRule): RuleSpec | undefined {
  if (r.table === undefined || !/^\d+$/.test(r.table)) return undefined;
  const table = Number(r.table);
  const rule: RuleSpec = { family, pref: r.priority, table: table === MAIN_TABLE ? 'main' : table };
  const selector = (addr: string | undefined, len: number | undefined) =>
    addr === undefined ? undefined : canonicalSelector(len === undefined ? addr : `${addr}/${len}`);
  const from = selector(r.src, r.srclen);
  const to = selector(r.dst, r.dstlen);
  if (from !== undefined) rule.from = from;
  if (to !== undefined) rule.to = to;
  if (r.iif !== undefined) rule.iif = r.iif;
  if (r.fwmark !== undefined) {
    rule.fwmark = {
      value: Number(r.fwmark) >>> 0,
      mask: r.fwmask === undefined ? 0xffff_ffff : Number(r.fwmask) >>> 0,
    };
  }
  const proto = ipprotoName(r.ipproto);
  if (proto !== undefined) rule.ipproto = proto;
  if (r.sport !== undefined) rule.sport = r.sport;
  return rule;
}

/**
 * A route of `ip -N -j route show table all` in canonical form, or undefined when it is not one
 * the agent could have made: neither unicast nor local, added by the kernel, multipath, or
 * without a device.
 */
export function parseRoute(family: Family, r: IpRoute): RouteSpec | undefined {
  if (r.table === undefined || !/^\d+$/.test(r.table) || !isOwnedTable(Number(r.table))) return undefined;
  const local = r.type === 'local' || r.type === '2';
  if (r.type !== undefined && r.type !== 'unicast' && r.type !== '1' && !local) return undefined;
  if (r.protocol === 'kernel' || r.protocol === '2') return undefined;
  if (r.dev === undefined || r.nexthops !== undefined) return undefined;
  const route: RouteSpec = { family, table: Number(r.table), dst: canonicalDst(r.dst), dev: r.dev };
  if (r.gateway !== undefined) route.via = canonicalIp(r.gateway);
  if (local) route.type = 'local';
  return route;
}

/** An owned link of `ip -j -d addr show` in canonical form, or undefined when not tun/macvlan. */
export function parseLink(l: IpLink, byIndex: ReadonlyMap<number, string>): LinkSpec | undefined {
  if (!l.ifname.startsWith(LINK_PREFIX)) return undefined;
  const kind = l.linkinfo?.info_kind;
  if (kind === 'tun') return { name: l.ifname, kind, mtu: l.mtu };
  if (kind === 'veth') return parsePacer(l);
  if (kind !== 'macvlan') return undefined;
  const link: LinkSpec = { name: l.ifname, kind, mtu: l.mtu };
  if (l.address !== undefined) link.mac = l.address.toLowerCase();
  if (l.link_netnsid === undefined) {
    const parent = l.link ?? (l.link_index !== undefined ? byIndex.get(l.link_index) : undefined);
    if (parent !== undefined) link.parent = parent;
  }
  return link;
}

/**
 * A pacer's `name` end (its peer is part of it, not a link of its own): its rate from the alias
 * it was made with, its peer's IPv4 address. Undefined for the peer end.
 */
function parsePacer(l: IpLink): LinkSpec | undefined {
  if (!isPacerName(l.ifname)) return undefined;
  const link: LinkSpec = { name: l.ifname, kind: 'pacer', mtu: l.mtu };
  const rate = l.ifalias?.startsWith(PACER_ALIAS) ? Number(l.ifalias.slice(PACER_ALIAS.length)) : Number.NaN;
  if (Number.isSafeInteger(rate)) link.rateBps = rate;
  return link;
}

/** The addresses of an owned link, without the IPv6 link-local ones the kernel adds itself. */
export function parseAddresses(l: IpLink): AddressSpec[] {
  return (l.addr_info ?? [])
    .filter((a) => (a.family === 'inet' || a.family === 'inet6') && !/^fe[89ab]/i.test(a.local))
    .map((a) => ({ dev: l.ifname, cidr: canonicalCidr(`${a.local}/${a.prefixlen}`) }));
}

/** The nft listing of the agent's table without its `table ... {` and closing `}` lines. */
export function nftBody(listing: string): string | null {
  const lines = canonicalNft(listing)!.split('\n');
  if (lines[0] !== `table inet ${NFT_TABLE} {` || lines.at(-1) !== '}') return canonicalNft(listing);
  return lines.slice(1, -1).join('\n');
}

const SYSCTL_KEY = /^[A-Za-z0-9_./-]+$/;

/** /proc/sys/... of a dotted (or slashed) key; refuses anything that could leave /proc/sys. */
function sysctlPath(key: string): string {
  if (!SYSCTL_KEY.test(key) || key.split(/[./]/).some((p) => p === '' || p === '..')) {
    throw new KernelError(`sysctl ${key}`, 'invalid sysctl key');
  }
  return `/proc/sys/${key.includes('/') ? key : key.replaceAll('.', '/')}`;
}

export class LinuxKernel implements KernelPort {
  private readonly netns: string | undefined;
  private readonly tunOpener: ((name: string) => Tun) | undefined;
  private readonly timeoutMs: number;

  constructor(options: LinuxKernelOptions = {}) {
    this.netns = options.netns;
    this.tunOpener = options.openTun;
    this.timeoutMs = options.commandTimeoutMs ?? 30_000;
  }

  openTun(name: string): Tun {
    if (!this.tunOpener) throw new Error('no TUN support');
    return this.tunOpener(name);
  }

  async observe(): Promise<KernelState> {
    const raw = await this.raw();
    const byIndex = new Map(raw.links.map((l) => [l.ifindex, l.ifname]));
    const links: LinkSpec[] = [];
    const addresses: AddressSpec[] = [];
    for (const l of raw.links) {
      const link = parseLink(l, byIndex);
      if (!link) continue;
      links.push(link);
      if (link.kind === 'pacer') {
        // Its peer's address is part of it (made and gone with the pair).
        const peer = raw.links.find((x) => x.ifname === pacerPeerName(l.ifname));
        const v4 = peer?.addr_info?.find((a) => a.family === 'inet');
        if (v4) link.peerAddress = canonicalCidr(`${v4.local}/${v4.prefixlen}`);
        continue;
      }
      addresses.push(...parseAddresses(l));
    }
    const rules: RuleSpec[] = [];
    const routes: RouteSpec[] = [];
    for (const family of [4, 6] as const) {
      for (const r of raw.rules[family]) {
        if (!isOwnedPref(r.priority)) continue;
        const rule = parseRule(family, r);
        if (rule) rules.push(rule);
      }
      for (const r of raw.routes[family]) {
        const route = parseRoute(family, r);
        if (route) routes.push(route);
      }
    }
    return { links, addresses, rules, routes, nft: raw.nft === null ? null : nftBody(raw.nft) };
  }

  async apply(changes: readonly KernelChange[]): Promise<void> {
    // Render everything first: an invalid change refuses the whole call before anything runs.
    const rendered = changes.flatMap(renderChange);
    const groups: Rendered[][] = [];
    for (const r of rendered) {
      const last = groups.at(-1);
      if (last && r.tool !== 'nft' && last[0]!.tool === r.tool) last.push(r);
      else groups.push([r]);
    }
    for (const group of groups) await this.runGroup(group);
  }

  async flush(): Promise<void> {
    // Up to 3 rounds: something may vanish (a TUN closed) or appear between reading and deleting.
    let lastError: unknown;
    for (let round = 0; ; round++) {
      const owned = ownedRaw(await this.raw());
      if (owned.empty) return;
      if (round === 3) break;
      try {
        for (const family of [4, 6] as const) {
          // `rule del pref P` removes the first rule at P: one line per rule removes them all,
          // whatever selectors they have.
          const lines = owned.rules[family].map((r) => `rule del pref ${r.priority}`);
          lines.push(...owned.tables[family].map((t) => `route flush table ${t}`));
          if (lines.length) await this.batch(FAMILY_TOOL[family], lines);
        }
        if (owned.nft) await this.nft(renderNft(null).lines);
        if (owned.links.length)
          await this.batch(
            'ip',
            owned.links.map((n) => `link del ${n}`),
          );
        lastError = undefined;
      } catch (err) {
        lastError = err;
      }
    }
    throw lastError ?? new KernelError('flush', 'owned state remains after 3 rounds');
  }

  async readSysctl(key: string): Promise<string | null> {
    const path = sysctlPath(key);
    if (this.netns === undefined) {
      try {
        return (await readFile(path, 'utf8')).trim();
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
        throw err;
      }
    }
    const res = await this.exec(['ip', 'netns', 'exec', this.netns, 'cat', path]);
    if (res.code === 0) return res.stdout.trim();
    if (/No such file or directory/.test(res.stderr)) return null;
    throw new KernelError(`cat ${path}`, res.stderr);
  }

  async writeSysctl(key: string, value: string): Promise<void> {
    const path = sysctlPath(key);
    if (!/^[0-9A-Za-z _.:-]*$/.test(value)) throw new KernelError(`sysctl ${key}`, 'invalid value');
    if (this.netns === undefined) {
      try {
        await writeFile(path, `${value}\n`);
      } catch (err) {
        throw new KernelError(`write ${path}`, (err as Error).message);
      }
      return;
    }
    const res = await this.exec(['ip', 'netns', 'exec', this.netns, 'tee', path], `${value}\n`);
    if (res.code !== 0) throw new KernelError(`tee ${path}`, res.stderr);
  }

  async uplink(): Promise<Uplink | null> {
    const [v4, v6] = await Promise.all([
      this.ipJson(['-j', '-4', 'route', 'show', 'default']),
      this.ipJson(['-j', '-6', 'route', 'show', 'default']),
    ]);
    const best = (routes: unknown): { dev: string; gateway: string | null } | null => {
      const candidates = (routes as IpRoute[])
        .map((r) => ({
          metric: r.metric ?? 0,
          dev: r.dev ?? r.nexthops?.[0]?.dev,
          gateway: r.gateway ?? r.nexthops?.[0]?.gateway,
        }))
        .filter((r): r is { metric: number; dev: string; gateway: string | undefined } => r.dev !== undefined)
        .sort((a, b) => a.metric - b.metric);
      const first = candidates[0];
      return first ? { dev: first.dev, gateway: first.gateway ?? null } : null;
    };
    const four = best(v4);
    const six = best(v6);
    const dev = four?.dev ?? six?.dev;
    if (dev === undefined) return null;
    return {
      dev,
      gateway4: four?.dev === dev ? four.gateway : null,
      gateway6: six?.dev === dev ? six.gateway : null,
    };
  }

  async routeGet(queries: readonly RouteQuery[]): Promise<(RouteAnswer | null)[]> {
    if (queries.length === 0) return [];
    // The links first (their state, and the input interface's index), then one lookup per query,
    // as `ip route get fibmatch` asks it. A lookup the kernel refuses (no route, an unknown input
    // interface) is no route, as it was with `ip -force`.
    const links = decodeLinks(this.netlink(dumpLinksRequest()));
    const names = new Map(links.map((l) => [l.ifindex, l.ifname]));
    const byName = new Map(links.map((l) => [l.ifname, l]));
    return queries.map((q) => {
      const iifIndex = q.iif === undefined ? undefined : byName.get(q.iif)?.ifindex;
      if (q.iif !== undefined && iifIndex === undefined) return null;
      try {
        const request = routeGetRequest({ dst: q.dst, from: q.from, iifIndex, mark: q.mark });
        const [route] = decodeRoutes(this.netlink(request), names, `route get ${q.dst}`);
        return route ? routeAnswer(route, byName) : null;
      } catch (err) {
        if (err instanceof NetlinkError) return null;
        throw err;
      }
    });
  }

  /**
   * Reads links with addresses, rules and routes of both families, and the nft table: netlink
   * dumps and one libnftables listing in this process, no process started (docs/architecture.md,
   * "Reading the kernel").
   */
  private async raw(): Promise<Raw> {
    const links = withAddresses(
      decodeLinks(this.netlink(dumpLinksRequest())),
      this.netlink(dumpAddressesRequest()),
    );
    const names = new Map(links.map((l) => [l.ifindex, l.ifname]));
    const rules = (family: Family) => decodeRules(this.netlink(dumpRulesRequest(family)));
    const routes = (family: Family) =>
      decodeRoutes(this.netlink(dumpRoutesRequest(family)), names, 'route dump');
    return {
      links,
      rules: { 4: rules(4), 6: rules(6) },
      routes: { 4: routes(4), 6: routes(6) },
      nft: this.listNft(),
    };
  }

  /** One netlink request in the kernel's (or the namespace's) routing netlink. */
  private netlink(request: Buffer): Buffer {
    try {
      return netlinkRequest(NETLINK_ROUTE, request, this.netns);
    } catch (err) {
      throw new KernelError('netlink request', (err as Error).message);
    }
  }

  private listNft(): string | null {
    const command = `list table inet ${NFT_TABLE}`;
    let res: { code: number; output: string; error: string };
    try {
      res = nftCommand(command, this.netns);
    } catch (err) {
      throw new KernelError(`nft ${command}`, (err as Error).message);
    }
    if (res.code === 0) return res.output;
    if (/No such file or directory/.test(res.error)) return null;
    throw new KernelError(`nft ${command}`, res.error);
  }

  private async runGroup(group: Rendered[]): Promise<void> {
    const tool = group[0]!.tool;
    if (tool === 'nft') return this.nft(group[0]!.lines);
    let existing: Set<string> | undefined;
    const lines: string[] = [];
    for (const r of group) {
      if (r.onlyIfLinkExists !== undefined) {
        existing ??= new Set(((await this.ipJson(['-j', 'link', 'show'])) as IpLink[]).map((l) => l.ifname));
        if (!existing.has(r.onlyIfLinkExists)) continue;
        existing.delete(r.onlyIfLinkExists);
      }
      lines.push(...r.lines);
    }
    if (lines.length) await this.batch(tool, lines);
  }

  /** Feeds lines to `ip [-4|-6] -batch -` or `tc -batch -`; on failure names the line it reports. */
  private async batch(tool: Tool, lines: string[]): Promise<void> {
    const args = [...tool.split(' ').slice(1), '-batch', '-'];
    const res = await this.exec(
      tool === 'tc' ? this.tcArgv(args) : this.ipArgv(args),
      `${lines.join('\n')}\n`,
    );
    if (res.code === 0) return;
    const n = /Command failed -:(\d+)/.exec(res.stderr);
    const failed = n ? lines[Number(n[1]) - 1] : undefined;
    throw new KernelError(
      failed !== undefined ? `${tool} ${failed}` : `${tool} -batch - (${lines.length} lines)`,
      res.stderr,
    );
  }

  /** Runs an nft script in one transaction; on failure names the script line nft reports. */
  private async nft(lines: string[]): Promise<void> {
    const script = `${lines.join('\n')}\n`;
    const res = await this.exec(this.nftArgv(['-f', '-']), script);
    if (res.code === 0) return;
    const n = /\/dev\/stdin:(\d+):/.exec(res.stderr);
    const failed = n ? script.split('\n')[Number(n[1]) - 1] : undefined;
    throw new KernelError(failed !== undefined ? `nft ${failed.trim()}` : 'nft -f -', res.stderr);
  }

  private async ipJson(args: string[]): Promise<unknown> {
    const res = await this.exec(this.ipArgv(args));
    if (res.code !== 0) throw new KernelError(`ip ${args.join(' ')}`, res.stderr);
    return JSON.parse(res.stdout || '[]');
  }

  private ipArgv(args: string[]): string[] {
    return this.netns === undefined ? ['ip', ...args] : ['ip', '-n', this.netns, ...args];
  }

  private tcArgv(args: string[]): string[] {
    return this.netns === undefined ? ['tc', ...args] : ['tc', '-n', this.netns, ...args];
  }

  private nftArgv(args: string[]): string[] {
    return this.netns === undefined ? ['nft', ...args] : ['ip', 'netns', 'exec', this.netns, 'nft', ...args];
  }

  private exec(argv: string[], input?: string): Promise<RunResult> {
    return new Promise((resolve, reject) => {
      const child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        child.kill('SIGKILL');
      }, this.timeoutMs);
      child.stdout.on('data', (b: Buffer) => out.push(b));
      child.stderr.on('data', (b: Buffer) => err.push(b));
      // The tool may exit (a failed batch line) before reading all of stdin: EPIPE is expected.
      child.stdin.on('error', () => {});
      child.on('error', (e) => {
        clearTimeout(timer);
        reject(new KernelError(argv.join(' '), e.message));
      });
      child.on('close', (code) => {
        clearTimeout(timer);
        const stderr =
          Buffer.concat(err).toString() + (timedOut ? `\nkilled after ${this.timeoutMs} ms` : '');
        resolve({ code: code ?? -1, stdout: Buffer.concat(out).toString(), stderr });
      });
      child.stdin.end(input ?? '');
    });
  }
}

/** What flush() removes: owned rules (kernel order), tables with routes, links, the nft table. */
function ownedRaw(raw: Raw) {
  const tables = (routes: IpRoute[]) => [
    ...new Set(routes.map((r) => Number(r.table)).filter((t) => Number.isInteger(t) && isOwnedTable(t))),
  ];
  const rules = {
    4: raw.rules[4].filter((r) => isOwnedPref(r.priority)),
    6: raw.rules[6].filter((r) => isOwnedPref(r.priority)),
  };
  const routeTables = { 4: tables(raw.routes[4]), 6: tables(raw.routes[6]) };
  // A pacer's peer goes with the pacer.
  const links = raw.links
    .map((l) => l.ifname)
    .filter((n) => n.startsWith(LINK_PREFIX) && !isPacerPeerName(n));
  const empty =
    rules[4].length + rules[6].length + routeTables[4].length + routeTables[6].length + links.length === 0 &&
    raw.nft === null;
  return { rules, tables: routeTables, links, nft: raw.nft !== null, empty };
}

interface FibMatch {
  dst?: string;
  type?: string;
  dev?: string;
  gateway?: string;
  nexthops?: { dev?: string; gateway?: string }[];
}

function routeAnswer(
  route: FibMatch,
  links: ReadonlyMap<string, { operstate?: string; flags?: string[] }>,
): RouteAnswer | null {
  // Routes that refuse (unreachable, blackhole, prohibit) or go nowhere are no route.
  if (route.type !== undefined && route.type !== 'unicast' && route.type !== 'local') return null;
  if (route.dst === undefined) return null;
  const usable = (dev: string) => {
    const link = links.get(dev);
    const operstate = link?.operstate ?? 'UNKNOWN';
    const up = link?.flags?.includes('UP') ?? false;
    const carrier = !(link?.flags?.includes('NO-CARRIER') ?? false);
    return { usable: up && carrier && (operstate === 'UP' || operstate === 'UNKNOWN'), operstate };
  };
  // A multipath route carries while any of its next hops can: judged by the first that can.
  const hops = route.dev !== undefined ? [route] : (route.nexthops ?? []).filter((h) => h.dev !== undefined);
  const hop = hops.find((h) => usable(h.dev!).usable) ?? hops[0];
  if (hop?.dev === undefined) return null;
  return {
    dev: hop.dev,
    gateway: hop.gateway ?? null,
    prefix: canonicalPrefix(route.dst, hop.gateway),
    ...usable(hop.dev),
    ...(route.type === 'local' ? { local: true } : {}),
  };
}

/** `default`, `10.1.2.0/24`, `10.1.2.5` as ip prints a matched route's destination, with its length. */
function canonicalPrefix(dst: string, gateway: string | undefined): string {
  const six = dst.includes(':') || (dst === 'default' && gateway?.includes(':') === true);
  if (dst === 'default') return six ? '::/0' : '0.0.0.0/0';
  return dst.includes('/') ? dst : `${dst}/${six ? 128 : 32}`;
}
