/**
 * What the console's topology view draws (docs/console.md), from the public API's answers: the
 * tunnels this agent keeps, read from the Prometheus text of GET /metrics, and the services
 * grouped into one arrow per ingress, exit and state, so that a thousand services stay a few
 * readable arrows. Pure: no DOM, no fetch, so the unit tier checks it and esbuild bundles it.
 */

export interface Sample {
  labels: Record<string, string>;
  value: number;
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

/** The samples of the named metrics in Prometheus text format 0.0.4; other lines are skipped. */
export function samples(text: string, names: readonly string[]): Map<string, Sample[]> {
  const out = new Map<string, Sample[]>(names.map((n) => [n, []]));
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue;
    const m = SAMPLE.exec(line);
    const list = m ? out.get(m[1] ?? '') : undefined;
    if (!m || !list) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(LABEL))
      labels[l[1] ?? ''] = (l[2] ?? '').replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
    const value = Number(m[3]);
    if (!Number.isNaN(value)) list.push({ labels, value });
  }
  return out;
}

export interface TunnelLink {
  peerId: string;
  transport: string;
  up: boolean;
  /** The round-trip time in ms: kcp's smoothed one where there is one, else the last PING's. */
  rttMs: number | null;
}

/**
 * The tunnels in a /metrics answer: `mesh_tunnel_up{peer_id,transport}` for each and its state,
 * `mesh_tunnel_rtt_seconds{peer_id,transport}` and `mesh_kcp_rtt_seconds{peer_id}` for the time.
 */
export function tunnelLinks(metricsText: string): TunnelLink[] {
  const m = samples(metricsText, ['mesh_tunnel_up', 'mesh_tunnel_rtt_seconds', 'mesh_kcp_rtt_seconds']);
  const key = (s: Sample) => `${s.labels.peer_id}\n${s.labels.transport}`;
  const rtt = new Map((m.get('mesh_tunnel_rtt_seconds') ?? []).map((s) => [key(s), s.value]));
  const kcp = new Map((m.get('mesh_kcp_rtt_seconds') ?? []).map((s) => [s.labels.peer_id, s.value]));
  return (m.get('mesh_tunnel_up') ?? [])
    .map((s) => {
      const seconds =
        (s.labels.transport === 'kcp' ? kcp.get(s.labels.peer_id) : undefined) ?? rtt.get(key(s));
      return {
        peerId: s.labels.peer_id ?? '',
        transport: s.labels.transport ?? '',
        up: s.value === 1,
        rttMs: seconds === undefined ? null : seconds * 1000,
      };
    })
    .sort((a, b) => a.peerId.localeCompare(b.peerId) || a.transport.localeCompare(b.transport));
}

/** A service as GET /v1/services answers it, the fields the graph needs. */
export interface ServiceLike {
  id: string;
  source_peer_id: string;
  target_peer_id: string;
  is_active?: boolean;
}

/**
 * Whether failover lets each service carry its routes, from `mesh_dataplane_service_carrying`
 * in a /metrics answer: its series exist on an ingress that runs a data plane, for the services
 * it is the ingress of, and nowhere else. The list GET /v1/services has no health: its body is
 * rendered once per store generation, and a switch changes no record.
 */
export function carryingServices(metricsText: string): Map<string, boolean> {
  const m = samples(metricsText, ['mesh_dataplane_service_carrying']);
  return new Map(
    (m.get('mesh_dataplane_service_carrying') ?? []).map((s) => [s.labels.service_id ?? '', s.value === 1]),
  );
}

/** active: carries its routes; standby: stands aside after failover; inactive: an end left. */
export type ServiceState = 'active' | 'standby' | 'inactive';

/** A service's state; `carrying` from carryingServices (empty where nothing is known). */
export function serviceState(s: ServiceLike, carrying: ReadonlyMap<string, boolean>): ServiceState {
  if (s.is_active === false) return 'inactive';
  return carrying.get(s.id) === false ? 'standby' : 'active';
}

export interface Arrow {
  from: string;
  to: string;
  state: ServiceState;
  /** The services it stands for (their ids, at most `ids` of them kept). */
  count: number;
  ids: string[];
}

/**
 * One arrow per (ingress, exit, state), the busiest first, at most `max`; `hidden` counts the
 * services of the arrows left out. The ids kept per arrow are bounded too (for its tooltip).
 */
export function arrows(
  services: readonly ServiceLike[],
  carrying: ReadonlyMap<string, boolean>,
  max: number,
): { arrows: Arrow[]; hidden: number } {
  const byKey = new Map<string, Arrow>();
  for (const s of services) {
    const state = serviceState(s, carrying);
    const key = `${s.source_peer_id}\n${s.target_peer_id}\n${state}`;
    let a = byKey.get(key);
    if (!a) {
      a = { from: s.source_peer_id, to: s.target_peer_id, state, count: 0, ids: [] };
      byKey.set(key, a);
    }
    a.count++;
    if (a.ids.length < 5) a.ids.push(s.id);
  }
  const all = [...byKey.values()].sort((a, b) => b.count - a.count);
  const shown = all.slice(0, max);
  return { arrows: shown, hidden: all.slice(max).reduce((n, a) => n + a.count, 0) };
}

export interface PeerPlacement {
  /** Centre of each peer's node, by the peers' order, in a square of side `size`. */
  at: { x: number; y: number }[];
  /** The nodes' radius: smaller as peers are added, so that a hundred stay apart. */
  nodeRadius: number;
  /** Names are drawn beside the nodes up to 24 peers; past that, only in their tooltips. */
  labelled: boolean;
}

/** The fewest pixels a node's radius shrinks to; below it a node is hard to point at. */
const MIN_NODE_RADIUS = 5;
/** The width of a node's outline, half of it outside the radius: two nodes need that much more. */
export const NODE_STROKE = 2;

/**
 * Peers on a circle in a `size` square, the first at the top, with room for labels around it
 * while there are labels, and for the nodes alone past that.
 */
export function placePeers(count: number, size: number): PeerPlacement {
  const labelled = count <= 24;
  const r = count <= 1 ? 0 : size / 2 - (labelled ? 70 : 24);
  const at = Array.from({ length: count }, (_, i) => {
    const a = (2 * Math.PI * i) / Math.max(1, count) - Math.PI / 2;
    return { x: size / 2 + r * Math.cos(a), y: size / 2 + r * Math.sin(a) };
  });
  // Half the arc between neighbours, less the outline and a 2 px gap.
  const arcRadius = (Math.PI * r) / count - NODE_STROKE / 2 - 2;
  const nodeRadius = Math.max(MIN_NODE_RADIUS, Math.min(18, count > 1 ? arcRadius : 18));
  return { at, nodeRadius, labelled };
}
