/**
 * The rules a service and its routes must satisfy (API document, Services and Routes;
 * docs/decisions.md §5 and §6), as pure functions that throw the documented 400 errors.
 */
import { parseCidr } from './cidr.js';
import { ApiError, invalidRequest } from './errors.js';

export interface ServiceShape {
  sourcePeerId: string;
  targetPeerId: string;
  transportType: string;
  requiresInterface: boolean;
  desiredIpv4Cidr: string | null;
  desiredIpv6Cidr: string | null;
  fullyTransparent: boolean;
}

/** The fields of a service's create body that its shape is made of (API document, Services). */
export interface ServiceCreateFields {
  target_peer_id: string;
  source_peer_id?: string;
  transport_type?: string;
  requires_interface?: boolean;
  desired_ipv4_cidr?: string | null;
  desired_ipv6_cidr?: string | null;
  fully_transparent?: boolean;
}

/** A create body's service with the document's defaults filled in (the source: this agent). */
export function serviceShapeOf(input: ServiceCreateFields, localPeerId: string): ServiceShape {
  return {
    sourcePeerId: input.source_peer_id ?? localPeerId,
    targetPeerId: input.target_peer_id,
    transportType: input.transport_type ?? 'tcp',
    requiresInterface: input.requires_interface ?? false,
    desiredIpv4Cidr: input.desired_ipv4_cidr ?? null,
    desiredIpv6Cidr: input.desired_ipv6_cidr ?? null,
    fullyTransparent: input.fully_transparent ?? false,
  };
}

/**
 * A service is active while both of its peers are (docs/decisions.md §5): `is_active` in the
 * API, and whether the data plane carries it.
 */
export function isServiceActive(
  s: Pick<ServiceShape, 'sourcePeerId' | 'targetPeerId'>,
  activePeerIds: ReadonlySet<string>,
): boolean {
  return activePeerIds.has(s.sourcePeerId) && activePeerIds.has(s.targetPeerId);
}

/** Checks a whole service as it would be stored; returns the interface CIDRs in canonical form. */
export function checkService(s: ServiceShape): {
  desiredIpv4Cidr: string | null;
  desiredIpv6Cidr: string | null;
} {
  if (s.transportType !== 'tcp' && s.transportType !== 'kcp') {
    throw new ApiError(
      'INVALID_TRANSPORT',
      `transport_type must be tcp or kcp, not ${JSON.stringify(s.transportType)}`,
    );
  }
  if (s.sourcePeerId === s.targetPeerId) {
    throw invalidRequest('source_peer_id and target_peer_id must be different peers');
  }
  if (s.fullyTransparent && s.transportType !== 'tcp') {
    throw invalidRequest('a fully_transparent service needs transport_type tcp (transparent mode rule 3)');
  }
  if (s.fullyTransparent && !s.requiresInterface) {
    throw invalidRequest(
      'a fully_transparent service needs requires_interface true (transparent mode rule 3)',
    );
  }
  // An interface address on a service without an interface would silently do nothing.
  if (!s.requiresInterface && (s.desiredIpv4Cidr !== null || s.desiredIpv6Cidr !== null)) {
    throw invalidRequest('desired_ipv4_cidr and desired_ipv6_cidr need requires_interface true');
  }
  return {
    desiredIpv4Cidr: interfaceCidr(s.desiredIpv4Cidr, 4, 'desired_ipv4_cidr'),
    desiredIpv6Cidr: interfaceCidr(s.desiredIpv6Cidr, 6, 'desired_ipv6_cidr'),
  };
}

export function interfaceCidr(text: string | null, family: 4 | 6, field: string): string | null {
  if (text === null) return null;
  const cidr = parseCidr(text, false);
  if (!cidr || cidr.family !== family) {
    throw invalidRequest(
      `${field} must be an IPv${family} address with a prefix length, e.g. ${family === 4 ? '192.0.2.10/24' : '2001:db8::10/64'}`,
    );
  }
  return cidr.text;
}

export interface RouteShape {
  priority: number;
  sourceCidr: string | null;
  destCidr: string | null;
}

export const MAX_PRIORITY = 65535;

/** Checks one route; returns its CIDRs in canonical form. Throws INVALID_CIDR or INVALID_REQUEST. */
export function checkRoute(r: RouteShape, label = 'route'): RouteShape {
  if (!Number.isInteger(r.priority) || r.priority < 0 || r.priority > MAX_PRIORITY) {
    throw invalidRequest(`${label}: priority must be an integer from 0 to ${MAX_PRIORITY}`);
  }
  if (r.sourceCidr === null && r.destCidr === null) {
    throw invalidRequest(`${label}: give source_cidr, dest_cidr or both`);
  }
  const source = routeCidr(r.sourceCidr, `${label}: source_cidr`);
  const dest = routeCidr(r.destCidr, `${label}: dest_cidr`);
  if (source && dest && source.family !== dest.family) {
    throw new ApiError(
      'INVALID_CIDR',
      `${label}: source_cidr and dest_cidr must be of the same address family`,
    );
  }
  return { priority: r.priority, sourceCidr: source?.text ?? null, destCidr: dest?.text ?? null };
}

export function routeCidr(text: string | null, label: string) {
  if (text === null) return undefined;
  const cidr = parseCidr(text, true);
  if (!cidr) {
    const loose = parseCidr(text, false);
    throw new ApiError(
      'INVALID_CIDR',
      loose
        ? `${label} ${JSON.stringify(text)} has host bits set; the network is ${loose.text.replace(/\/.*/, '')}… (use the network address)`
        : `${label} ${JSON.stringify(text)} is not CIDR notation (address/prefix, IPv4 or IPv6)`,
    );
  }
  return cidr;
}
