/**
 * How the agent marks the kernel state it owns, so that it removes only its own state (also a
 * crashed predecessor's) and never touches anyone else's (docs/decisions.md §6; nothing is left
 * behind after a crash). Everything here is a constant of the on-host contract: changing one
 * strands state created by an older version, so add new ranges rather than move these.
 *
 * One agent per network namespace: two agents in one namespace would own the same names.
 */

import { createHash } from 'node:crypto';

/**
 * Owned links: TUN devices `mesh-t<slot>`, MACVLANs `mesh-m<slot>`, and a pacer's veth pair
 * `mesh-p<slot>` (the end whose queue paces) and `mesh-q<slot>` (where the paced packets arrive).
 */
export const LINK_PREFIX = 'mesh-';
export const tunName = (slot: number): string => `${LINK_PREFIX}t${slot}`;
export const macvlanName = (slot: number): string => `${LINK_PREFIX}m${slot}`;
export const pacerName = (slot: number): string => `${LINK_PREFIX}p${slot}`;
/** The other end of a pacer's veth pair, named after the pacer. */
export const pacerPeerName = (pacer: string): string =>
  `${LINK_PREFIX}q${pacer.slice(LINK_PREFIX.length + 1)}`;
/** The pacer a peer end belongs to (pacerPeerName's inverse). */
export const pacerOfPeer = (peer: string): string => `${LINK_PREFIX}p${peer.slice(LINK_PREFIX.length + 1)}`;
const PACER = new RegExp(`^${LINK_PREFIX}p\\d+$`);
const PACER_PEER = new RegExp(`^${LINK_PREFIX}q\\d+$`);
export const isPacerName = (name: string): boolean => PACER.test(name);
export const isPacerPeerName = (name: string): boolean => PACER_PEER.test(name);

/**
 * A MACVLAN's hardware address: locally administered, unicast, and the same for a service every
 * time its link is made (a restart, a slot moved). With a new random one, a neighbour that still
 * holds the address's old entry sends to a MAC nobody has until that entry fails, which took up
 * to 10 s (Linux: STALE, then DELAY 5 s, then 3 unicast probes); an agent that restarts would
 * black-hole replies that long.
 */
export function macvlanMac(serviceId: string): string {
  const b = createHash('sha256').update(`mesh-agent macvlan ${serviceId}`).digest().subarray(0, 6);
  b[0] = (b[0]! & 0xfc) | 0x02;
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');
}

/** Slots number the services this agent carries: 1..MAX_SLOT (12 bits of the mark). */
export const MAX_SLOT = 4095;

/**
 * An exit's TUN holds one IPv4 link-local address of 169.254.240.0/20 (a /32, no prefix route),
 * never used to reach anything. Why: the kernel's reverse-path filter (rp_filter 1 or 2, which a
 * transparent exit sets and many distributions default to) drops every packet that arrives on
 * an interface without an IPv4 address and whose source is not routed back through that very
 * interface (fib_validate_source's `no_addr`): a client's packets in an exit's TUN, always.
 */
export const exitTunAddress = (slot: number): string => `169.254.${240 + (slot >> 8)}.${slot & 255}/32`;
/** The same for the end of a pacer where the paced clients' packets arrive (169.254.224.0/20). */
export const pacerPeerAddress = (slot: number): string => `169.254.${224 + (slot >> 8)}.${slot & 255}/32`;
/**
 * The gateway a pacer's routes name (169.254.208.0/20 in IPv4, nobody's address): the pacer does
 * no neighbour discovery, so it stands for its peer, and the kernel keeps one neighbour entry for
 * it instead of one per destination (which would fill the neighbour table, 1024 entries by
 * default, with a service's clients' destinations).
 */
export const pacerGateway = (slot: number, family: 4 | 6): string =>
  family === 4 ? `169.254.${208 + (slot >> 8)}.${slot & 255}` : 'fe80::1';

/**
 * Owned routing tables: tableOf(slot) routes into the service's TUN (ingress selection, exit
 * replies); exitTableOf(slot) leaves by the service's MACVLAN (exit with requires_interface);
 * INTERCEPT_TABLE delivers intercepted TCP to the agent; pacerTableOf(slot) sends a paced
 * service's clients' TCP through its pacer on the way there.
 */
export const TABLE_BASE = 52_000;
export const tableOf = (slot: number): number => TABLE_BASE + slot;
export const exitTableOf = (slot: number): number => TABLE_BASE + MAX_SLOT + 1 + slot;
/** The table TPROXY's marked packets look up: `local default dev lo`, delivered to the agent. */
export const INTERCEPT_TABLE = TABLE_BASE + 2 * (MAX_SLOT + 1);
export const pacerTableOf = (slot: number): number => INTERCEPT_TABLE + slot;
export const isOwnedTable = (table: number): boolean =>
  table > TABLE_BASE && table <= INTERCEPT_TABLE + MAX_SLOT;

/**
 * Owned policy-rule preferences, in the order they are evaluated:
 * - EXCLUDE: the agent's own traffic (to peer addresses, from its API port) and loopback look up
 *   main first, so even a catch-all route keeps the cluster up;
 * - INTERCEPT: TCP that nftables handed to the agent's TPROXY listener (marked) is delivered here,
 *   and so are replies to a transparent exit's sockets (addressed to a client, not to the host);
 * - PACE: a paced service's clients' TCP (marked PACE_MARK | slot on its way in) leaves through
 *   the service's pacer, and comes back in at its other end to be intercepted;
 * - TRANSPARENT: a transparent exit's sockets (source: the client's address) leave by their
 *   service's MACVLAN table; before REPLY, whose mark bits their mark also holds;
 * - REPLY: replies of connections that entered through an exit TUN go back into it (fwmark);
 * - FROM_TUN: packets coming out of one of the agent's TUNs are never selected again (no loops);
 *   at a MACVLAN exit they look up the service's table, which leaves by the MACVLAN;
 * - AGENT: the agent's own stream sockets (SO_MARK AGENT_MARK: replies to intercepted clients,
 *   connections an exit opens) look up main, after FROM_TUN so that a MACVLAN exit's sockets,
 *   bound to its address, still leave by the MACVLAN's table;
 * - ROUTES: one rule per route of a service this agent is the ingress of, in selection order.
 */
export const RULE_PREF = {
  EXCLUDE: 21_000,
  INTERCEPT: 21_050,
  PACE: 21_060,
  TRANSPARENT: 21_075,
  REPLY: 21_100,
  FROM_TUN: 21_200,
  AGENT: 21_300,
  ROUTES_FIRST: 22_000,
  LAST: 29_999,
} as const;
export const isOwnedPref = (pref: number): boolean => pref >= RULE_PREF.EXCLUDE && pref <= RULE_PREF.LAST;

/** Connection and packet marks: the slot in bits 16..27. */
export const MARK_SHIFT = 16;
export const MARK_MASK = 0x0fff_0000;
export const markOf = (slot: number): number => slot << MARK_SHIFT;
/** Packets TPROXY hands to the agent's listener (and locally originated TCP re-routed to it). */
export const INTERCEPT_MARK = 0x1000_0000;
/** The agent's own outbound stream sockets (SO_MARK): never selected, never intercepted. */
export const AGENT_MARK = 0x2000_0000;
/**
 * A transparent exit's sockets (bound to the client's address with IP_TRANSPARENT): SO_MARK
 * AGENT_MARK | TRANSPARENT_MARK | markOf(slot). The slot routes them out of the service's MACVLAN
 * (rule TRANSPARENT); the bit lets nftables tell their replies from anyone else's.
 */
export const TRANSPARENT_MARK = 0x4000_0000;
/**
 * A paced service's clients' TCP on its first way in (nftables sets PACE_MARK | markOf(slot)):
 * routed into the service's pacer (rule PACE). Cleared where it comes back in.
 */
export const PACE_MARK = 0x8000_0000;
export const paceMarkOf = (slot: number): number => (PACE_MARK | markOf(slot)) >>> 0;
export const transparentSocketMark = (slot: number): number =>
  (AGENT_MARK | TRANSPARENT_MARK | markOf(slot)) >>> 0;

/** The agent's nftables table (family inet: one ruleset for IPv4 and IPv6). */
export const NFT_TABLE = 'mesh_agent';
