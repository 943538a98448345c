/**
 * A peer's `address`: its management API `host:port` (docs/decisions.md §5). Port 1 to 65535, IPv6 hosts
 * in brackets, hostnames after RFC 1123. Pure.
 */
import { formatIp, parseIpv4, parseIpv6 } from './cidr.js';

const HOSTNAME =
  /^(?=.{1,253}$)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$/;

export interface PeerAddress {
  host: string;
  port: number;
  /** Canonical `host:port` text, the form stored and compared. */
  text: string;
}

export function parsePeerAddress(text: string): PeerAddress | undefined {
  if (typeof text !== 'string' || text.length > 300) return undefined;
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):([1-9]\d{0,4})$/.exec(text);
  if (!m) return undefined;
  const port = Number(m[3]);
  if (port > 65535) return undefined;
  if (m[1] !== undefined) {
    const v6 = parseIpv6(m[1]);
    if (!v6) return undefined;
    const host = formatIp(v6);
    return { host, port, text: `[${host}]:${port}` };
  }
  const host = m[2]!;
  // All-numeric dotted text must be a valid IPv4 address, not a "hostname".
  if (/^[\d.]+$/.test(host)) {
    const v4 = parseIpv4(host);
    return v4 ? { host, port, text: `${host}:${port}` } : undefined;
  }
  if (!HOSTNAME.test(host)) return undefined;
  const lower = host.toLowerCase();
  return { host: lower, port, text: `${lower}:${port}` };
}
