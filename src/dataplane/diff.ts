/**
 * The changes that turn the observed kernel state into the desired one (pure). Both sides are
 * compared in one canonical form (kernel/canonical.ts: the form observe() reports), so a state read back
 * from the kernel matches the state that produced it. Removals come first, innermost first
 * (rules, routes, addresses, links), then additions outermost first; the nftables table is
 * replaced whole when its listing differs from the one recorded after the last apply.
 *
 * Policy rules are the exception: a rule that goes is deleted after the rules that come are
 * added, so that a packet never meets a moment with neither (failover re-ranks a service's
 * rules while traffic flows; in between, its packets would fall through to the main table and
 * new connections fail). Only a rule the kernel would take for a duplicate of one being added
 * is deleted first, since the addition would fail beside it.
 */
import { canonicalAddress, canonicalLink, canonicalRoute, canonicalRule } from './kernel/canonical.js';
import type { AddressSpec, KernelChange, KernelState, LinkSpec, RouteSpec, RuleSpec } from './kernel/port.js';

/**
 * Keys of rules already seen: the wanted state's rules are the same objects from one reconcile
 * (and one explain) to the next. Rules are never changed once made.
 */
const ruleKeys = new WeakMap<RuleSpec, string>();

export function ruleKey(r: RuleSpec): string {
  let key = ruleKeys.get(r);
  if (key === undefined) {
    key = canonicalRuleKey(r);
    ruleKeys.set(r, key);
  }
  return key;
}

function canonicalRuleKey(r: RuleSpec): string {
  const c = canonicalRule(r);
  return JSON.stringify([
    c.family,
    c.pref,
    c.from ?? null,
    c.to ?? null,
    c.iif ?? null,
    c.fwmark ? [c.fwmark.value >>> 0, c.fwmark.mask >>> 0] : null,
    c.ipproto ?? null,
    c.sport ?? null,
    c.table,
  ]);
}

export function routeKey(r: RouteSpec): string {
  const c = canonicalRoute(r);
  return JSON.stringify([c.family, c.table, c.dst, c.dev, c.via ?? null, c.type ?? null]);
}

export function addressKey(a: AddressSpec): string {
  const c = canonicalAddress(a);
  return JSON.stringify([c.dev, c.cidr]);
}

export function linkKey(l: LinkSpec): string {
  const c = canonicalLink(l);
  return JSON.stringify([
    c.name,
    c.kind,
    c.parent ?? null,
    c.mac ?? null,
    c.mtu,
    c.rateBps ?? null,
    c.peerAddress ?? null,
  ]);
}

/**
 * The kernel refuses to add a rule beside an existing one (EEXIST) when everything but the
 * addresses is equal, and an address counts only where the new rule sets one (its rule_exists
 * and fib4/fib6_rule_compare). This is that everything: rules with different keys never collide.
 */
function duplicateKey(c: RuleSpec): string {
  return JSON.stringify([
    c.family,
    c.pref,
    String(c.table),
    c.iif ?? null,
    c.fwmark ? [c.fwmark.value >>> 0, c.fwmark.mask >>> 0] : null,
    c.ipproto ?? null,
    c.sport ?? null,
  ]);
}

/** With both rules canonical: an address counts only where the new rule sets one. */
function addressesCollide(rule: RuleSpec, existing: RuleSpec): boolean {
  return (
    (rule.from === undefined || rule.from === existing.from) &&
    (rule.to === undefined || rule.to === existing.to)
  );
}

/**
 * The rules of `toDelete` that one of `toAdd` would collide with (duplicateKey), in linear
 * time: a failover re-ranks a service's thousand rules at once, and comparing every pair held
 * the event loop for seconds.
 */
function rulesInTheWay(toDelete: readonly RuleSpec[], toAdd: readonly RuleSpec[]): Set<RuleSpec> {
  const adding = new Map<string, RuleSpec[]>();
  for (const rule of toAdd) {
    const c = canonicalRule(rule);
    const key = duplicateKey(c);
    const same = adding.get(key);
    if (same) same.push(c);
    else adding.set(key, [c]);
  }
  const inTheWay = new Set<RuleSpec>();
  for (const old of toDelete) {
    const c = canonicalRule(old);
    if (adding.get(duplicateKey(c))?.some((r) => addressesCollide(r, c))) inTheWay.add(old);
  }
  return inTheWay;
}

/** Stable: IPv4 first. Each family is one `ip -batch` run, not one per change of family. */
const byFamily = (rules: RuleSpec[]) => rules.sort((a, b) => a.family - b.family);

function missing<T>(from: readonly T[], other: readonly T[], key: (x: T) => string): T[] {
  const have = new Set(other.map(key));
  const seen = new Set<string>();
  return from.filter((x) => {
    const k = key(x);
    if (have.has(k) || seen.has(k)) return false;
    seen.add(k);
    return true;
  });
}

/**
 * @param nft `applied`: the listing nft printed right after the agent last replaced its table (the
 *   observed listing is compared with it, since nft prints a ruleset in its own words), and
 *   `appliedFrom`: the ruleset that produced it, to know whether the wanted one changed.
 */
export function diff(
  observed: KernelState,
  desired: KernelState,
  nft: { applied: string | null; appliedFrom: string | null },
): KernelChange[] {
  const changes: KernelChange[] = [];
  const rulesToAdd = byFamily(missing(desired.rules, observed.rules, ruleKey));
  const rulesToDelete = byFamily(missing(observed.rules, desired.rules, ruleKey));
  const inTheWay = rulesInTheWay(rulesToDelete, rulesToAdd);
  for (const rule of inTheWay) changes.push({ op: 'del', rule });
  for (const route of missing(observed.routes, desired.routes, routeKey)) changes.push({ op: 'del', route });
  for (const address of missing(observed.addresses, desired.addresses, addressKey)) {
    // An address on a link that goes away goes with it.
    if (!missing(observed.links, desired.links, linkKey).some((l) => l.name === address.dev)) {
      changes.push({ op: 'del', address });
    }
  }
  // A TUN is held by the agent's fd: a changed MTU is set again ('add' sets it), never re-created.
  const desiredTuns = new Set(desired.links.filter((l) => l.kind === 'tun').map((l) => l.name));
  const linksToDelete = missing(observed.links, desired.links, linkKey).filter(
    (l) => !(l.kind === 'tun' && desiredTuns.has(l.name)),
  );
  for (const link of linksToDelete) changes.push({ op: 'del', link });
  // A link deleted for a changed attribute (mtu, parent) is added again below, addresses too.
  const survivors = observed.links.filter((l) => !linksToDelete.includes(l));
  for (const link of missing(desired.links, survivors, linkKey)) changes.push({ op: 'add', link });
  const keptAddresses = observed.addresses.filter((a) => survivors.some((l) => l.name === a.dev));
  for (const address of missing(desired.addresses, keptAddresses, addressKey))
    changes.push({ op: 'add', address });
  // Routes through a re-created link vanished with it (routes through lo stay).
  const keptRoutes = observed.routes.filter((r) => !linksToDelete.some((l) => l.name === r.dev));
  for (const route of missing(desired.routes, keptRoutes, routeKey)) changes.push({ op: 'add', route });
  for (const rule of rulesToAdd) changes.push({ op: 'add', rule });
  for (const rule of rulesToDelete) if (!inTheWay.has(rule)) changes.push({ op: 'del', rule });
  const nftDrifted = observed.nft !== nft.applied;
  if (desired.nft !== nft.appliedFrom || nftDrifted) {
    if (desired.nft !== null || observed.nft !== null) changes.push({ op: 'nft', ruleset: desired.nft });
  }
  return changes;
}
