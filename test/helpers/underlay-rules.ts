/**
 * The nftables tables the failover suite (test/dataplane/failover-suite.ts) and bench
 * (bench/failover/run.ts, faults.ts) put on an underlay link inside an agent's namespace: a cut (every packet the namespace sends or receives on the link dropped) and
 * random loss (`numgen random mod 100 < PCT`, each direction), with counters that give the real
 * drop rate. Each is a table of the caller's own (`inet <name>`), so adding and removing it never
 * touches the agent's tables. Only the link's own traffic is matched (input and output hooks):
 * the exits forward nothing over their underlay.
 */
import type { Topology } from './netns-topology.js';

/** Both directions of one link: packets seen and packets dropped by the loss rule. */
export interface LossCounters {
  in: { seen: number; dropped: number };
  out: { seen: number; dropped: number };
}

const chains = (table: string) => [
  `add table inet ${table}`,
  `add chain inet ${table} in { type filter hook input priority filter ; policy accept ; }`,
  `add chain inet ${table} out { type filter hook output priority filter ; policy accept ; }`,
];

/** One nft invocation: its commands are one transaction. */
const nft = (topo: Topology, ns: string, commands: string[]) => topo.run(ns, 'nft', [commands.join(' ; ')]);

/** Drops every packet in and out of `dev` in `ns` until tableDown. */
export async function cutUp(topo: Topology, ns: string, dev: string, table: string): Promise<void> {
  await nft(topo, ns, [
    ...chains(table),
    `add rule inet ${table} in iifname "${dev}" drop`,
    `add rule inet ${table} out oifname "${dev}" drop`,
  ]);
}

/** Drops every TCP packet to `port` arriving in `ns` (a probe's target blocked) until tableDown. */
export async function portBlockUp(topo: Topology, ns: string, port: number, table: string): Promise<void> {
  await nft(topo, ns, [...chains(table), `add rule inet ${table} in tcp dport ${port} drop`]);
}

/** Drops `pct` % of the packets in and out of `dev` in `ns` at random, counting them. */
export async function lossUp(
  topo: Topology,
  ns: string,
  dev: string,
  table: string,
  pct: number,
): Promise<void> {
  const rules = (chain: 'in' | 'out', match: string) => [
    `add rule inet ${table} ${chain} ${match} "${dev}" counter`,
    `add rule inet ${table} ${chain} ${match} "${dev}" numgen random mod 100 < ${pct} counter drop`,
  ];
  await nft(topo, ns, [...chains(table), ...rules('in', 'iifname'), ...rules('out', 'oifname')]);
}

/** The counters of a lossUp table: per chain, its first rule counts all, its second the drops. */
export async function lossCounters(topo: Topology, ns: string, table: string): Promise<LossCounters> {
  const out = JSON.parse(await topo.run(ns, 'nft', ['-j', 'list', 'table', 'inet', table])) as {
    nftables: { rule?: { chain: string; expr: { counter?: { packets: number } }[] } }[];
  };
  const packets = (chain: string) =>
    out.nftables
      .filter((o) => o.rule?.chain === chain)
      .map((o) => o.rule!.expr.find((e) => e.counter)?.counter?.packets ?? 0);
  const [inSeen = 0, inDropped = 0] = packets('in');
  const [outSeen = 0, outDropped = 0] = packets('out');
  return { in: { seen: inSeen, dropped: inDropped }, out: { seen: outSeen, dropped: outDropped } };
}

/** Removes a table of cutUp or lossUp; one already gone is fine. */
export async function tableDown(topo: Topology, ns: string, table: string): Promise<void> {
  await topo.run(ns, 'nft', ['delete', 'table', 'inet', table]).catch((err: Error) => {
    if (!/No such file or directory/.test(err.message)) throw err;
  });
}
