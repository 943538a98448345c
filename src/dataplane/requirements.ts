/**
 * What the data plane needs from the host, checked at start (`--dataplane auto|on`) and on every
 * reconcile (forwarding), so that `/readyz` and one log line say why traffic cannot cross instead
 * of it failing silently. The agent changes none of these settings itself (global sysctls changed
 * behind the operator's back break other software on the host); docs/dataplane.md lists the
 * commands.
 */
import { execFile } from 'node:child_process';
import { accessSync, constants, readFileSync } from 'node:fs';

const CAP_NET_ADMIN = 12;

/** Whether this process holds CAP_NET_ADMIN in its effective set. */
export function hasNetAdmin(status: string = readFileSync('/proc/self/status', 'utf8')): boolean {
  const m = /^CapEff:\s*([0-9a-f]+)$/m.exec(status);
  return m !== null && ((BigInt(`0x${m[1]}`) >> BigInt(CAP_NET_ADMIN)) & 1n) === 1n;
}

function runs(command: string, args: string[]): Promise<boolean> {
  return new Promise((resolve) => {
    execFile(command, args, { timeout: 5000 }, (err) => resolve(!err));
  });
}

/** The reasons the data plane cannot run on this host; empty when it can. */
export async function missingRequirements(): Promise<string[]> {
  const reasons: string[] = [];
  if (!hasNetAdmin()) reasons.push('the process lacks CAP_NET_ADMIN (run as root or grant the capability)');
  try {
    accessSync('/dev/net/tun', constants.R_OK | constants.W_OK);
  } catch {
    reasons.push('/dev/net/tun is missing or not accessible (load the tun module)');
  }
  if (!(await runs('nft', ['--version']))) reasons.push('the nft command (nftables) is not installed');
  if (!(await runs('ip', ['-V']))) reasons.push('the ip command (iproute2) is not installed');
  return reasons;
}

/** Sysctl values that stop carried traffic, as reasons (read through the kernel port). */
export function forwardingProblems(values: {
  ipv4Forward: string | null;
  ipv6Forward: string | null;
  /** Only read where this agent is an exit: net.ipv4.conf.{all,default}.rp_filter. */
  rpFilterAll?: string | null;
  rpFilterDefault?: string | null;
}): string[] {
  const out: string[] = [];
  // An exit's packets from a TUN carry the client's address, which the main table routes out of
  // the uplink, not back into the TUN: strict mode (1) drops them all. The TUN's own key starts
  // as `default` and the kernel applies the larger of it and `all`.
  for (const [key, value] of [
    ['all', values.rpFilterAll],
    ['default', values.rpFilterDefault],
  ] as const) {
    if (value?.trim() === '1') {
      out.push(
        `net.ipv4.conf.${key}.rp_filter is 1 (strict): an exit drops every IPv4 packet from its tunnels (sysctl -w net.ipv4.conf.${key}.rp_filter=2)`,
      );
    }
  }
  if (values.ipv4Forward !== null && values.ipv4Forward.trim() !== '1') {
    out.push(
      'net.ipv4.ip_forward is 0: forwarded IPv4 traffic cannot enter or leave a tunnel (sysctl -w net.ipv4.ip_forward=1)',
    );
  }
  if (values.ipv6Forward !== null && values.ipv6Forward.trim() !== '1') {
    out.push(
      'net.ipv6.conf.all.forwarding is 0: forwarded IPv6 traffic cannot enter or leave a tunnel (sysctl -w net.ipv6.conf.all.forwarding=1)',
    );
  }
  return out;
}

/** What the host's settings allow of pacing (docs/dataplane.md, "Pacing a limited service's clients"). */
export interface PacingVerdict {
  /** The families whose clients' TCP may go through a pacer; none when `reason` is set. */
  families: Set<4 | 6>;
  /** Why nothing is paced, or null. */
  reason: string | null;
  /** net.ipv4.tcp_early_demux is 1 and must be set to 0 before anything is paced. */
  turnOffEarlyDemux: boolean;
}

/**
 * Whether the host lets a pacer's packets through, from its settings (read through the kernel
 * port; null where a key is missing):
 * - each paced packet is forwarded once, out of the pacer: only the families the host forwards;
 * - strict reverse-path filtering on `all` would drop them where they come back in, at the
 *   pacer's peer, out of which no route to the client leads; the agent does not loosen `all`;
 * - TCP early demux would hand a client's packet to the agent's socket before routing, and the
 *   kernel does not forward a packet that has a socket: it must be (or be set to) 0.
 */
export function pacingVerdict(values: {
  ipv4Forward: string | null;
  ipv6Forward: string | null;
  rpFilterAll: string | null;
  earlyDemux: string | null;
}): PacingVerdict {
  const families = new Set<4 | 6>();
  if (values.ipv4Forward?.trim() === '1') families.add(4);
  if (values.ipv6Forward?.trim() === '1') families.add(6);
  const refuse = (reason: string): PacingVerdict => ({
    families: new Set(),
    reason,
    turnOffEarlyDemux: false,
  });
  if (families.size === 0) return refuse('forwarding is off: limited services are not paced');
  if (values.rpFilterAll?.trim() === '1') {
    return refuse(
      'net.ipv4.conf.all.rp_filter is 1 (strict): limited services are not paced (sysctl -w net.ipv4.conf.all.rp_filter=2)',
    );
  }
  const demux = values.earlyDemux?.trim();
  if (demux !== '0' && demux !== '1') {
    return refuse(
      `net.ipv4.tcp_early_demux is ${demux ?? 'missing'}, not 0 or 1: limited services are not paced`,
    );
  }
  return { families, reason: null, turnOffEarlyDemux: demux === '1' };
}
