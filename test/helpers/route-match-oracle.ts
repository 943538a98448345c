/**
 * The route matching of src/dataplane/plan.ts as it was before RouteMatcher (sort on every call,
 * CIDRs parsed and formatted back for each comparison) and the exit's old text test for special
 * destinations: the oracle the compiled forms are checked against (plan.test.ts) and the baseline
 * of bench/dataplane/route-match.ts. Test and bench only; no production module imports it.
 */
import { formatCidr, masked, parseCidrLoose } from '../../src/dataplane/kernel/canonical.js';
import { compareRoutes, type PlanRoute } from '../../src/dataplane/plan.js';

/** serviceOfConnection before compilation, verbatim. */
export function oldServiceOfConnection(
  routes: readonly PlanRoute[],
  src: string,
  dst: string,
): string | null {
  for (const r of [...routes].sort(compareRoutes)) {
    if (r.sourceCidr !== null && !oldContains(r.sourceCidr, src)) continue;
    if (r.destCidr !== null && !oldContains(r.destCidr, dst)) continue;
    return r.serviceId;
  }
  return null;
}

function oldContains(network: string, ip: string): boolean {
  const net = parseCidrLoose(network);
  const host = parseCidrLoose(ip);
  if (!net || !host || net.family !== host.family) return false;
  return formatCidr(masked({ ...host, prefix: net.prefix })) === formatCidr(masked(net));
}

/** DataPlane.routesAllow's refusal of a destination address text, before the byte check. */
export function oldIsSpecialText(dstAddr: string): boolean {
  const special = /^(127\.|0\.|2(2[4-9]|3\d)\.|255\.255\.255\.255$)|^(::1?|ff[0-9a-f]{2}:.*)$/i;
  return special.test(dstAddr) || dstAddr.toLowerCase().startsWith('::ffff:');
}
