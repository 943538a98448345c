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
  /** On the ingress agent with a data plane (failover): whether its routes take the traffic. */
  health?: { carrying?: boolean; reason?: string | null } | null;
}

/** active: carries its routes; standby: stands aside after failover; inactive: an end left. */
export type ServiceState = 'active' | 'standby' | 'inactive';

export function serviceState(s: ServiceLike): ServiceState {
  if (s.is_active === false) return 'inactive';
  return s.health?.carrying === false ? 'standby' : 'active';
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
export function arrows(services: readonly ServiceLike[], max: number): { arrows: Arrow[]; hidden: number } {
  const byKey = new Map<string, Arrow>();
  for (const s of services) {
    const state = serviceState(s);
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
