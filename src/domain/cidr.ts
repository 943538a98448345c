/**
 * Strict IPv4/IPv6 address and CIDR parsing for routes and interface addresses (docs/decisions.md §6).
 * Refuses what an operator would not mean: leading zeros, spaces, zone ids, dotted IPv4 inside
 * IPv6 (IPv4-mapped and -compatible forms), prefixes out of range. Pure.
 */

export type Family = 4 | 6;

export interface Cidr {
  family: Family;
  /** 4 or 16 bytes. */
  bytes: Uint8Array;
  prefix: number;
  /** Canonical text: dotted quad, or RFC 5952 for IPv6 (lowercase, longest zero run compressed). */
  text: string;
}

const DEC_OCTET = /^(?:0|[1-9]\d{0,2})$/;
const PREFIX = /^(?:0|[1-9]\d{0,2})$/;

export function parseIpv4(text: string): Uint8Array | undefined {
  const parts = text.split('.');
  if (parts.length !== 4) return undefined;
  const bytes = new Uint8Array(4);
  for (let i = 0; i < 4; i++) {
    const p = parts[i]!;
    if (!DEC_OCTET.test(p) || Number(p) > 255) return undefined;
    bytes[i] = Number(p);
  }
  return bytes;
}

export function parseIpv6(text: string): Uint8Array | undefined {
  if (text.length > 39 || !/^[0-9A-Fa-f:]+$/.test(text)) return undefined;
  const halves = text.split('::');
  if (halves.length > 2) return undefined;
  const groups = (s: string) => (s === '' ? [] : s.split(':'));
  const head = groups(halves[0]!);
  const tail = halves.length === 2 ? groups(halves[1]!) : [];
  if ([...head, ...tail].some((g) => !/^[0-9A-Fa-f]{1,4}$/.test(g))) return undefined;
  const missing = 8 - head.length - tail.length;
  if (halves.length === 2 ? missing < 1 : missing !== 0) return undefined;
  const all = [...head, ...Array<string>(halves.length === 2 ? missing : 0).fill('0'), ...tail];
  const bytes = new Uint8Array(16);
  all.forEach((g, i) => {
    const v = Number.parseInt(g, 16);
    bytes[2 * i] = v >> 8;
    bytes[2 * i + 1] = v & 0xff;
  });
  return bytes;
}

export function formatIp(bytes: Uint8Array): string {
  if (bytes.length === 4) return [...bytes].join('.');
  const groups: number[] = [];
  for (let i = 0; i < 16; i += 2) groups.push((bytes[i]! << 8) | bytes[i + 1]!);
  // RFC 5952: compress the longest run of two or more zero groups, the first if tied.
  let bestStart = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (bestStart < 0) return hex.join(':');
  return `${hex.slice(0, bestStart).join(':')}::${hex.slice(bestStart + bestLen).join(':')}`;
}

export function parseIp(text: string): { family: Family; bytes: Uint8Array } | undefined {
  const v4 = parseIpv4(text);
  if (v4) return { family: 4, bytes: v4 };
  const v6 = parseIpv6(text);
  return v6 ? { family: 6, bytes: v6 } : undefined;
}

/**
 * Parses `address/prefix`. With `requireNetwork`, host bits must be zero (a route names a
 * network); without, any address in the network is fine (an interface address).
 */
export function parseCidr(text: string, requireNetwork: boolean): Cidr | undefined {
  if (typeof text !== 'string' || text.length > 43) return undefined;
  const slash = text.indexOf('/');
  if (slash < 0 || text.indexOf('/', slash + 1) >= 0) return undefined;
  const ip = parseIp(text.slice(0, slash));
  const prefixText = text.slice(slash + 1);
  if (!ip || !PREFIX.test(prefixText)) return undefined;
  const prefix = Number(prefixText);
  if (prefix > ip.bytes.length * 8) return undefined;
  if (requireNetwork && !hostBitsZero(ip.bytes, prefix)) return undefined;
  return { family: ip.family, bytes: ip.bytes, prefix, text: `${formatIp(ip.bytes)}/${prefix}` };
}

function hostBitsZero(bytes: Uint8Array, prefix: number): boolean {
  for (let bit = prefix; bit < bytes.length * 8; bit++) {
    if ((bytes[bit >> 3]! >> (7 - (bit & 7))) & 1) return false;
  }
  return true;
}
