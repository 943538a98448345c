/**
 * rtnetlink requests and replies as bytes (pure): the questions linux.ts asks the kernel through
 * the netlink addon (src/native/netlink.ts), and the answers read into the shapes `ip -j` prints,
 * so that one set of parsers (linux.ts parseRule, parseRoute, parseLink, parseAddresses) turns
 * both into the canonical form. Layouts: <linux/netlink.h>, <linux/rtnetlink.h>,
 * <linux/if_link.h>, <linux/if_addr.h>, <linux/fib_rules.h>; numbers in host order, which is
 * little-endian on every machine the agent runs on (x86-64, arm64). Used by linux.ts only.
 */
import { formatIp, parseIp } from '../../domain/cidr.js';

const NLMSG_ERROR = 2;
const NLMSG_DONE = 3;
const NLM_F_REQUEST = 0x1;
const NLM_F_DUMP = 0x300;
const RTM_NEWLINK = 16;
const RTM_GETLINK = 18;
const RTM_NEWADDR = 20;
const RTM_GETADDR = 22;
const RTM_NEWROUTE = 24;
const RTM_GETROUTE = 26;
const RTM_NEWRULE = 32;
const RTM_GETRULE = 34;
const RTM_F_FIB_MATCH = 0x2000;
const AF_INET = 2;
const AF_INET6 = 10;

const RTA = { DST: 1, SRC: 2, IIF: 3, OIF: 4, GATEWAY: 5, MULTIPATH: 9, TABLE: 15, MARK: 16 } as const;
const IFLA = {
  ADDRESS: 1,
  IFNAME: 3,
  MTU: 4,
  LINK: 5,
  OPERSTATE: 16,
  LINKINFO: 18,
  IFALIAS: 20,
  LINK_NETNSID: 37,
} as const;
const IFLA_INFO_KIND = 1;
const IFA = { ADDRESS: 1, LOCAL: 2 } as const;
const FRA = {
  DST: 1,
  SRC: 2,
  IIFNAME: 3,
  PRIORITY: 6,
  FWMARK: 10,
  TABLE: 15,
  FWMASK: 16,
  IP_PROTO: 22,
  SPORT_RANGE: 23,
} as const;
const FR_ACT_TO_TBL = 1;
const IFF_UP = 0x1;
const IFF_RUNNING = 0x40;
/** rtm_type names as ip prints them. */
const ROUTE_TYPES = ['unspec', 'unicast', 'local', 'broadcast', 'anycast', 'multicast', 'blackhole'];
const ROUTE_TYPES_MORE = ['unreachable', 'prohibit', 'throw', 'nat', 'xresolve'];
const OPERSTATES = ['UNKNOWN', 'NOTPRESENT', 'DOWN', 'LOWERLAYERDOWN', 'TESTING', 'DORMANT', 'UP'];

export type NetlinkFamily = 4 | 6;
const afOf = (family: NetlinkFamily) => (family === 4 ? AF_INET : AF_INET6);

/** A link as `ip -j -d addr show` prints it (the fields linux.ts reads). */
export interface NlLink {
  ifindex: number;
  ifname: string;
  mtu: number;
  link_index?: number;
  link_netnsid?: number;
  address?: string;
  operstate: string;
  flags: string[];
  linkinfo?: { info_kind?: string };
  ifalias?: string;
  addr_info: { family: string; local: string; prefixlen: number }[];
}

/** A rule as `ip -N -j rule show` prints it. */
export interface NlRule {
  priority: number;
  src?: string;
  srclen?: number;
  dst?: string;
  dstlen?: number;
  iif?: string;
  fwmark?: string;
  fwmask?: string;
  ipproto?: string;
  sport?: number;
  table?: string;
}

/** A route as `ip -N -j route show table all` (and `route get fibmatch`) prints it. */
export interface NlRoute {
  type: string;
  dst: string;
  gateway?: string;
  dev?: string;
  table: string;
  protocol: string;
  nexthops?: { gateway?: string; dev?: string }[];
}

let sequence = 1;

/** One request: header, fixed part, attributes (each padded to 4 bytes). */
function message(type: number, flags: number, fixed: Buffer, attrs: [number, Buffer][] = []): Buffer {
  const parts = [fixed];
  for (const [kind, value] of attrs) {
    const head = Buffer.alloc(4);
    head.writeUInt16LE(4 + value.length, 0);
    head.writeUInt16LE(kind, 2);
    parts.push(head, value, Buffer.alloc((4 - (value.length % 4)) % 4));
  }
  const body = Buffer.concat(parts);
  const header = Buffer.alloc(16);
  header.writeUInt32LE(16 + body.length, 0);
  header.writeUInt16LE(type, 4);
  header.writeUInt16LE(NLM_F_REQUEST | flags, 6);
  header.writeUInt32LE(sequence++ >>> 0, 8);
  return Buffer.concat([header, body]);
}

const u32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n >>> 0, 0);
  return b;
};

/** rtmsg / fib_rule_hdr (the same 12 bytes): family first, the rest zero but rtm_flags. */
function rtmsg(af: number, fields: { dstLen?: number; srcLen?: number; flags?: number } = {}): Buffer {
  const b = Buffer.alloc(12);
  b.writeUInt8(af, 0);
  b.writeUInt8(fields.dstLen ?? 0, 1);
  b.writeUInt8(fields.srcLen ?? 0, 2);
  b.writeUInt32LE(fields.flags ?? 0, 8);
  return b;
}

export const dumpLinksRequest = (): Buffer => message(RTM_GETLINK, NLM_F_DUMP, Buffer.alloc(16));

export const dumpAddressesRequest = (): Buffer => message(RTM_GETADDR, NLM_F_DUMP, Buffer.alloc(8));

export const dumpRulesRequest = (family: NetlinkFamily): Buffer =>
  message(RTM_GETRULE, NLM_F_DUMP, rtmsg(afOf(family)));

/** Every route of every table of the family (`ip route show table all`). */
export const dumpRoutesRequest = (family: NetlinkFamily): Buffer =>
  message(RTM_GETROUTE, NLM_F_DUMP, rtmsg(afOf(family)));

/**
 * `ip route get fibmatch DST [from SRC] [iif IFINDEX] [mark M]`: the route the kernel's lookup
 * matches for such a packet, policy rules included.
 */
export function routeGetRequest(q: { dst: string; from?: string; iifIndex?: number; mark?: number }): Buffer {
  const dst = parseIp(q.dst);
  if (!dst) throw new Error(`route get: ${q.dst} is not an address`);
  const attrs: [number, Buffer][] = [[RTA.DST, Buffer.from(dst.bytes)]];
  let srcLen = 0;
  if (q.from !== undefined) {
    const src = parseIp(q.from);
    if (!src || src.family !== dst.family) throw new Error(`route get: ${q.from} is no source for ${q.dst}`);
    attrs.push([RTA.SRC, Buffer.from(src.bytes)]);
    srcLen = src.bytes.length * 8;
  }
  if (q.iifIndex !== undefined) attrs.push([RTA.IIF, u32(q.iifIndex)]);
  if (q.mark !== undefined) attrs.push([RTA.MARK, u32(q.mark)]);
  const fixed = rtmsg(dst.family === 4 ? AF_INET : AF_INET6, {
    dstLen: dst.bytes.length * 8,
    srcLen,
    flags: RTM_F_FIB_MATCH,
  });
  return message(RTM_GETROUTE, 0, fixed, attrs);
}

/** A reply message: its type and body (after the 16-byte header). */
interface Reply {
  type: number;
  body: Buffer;
}

/** An error the kernel answered (NLMSG_ERROR with a non-zero code): its errno, positive. */
export class NetlinkError extends Error {
  constructor(
    readonly errno: number,
    what: string,
  ) {
    super(`${what}: kernel answered errno ${errno}`);
    this.name = 'NetlinkError';
  }
}

/** The replies in a buffer, up to NLMSG_DONE; an NLMSG_ERROR with a code throws NetlinkError. */
export function replies(buffer: Buffer, what: string): Reply[] {
  const out: Reply[] = [];
  for (let at = 0; at + 16 <= buffer.length; ) {
    const len = buffer.readUInt32LE(at);
    const type = buffer.readUInt16LE(at + 4);
    if (len < 16 || at + len > buffer.length) throw new Error(`${what}: a reply is cut short`);
    const body = buffer.subarray(at + 16, at + len);
    at += (len + 3) & ~3;
    if (type === NLMSG_DONE) break;
    if (type === NLMSG_ERROR) {
      const code = body.readInt32LE(0);
      if (code === 0) continue;
      throw new NetlinkError(-code, what);
    }
    out.push({ type, body });
  }
  return out;
}

/** The attributes from `offset` of a body, by type (the last one wins; nested flag bits cleared). */
function attributes(body: Buffer, offset: number): Map<number, Buffer> {
  const attrs = new Map<number, Buffer>();
  for (let at = offset; at + 4 <= body.length; ) {
    const len = body.readUInt16LE(at);
    if (len < 4 || at + len > body.length) break;
    attrs.set(body.readUInt16LE(at + 2) & 0x3fff, body.subarray(at + 4, at + len));
    at += (len + 3) & ~3;
  }
  return attrs;
}

const text = (b: Buffer | undefined) =>
  b === undefined ? undefined : b.toString('latin1').replace(/\0.*$/s, '');
const ip = (b: Buffer | undefined) => (b === undefined ? undefined : formatIp(new Uint8Array(b)));
const hex = (n: number) => `0x${n.toString(16)}`;

/** The links of a RTM_GETLINK dump, without addresses (see withAddresses). */
export function decodeLinks(buffer: Buffer): NlLink[] {
  const links: NlLink[] = [];
  for (const r of replies(buffer, 'link dump')) {
    if (r.type !== RTM_NEWLINK) continue;
    const ifindex = r.body.readInt32LE(4);
    const flags = r.body.readUInt32LE(8);
    const a = attributes(r.body, 16);
    const link: NlLink = {
      ifindex,
      ifname: text(a.get(IFLA.IFNAME)) ?? '',
      mtu: a.get(IFLA.MTU)?.readUInt32LE(0) ?? 0,
      operstate: OPERSTATES[a.get(IFLA.OPERSTATE)?.readUInt8(0) ?? 0] ?? 'UNKNOWN',
      // As ip prints them: NO-CARRIER is an interface that is up but not running.
      flags: [
        ...(flags & IFF_UP ? ['UP'] : []),
        ...(flags & IFF_UP && !(flags & IFF_RUNNING) ? ['NO-CARRIER'] : []),
      ],
      addr_info: [],
    };
    const parent = a.get(IFLA.LINK)?.readUInt32LE(0);
    if (parent !== undefined && parent !== ifindex) link.link_index = parent;
    const netnsid = a.get(IFLA.LINK_NETNSID);
    if (netnsid !== undefined) link.link_netnsid = netnsid.readInt32LE(0);
    const mac = a.get(IFLA.ADDRESS);
    if (mac?.length === 6) link.address = [...mac].map((x) => x.toString(16).padStart(2, '0')).join(':');
    const info = a.get(IFLA.LINKINFO);
    const kind = info && text(attributes(info, 0).get(IFLA_INFO_KIND));
    if (kind !== undefined) link.linkinfo = { info_kind: kind };
    const alias = text(a.get(IFLA.IFALIAS));
    if (alias) link.ifalias = alias;
    links.push(link);
  }
  return links;
}

/** The links with the addresses of a RTM_GETADDR dump put on them (`ip addr show`). */
export function withAddresses(links: NlLink[], buffer: Buffer): NlLink[] {
  const byIndex = new Map(links.map((l) => [l.ifindex, l]));
  for (const r of replies(buffer, 'address dump')) {
    if (r.type !== RTM_NEWADDR) continue;
    const af = r.body.readUInt8(0);
    const prefixlen = r.body.readUInt8(1);
    const a = attributes(r.body, 8);
    const local = ip(a.get(IFA.LOCAL) ?? a.get(IFA.ADDRESS));
    const link = byIndex.get(r.body.readUInt32LE(4));
    if (!link || local === undefined || (af !== AF_INET && af !== AF_INET6)) continue;
    link.addr_info.push({ family: af === AF_INET ? 'inet' : 'inet6', local, prefixlen });
  }
  return links;
}

/** The rules of a RTM_GETRULE dump. */
export function decodeRules(buffer: Buffer): NlRule[] {
  const rules: NlRule[] = [];
  for (const r of replies(buffer, 'rule dump')) {
    if (r.type !== RTM_NEWRULE) continue;
    const a = attributes(r.body, 12);
    const rule: NlRule = { priority: a.get(FRA.PRIORITY)?.readUInt32LE(0) ?? 0 };
    const src = ip(a.get(FRA.SRC));
    if (src !== undefined) Object.assign(rule, { src, srclen: r.body.readUInt8(2) });
    const dst = ip(a.get(FRA.DST));
    if (dst !== undefined) Object.assign(rule, { dst, dstlen: r.body.readUInt8(1) });
    const iif = text(a.get(FRA.IIFNAME));
    if (iif !== undefined) rule.iif = iif;
    const mark = a.get(FRA.FWMARK)?.readUInt32LE(0);
    const mask = a.get(FRA.FWMASK)?.readUInt32LE(0);
    if (mark !== undefined || (mask !== undefined && mask !== 0xffff_ffff)) rule.fwmark = hex(mark ?? 0);
    if (mask !== undefined && mask !== 0xffff_ffff) rule.fwmask = hex(mask);
    const proto = a.get(FRA.IP_PROTO)?.readUInt8(0);
    if (proto !== undefined) rule.ipproto = String(proto);
    const sport = a.get(FRA.SPORT_RANGE);
    if (sport && sport.readUInt16LE(0) === sport.readUInt16LE(2)) rule.sport = sport.readUInt16LE(0);
    if (r.body.readUInt8(7) === FR_ACT_TO_TBL)
      rule.table = String(a.get(FRA.TABLE)?.readUInt32LE(0) ?? r.body.readUInt8(4));
    rules.push(rule);
  }
  return rules;
}

/** The routes of a RTM_GETROUTE dump or lookup; devices named through `names` (by ifindex). */
export function decodeRoutes(buffer: Buffer, names: ReadonlyMap<number, string>, what: string): NlRoute[] {
  const routes: NlRoute[] = [];
  for (const r of replies(buffer, what)) {
    if (r.type !== RTM_NEWROUTE) continue;
    const af = r.body.readUInt8(0);
    const dstLen = r.body.readUInt8(1);
    const typeNumber = r.body.readUInt8(7);
    const a = attributes(r.body, 12);
    const dst = ip(a.get(RTA.DST));
    const route: NlRoute = {
      type: ROUTE_TYPES[typeNumber] ?? ROUTE_TYPES_MORE[typeNumber - 7] ?? String(typeNumber),
      // A default route as ip names it; IPv6's keeps its family in the text.
      dst: dstLen === 0 || dst === undefined ? (af === AF_INET6 ? '::/0' : 'default') : `${dst}/${dstLen}`,
      table: String(a.get(RTA.TABLE)?.readUInt32LE(0) ?? r.body.readUInt8(4)),
      protocol: String(r.body.readUInt8(5)),
    };
    const gateway = ip(a.get(RTA.GATEWAY));
    if (gateway !== undefined) route.gateway = gateway;
    const oif = a.get(RTA.OIF)?.readUInt32LE(0);
    if (oif !== undefined) route.dev = names.get(oif) ?? `if${oif}`;
    const multipath = a.get(RTA.MULTIPATH);
    if (multipath) route.nexthops = nexthops(multipath, names);
    routes.push(route);
  }
  return routes;
}

/** RTA_MULTIPATH: rtnexthop {len u16, flags u8, hops u8, ifindex i32} each with its attributes. */
function nexthops(b: Buffer, names: ReadonlyMap<number, string>): { gateway?: string; dev?: string }[] {
  const out: { gateway?: string; dev?: string }[] = [];
  for (let at = 0; at + 8 <= b.length; ) {
    const len = b.readUInt16LE(at);
    if (len < 8 || at + len > b.length) break;
    const hop: { gateway?: string; dev?: string } = {};
    const index = b.readInt32LE(at + 4);
    if (index > 0) hop.dev = names.get(index) ?? `if${index}`;
    const gateway = ip(attributes(b.subarray(at, at + len), 8).get(RTA.GATEWAY));
    if (gateway !== undefined) hop.gateway = gateway;
    out.push(hop);
    at += (len + 3) & ~3;
  }
  return out;
}
