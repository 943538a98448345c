/**
 * The kernel port: every piece of kernel state the data plane reads or changes goes through this
 * interface (links, addresses, policy rules, routes, the agent's nftables table, sysctls, TUN
 * devices, a pacer's queue). linux.ts drives the real kernel with `ip -batch`, `tc -batch` and
 * `nft -f`; recording.ts is an in-memory twin that keeps a transcript of the same command lines
 * for unit tests. Only src/dataplane uses it.
 *
 * The port sees and touches only what the agent owns (ownership.ts says how it is marked):
 * links whose name starts with the agent's prefix, their addresses, rules in the agent's
 * preference range, routes in the agent's routing tables, and the agent's nftables table.
 */

export type Family = 4 | 6;

/**
 * A TUN device held open by this process (the native addon's device satisfies it): packets are
 * read in batches on the event loop and written in batches. It disappears when closed or when the
 * process dies, taking the routes through it along.
 */
export interface Tun {
  readonly name: string;
  onPackets(listener: (packets: Buffer[]) => void): void;
  /**
   * Sets the one listener for a failed read (the device deleted under its fd): reading has
   * stopped and the TUN is of no more use. Without a listener the error would be thrown.
   */
  onError(listener: (error: Error) => void): void;
  /** Writes the packets, one per write; returns how many the kernel took. */
  write(packets: readonly Buffer[]): number;
  pause(): void;
  resume(): void;
  close(): void;
}

/**
 * A link the agent owns. TUN devices are created by openTun (their fd), MACVLANs and pacers by
 * apply. A pacer is a veth pair, `name` and its peer (ownership.ts pacerPeerName), whose `name`
 * end holds a queue that sends at `rateBps`: packets routed out of it come back in at the peer,
 * paced (docs/dataplane.md, "Pacing a limited service's clients"). It is made, and goes, whole:
 * the pair, the peer's address and the queue.
 */
export interface LinkSpec {
  name: string;
  kind: 'tun' | 'macvlan' | 'pacer';
  /** MACVLAN only: the uplink it sits on. */
  parent?: string;
  /** MACVLAN only: its hardware address (ownership.ts macvlanMac), lower case. */
  mac?: string;
  mtu: number;
  /** Pacer only: the rate its queue sends at, bits per second. */
  rateBps?: number;
  /** Pacer only: the peer end's IPv4 address (ownership.ts pacerPeerAddress), with its prefix. */
  peerAddress?: string;
}

/** An address on an owned link; added without a prefix route (the agent routes in its own tables). */
export interface AddressSpec {
  dev: string;
  /** Address with its prefix length, e.g. 10.91.2.50/24 or fd00:91:2::50/64. */
  cidr: string;
}

/** A policy rule in the agent's preference range. */
export interface RuleSpec {
  family: Family;
  pref: number;
  from?: string;
  to?: string;
  iif?: string;
  /** Packet mark and mask, e.g. { value: 0x10000, mask: 0xfff0000 }. */
  fwmark?: { value: number; mask: number };
  ipproto?: 'tcp' | 'udp';
  sport?: number;
  /** Where matching packets are looked up: one of the agent's tables, or main (an exclusion). */
  table: number | 'main';
}

/** A route in one of the agent's tables. */
export interface RouteSpec {
  family: Family;
  table: number;
  /** 'default' or a CIDR. */
  dst: string;
  dev: string;
  via?: string;
  /**
   * 'local': deliver to this host whatever the destination (`local default dev lo`, the table
   * TPROXY's marked packets look up). Absent: an ordinary unicast route.
   */
  type?: 'local';
}

/** The part of the kernel the agent owns, as observed or as desired. */
export interface KernelState {
  links: LinkSpec[];
  addresses: AddressSpec[];
  rules: RuleSpec[];
  routes: RouteSpec[];
  /**
   * The agent's nftables table: the desired ruleset text (statements inside `table inet NAME { }`),
   * or, when observed, nft's own listing of the table; null when the table does not exist.
   */
  nft: string | null;
}

export type KernelChange =
  | { op: 'add' | 'del'; link: LinkSpec }
  | { op: 'add' | 'del'; address: AddressSpec }
  | { op: 'add' | 'del'; rule: RuleSpec }
  | { op: 'add' | 'del'; route: RouteSpec }
  /** Replaces the whole table atomically (one `nft -f` transaction); null deletes it. */
  | { op: 'nft'; ruleset: string | null };

/** The interface that carries the default route, and its gateways (MACVLAN parent default). */
export interface Uplink {
  dev: string;
  gateway4: string | null;
  gateway6: string | null;
}

export interface KernelPort {
  /** Reads the owned state. */
  observe(): Promise<KernelState>;
  /**
   * Applies changes in the given order (the caller orders them: links, addresses, routes, rules,
   * nft on the way up; the reverse on the way down). Throws a KernelError naming the failed
   * command; changes before it stay applied (the next reconcile repairs from observation).
   */
  apply(changes: readonly KernelChange[]): Promise<void>;
  /** Removes everything the agent owns, whoever created it (a crashed predecessor included). */
  flush(): Promise<void>;
  /** Creates (or re-attaches to nothing: names are unique) a TUN device held by this process. */
  openTun(name: string): Tun;
  readSysctl(key: string): Promise<string | null>;
  /**
   * Sets one sysctl. Only for the keys a service needs (a transparent exit's rp_filter, see
   * docs/transparent.md): never global sysctls behind the operator's back. Throws a
   * KernelError saying why it could not (read-only /proc/sys, no CAP_NET_ADMIN, no such key).
   */
  writeSysctl(key: string, value: string): Promise<void>;
  /** The default-route interface, for --macvlan-parent's default. */
  uplink(): Promise<Uplink | null>;
  /**
   * What the kernel does with packets to each `dst`, as one arriving on `iif` from `from` with
   * `mark` would be routed (`ip route get fibmatch`, the policy rules included): the route it
   * matches, the device it leaves by and whether that device can carry it now (up, with
   * carrier). Null where there is no route. One answer per query, in order, from one reading.
   */
  routeGet(queries: readonly RouteQuery[]): Promise<(RouteAnswer | null)[]>;
}

export interface RouteQuery {
  dst: string;
  from?: string;
  iif?: string;
  mark?: number;
}

export interface RouteAnswer {
  dev: string;
  gateway: string | null;
  /** The destination of the route the lookup matched, as a CIDR (a default route: 0.0.0.0/0, ::/0). */
  prefix: string;
  /** The device is up and has carrier (operstate UP, or UNKNOWN for devices without one). */
  usable: boolean;
  /** The device's operstate, as the kernel names it (UP, DOWN, LOWERLAYERDOWN, UNKNOWN, ...). */
  operstate: string;
  /** A `local` route: the destination is an address of this host. */
  local?: boolean;
}

/** A kernel command that failed: the command line and what the tool printed. */
export class KernelError extends Error {
  constructor(
    readonly command: string,
    readonly output: string,
  ) {
    super(`${command}: ${output.trim() || 'failed'}`);
    this.name = 'KernelError';
  }
}
