/**
 * The canonical form of kernel state: how LinuxKernel.observe() reports what `ip -j` and `nft`
 * print, how RecordingKernel stores what it was given, and how a desired state is written so it
 * can be compared with an observed one (`assert.deepStrictEqual(canonicalState(desired),
 * canonicalState(observed))`). Pure; used by the kernel port implementations and the reconciler.
 *
 * The forms (they follow what the kernel keeps, not what was typed):
 * - addresses: dotted quad / RFC 5952 IPv6 (lowercase, longest zero run compressed), always with
 *   a prefix length: a host is `10.0.0.1/32` or `fd00::1/128`, never bare;
 * - AddressSpec.cidr keeps its host bits (`10.91.2.50/24`);
 * - RuleSpec.from/to keep host bits too (the kernel stores them), and a /0 selector is absent
 *   (the kernel prints `from all`); fwmark is numbers, a mask of all ones included;
 *   table 254 is 'main';
 * - RouteSpec.dst is 'default' for /0; an IPv6 destination has its host bits cleared (the kernel
 *   masks it), an IPv4 one with host bits set is refused by the kernel and left as given here;
 * - optional keys are absent, never `undefined` (deepStrictEqual tells them apart);
 * - nft: the text between `table inet mesh_agent {` and its closing `}`, every line trimmed and
 *   blank lines dropped. nft rewrites what it is given (`and` -> `&`, `!= 0` -> `!= 0x00000000`):
 *   a desired ruleset compares equal only when written the way `nft list` prints it.
 */
import { formatIp, parseIp } from '../../domain/cidr.js';
import type { AddressSpec, Family, KernelState, LinkSpec, RouteSpec, RuleSpec } from './port.js';

/** The main routing table's number: a rule looking it up is written `table: 'main'`. */
export const MAIN_TABLE = 254;

export interface ParsedCidr {
  family: Family;
  bytes: Uint8Array;
  prefix: number;
}

/** Parses `address[/prefix]` (no prefix: a host); undefined when it is not one. */
export function parseCidrLoose(text: string): ParsedCidr | undefined {
  if (typeof text !== 'string') return undefined;
  const slash = text.indexOf('/');
  const ip = parseIp(slash < 0 ? text : text.slice(0, slash));
  if (!ip) return undefined;
  const bits = ip.bytes.length * 8;
  if (slash < 0) return { ...ip, prefix: bits };
  const prefixText = text.slice(slash + 1);
  if (!/^(?:0|[1-9]\d{0,2})$/.test(prefixText)) return undefined;
  const prefix = Number(prefixText);
  return prefix > bits ? undefined : { ...ip, prefix };
}

export const formatCidr = (c: ParsedCidr): string => `${formatIp(c.bytes)}/${c.prefix}`;

export function hasHostBits(c: ParsedCidr): boolean {
  for (let bit = c.prefix; bit < c.bytes.length * 8; bit++) {
    if ((c.bytes[bit >> 3]! >> (7 - (bit & 7))) & 1) return true;
  }
  return false;
}

export function masked(c: ParsedCidr): ParsedCidr {
  const bytes = Uint8Array.from(c.bytes);
  for (let bit = c.prefix; bit < bytes.length * 8; bit++) bytes[bit >> 3]! &= ~(1 << (7 - (bit & 7)));
  return { ...c, bytes };
}

/** The canonical text of an address or CIDR (prefix added for a host), or the input when unparsable. */
export function canonicalCidr(text: string): string {
  const c = parseCidrLoose(text);
  return c ? formatCidr(c) : text;
}

/** The canonical text of a bare address (a gateway), or the input when unparsable. */
export function canonicalIp(text: string): string {
  const ip = parseIp(text);
  return ip ? formatIp(ip.bytes) : text;
}

/**
 * Selectors already made canonical, by their text: every reconcile and every explain with a
 * data plane compares a thousand rules, whose few distinct networks were parsed and formatted
 * again each time (a third of explain's time at 1,000 routes). Emptied when full.
 */
const selectors = new Map<string, string | null>();
const MAX_SELECTORS = 16_384;

/** A rule selector: absent for /0 (the kernel's `all`), else the canonical CIDR. */
export function canonicalSelector(text: string | undefined): string | undefined {
  if (text === undefined || text === 'all') return undefined;
  let canonical = selectors.get(text);
  if (canonical === undefined) {
    const c = parseCidrLoose(text);
    canonical = !c ? text : c.prefix === 0 ? null : formatCidr(c);
    if (selectors.size >= MAX_SELECTORS) selectors.clear();
    selectors.set(text, canonical);
  }
  return canonical ?? undefined;
}

/** A route destination: 'default' for /0, IPv6 host bits cleared. */
export function canonicalDst(text: string): string {
  if (text === 'default') return text;
  const c = parseCidrLoose(text);
  if (!c) return text;
  if (c.prefix === 0) return 'default';
  return formatCidr(c.family === 6 ? masked(c) : c);
}

export function canonicalLink(l: LinkSpec): LinkSpec {
  const out: LinkSpec = { name: l.name, kind: l.kind, mtu: l.mtu };
  if (l.kind === 'macvlan' && l.parent !== undefined) out.parent = l.parent;
  if (l.kind === 'macvlan' && l.mac !== undefined) out.mac = l.mac.toLowerCase();
  if (l.kind === 'pacer' && l.rateBps !== undefined) out.rateBps = l.rateBps;
  if (l.kind === 'pacer' && l.peerAddress !== undefined) out.peerAddress = canonicalCidr(l.peerAddress);
  return out;
}

export function canonicalAddress(a: AddressSpec): AddressSpec {
  return { dev: a.dev, cidr: canonicalCidr(a.cidr) };
}

export function canonicalRule(r: RuleSpec): RuleSpec {
  const out: RuleSpec = { family: r.family, pref: r.pref, table: r.table === MAIN_TABLE ? 'main' : r.table };
  const from = canonicalSelector(r.from);
  const to = canonicalSelector(r.to);
  if (from !== undefined) out.from = from;
  if (to !== undefined) out.to = to;
  if (r.iif !== undefined) out.iif = r.iif;
  if (r.fwmark !== undefined) out.fwmark = { value: r.fwmark.value >>> 0, mask: r.fwmark.mask >>> 0 };
  if (r.ipproto !== undefined) out.ipproto = r.ipproto;
  if (r.sport !== undefined) out.sport = r.sport;
  return out;
}

export function canonicalRoute(r: RouteSpec): RouteSpec {
  const out: RouteSpec = { family: r.family, table: r.table, dst: canonicalDst(r.dst), dev: r.dev };
  if (r.via !== undefined) out.via = canonicalIp(r.via);
  if (r.type !== undefined) out.type = r.type;
  return out;
}

/** nft text with every line trimmed and blank lines dropped; null stays null. */
export function canonicalNft(text: string | null): string | null {
  if (text === null) return null;
  return text
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '')
    .join('\n');
}

const byKey =
  <T>(key: (x: T) => string) =>
  (a: T, b: T): number => {
    const ka = key(a);
    const kb = key(b);
    return ka < kb ? -1 : ka > kb ? 1 : 0;
  };
const pad = (n: number) => String(n).padStart(10, '0');

const ruleKey = (r: RuleSpec): string =>
  [
    r.family,
    pad(r.pref),
    r.from ?? '',
    r.to ?? '',
    r.iif ?? '',
    r.fwmark ? `${pad(r.fwmark.value)}/${pad(r.fwmark.mask)}` : '',
    r.ipproto ?? '',
    r.sport ?? '',
    r.table,
  ].join(' ');

/** Canonical and sorted: two states describing the same kernel state are deepStrictEqual. */
export function canonicalState(s: KernelState): KernelState {
  return {
    links: s.links.map(canonicalLink).sort(byKey((l) => l.name)),
    addresses: s.addresses.map(canonicalAddress).sort(byKey((a) => `${a.dev} ${a.cidr}`)),
    rules: s.rules.map(canonicalRule).sort(byKey(ruleKey)),
    routes: s.routes
      .map(canonicalRoute)
      .sort(byKey((r) => `${r.family} ${pad(r.table)} ${r.dst} ${r.dev} ${r.via ?? ''}`)),
    nft: canonicalNft(s.nft),
  };
}
