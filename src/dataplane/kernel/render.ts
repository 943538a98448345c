/**
 * The exact command text of every KernelChange: which tool runs it (`ip -batch`, `ip -4/-6
 * -batch`, `nft -f`) and the lines fed to it. Pure. LinuxKernel feeds these lines to the tools;
 * RecordingKernel writes the same lines to its transcript, so a unit test of the reconciler reads
 * the commands the real kernel would get. Also checks every field before anything runs: a name
 * or number that would change the meaning of a batch line is refused here (KernelError).
 *
 * Choices made here (the kernel port's contract, see port.ts):
 * - addresses are added `noprefixroute` (IPv6 also `nodad`): the agent routes in its own tables;
 * - a MACVLAN is `link add link P name N [address MAC] type macvlan mode bridge` then `link set N mtu M up`;
 *   a TUN already exists (openTun), so adding it is only `link set N mtu M txqueuelen Q up`;
 * - a pacer is a veth pair (see pacerLines) and then its queue, `tc` lines (see pacerQueueLines);
 * - a route with a gateway is added `onlink`: the agent's addresses have no prefix route, so the
 *   kernel would otherwise refuse a gateway it cannot reach through the route's own table
 *   ("Nexthop has invalid gateway"); deleting it needs no flag;
 * - the nft table is replaced in one transaction that also works when it does not exist:
 *   `table inet mesh_agent {}` + `delete table inet mesh_agent` [+ the new table].
 */

import { parseIp } from '../../domain/cidr.js';
import { parseCidrLoose } from './canonical.js';
import { isPacerName, NFT_TABLE, pacerPeerName } from './ownership.js';
import {
  type AddressSpec,
  type Family,
  type KernelChange,
  KernelError,
  type LinkSpec,
  type RouteSpec,
  type RuleSpec,
} from './port.js';

/**
 * The process a line goes to: `ip -batch -`, `ip -4 -batch -`, `ip -6 -batch -`, `tc -batch -`
 * or `nft -f -`.
 */
export type Tool = 'ip' | 'ip -4' | 'ip -6' | 'tc' | 'nft';

export interface Rendered {
  tool: Tool;
  /** Lines for the tool's stdin, in order (an nft table body spans several text lines). */
  lines: string[];
  /** Run only if this link still exists (deleting a TUN the kernel may already have removed). */
  onlyIfLinkExists?: string;
}

/** The commands a Rendered stands for, as one would type them (`ip -4 route add ...`). */
export const commandsOf = (r: Rendered): string[] => r.lines.map((l) => `${r.tool} ${l}`);

const MAC = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;
const NAME = /^[A-Za-z0-9_.+-]{1,15}$/;
const validName = (n: unknown): n is string =>
  typeof n === 'string' && NAME.test(n) && n !== '.' && n !== '..';
/** Throws unless `name` is a valid interface name (what openTun and every line accept). */
export function checkLinkName(name: string): void {
  if (!validName(name)) throw new KernelError(`open ${name}`, `invalid link name: ${JSON.stringify(name)}`);
}
const isUint = (n: unknown, max: number): n is number =>
  typeof n === 'number' && Number.isInteger(n) && n >= 0 && n <= max;
const U32 = 0xffff_ffff;
const hex = (n: number) => `0x${n.toString(16)}`;

class Checker {
  constructor(private readonly command: string) {}
  need(ok: boolean, what: string, value: unknown): void {
    if (!ok) throw new KernelError(this.command, `invalid ${what}: ${JSON.stringify(value)}`);
  }
  name(what: string, n: unknown): void {
    this.need(validName(n), what, n);
  }
  /** An address or CIDR of the given family (route destinations: see route()). */
  cidr(what: string, text: unknown, family: Family): void {
    const c = typeof text === 'string' ? parseCidrLoose(text) : undefined;
    this.need(c !== undefined && c.family === family, `${what} (IPv${family})`, text);
  }
  ip(what: string, text: unknown, family: Family): void {
    const ip = typeof text === 'string' ? parseIp(text) : undefined;
    this.need(ip !== undefined && ip.family === family, `${what} (IPv${family})`, text);
  }
}

function familyOfCidr(text: string): Family | undefined {
  return parseCidrLoose(text)?.family;
}

/** The txqueuelen of the agent's TUN devices. */
export const TUN_QUEUE_PACKETS = 1000;

export function renderLink(op: 'add' | 'del', link: LinkSpec): Rendered[] {
  if (link.kind === 'pacer') return renderPacer(op, link);
  return [renderNetdev(op, link)];
}

function renderNetdev(op: 'add' | 'del', link: LinkSpec): Rendered {
  if (op === 'del') {
    const line = `link del ${link.name}`;
    new Checker(`ip ${line}`).name('link name', link.name);
    return link.kind === 'tun'
      ? { tool: 'ip', lines: [line], onlyIfLinkExists: link.name }
      : { tool: 'ip', lines: [line] };
  }
  const up = `link set ${link.name} mtu ${link.mtu} up`;
  const check = new Checker(`ip ${up}`);
  check.name('link name', link.name);
  check.need(isUint(link.mtu, U32) && link.mtu > 0, 'mtu', link.mtu);
  // A TUN's queue is where the kernel waits for the agent to read: 500 packets (the TUN default)
  // overflowed under a single TCP stream in bench/dataplane (2-7 % of packets dropped, thousands
  // of retransmits); 1000 is the Ethernet default and did not.
  if (link.kind === 'tun') {
    return {
      tool: 'ip',
      lines: [`link set ${link.name} mtu ${link.mtu} txqueuelen ${TUN_QUEUE_PACKETS} up`],
    };
  }
  check.need(link.kind === 'macvlan', 'link kind', link.kind);
  const mac = link.mac === undefined ? '' : ` address ${link.mac}`;
  const add = `link add link ${link.parent} name ${link.name}${mac} type macvlan mode bridge`;
  const checkAdd = new Checker(`ip ${add}`);
  checkAdd.name('MACVLAN parent', link.parent);
  if (link.mac !== undefined) checkAdd.need(MAC.test(link.mac), 'MAC address', link.mac);
  return { tool: 'ip', lines: [add, up] };
}

/** The most a pacer's bucket queues: this long at the pacer's rate (docs/dataplane.md). */
const PACER_QUEUE_MS = 10;
/** The largest rate a pacer takes: above the largest limit the API takes (10^12 bit/s of payload). */
const PACER_MAX_BPS = 2e12;
/**
 * The least burst of a bucket's cutting tbf, which drops a packet larger than its burst that it
 * cannot cut into segments: a jumbo frame's (9000 bytes and its header) passes whole.
 */
const PACER_LEAST_BURST = 9216;
/**
 * A bucket passes a packet of up to this long at the pacer's rate whole (and at least
 * PACER_LEAST_BURST). A client's TCP sizes its TSO packets to about a millisecond of its pacing
 * rate, which runs ahead of the limit while BBR probes; cut into segments, each segment is a
 * wakeup, a read and a frame for the agent, which then needed about three times the CPU
 * (docs/dataplane.md, "Why TSO packets pass whole").
 */
const PACER_WHOLE_MS = 4;
/** The largest packet a bucket sees: a TSO packet of 64 KiB and its headers. */
const PACER_LARGEST_PACKET = 65_536 + 128;
/** The least a bucket holds, whatever the rate: two of the largest packets it takes whole. */
const PACER_LEAST_BYTES = 2 * PACER_LEAST_BURST;

/**
 * A pacer: a veth pair whose `name` end sends at `rateBps` and whose peer receives what it sent,
 * in the same namespace. Both ends carry the same MAC and `name` does no ARP (nor IPv6 neighbour
 * discovery), so what is routed out of it is addressed to its peer whatever its destination;
 * neither end makes an IPv6 link-local address (the same MAC on both would fail DAD). The peer
 * holds a link-local IPv4 address: reverse-path filtering drops whatever arrives on an interface
 * without one (ownership.ts exitTunAddress). The alias records the rate, which observe reads back.
 */
function renderPacer(op: 'add' | 'del', link: LinkSpec): Rendered[] {
  const peer = pacerPeerName(link.name);
  if (op === 'del') {
    const line = `link del ${link.name}`;
    new Checker(`ip ${line}`).name('link name', link.name);
    return [{ tool: 'ip', lines: [line] }];
  }
  const mac = pacerMac(link.name);
  const add = `link add ${link.name} mtu ${link.mtu} address ${mac} type veth peer name ${peer} mtu ${link.mtu} address ${mac}`;
  const check = new Checker(`ip ${add}`);
  check.need(isPacerName(link.name), 'pacer name', link.name);
  check.name('peer name', peer);
  check.need(isUint(link.mtu, U32) && link.mtu > 0, 'mtu', link.mtu);
  const rate = link.rateBps;
  check.need(isUint(rate, PACER_MAX_BPS) && rate >= 8000, 'pacer rate (bit/s)', rate);
  check.cidr('peer address', link.peerAddress, 4);
  const bps = rate as number;
  // The alias, which observe reads the rate back from, comes last: a pacer whose queue could not
  // be made reads as one of unknown rate and is made again.
  return [
    {
      tool: 'ip',
      lines: [
        add,
        `link set ${link.name} addrgenmode none arp off`,
        `link set ${peer} addrgenmode none`,
        `address add ${link.peerAddress} dev ${peer} noprefixroute`,
        `link set ${peer} up`,
        `link set ${link.name} up`,
      ],
    },
    { tool: 'tc', lines: pacerQueueLines(link.name, bps) },
    { tool: 'ip', lines: [`link set ${link.name} alias ${PACER_ALIAS}${bps}`] },
  ];
}

/** What a pacer's alias starts with; the rate in bit/s follows (linux.ts parseLink reads it). */
export const PACER_ALIAS = 'mesh-agent-pacer-bps=';

/** Locally administered, unicast, one per pacer name (nothing outside the pair ever sees it). */
function pacerMac(name: string): string {
  const slot = Number(name.replace(/\D/g, '')) & 0xffff;
  return `02:6d:70:00:${(slot >> 8).toString(16).padStart(2, '0')}:${(slot & 255).toString(16).padStart(2, '0')}`;
}

/** Buckets a pacer's queue hashes its flows into (a power of two, at most 256). */
const PACER_BUCKETS = 64;

/**
 * The pacer's queue, `tc` lines: htb at the rate. Small packets (under 256 bytes: SYNs, pure
 * ACKs, a small request) go first, so a request beside a bulk upload does not wait behind the
 * upload's queue. The rest are hashed by the client's port (bits 1-6: Linux hands out even ports
 * to connect()) into PACER_BUCKETS classes of equal priority, which htb serves in turn, each
 * a quantum of bytes: flows share the rate fairly, as in SFQ (which this kernel, like many,
 * lacks), unless two land in one bucket. htb lets a class send one packet per turn however far
 * its quantum is overdrawn, so the quantum is the largest packet a bucket passes whole: smaller,
 * a flow with bigger TSO packets (which TCP sizes from its own rate) would take more. Each
 * bucket queues PACER_QUEUE_MS of the rate, beyond which its packets are dropped (its sender
 * backs off, as behind any bottleneck). A bucket's FIFO is a tbf
 * well above the rate only for what tbf does on the way in: it cuts a TSO packet (up to 64 KiB)
 * longer than PACER_WHOLE_MS into segments, so that no one packet holds the bucket or the rate
 * for long; htb does the pacing.
 * Hashing assumes IP headers without options (TCP at byte 20, or 40 after IPv6's header): any
 * other packet still lands in some bucket.
 */
function pacerQueueLines(dev: string, bps: number): string[] {
  const queue = Math.max(PACER_LEAST_BYTES, Math.round(((bps / 8) * PACER_QUEUE_MS) / 1000));
  const cutBurst = Math.max(PACER_LEAST_BURST, Math.round(((bps / 8) * PACER_WHOLE_MS) / 1000));
  const quantum = Math.min(cutBurst, PACER_LARGEST_PACKET);
  // Guaranteed rates add up to the parent's: a tenth for small packets, the rest in equal shares.
  const small = Math.max(8000, Math.floor(bps / 10));
  const share = Math.max(8000, Math.floor((bps - small) / PACER_BUCKETS));
  const bucket = (b: number) => (0x100 + b).toString(16);
  const hash = PACER_BUCKETS - 1;
  const lines = [
    `qdisc add dev ${dev} root handle 1: htb default ${bucket(0)}`,
    `class add dev ${dev} parent 1: classid 1:1 htb rate ${bps}bit ceil ${bps}bit`,
    `class add dev ${dev} parent 1:1 classid 1:2 htb rate ${small}bit ceil ${bps}bit prio 0`,
    `qdisc add dev ${dev} parent 1:2 handle 2: pfifo limit 1000`,
  ];
  for (let b = 0; b < PACER_BUCKETS; b++) {
    lines.push(
      `class add dev ${dev} parent 1:1 classid 1:${bucket(b)} htb rate ${share}bit ceil ${bps}bit prio 1 quantum ${quantum}`,
      `qdisc add dev ${dev} parent 1:${bucket(b)} handle ${bucket(b)}: tbf rate ${4 * bps}bit burst ${cutBurst} limit ${queue}`,
    );
  }
  lines.push(
    `filter add dev ${dev} parent 1: protocol ip prio 1 u32 match u16 0x0000 0xff00 at 2 flowid 1:2`,
    `filter add dev ${dev} parent 1: protocol ipv6 prio 2 u32 match u16 0x0000 0xff00 at 4 flowid 1:2`,
  );
  for (const [prio, protocol, tcpAt, protoAt] of [
    [3, 'ip', 20, 9],
    [4, 'ipv6', 40, 6],
  ] as const) {
    lines.push(
      `filter add dev ${dev} parent 1: protocol ${protocol} prio ${prio} handle ${prio}: u32 divisor ${PACER_BUCKETS}`,
    );
    for (let b = 0; b < PACER_BUCKETS; b++) {
      lines.push(
        `filter add dev ${dev} parent 1: protocol ${protocol} prio ${prio} u32 ht ${prio}:${b.toString(16)}: match u8 0 0 flowid 1:${bucket(b)}`,
      );
    }
    lines.push(
      `filter add dev ${dev} parent 1: protocol ${protocol} prio ${prio} u32 match u8 6 0xff at ${protoAt} hashkey mask 0x${(hash << 17).toString(16).padStart(8, '0')} at ${tcpAt} link ${prio}:`,
    );
  }
  return lines;
}

export function renderAddress(op: 'add' | 'del', a: AddressSpec): Rendered {
  const family = typeof a.cidr === 'string' ? familyOfCidr(a.cidr) : undefined;
  const flags = op === 'add' ? (family === 6 ? ' noprefixroute nodad' : ' noprefixroute') : '';
  const line = `address ${op} ${a.cidr} dev ${a.dev}${flags}`;
  const check = new Checker(`ip ${line}`);
  check.need(family !== undefined, 'address', a.cidr);
  check.name('device', a.dev);
  return { tool: 'ip', lines: [line] };
}

export function renderRule(op: 'add' | 'del', r: RuleSpec): Rendered {
  const parts = [`rule ${op} pref ${r.pref}`];
  if (r.from !== undefined) parts.push(`from ${r.from}`);
  if (r.to !== undefined) parts.push(`to ${r.to}`);
  if (r.iif !== undefined) parts.push(`iif ${r.iif}`);
  if (r.fwmark !== undefined) parts.push(`fwmark ${hex(r.fwmark.value)}/${hex(r.fwmark.mask)}`);
  if (r.ipproto !== undefined) parts.push(`ipproto ${r.ipproto}`);
  if (r.sport !== undefined) parts.push(`sport ${r.sport}`);
  parts.push(`lookup ${r.table}`);
  const line = parts.join(' ');
  const tool: Tool = r.family === 6 ? 'ip -6' : 'ip -4';
  const check = new Checker(`${tool} ${line}`);
  check.need(r.family === 4 || r.family === 6, 'family', r.family);
  check.need(isUint(r.pref, U32), 'pref', r.pref);
  if (r.from !== undefined) check.cidr('from', r.from, r.family);
  if (r.to !== undefined) check.cidr('to', r.to, r.family);
  if (r.iif !== undefined) check.name('iif', r.iif);
  if (r.fwmark !== undefined) {
    check.need(isUint(r.fwmark.value, U32), 'fwmark value', r.fwmark.value);
    check.need(isUint(r.fwmark.mask, U32), 'fwmark mask', r.fwmark.mask);
  }
  if (r.ipproto !== undefined) check.need(r.ipproto === 'tcp' || r.ipproto === 'udp', 'ipproto', r.ipproto);
  if (r.sport !== undefined) check.need(isUint(r.sport, 65_535) && r.sport > 0, 'sport', r.sport);
  check.need(r.table === 'main' || (isUint(r.table, U32) && r.table > 0), 'table', r.table);
  return { tool, lines: [line] };
}

export function renderRoute(op: 'add' | 'del', r: RouteSpec): Rendered {
  let line = `route ${op} ${r.type === 'local' ? 'local ' : ''}${r.dst} dev ${r.dev}`;
  if (r.via !== undefined) line += op === 'add' ? ` via ${r.via} onlink` : ` via ${r.via}`;
  line += ` table ${r.table}`;
  const tool: Tool = r.family === 6 ? 'ip -6' : 'ip -4';
  const check = new Checker(`${tool} ${line}`);
  check.need(r.family === 4 || r.family === 6, 'family', r.family);
  if (r.dst !== 'default') check.cidr('destination', r.dst, r.family);
  check.name('device', r.dev);
  if (r.via !== undefined) check.ip('gateway', r.via, r.family);
  check.need(r.type === undefined || (r.type === 'local' && r.via === undefined), 'type', r.type);
  check.need(isUint(r.table, U32) && r.table > 0, 'table', r.table);
  return { tool, lines: [line] };
}

/**
 * Whether the braces of an nft body balance (outside quoted strings and comments), so the body
 * cannot close the agent's table and go on to change another one.
 */
export function bracesBalance(text: string): boolean {
  let depth = 0;
  let quoted = false;
  let comment = false;
  for (const ch of text) {
    if (comment) {
      if (ch === '\n') comment = false;
    } else if (quoted) {
      if (ch === '"') quoted = false;
      else if (ch === '\n') return false;
    } else if (ch === '"') quoted = true;
    else if (ch === '#') comment = true;
    else if (ch === '{') depth++;
    else if (ch === '}' && --depth < 0) return false;
  }
  return depth === 0 && !quoted;
}

export function renderNft(ruleset: string | null): Rendered {
  const lines = [`table inet ${NFT_TABLE} {}`, `delete table inet ${NFT_TABLE}`];
  if (ruleset === null) return { tool: 'nft', lines };
  const body = `table inet ${NFT_TABLE} {\n${ruleset}\n}`;
  new Checker(`nft ${body}`).need(
    typeof ruleset === 'string' && bracesBalance(ruleset),
    'ruleset (unbalanced braces)',
    ruleset,
  );
  return { tool: 'nft', lines: [...lines, body] };
}

/**
 * The command lines of one change, per tool in the order they run (one tool but for a pacer's
 * link); throws KernelError naming the command if a field is invalid.
 */
export function renderChange(change: KernelChange): Rendered[] {
  if ('link' in change) return renderLink(change.op, change.link);
  if ('address' in change) return [renderAddress(change.op, change.address)];
  if ('rule' in change) return [renderRule(change.op, change.rule)];
  if ('route' in change) return [renderRoute(change.op, change.route)];
  return [renderNft(change.ruleset)];
}
