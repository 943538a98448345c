/**
 * Explain at this agent (GET and POST /v1/explain, and another agent's `explain` request over the
 * gossip channel): the request checked into a packet and an optional proposed change, the
 * configuration taken from the data plane's view of the store, ranked by src/dataplane/explain.ts,
 * with the running data plane's failover state where there is one. The kernel's view is added by
 * the caller (explainWithKernel). Everything a request gets wrong is a 400 (or the 404/409 a
 * real write of the proposal would get) and changes nothing: explain writes nothing.
 */
import { isIP } from 'node:net';
import type { DataPlaneView } from '../dataplane/dataplane.js';
import {
  canonicalAddress,
  type ExplainConfig,
  type ExplainPacket,
  type ExplainProtocol,
  type Explanation,
  type IngressRuntime,
  type KernelView,
  RouteExplainer,
  withKernel,
} from '../dataplane/explain.js';
import { applyProposal, type Proposal } from '../dataplane/explain-proposal.js';
import { ApiError, invalidRequest } from '../domain/errors.js';
import { parsePeerAddress } from '../domain/peer-address.js';

export interface ExplainRequest {
  packet: ExplainPacket;
  /** The ingress agent asked; null: this one. */
  peer: string | null;
  proposal: Proposal | null;
}

/** What explaining at this agent reads: the configuration, the peers, the data plane if any. */
export interface LocalExplainDeps {
  view(): DataPlaneView;
  /** Changes with every write to the configuration (Store.generation). */
  generation(): number;
  peers(): readonly { id: string; isActive: boolean }[];
  /** The running data plane's ingress state; null where none runs. */
  runtime(): IngressRuntime | null;
  /** The kernel's view of the packet (DataPlane.kernelView); null where no data plane runs. */
  kernelView(packet: ExplainPacket, expected: string | null): Promise<KernelView> | null;
}

const PROTOCOLS: readonly ExplainProtocol[] = ['tcp', 'udp', 'icmp'];

type Obj = Record<string, unknown>;

/**
 * The request, from a query string (GET), a JSON body (POST) or a peer's gossip request: checked
 * field by field here (a peer's request has passed no schema).
 */
export function explainRequest(input: unknown): ExplainRequest {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) {
    throw invalidRequest('the request must be an object');
  }
  const q = input as Obj;
  const address = (field: 'source' | 'destination') => {
    const text = q[field];
    if (typeof text !== 'string') throw invalidRequest(`${field} is required: an IP address`);
    const a = canonicalAddress(text);
    if (!a)
      throw invalidRequest(
        `${field} must be an IPv4 or IPv6 address, not ${JSON.stringify(text.slice(0, 60))}`,
      );
    return a;
  };
  const source = address('source');
  const destination = address('destination');
  if (source.family !== destination.family) {
    throw invalidRequest('source and destination must be of the same address family');
  }
  const protocol = q.protocol ?? null;
  if (protocol !== null && !PROTOCOLS.includes(protocol as ExplainProtocol)) {
    throw invalidRequest(
      `protocol must be tcp, udp or icmp, not ${JSON.stringify(String(protocol).slice(0, 20))}`,
    );
  }
  let port: number | null = null;
  if (q.port !== undefined && q.port !== null) {
    port = typeof q.port === 'string' && /^\d{1,5}$/.test(q.port) ? Number(q.port) : (q.port as number);
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw invalidRequest('port must be an integer from 1 to 65535');
    }
    if (protocol !== 'tcp' && protocol !== 'udp') throw invalidRequest('port needs protocol tcp or udp');
  }
  const peer = q.peer ?? null;
  if (peer !== null && (typeof peer !== 'string' || peer.length === 0 || peer.length > 256)) {
    throw invalidRequest('peer must be a peer id');
  }
  const proposal = q.with === undefined || q.with === null ? null : proposalOf(q.with);
  return {
    packet: {
      source: source.text,
      destination: destination.text,
      protocol: protocol as ExplainProtocol | null,
      port,
    },
    peer: peer as string | null,
    proposal,
  };
}

/** The request as the body of POST /v1/explain (what is sent to a peer, without `peer`). */
export function requestBody(r: ExplainRequest): Obj {
  return {
    source: r.packet.source,
    destination: r.packet.destination,
    ...(r.packet.protocol !== null ? { protocol: r.packet.protocol } : {}),
    ...(r.packet.port !== null ? { port: r.packet.port } : {}),
    ...(r.proposal ? { with: r.proposal } : {}),
  };
}

/** `with`: its shape checked here; its values are checked as a real write's (explain-proposal.ts). */
function proposalOf(value: unknown): Proposal {
  const object = (v: unknown, what: string): Obj => {
    if (typeof v !== 'object' || v === null || Array.isArray(v))
      throw invalidRequest(`${what} must be an object`);
    return v as Obj;
  };
  const optional = (o: Obj, key: string, type: 'string' | 'boolean' | 'integer' | 'cidr', what: string) => {
    const v = o[key];
    if (v === undefined) return;
    const ok =
      type === 'integer'
        ? Number.isInteger(v)
        : type === 'cidr'
          ? v === null || typeof v === 'string'
          : typeof v === type;
    if (!ok)
      throw invalidRequest(`${what}.${key} must be ${type === 'cidr' ? 'a CIDR or null' : `a ${type}`}`);
  };
  const w = object(value, 'with');
  const out: Proposal = {};
  if (w.service !== undefined) {
    const s = object(w.service, 'with.service');
    if (typeof s.target_peer_id !== 'string') throw invalidRequest('with.service.target_peer_id is required');
    for (const k of ['source_peer_id', 'transport_type']) optional(s, k, 'string', 'with.service');
    for (const k of ['requires_interface', 'fully_transparent']) optional(s, k, 'boolean', 'with.service');
    for (const k of ['desired_ipv4_cidr', 'desired_ipv6_cidr']) optional(s, k, 'cidr', 'with.service');
    optional(s, 'bandwidth_limit_mbps', 'integer', 'with.service');
    const mbps = s.bandwidth_limit_mbps as number | undefined;
    if (mbps !== undefined && (mbps < 0 || mbps > 1_000_000)) {
      throw invalidRequest('with.service.bandwidth_limit_mbps must be from 0 to 1000000');
    }
    out.service = s as unknown as Proposal['service'];
  }
  if (w.routes !== undefined) {
    if (!Array.isArray(w.routes) || w.routes.length > 1000)
      throw invalidRequest('with.routes must be an array of at most 1000 routes');
    out.routes = w.routes.map((r, i) => {
      const o = object(r, `with.routes[${i}]`);
      optional(o, 'service_id', 'string', `with.routes[${i}]`);
      for (const k of ['route_id', 'priority']) optional(o, k, 'integer', `with.routes[${i}]`);
      for (const k of ['source_cidr', 'dest_cidr']) optional(o, k, 'cidr', `with.routes[${i}]`);
      return o as NonNullable<Proposal['routes']>[number];
    });
  }
  if (w.remove_routes !== undefined) {
    if (!Array.isArray(w.remove_routes) || !w.remove_routes.every((id) => Number.isInteger(id))) {
      throw invalidRequest('with.remove_routes must be an array of route ids');
    }
    out.remove_routes = w.remove_routes as number[];
  }
  return out;
}

/**
 * Explains at this agent. The configuration's ranking is compiled once per store generation and
 * set of services standing aside, and kept while neither changes (a proposal gets its own).
 */
export class LocalExplainer {
  private cached: {
    generation: number;
    standby: string;
    config: ExplainConfig;
    explainer: RouteExplainer;
  } | null = null;

  constructor(private readonly deps: LocalExplainDeps) {}

  /**
   * The ranking, and where a data plane runs the kernel's view: not for a proposed change (the
   * kernel holds the configuration as it is). A kernel that cannot be asked is said, not fatal.
   */
  async explain(request: ExplainRequest, now = Date.now()): Promise<Explanation> {
    const e = this.rank(request, now);
    if (request.proposal) return e;
    let view: Promise<KernelView> | null;
    try {
      view = this.deps.kernelView(request.packet, e.winner?.service_id ?? null);
      if (view === null) return e;
      return withKernel(e, await view);
    } catch (err) {
      return { ...e, kernel_difference: `the kernel could not be asked: ${(err as Error).message}` };
    }
  }

  private rank(request: ExplainRequest, now: number): Explanation {
    const runtime = this.deps.runtime();
    const standby = runtime?.standby ?? new Set<string>();
    if (request.proposal) {
      const config = applyProposal(this.config(), request.proposal, {
        peers: new Map(this.deps.peers().map((p) => [p.id, p])),
      });
      return new RouteExplainer(config, standby).explain(request.packet, runtime, now);
    }
    const key = [...standby].sort().join(' ');
    const generation = this.deps.generation();
    if (this.cached?.generation !== generation || this.cached.standby !== key) {
      const config = this.cached?.generation === generation ? this.cached.config : this.config();
      this.cached = { generation, standby: key, config, explainer: new RouteExplainer(config, standby) };
    }
    return this.cached.explainer.explain(request.packet, runtime, now);
  }

  private config(): ExplainConfig {
    const view = this.deps.view();
    return {
      localPeerId: view.localPeerId,
      services: view.services,
      routes: view.routes,
      // The exclusion rules name peers by address; names the data plane resolved come with its state.
      peerIps: view.peers
        .map((p) => parsePeerAddress(p.address)?.host)
        .filter((h): h is string => !!h && isIP(h) !== 0),
    };
  }
}

/**
 * A peer's answer to an `explain` request (gossip.ts): the explanation, or the error the request
 * got there, in the API's shape, so that the asking agent answers with the same status.
 */
export async function answerPeer(
  explainHereFor: (request: ExplainRequest) => Promise<unknown>,
  body: unknown,
): Promise<unknown> {
  try {
    const request = explainRequest(body);
    return { explanation: await explainHereFor({ ...request, peer: null }) };
  } catch (err) {
    if (err instanceof ApiError) return { error: { code: err.code, error: err.message } };
    throw err;
  }
}

/** The explanation in a peer's reply, or its error as the API's (503 when it cannot be read). */
export function peerAnswer(peerId: string, reply: unknown): unknown {
  const r = (reply ?? {}) as { explanation?: unknown; error?: { code?: unknown; error?: unknown } };
  if (r.explanation !== undefined) return r.explanation;
  const code = r.error?.code;
  if (
    code === 'INVALID_REQUEST' ||
    code === 'INVALID_CIDR' ||
    code === 'NOT_FOUND' ||
    code === 'ALREADY_EXISTS' ||
    code === 'INVALID_TRANSPORT'
  ) {
    throw new ApiError(code, `peer ${peerId}: ${String(r.error?.error ?? '')}`);
  }
  throw new ApiError('UNAVAILABLE', `peer ${peerId} gave no explanation`);
}
