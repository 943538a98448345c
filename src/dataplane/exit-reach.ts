/**
 * The exit's own check that it can forward a service's traffic (failover, docs/dataplane.md):
 * for each of the service's route destinations, the kernel's route toward it must leave by a
 * device that is up, with carrier. Its verdict travels to the ingress in a status message
 * (status-frames.ts). Pure: the kernel's answers come in, verdicts go out.
 *
 * A lookup that succeeds is not enough. When the device of a LAN goes down, its connected route
 * goes with it and the lookup falls through to a broader route, usually the default route out of
 * the uplink: the kernel would send the LAN's traffic to the internet (tailscale#16357 is an exit
 * that kept its traffic so). So each destination remembers the most specific route it has been
 * reached by since the service's routes were set; a lookup that now matches a less specific one
 * means that route is gone. A destination first seen through the default route (an exit to the
 * internet for a public prefix) keeps counting it as its route.
 */
import { formatIp, parseCidr } from '../domain/cidr.js';
import type { RouteAnswer, RouteQuery } from './kernel/port.js';

export interface ExitDestinations {
  serviceId: string;
  /**
   * Its routes' destination CIDRs, each with the address its traffic leaves from when that is
   * not the kernel's choice (a MACVLAN's, of the destination's family).
   */
  destinations: readonly { cidr: string; from?: string }[];
}

export interface ExitReachVerdict {
  canForward: boolean;
  /** What failed, for people: empty when it can forward. */
  detail: string;
}

/** The destinations there is an address to ask the kernel for (lookupAddress). */
const checkable = (s: ExitDestinations) => s.destinations.filter((d) => lookupAddress(d.cidr) !== null);
const memoryKey = (d: { cidr: string; from?: string }) => `${d.cidr} ${d.from ?? ''}`;

export class ExitReach {
  /** @param mark the packet mark the exit's own traffic carries, so lookups take its rules. */
  constructor(private readonly mark?: number) {}

  /**
   * Per service, per destination CIDR and source address: the longest matched prefix seen while
   * usable (a lookup from another address may take another table).
   */
  private readonly best = new Map<string, Map<string, number>>();

  /** The lookups to ask the kernel for these services, in order (judge() takes their answers). */
  queries(services: readonly ExitDestinations[]): RouteQuery[] {
    return services.flatMap((s) =>
      checkable(s).map((d) => ({
        dst: lookupAddress(d.cidr)!,
        ...(d.from !== undefined ? { from: d.from } : {}),
        ...(this.mark !== undefined ? { mark: this.mark } : {}),
      })),
    );
  }

  /**
   * Judges each service from the answers to queries(services), in the same order. Forgets the
   * services and destinations not in `services` (their routes changed or went).
   */
  judge(
    services: readonly ExitDestinations[],
    answers: readonly (RouteAnswer | null)[],
  ): Map<string, ExitReachVerdict> {
    const verdicts = new Map<string, ExitReachVerdict>();
    let at = 0;
    for (const s of services) {
      let best = this.best.get(s.serviceId);
      if (!best) {
        best = new Map();
        this.best.set(s.serviceId, best);
      }
      const destinations = checkable(s);
      for (const key of best.keys()) if (!destinations.some((d) => memoryKey(d) === key)) best.delete(key);
      const failures: string[] = [];
      for (const d of destinations) {
        const answer = answers[at++] ?? null;
        const failure = this.failure(best, d, answer);
        if (failure) failures.push(failure);
      }
      verdicts.set(s.serviceId, { canForward: failures.length === 0, detail: failures.join('; ') });
    }
    for (const id of this.best.keys()) if (!verdicts.has(id)) this.best.delete(id);
    return verdicts;
  }

  private failure(
    best: Map<string, number>,
    d: { cidr: string; from?: string },
    answer: RouteAnswer | null,
  ): string | null {
    const cidr = d.cidr;
    if (!answer) return `no route toward ${cidr}`;
    if (!answer.usable) return `${cidr}: ${answer.dev} is ${answer.operstate.toLowerCase()}`;
    const length = prefixLength(answer.prefix);
    const seen = best.get(memoryKey(d));
    if (seen !== undefined && length < seen)
      return `${cidr}: its /${seen} route is gone, the kernel would use ${answer.prefix} via ${answer.dev}`;
    best.set(memoryKey(d), length);
    return null;
  }
}

/**
 * The address to look a destination CIDR up by: its first host, the network address plus one
 * where the prefix has room, or null where there is no address to ask for. The network address
 * itself is special: IPv6's is the subnet-router anycast address (a router's lookup answers
 * `anycast`, not a route). Addresses in 0.0.0.0/8 and ::/3's low end are no destinations to the
 * kernel (0.0.0.1 is refused, ::1 is loopback): a catch-all route (0.0.0.0/0, ::/0 and the
 * halves of a split default) is asked for 1.0.0.1 or 2000::1, a unicast address it covers.
 */
export function lookupAddress(cidr: string): string | null {
  const parsed = parseCidr(cidr, false);
  if (!parsed) return null;
  const bytes = Uint8Array.from(parsed.bytes);
  const bits = bytes.length * 8;
  if (parsed.prefix < bits - 1) bytes[bytes.length - 1] = bytes[bytes.length - 1]! | 1;
  if (parsed.family === 4 && bytes[0] === 0) return parsed.prefix <= 7 ? '1.0.0.1' : null;
  if (parsed.family === 6 && bytes[0]! < 0x20 && bytes.subarray(0, 15).every((b) => b === 0))
    return parsed.prefix <= 2 ? '2000::1' : null;
  return formatIp(bytes);
}

function prefixLength(prefix: string): number {
  return Number(prefix.split('/')[1]);
}
