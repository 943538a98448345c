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
