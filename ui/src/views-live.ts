/** The views that watch: overview, topology, events, explain. */
import { useEffect, useState } from 'preact/hooks';
import { can, follow, get, withQuery } from './api.js';
import { ErrorBox, html, shortId, Table } from './ui.js';
import type { Peer, Service } from './views-config.js';

/** Reads `path` now and every `everyMs`, while the view is shown. */
function usePoll<T>(path: string | undefined, everyMs: number): { data: T | undefined; error: unknown } {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  useEffect(() => {
    if (!path) return;
    let live = true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const tick = async () => {
      try {
        const r = await get<T>(path);
        if (live) {
          setData(r);
          setError(undefined);
        }
      } catch (e) {
        if (live) setError(e);
      }
      if (live) timer = setTimeout(tick, everyMs);
    };
    tick();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [path, everyMs]);
  return { data, error };
}

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

/** Peers on a circle, services as arrows from ingress to exit; re-read every second. */
export function TopologyView() {
  const peers = usePoll<Peer[]>('/v1/peers', 1000);
  const services = usePoll<Service[]>(can('services.read') ? '/v1/services' : undefined, 2000);
  const list = peers.data ?? [];
  const size = 520;
  const r = list.length <= 1 ? 0 : size / 2 - 70;
  const at = new Map(
    list.map((p, i) => {
      const a = (2 * Math.PI * i) / Math.max(1, list.length) - Math.PI / 2;
      return [p.id, { x: size / 2 + r * Math.cos(a), y: size / 2 + r * Math.sin(a) }];
    }),
  );
  // A hundred peers stay apart: smaller nodes, and names only in their tooltips past 24.
  const nodeR = Math.max(5, Math.min(18, list.length > 1 ? (Math.PI * r) / list.length - 2 : 18));
  const labelled = list.length <= 24;
  const state = (p: Peer) =>
    p.is_active === false ? 'inactive' : p.reachable === false ? 'unreachable' : 'reachable';
  const arrows = (services.data ?? []).slice(0, 500);
  return html`<section aria-labelledby="topo-h">
    <h1 id="topo-h">Topology</h1>
    <${ErrorBox} error=${peers.error ?? services.error} />
    <svg class="topology" viewBox=${`0 0 ${size} ${size}`} role="img" aria-label="peers and services">
      <defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto-start-reverse">
        <path d="M 0 0 L 10 5 L 0 10 z" class="arrowhead" /></marker></defs>
      ${arrows.map((s, i) => {
        const a = at.get(s.source_peer_id);
        const b = at.get(s.target_peer_id);
        if (!a || !b || a === b) return null;
        const bend = 12 + (i % 5) * 8;
        const mx = (a.x + b.x) / 2 + ((b.y - a.y) / 200) * bend;
        const my = (a.y + b.y) / 2 - ((b.x - a.x) / 200) * bend;
        // Ends on the circles' edges, so the arrowhead shows outside the exit's node.
        const edge = (p: { x: number; y: number }) => {
          const len = Math.hypot(mx - p.x, my - p.y) || 1;
          return { x: p.x + ((mx - p.x) / len) * (nodeR + 2), y: p.y + ((my - p.y) / len) * (nodeR + 2) };
        };
        const [from, to] = [edge(a), edge(b)];
        return html`<path class=${`svc ${s.is_active === false ? 'inactive' : ''}`} d=${`M ${from.x} ${from.y} Q ${mx} ${my} ${to.x} ${to.y}`} marker-end="url(#arrow)"><title>service ${s.id}</title></path>`;
      })}
      ${list.map((p) => {
        const pos = at.get(p.id)!;
        return html`<g class=${`node ${state(p)}`}>
          <circle cx=${pos.x} cy=${pos.y} r=${nodeR}><title>${p.name || p.address}: ${state(p)}</title></circle>
          ${labelled ? html`<text x=${pos.x} y=${pos.y + nodeR + 16} text-anchor="middle">${p.name || p.address}</text>` : null}
        </g>`;
      })}
    </svg>
    <h2>Peers</h2>
    <ul class="peer-states">
      ${list.map(
        (p) => html`<li data-peer-id=${p.id} data-state=${state(p)}>
          <span class=${`state ${state(p)}`}>${state(p)}</span> ${p.name || p.address} <code>${shortId(p.id)}</code>
          ${p.is_local ? ' (this agent)' : p.last_seen_at ? ` · last seen ${new Date(p.last_seen_at).toLocaleTimeString()}` : ''}
        </li>`,
      )}
    </ul>
    <p class="legend">Solid arrow: active service, ingress → exit; dashed: inactive. Red node: unreachable.</p>
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

export function EventsView() {
  const [type, setType] = useState('');
  const [resource, setResource] = useState('');
  const [applied, setApplied] = useState({ type: '', resource: '' });
  const [events, setEvents] = useState<MeshEvent[]>([]);
  const [error, setError] = useState<unknown>(undefined);
  const [live, setLive] = useState(false);
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
    (async () => {
      // The newest seq, without reading the log: a filter that matches nothing answers with
      // `next` at the newest seq the agent has given (docs/events.md). Then the last 200 seqs,
      // then the stream from where that page ended: nothing between is lost.
      const head = await get<{ next: number }>(withQuery('/v1/events', { type: 'console.none', limit: '1' }));
      const since = String(Math.max(0, head.next - SHOWN_EVENTS));
      const page = await get<{ events: MeshEvent[]; next: number }>(
        withQuery('/v1/events', { ...query, since, limit: String(SHOWN_EVENTS) }),
      );
      const next = page.next;
      add(page.events);
      setLive(true);
      await follow(
        withQuery('/v1/events/stream', { ...query, since: String(next) }),
        (t, data) => {
          if (t !== 'resync') add([JSON.parse(data) as MeshEvent]);
        },
        abort.signal,
      );
    })()
      .catch((e) => {
        if (!abort.signal.aborted) setError(e);
      })
      .finally(() => setLive(false));
    return () => abort.abort();
  }, [applied]);
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
    <p role="status"><span class=${`state ${live ? 'reachable' : 'inactive'}`}>${live ? 'live' : 'not connected'}</span> ${events.length} event(s) shown, newest first</p>
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
