/** The views that watch: overview, topology, events, explain. */
import { useEffect, useState } from 'preact/hooks';
import {
  arrows,
  carryingServices,
  NODE_STROKE,
  placePeers,
  serviceState,
  type TunnelLink,
  tunnelLinks,
} from '../../src/console/topology.js';
import { ApiFailure, can, follow, get, getText, withQuery } from './api.js';
import { ErrorBox, html, shortId, Table, usePoll } from './ui.js';
import type { Peer, Service } from './views-config.js';

function Pairs(props: { value: Record<string, unknown> }) {
  return html`<dl class="pairs">${Object.entries(props.value).map(
    ([k, v]) =>
      html`<dt>${k}</dt><dd>${typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v)}</dd>`,
  )}</dl>`;
}

export function OverviewView() {
  const identity = usePoll<Record<string, unknown>>('/v1/cluster/identity', 10_000);
  const license = usePoll<Record<string, unknown>>(can('admin') ? '/v1/cluster/license' : undefined, 10_000);
  const peers = usePoll<Peer[]>(can('peers.read') ? '/v1/peers' : undefined, 5000);
  const services = usePoll<Service[]>(can('services.read') ? '/v1/services' : undefined, 5000);
  const [ready, setReady] = useState<
    { status: string; reasons?: string[]; warnings?: string[] } | undefined
  >();
  useEffect(() => {
    fetch('/readyz', { credentials: 'omit' })
      .then((r) => r.json())
      .then(setReady)
      .catch(() => setReady({ status: 'unreachable' }));
  }, []);
  const unreachable = peers.data?.filter((p) => p.reachable === false).length ?? 0;
  return html`<section aria-labelledby="overview-h">
    <h1 id="overview-h">Overview</h1>
    <div class="cards">
      <div class="card"><h2>Counts</h2>
        <p class="big">${peers.data ? peers.data.length : '–'} <small>peers</small></p>
        <p class="big">${services.data ? services.data.length : '–'} <small>services</small></p>
        ${unreachable > 0 ? html`<p class="warn">${unreachable} peer(s) unreachable</p>` : null}
        ${can('peers.read') ? null : html`<p class="need">peer counts need peers.read</p>`}
      </div>
      <div class="card"><h2>Readiness</h2>
        <p><span class=${`state ${ready?.status === 'ok' ? 'reachable' : 'unreachable'}`}>${ready?.status ?? '…'}</span></p>
        ${[...(ready?.reasons ?? []), ...(ready?.warnings ?? [])].map((w) => html`<p class="warn">${w}</p>`)}
      </div>
      <div class="card"><h2>This agent</h2>${identity.data ? html`<${Pairs} value=${identity.data} />` : html`<${ErrorBox} error=${identity.error} />`}</div>
      <div class="card"><h2>License</h2>
        ${can('admin') ? (license.data ? html`<${Pairs} value=${license.data} />` : html`<${ErrorBox} error=${license.error} />`) : html`<p class="need">needs admin</p>`}
      </div>
    </div>
  </section>`;
}

/** The most arrows drawn; the rest are counted under the graph. */
const MAX_ARROWS = 100;

/**
 * Peers on a circle; this agent's tunnels as lines to its peers (transport, up or down, round-trip
 * time, from /metrics); services as one arrow per ingress, exit and state (active, standby after
 * failover, inactive), thicker with more services. Peers re-read every second, the rest every 2 s.
 */
export function TopologyView() {
  const peers = usePoll<Peer[]>('/v1/peers', 1000);
  const services = usePoll<Service[]>(can('services.read') ? '/v1/services' : undefined, 2000);
  const metrics = usePoll<string>('/metrics', 2000, getText);
  const list = peers.data ?? [];
  const size = 520;
  // A hundred peers stay apart: smaller nodes, and names only in their tooltips past 24.
  const placement = placePeers(list.length, size);
  const at = new Map(list.map((p, i) => [p.id, placement.at[i]!]));
  const nodeR = placement.nodeRadius;
  const labelled = placement.labelled;
  const state = (p: Peer) =>
    p.is_active === false ? 'inactive' : p.reachable === false ? 'unreachable' : 'reachable';
  const name = (id: string) => {
    const p = list.find((q) => q.id === id);
    return p ? p.name || p.address : shortId(id);
  };
  const self = list.find((p) => p.is_local);
  const tunnels = metrics.data === undefined ? [] : tunnelLinks(metrics.data);
  const carrying = metrics.data === undefined ? new Map<string, boolean>() : carryingServices(metrics.data);
  const all = services.data ?? [];
  const drawn = arrows(all, carrying, MAX_ARROWS);
  const standby = all.filter((s) => serviceState(s, carrying) === 'standby').length;
  const rtt = (t: TunnelLink) =>
    t.rttMs === null ? 'no RTT yet' : `${t.rttMs < 10 ? t.rttMs.toFixed(1) : Math.round(t.rttMs)} ms`;
  const summary = `${list.length} peers · ${tunnels.filter((t) => t.up).length}/${tunnels.length} tunnels up · ${all.length} services as ${drawn.arrows.length} arrows`;
  return html`<section aria-labelledby="topo-h">
    <h1 id="topo-h">Topology</h1>
    <${ErrorBox} error=${peers.error ?? services.error ?? metrics.error} />
    <p class="summary" data-testid="topology-summary">${summary}${standby > 0 ? html` · <strong class="standby-text">${standby} standby</strong>` : null}${drawn.hidden > 0 ? ` · ${drawn.hidden} services of the least busy pairs not drawn (all are under Services)` : null}</p>
    <svg class="topology" viewBox=${`0 0 ${size} ${size}`} role="img" aria-label="peers, tunnels and services">
      <defs>${['active', 'standby', 'inactive'].map(
        (
          k,
        ) => html`<marker id=${`arrow-${k}`} viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto-start-reverse">
        <path d="M 0 0 L 10 5 L 0 10 z" class=${`arrowhead ${k}`} /></marker>`,
      )}</defs>
      ${tunnels.map((t, i) => {
        const a = self ? at.get(self.id) : undefined;
        const b = at.get(t.peerId);
        if (!a || !b || a === b) return null;
        // Two transports to one peer: two parallel lines, a few pixels apart.
        const len = Math.hypot(b.x - a.x, b.y - a.y) || 1;
        const off = (t.transport === 'kcp' ? 1 : -1) * 3;
        const [dx, dy] = [(-(b.y - a.y) / len) * off, ((b.x - a.x) / len) * off];
        const label = `${t.transport} ${t.up ? 'up' : 'down'}, ${rtt(t)}`;
        return html`<g class=${`tunnel ${t.up ? 'up' : 'down'}`} data-peer-id=${t.peerId} data-transport=${t.transport} key=${`t${i}`}>
          <line x1=${a.x + dx} y1=${a.y + dy} x2=${b.x + dx} y2=${b.y + dy}><title>tunnel to ${name(t.peerId)}: ${label}</title></line>
          ${labelled ? html`<text x=${(a.x + b.x) / 2 + dx * 4} y=${(a.y + b.y) / 2 + dy * 4} text-anchor="middle" class="tunnel-label">${label}</text>` : null}
        </g>`;
      })}
      ${drawn.arrows.map((s, i) => {
        const a = at.get(s.from);
        const b = at.get(s.to);
        if (!a || !b || a === b) return null;
        const bend = 14 + (i % 5) * 8 + (s.state === 'standby' ? 10 : 0);
        const mx = (a.x + b.x) / 2 + ((b.y - a.y) / 200) * bend;
        const my = (a.y + b.y) / 2 - ((b.x - a.x) / 200) * bend;
        // Ends on the circles' edges, so the arrowhead shows outside the exit's node.
        const edge = (p: { x: number; y: number }) => {
          const len = Math.hypot(mx - p.x, my - p.y) || 1;
          return { x: p.x + ((mx - p.x) / len) * (nodeR + 2), y: p.y + ((my - p.y) / len) * (nodeR + 2) };
        };
        const [from, to] = [edge(a), edge(b)];
        const what = `${s.count} ${s.state} service${s.count === 1 ? '' : 's'} ${name(s.from)} → ${name(s.to)}: ${s.ids.join(', ')}${s.count > s.ids.length ? ', …' : ''}`;
        return html`<path class=${`svc ${s.state}`} data-from=${s.from} data-to=${s.to} data-state=${s.state} data-count=${s.count} style=${`stroke-width:${Math.min(8, 2 + Math.log2(s.count))}`}
          d=${`M ${from.x} ${from.y} Q ${mx} ${my} ${to.x} ${to.y}`} marker-end=${`url(#arrow-${s.state})`}><title>${what}</title></path>
          ${s.count > 1 ? html`<text x=${mx} y=${my} text-anchor="middle" class="count">${s.count}</text>` : null}`;
      })}
      ${list.map((p) => {
        const pos = at.get(p.id)!;
        return html`<g class=${`node ${state(p)}`}>
          <circle cx=${pos.x} cy=${pos.y} r=${nodeR} stroke-width=${NODE_STROKE}><title>${p.name || p.address}: ${state(p)}</title></circle>
          ${labelled ? html`<text x=${pos.x} y=${pos.y + nodeR + 16} text-anchor="middle">${p.name || p.address}</text>` : null}
        </g>`;
      })}
    </svg>
    <ul class="legend" aria-label="legend">
      <li>Services, ingress → exit: <span class="key active">blue solid</span> active (carrying), <span class="key standby">orange dotted</span> standby (stands aside after failover), <span class="key inactive">grey dashed</span> inactive; a number counts an arrow's services.</li>
      <li>Tunnels of this agent: <span class="key up">green</span> up, <span class="key down">red dashed</span> down; transport and round-trip time beside each.</li>
      <li>Peers: green reachable, <span class="key down">red</span> unreachable, grey inactive.</li>
    </ul>
    <h2>Tunnels of this agent</h2>
    ${
      metrics.data !== undefined && tunnels.length === 0
        ? html`<p data-testid="no-tunnels">No tunnels: this agent keeps one only to the peers it shares a carried service with, and only when it runs a data plane.</p>`
        : html`<${Table} label="tunnels">
          <thead><tr><th>Peer</th><th>Transport</th><th>State</th><th>Round-trip</th></tr></thead>
          <tbody>${tunnels.map(
            (
              t,
            ) => html`<tr data-peer-id=${t.peerId} data-transport=${t.transport} data-state=${t.up ? 'up' : 'down'}>
              <td>${name(t.peerId)} <code>${shortId(t.peerId)}</code></td><td>${t.transport}</td>
              <td><span class=${`state ${t.up ? 'reachable' : 'unreachable'}`}>${t.up ? 'up' : 'down'}</span></td><td>${rtt(t)}</td></tr>`,
          )}</tbody><//>`
    }
    <h2>Peers</h2>
    <ul class="peer-states">
      ${list.map(
        (p) => html`<li data-peer-id=${p.id} data-state=${state(p)}>
          <span class=${`state ${state(p)}`}>${state(p)}</span> ${p.name || p.address} <code>${shortId(p.id)}</code>
          ${p.is_local ? ' (this agent)' : p.last_seen_at ? ` · last seen ${new Date(p.last_seen_at).toLocaleTimeString()}` : ''}
        </li>`,
      )}
    </ul>
  </section>`;
}

interface MeshEvent {
  seq: number;
  type: string;
  time: string;
  resource?: { kind: string; id: string };
  actor?: { client_id?: string; agent?: string };
}

/** The most events the view holds: the newest first. */
const SHOWN_EVENTS = 200;

/** The stream's state: live, or waiting to reconnect after it ended (the agent restarted). */
type Connection =
  | { state: 'connecting' | 'live' | 'closed' }
  | { state: 'reconnecting'; attempt: number; waitMs: number; after: number };

/** Waits `ms`, or less if `signal` aborts. */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener(
      'abort',
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
  });
}

/** The first wait before reconnecting, doubled at each failed attempt up to the longest. */
const RECONNECT_FIRST_MS = 500;
const RECONNECT_LONGEST_MS = 10_000;

export function EventsView() {
  const [type, setType] = useState('');
  const [resource, setResource] = useState('');
  const [applied, setApplied] = useState({ type: '', resource: '' });
  const [events, setEvents] = useState<MeshEvent[]>([]);
  const [error, setError] = useState<unknown>(undefined);
  const [connection, setConnection] = useState<Connection>({ state: 'connecting' });
  useEffect(() => {
    const abort = new AbortController();
    const query = { type: applied.type, resource: applied.resource };
    let seen: MeshEvent[] = [];
    const add = (e: MeshEvent[]) => {
      seen = [...e.reverse(), ...seen].slice(0, SHOWN_EVENTS);
      setEvents(seen);
    };
    setEvents([]);
    setError(undefined);
    setConnection({ state: 'connecting' });
    (async () => {
      // The newest seq, without reading the log: a filter that matches nothing answers with
      // `next` at the newest seq the agent has given (docs/events.md). Then the last 200 seqs,
      // then the stream from where that page ended: nothing between is lost.
      const head = await get<{ next: number }>(withQuery('/v1/events', { type: 'console.none', limit: '1' }));
      const page = await get<{ events: MeshEvent[]; next: number }>(
        withQuery('/v1/events', {
          ...query,
          since: String(Math.max(0, head.next - SHOWN_EVENTS)),
          limit: String(SHOWN_EVENTS),
        }),
      );
      let after = page.next;
      add(page.events);
      // A stream ends when the agent stops (docs/events.md, "Ends") and fails while it is down:
      // reconnect with a growing wait, after the last seq seen, so nothing is lost or shown twice.
      for (let attempt = 0; ; ) {
        try {
          await follow(
            withQuery('/v1/events/stream', { ...query, since: String(after) }),
            (t, data, id) => {
              if (t !== 'resync') add([JSON.parse(data) as MeshEvent]);
              if (id) after = Number(id);
            },
            abort.signal,
            () => {
              attempt = 0;
              setConnection({ state: 'live' });
            },
          );
        } catch (e) {
          // Refused for a reason a retry does not change (a 401 has ended the session already).
          if (e instanceof ApiFailure && e.status >= 400 && e.status < 500) throw e;
        }
        if (abort.signal.aborted) return;
        attempt++;
        const waitMs = Math.min(RECONNECT_LONGEST_MS, RECONNECT_FIRST_MS * 2 ** (attempt - 1));
        setConnection({ state: 'reconnecting', attempt, waitMs, after });
        await pause(waitMs, abort.signal);
        if (abort.signal.aborted) return;
      }
    })().catch((e) => {
      if (abort.signal.aborted) return;
      setError(e);
      setConnection({ state: 'closed' });
    });
    return () => abort.abort();
  }, [applied]);
  const status =
    connection.state === 'reconnecting'
      ? `reconnecting (attempt ${connection.attempt}, every ${connection.waitMs / 1000} s at most; resumes after seq ${connection.after})`
      : connection.state === 'live'
        ? 'live'
        : connection.state === 'connecting'
          ? 'connecting'
          : 'not connected';
  return html`<section aria-labelledby="events-h">
    <h1 id="events-h">Events</h1>
    <form class="filters" aria-label="filter events" onSubmit=${(e: Event) => {
      e.preventDefault();
      setApplied({ type, resource });
    }}>
      <div class="field"><label for="ev-type">Type (prefix)</label>
        <input id="ev-type" placeholder="service." value=${type} onInput=${(e: Event) => setType((e.target as HTMLInputElement).value)} /></div>
      <div class="field"><label for="ev-resource">Resource id</label>
        <input id="ev-resource" value=${resource} onInput=${(e: Event) => setResource((e.target as HTMLInputElement).value)} /></div>
      <button type="submit" class="primary">Apply</button>
    </form>
    <p role="status"><span data-testid="stream-state" data-state=${connection.state} class=${`state ${connection.state === 'live' ? 'reachable' : connection.state === 'reconnecting' ? 'unreachable' : 'inactive'}`}>${status}</span> ${events.length} event(s) shown, newest first</p>
    <${ErrorBox} error=${error} />
    <${Table} label="events">
      <thead><tr><th>Seq</th><th>Time</th><th>Type</th><th>Resource</th><th>Actor</th></tr></thead>
      <tbody>${events.map(
        (e) => html`<tr key=${e.seq} data-seq=${e.seq}>
          <td>${e.seq}</td><td>${new Date(e.time).toLocaleTimeString()}</td><td>${e.type}</td>
          <td>${e.resource ? `${e.resource.kind} ${e.resource.id}` : ''}</td>
          <td>${e.actor?.client_id ?? (e.actor?.agent ? shortId(e.actor.agent) : '')}</td>
        </tr>`,
      )}</tbody>
    <//>
  </section>`;
}

interface Ranked {
  service_id?: string;
  route_id?: number;
  outcome?: string;
  decided_by?: string;
  reason?: string;
  service?: { id?: string };
  route?: { id?: number; priority?: number; source_cidr?: string | null; dest_cidr?: string | null };
}

export function ExplainView() {
  const [q, setQ] = useState({ source: '', destination: '', protocol: '', port: '', peer: '' });
  const [answer, setAnswer] = useState<Record<string, unknown> | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  const ask = async (e: Event) => {
    e.preventDefault();
    setError(undefined);
    try {
      setAnswer(await get(withQuery('/v1/explain', q)));
    } catch (err) {
      setAnswer(undefined);
      setError(err);
    }
  };
  const input = (k: keyof typeof q, label: string, placeholder: string) => html`<div class="field">
    <label for=${`ex-${k}`}>${label}</label>
    <input id=${`ex-${k}`} placeholder=${placeholder} value=${q[k]} onInput=${(e: Event) => setQ({ ...q, [k]: (e.target as HTMLInputElement).value })} />
  </div>`;
  const ranking = (answer?.ranking as Ranked[] | undefined) ?? [];
  return html`<section aria-labelledby="explain-h">
    <h1 id="explain-h">Explain</h1>
    <p>Which route of which service takes a packet at an ingress agent, and why.</p>
    <form class="card filters" onSubmit=${ask} aria-label="explain a packet">
      ${input('source', 'Source address', '10.0.0.5')}
      ${input('destination', 'Destination address', '192.168.1.10')}
      <div class="field"><label for="ex-protocol">Protocol</label>
        <select id="ex-protocol" onChange=${(e: Event) => setQ({ ...q, protocol: (e.target as HTMLSelectElement).value })}>
          <option value="">any</option><option value="tcp">tcp</option><option value="udp">udp</option><option value="icmp">icmp</option>
        </select></div>
      ${input('port', 'Port', '443')}
      ${input('peer', 'Ingress peer id (empty: this agent)', '')}
      <button type="submit" class="primary">Explain</button>
    </form>
    <${ErrorBox} error=${error} />
    ${
      answer
        ? html`<div class="card" data-testid="explain-answer">
            <h2>Answer</h2>
            ${answer.winner ? html`<p>Winner: <code>${JSON.stringify(answer.winner)}</code></p>` : html`<p>No route takes this packet.</p>`}
            ${
              ranking.length > 0
                ? html`<${Table} label="ranking"><thead><tr><th>#</th><th>Service</th><th>Route</th><th>Outcome</th><th>Decided by</th><th>Reason</th></tr></thead>
                  <tbody>${ranking.map(
                    (
                      r,
                      i,
                    ) => html`<tr><td>${i + 1}</td><td>${r.service_id ?? r.service?.id ?? ''}</td><td>${r.route_id ?? r.route?.id ?? ''}</td>
                      <td>${r.outcome}</td><td>${r.decided_by ?? ''}</td><td>${r.reason ?? ''}</td></tr>`,
                  )}</tbody><//>`
                : null
            }
            <details><summary>Whole answer</summary><pre>${JSON.stringify(answer, null, 2)}</pre></details>
          </div>`
        : null
    }
  </section>`;
}
