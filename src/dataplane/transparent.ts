/**
 * What a transparent exit (fully_transparent, docs/transparent.md) needs of its host, and what it
 * finds wrong on the way: checked on every reconcile, reported on the service
 * (`transparent_ready`, `transparent_reasons`), in /readyz and once in the log.
 *
 * Of the host's settings the agent changes only the three a transparent exit cannot work
 * without and that it may set: net.ipv4.conf.{all,default,<MACVLAN>}.rp_filter from 1 (strict,
 * which drops the replies addressed to a client) to 2 (loose). docs/decisions.md §6; the only
 * other sysctls the agent changes are for pacing (dataplane.ts pacingAllowed and
 * loosenPacerPeers): net.ipv4.tcp_early_demux, and its own pacers' rp_filter. Each change is logged with its old value. IP
 * forwarding and CAP_NET_ADMIN are checked and reported, never changed.
 *
 * Asymmetric return paths: a transparent connection whose SYNs get no answer is probed once from
 * the MACVLAN's own address. If the destination answers that, it is up and reachable, and its
 * replies to the client's address take a path that avoids this exit: reported with the return
 * route it needs, until a transparent connection of the service succeeds again.
 */
import type { Logger } from 'pino';
import type { KernelPort } from './kernel/port.js';

/** A transparent exit as the checks need it (from plan.ts's CarriedService and the service). */
export interface TransparentExit {
  serviceId: string;
  /** The service's MACVLAN interface (`mesh-mN`). */
  macvlan: string;
  /** The address families the MACVLAN has an address of (desired_ipv4_cidr / desired_ipv6_cidr). */
  families: readonly (4 | 6)[];
}

export interface TransparentChecksOptions {
  kernel: KernelPort;
  logger: Logger;
  /** Whether the process holds CAP_NET_ADMIN (requirements.ts hasNetAdmin). */
  netAdmin: () => boolean;
  /** Whether TCP is carried as streams (TPROXY listener and native sockets up). */
  streams: () => boolean;
}

/** A transparent connection that got no SYN-ACK, and what the probe from the MACVLAN found. */
export interface UnansweredConnection {
  client: string;
  destination: string;
  port: number;
  /** The MACVLAN address the probe used, which the destination did answer. */
  via: string;
  /** The client network the destination must route back through this exit (a route's source_cidr, or the client itself). */
  clientNetwork: string;
}

export const rpFilterKeys = (macvlan: string): string[] => [
  'net.ipv4.conf.all.rp_filter',
  'net.ipv4.conf.default.rp_filter',
  `net.ipv4.conf.${macvlan}.rp_filter`,
];

/** The reason shown for a probable asymmetric route, with the route the destination needs. */
export function asymmetricRouteReason(u: UnansweredConnection): string {
  return (
    `probable asymmetric route: ${u.destination}:${u.port} did not answer a connection from the client ` +
    `${u.client} (SYNs sent, no SYN-ACK) but answers the MACVLAN address ${u.via}: its replies to the client ` +
    `take a path that avoids this exit. On the destination's side add the return route ` +
    `"${u.clientNetwork} via ${u.via}" (e.g. ip route add ${u.clientNetwork} via ${u.via})`
  );
}

export class TransparentChecks {
  /** Reasons found by the last check, per transparent exit service (empty: ready). */
  private found = new Map<string, string[]>();
  private readonly unanswered = new Map<string, UnansweredConnection>();
  /** What was last logged per service, so that a problem is said once, not on every reconcile. */
  private readonly logged = new Map<string, string>();

  constructor(private readonly options: TransparentChecksOptions) {}

  /** Checks every transparent exit this agent carries; sets rp_filter where it must and may. */
  async check(exits: readonly TransparentExit[]): Promise<void> {
    const { kernel, logger } = this.options;
    const found = new Map<string, string[]>();
    for (const exit of exits) {
      const reasons: string[] = [];
      if (!this.options.netAdmin()) {
        reasons.push(
          'the agent lacks CAP_NET_ADMIN: it cannot open connections from a client address (IP_TRANSPARENT)',
        );
      }
      if (!this.options.streams()) {
        reasons.push(
          'TCP is not carried as streams on this agent (no native addon or TPROXY listener): transparent mode needs them',
        );
      }
      if (exit.families.length === 0) {
        reasons.push(
          'the service has no desired_ipv4_cidr or desired_ipv6_cidr: its MACVLAN has no address, so no route out of it',
        );
      }
      for (const family of exit.families) {
        const key = family === 4 ? 'net.ipv4.ip_forward' : 'net.ipv6.conf.all.forwarding';
        const value = await kernel.readSysctl(key);
        if (value !== null && value !== '1') {
          reasons.push(
            `${key} is ${value}: the service's UDP and ICMP cannot leave this exit (sysctl -w ${key}=1)`,
          );
        }
      }
      // rp_filter exists for IPv4 only; the kernel applies the larger of `all` and the interface's.
      if (exit.families.includes(4)) {
        for (const key of rpFilterKeys(exit.macvlan)) {
          const value = await kernel.readSysctl(key);
          if (value !== '1') continue; // 0 (off) and 2 (loose) both let the replies in
          try {
            await kernel.writeSysctl(key, '2');
            logger.warn(
              { service: exit.serviceId, key, from: value, to: '2' },
              'transparent service: set reverse-path filtering to loose (strict mode drops the replies to clients)',
            );
          } catch (err) {
            reasons.push(
              `${key} is 1 (strict) and the agent could not set it to 2 (${(err as Error).message}): ` +
                `replies to client addresses are dropped (sysctl -w ${key}=2)`,
            );
          }
        }
      }
      found.set(exit.serviceId, reasons);
    }
    this.found = found;
    for (const id of this.unanswered.keys()) if (!found.has(id)) this.unanswered.delete(id);
    for (const id of this.logged.keys()) if (!found.has(id)) this.logged.delete(id);
    for (const id of found.keys()) this.logOnce(id);
  }

  /** `transparent_ready` and its reasons; null where this agent is not the service's transparent exit. */
  readiness(serviceId: string): { ready: boolean; reasons: string[] } | null {
    const reasons = this.found.get(serviceId);
    if (!reasons) return null;
    const u = this.unanswered.get(serviceId);
    const all = u ? [...reasons, asymmetricRouteReason(u)] : reasons;
    return { ready: all.length === 0, reasons: all };
  }

  /** Each transparent exit service this agent carries: whether it is ready (for /metrics). */
  readyByService(): Map<string, boolean> {
    return new Map([...this.found.keys()].map((id) => [id, this.readiness(id)!.ready]));
  }

  /** Every not-ready service's reasons, for /readyz. */
  problems(): string[] {
    const out: string[] = [];
    for (const id of this.found.keys()) {
      for (const r of this.readiness(id)!.reasons) out.push(`transparent service ${id}: ${r}`);
    }
    return out;
  }

  /** A transparent connection of the service was answered: a reported asymmetric route is gone. */
  answered(serviceId: string): void {
    if (!this.unanswered.delete(serviceId)) return;
    this.logOnce(serviceId);
  }

  /** A transparent connection got no SYN-ACK while the MACVLAN's own address was answered. */
  unansweredButReachable(serviceId: string, u: UnansweredConnection): void {
    if (!this.found.has(serviceId)) return;
    this.unanswered.set(serviceId, u);
    this.logOnce(serviceId);
  }

  private logOnce(serviceId: string): void {
    const r = this.readiness(serviceId);
    if (!r) return;
    const text = r.reasons.join('\n');
    if (this.logged.get(serviceId) === text) return;
    const before = this.logged.get(serviceId);
    this.logged.set(serviceId, text);
    if (!r.ready) {
      this.options.logger.warn({ service: serviceId, reasons: r.reasons }, 'transparent service not ready');
    } else if (before !== undefined) {
      this.options.logger.info({ service: serviceId }, 'transparent service ready');
    }
  }
}
