/**
 * A service's active health check, the `health_check` extension field (docs/decisions.md §7):
 * a probe that the service's exit runs toward one address, a TCP connect (`tcp`) or an ICMP echo
 * (`icmp`), every `interval_ms`; `failures` failed probes in a row make the check fail. The one
 * place that checks a value and gives its canonical form, for the API, gossip, the store and the
 * data plane's view. Pure.
 */
import { type Family, formatIp, parseIp } from './cidr.js';
import { invalidRequest } from './errors.js';
import { parsePeerAddress } from './peer-address.js';

export const HEALTH_CHECK_INTERVAL_MS = { min: 100, max: 60_000, default: 1000 } as const;
export const HEALTH_CHECK_FAILURES = { min: 1, max: 10, default: 3 } as const;
/** Longest target text: `[` + 39 characters of IPv6 + `]:65535` is 47. */
export const HEALTH_CHECK_TARGET_MAX = 47;

/**
 * The canonical form, as the API shows it, gossip carries it and the store keeps it (as JSON):
 * exactly one of `tcp` and `icmp`, defaults filled in, addresses in canonical text (RFC 5952
 * for IPv6), keys in this order.
 */
export type HealthCheck =
  | { tcp: string; interval_ms: number; failures: number }
  | { icmp: string; interval_ms: number; failures: number };

/** The check as a prober runs it: the address already parsed. */
export type HealthProbe =
  | {
      kind: 'tcp';
      /** The canonical target as the API shows it, `10.1.2.3:443` or `[fd00::1]:443`, for logs. */
      target: string;
      /** The IP address alone, without brackets. */
      address: string;
      family: Family;
      port: number;
      intervalMs: number;
      failures: number;
    }
  | {
      kind: 'icmp';
      target: string;
      address: string;
      family: Family;
      intervalMs: number;
      failures: number;
    };

export type HealthCheckReading = { check: HealthCheck } | { problem: string };

/**
 * Reads a value of the field (anything but absent and null, which callers handle: no check, or
 * unchanged). Keys other than the four are ignored and not kept, like unknown body fields
 * (docs/decisions.md §3).
 */
export function readHealthCheck(value: unknown): HealthCheckReading {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    return { problem: 'health_check must be an object such as {"tcp": "10.1.2.3:443"}, or null' };
  }
  const own = (k: string): unknown =>
    Object.hasOwn(value, k) ? (value as Record<string, unknown>)[k] : undefined;
  const tcp = own('tcp');
  const icmp = own('icmp');
  if ((tcp === undefined) === (icmp === undefined)) {
    return { problem: 'health_check needs exactly one of tcp and icmp' };
  }
  const target = tcp !== undefined ? tcpTarget(tcp) : icmpTarget(icmp);
  if ('problem' in target) return target;
  const interval = bounded(own('interval_ms'), HEALTH_CHECK_INTERVAL_MS);
  if (interval === undefined) {
    return {
      problem: `health_check.interval_ms must be an integer from ${rangeText(HEALTH_CHECK_INTERVAL_MS)}`,
    };
  }
  const failures = bounded(own('failures'), HEALTH_CHECK_FAILURES);
  if (failures === undefined) {
    return { problem: `health_check.failures must be an integer from ${rangeText(HEALTH_CHECK_FAILURES)}` };
  }
  return {
    check:
      tcp !== undefined
        ? { tcp: target.text, interval_ms: interval, failures }
        : { icmp: target.text, interval_ms: interval, failures },
  };
}

/** readHealthCheck for a request: a problem is 400 INVALID_REQUEST. */
export function parseHealthCheck(value: unknown): HealthCheck {
  const reading = readHealthCheck(value);
  if ('problem' in reading) throw invalidRequest(reading.problem);
  return reading.check;
}

/** The canonical JSON text of a check: what the store keeps. */
export function healthCheckJson(check: HealthCheck): string {
  const ordered =
    'tcp' in check
      ? { tcp: check.tcp, interval_ms: check.interval_ms, failures: check.failures }
      : { icmp: check.icmp, interval_ms: check.interval_ms, failures: check.failures };
  return JSON.stringify(ordered);
}

export function sameHealthCheck(a: HealthCheck | null, b: HealthCheck | null): boolean {
  if (a === null || b === null) return a === b;
  return healthCheckJson(a) === healthCheckJson(b);
}

/**
 * The probe a canonical check describes. null only for a value that never went through
 * readHealthCheck (the API and gossip both do), so that a bad row cannot stop the data plane.
 */
export function healthProbe(check: HealthCheck): HealthProbe | null {
  const timing = { intervalMs: check.interval_ms, failures: check.failures };
  if ('tcp' in check) {
    const at = parsePeerAddress(check.tcp);
    const ip = at && parseIp(at.host);
    if (!at || !ip) return null;
    return { kind: 'tcp', target: at.text, address: at.host, family: ip.family, port: at.port, ...timing };
  }
  const ip = parseIp(check.icmp);
  if (!ip) return null;
  const address = formatIp(ip.bytes);
  return { kind: 'icmp', target: address, address, family: ip.family, ...timing };
}

const rangeText = (r: { min: number; max: number }) => `${r.min} to ${r.max}`;

/** The value, or the default when absent; undefined when it is not an integer in range. */
function bounded(v: unknown, r: { min: number; max: number; default: number }): number | undefined {
  if (v === undefined) return r.default;
  return Number.isSafeInteger(v) && (v as number) >= r.min && (v as number) <= r.max
    ? (v as number)
    : undefined;
}

type TargetReading = { text: string } | { problem: string };

/**
 * `address:port` with an IP literal, IPv6 in brackets. parsePeerAddress also takes host names;
 * a probe target must be an address, so that what the exit probes never depends on its resolver.
 */
function tcpTarget(v: unknown): TargetReading {
  const at = typeof v === 'string' && v.length <= HEALTH_CHECK_TARGET_MAX ? parsePeerAddress(v) : undefined;
  const ip = at && parseIp(at.host);
  if (!at || !ip) {
    return {
      problem:
        'health_check.tcp must be an IP address and a port, e.g. 10.1.2.3:443 or [fd00::1]:443 (no host names)',
    };
  }
  const bad = unprobeable(ip.bytes);
  return bad ? { problem: `health_check.tcp ${bad}` } : { text: at.text };
}

function icmpTarget(v: unknown): TargetReading {
  const ip = typeof v === 'string' && v.length <= HEALTH_CHECK_TARGET_MAX ? parseIp(v) : undefined;
  if (!ip) {
    return {
      problem: 'health_check.icmp must be an IP address, e.g. 10.1.2.3 or fd00::1 (no host name, no port)',
    };
  }
  const bad = unprobeable(ip.bytes);
  return bad ? { problem: `health_check.icmp ${bad}` } : { text: formatIp(ip.bytes) };
}

/** Addresses no probe can mean: they name no one host. */
function unprobeable(bytes: Uint8Array): string | undefined {
  if (bytes.every((b) => b === 0)) return 'cannot be the unspecified address';
  if (bytes.length === 4) {
    if (bytes[0]! >= 224 && bytes[0]! <= 239) return 'cannot be a multicast address';
    if (bytes.every((b) => b === 255)) return 'cannot be the broadcast address';
    return undefined;
  }
  return bytes[0] === 0xff ? 'cannot be a multicast address' : undefined;
}
