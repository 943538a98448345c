/** The views that change the configuration: peers, services and routes, credentials. */

import { useEffect, useState } from 'preact/hooks';
import { carryingServices, serviceState } from '../../src/console/topology.js';
import { ApiFailure, call, get, getText, SCOPE_NAMES, SCOPE_PREFIX, withQuery } from './api.js';
import {
  Action,
  Confirm,
  ErrorBox,
  Field,
  fieldOf,
  html,
  Submit,
  shortId,
  Table,
  usePages,
  usePoll,
} from './ui.js';

export interface Peer {
  id: string;
  name: string;
  address: string;
  is_local: boolean;
  is_active?: boolean;
  reachable?: boolean;
  last_seen_at?: string | null;
  public_key: string;
  created_at: string;
}

export interface Service {
  id: string;
  source_peer_id: string;
  target_peer_id: string;
  transport_type: string;
  requires_interface: boolean;
  interface_ipv4_cidr: string | null;
  interface_ipv6_cidr: string | null;
  fully_transparent: boolean;
  bandwidth_limit_mbps: number;
  route_count?: number;
  is_active?: boolean;
  health_check?: { tcp?: string; icmp?: string; interval_ms: number; failures: number } | null;
  /**
   * In GET /v1/services/{id} only, at the ingress with a data plane (failover, docs/dataplane.md);
   * the list has none: carryingServices reads its state from /metrics.
   */
  health?: { state?: string; reason?: string | null; carrying?: boolean } | null;
  routes?: Route[];
}

export interface Route {
  id: number;
  priority: number;
  source_cidr: string | null;
  dest_cidr: string | null;
  active?: boolean;
  standby_reason?: string | null;
}

/** Loads a list, and loads it again on demand. */
function useList<T>(path: string): { items: T[] | undefined; error: unknown; reload: () => void } {
  const [items, setItems] = useState<T[] | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  const [n, setN] = useState(0);
  useEffect(() => {
    let live = true;
    get<T[]>(path)
      .then((r) => {
        if (live) {
          setItems(r);
          setError(undefined);
        }
      })
      .catch((e) => live && setError(e));
    return () => {
      live = false;
    };
  }, [path, n]);
  return { items, error, reload: () => setN((x) => x + 1) };
}

const peerName = (peers: Peer[] | undefined, id: string) => {
  const p = peers?.find((x) => x.id === id);
  return p ? p.name || p.address : shortId(id);
};

// ---------------------------------------------------------------------------- peers

function PeerRow(props: { peer: Peer; reload: () => void; setError: (e: unknown) => void }) {
  const { peer } = props;
  const [renaming, setRenaming] = useState(false);
  const [name, setName] = useState(peer.name);
  const rename = async (e: Event) => {
    e.preventDefault();
    try {
      await call('PUT', `/v1/peers/${encodeURIComponent(peer.id)}`, { name });
      setRenaming(false);
      props.reload();
    } catch (err) {
      props.setError(err);
    }
  };
  const state =
    peer.is_active === false ? 'inactive' : peer.reachable === false ? 'unreachable' : 'reachable';
  return html`<tr data-peer-id=${peer.id}>
    <td>
      ${
        renaming
          ? html`<form class="inline" onSubmit=${rename}>
              <label class="sr-only" for=${`rename-${peer.id}`}>New name</label>
              <input id=${`rename-${peer.id}`} value=${name} onInput=${(e: Event) => setName((e.target as HTMLInputElement).value)} />
              <button type="submit" class="primary">Save</button>
              <button type="button" onClick=${() => setRenaming(false)}>Cancel</button>
            </form>`
          : html`${peer.name || html`<em>unnamed</em>`} ${peer.is_local ? html`<span class="tag">this agent</span>` : null}`
      }
    </td>
    <td><code title=${peer.id}>${shortId(peer.id)}</code></td>
    <td>${peer.address}</td>
    <td><span class=${`state ${state}`}>${state}</span></td>
    <td>${peer.last_seen_at ? new Date(peer.last_seen_at).toLocaleString() : peer.is_local ? 'now' : 'never'}</td>
    <td class="actions">
      ${renaming ? null : html`<${Action} need="peers.write" onClick=${() => setRenaming(true)}>Rename<//>`}
      ${
        peer.is_local
          ? html`<${Confirm}
              need="admin"
              label="Leave"
              testid="leave"
              explain="Leaving deactivates this agent in the whole cluster: every service it is a source or target of becomes inactive, and it cannot rejoin with this identity."
              onConfirm=${async () => {
                try {
                  await call('DELETE', '/v1/peers/self');
                  props.reload();
                } catch (err) {
                  props.setError(err);
                }
              }}
            />`
          : html`<${Confirm}
              need="peers.write"
              label="Remove"
              explain=${`Remove ${peer.name || peer.address} from the cluster?`}
              onConfirm=${async () => {
                try {
                  await call('DELETE', `/v1/peers/${encodeURIComponent(peer.id)}`);
                  props.reload();
                } catch (err) {
                  props.setError(err);
                }
              }}
            />`
      }
    </td>
  </tr>`;
}

export function PeersView() {
  const { items, error, reload } = useList<Peer>('/v1/peers');
  const [address, setAddress] = useState('');
  const [addError, setAddError] = useState<unknown>(undefined);
  const [rowError, setRowError] = useState<unknown>(undefined);
  const [busy, setBusy] = useState(false);
  const { shown, pager } = usePages(items ?? []);
  const add = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setAddError(undefined);
    try {
      await call('POST', '/v1/peers', { address });
      setAddress('');
      reload();
    } catch (err) {
      setAddError(err);
    } finally {
      setBusy(false);
    }
  };
  return html`<section aria-labelledby="peers-h">
    <h1 id="peers-h">Peers</h1>
    <form class="card" onSubmit=${add} aria-label="add a peer">
      <h2>Add a peer</h2>
      <${Field} label="Address (host:port of its API)" name="address" error=${addError} errorField=${addError ? 'address' : undefined}>
        <input id="f-address" required placeholder="10.0.0.2:8443" value=${address}
          onInput=${(e: Event) => setAddress((e.target as HTMLInputElement).value)} />
      <//>
      <${Submit} need="peers.write" busy=${busy}>${busy ? 'Adding…' : 'Add peer'}<//>
    </form>
    <${ErrorBox} error=${error ?? rowError} />
    ${
      items
        ? html`<${Table} label="peers">
            <thead><tr><th>Name</th><th>Id</th><th>Address</th><th>State</th><th>Last seen</th><th>Actions</th></tr></thead>
            <tbody>${shown.map((p) => html`<${PeerRow} key=${p.id} peer=${p} reload=${reload} setError=${setRowError} />`)}</tbody>
          <//>${pager}`
        : error
          ? null
          : html`<p>Loading…</p>`
    }
  </section>`;
}

// ---------------------------------------------------------------------------- services

interface ServiceDraft {
  target_peer_id: string;
  source_peer_id: string;
  transport_type: string;
  requires_interface: boolean;
  desired_ipv4_cidr: string;
  desired_ipv6_cidr: string;
  fully_transparent: boolean;
  bandwidth_limit_mbps: string;
  check_kind: string;
  check_target: string;
  check_interval_ms: string;
  check_failures: string;
}

const SERVICE_FIELDS = [
  'target_peer_id',
  'source_peer_id',
  'transport_type',
  'requires_interface',
  'desired_ipv4_cidr',
  'desired_ipv6_cidr',
  'fully_transparent',
  'bandwidth_limit_mbps',
  'health_check',
] as const;

function draftOf(s: Service | undefined, localId: string): ServiceDraft {
  const check = s?.health_check;
  return {
    target_peer_id: s?.target_peer_id ?? '',
    source_peer_id: s?.source_peer_id ?? localId,
    transport_type: s?.transport_type ?? 'tcp',
    requires_interface: s?.requires_interface ?? false,
    desired_ipv4_cidr: s?.interface_ipv4_cidr ?? '',
    desired_ipv6_cidr: s?.interface_ipv6_cidr ?? '',
    fully_transparent: s?.fully_transparent ?? false,
    bandwidth_limit_mbps: String(s?.bandwidth_limit_mbps ?? 0),
    check_kind: check ? (check.tcp ? 'tcp' : 'icmp') : 'none',
    check_target: check ? (check.tcp ?? check.icmp ?? '') : '',
    check_interval_ms: String(check?.interval_ms ?? 1000),
    check_failures: String(check?.failures ?? 3),
  };
}

/** The API body of a draft: every field for a create; for an edit, only what changed. */
function bodyOf(d: ServiceDraft, before: ServiceDraft | undefined): Record<string, unknown> {
  const healthCheck =
    d.check_kind === 'none'
      ? null
      : {
          [d.check_kind]: d.check_target,
          interval_ms: Number(d.check_interval_ms),
          failures: Number(d.check_failures),
        };
  const full: Record<string, unknown> = {
    target_peer_id: d.target_peer_id,
    source_peer_id: d.source_peer_id,
    transport_type: d.transport_type,
    requires_interface: d.requires_interface,
    desired_ipv4_cidr: d.desired_ipv4_cidr === '' ? null : d.desired_ipv4_cidr,
    desired_ipv6_cidr: d.desired_ipv6_cidr === '' ? null : d.desired_ipv6_cidr,
    fully_transparent: d.fully_transparent,
    bandwidth_limit_mbps: d.bandwidth_limit_mbps.trim() === '' ? 0 : Number(d.bandwidth_limit_mbps),
    health_check: healthCheck,
  };
  if (!before) {
    // Absent rather than null on create: the document's create body has no nulls.
    return Object.fromEntries(Object.entries(full).filter(([, v]) => v !== null));
  }
  const was = bodyOf(before, undefined);
  const changed: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(full)) {
    if (JSON.stringify(v) !== JSON.stringify(was[k] ?? null)) changed[k] = v;
  }
  return changed;
}

function ServiceForm(props: {
  peers: Peer[];
  service?: Service;
  onSaved: (id: string) => void;
  onCancel?: () => void;
}) {
  const local = props.peers.find((p) => p.is_local)?.id ?? '';
  const start = draftOf(props.service, local);
  const [d, setD] = useState<ServiceDraft>(start);
  const [error, setError] = useState<unknown>(undefined);
  const editing = props.service !== undefined;
  const set = (k: keyof ServiceDraft) => (e: Event) => {
    const t = e.target as HTMLInputElement;
    setD({ ...d, [k]: t.type === 'checkbox' ? t.checked : t.value });
  };
  const errorField = fieldOf(error, SERVICE_FIELDS, {
    INVALID_TRANSPORT: 'transport_type',
    NOT_FOUND: 'target_peer_id',
  });
  const submit = async (e: Event) => {
    e.preventDefault();
    setError(undefined);
    try {
      if (editing) {
        const body = bodyOf(d, start);
        if (Object.keys(body).length > 0)
          await call('PUT', `/v1/services/${encodeURIComponent(props.service!.id)}`, body);
        props.onSaved(props.service!.id);
      } else {
        const created = await call<Service>('POST', '/v1/services', bodyOf(d, undefined));
        props.onSaved(created.id);
      }
    } catch (err) {
      setError(err);
    }
  };
  const peerOptions = (selected: string) =>
    props.peers.map(
      (p) =>
        html`<option value=${p.id} selected=${p.id === selected}>${p.name || p.address} (${shortId(p.id)})</option>`,
    );
  // Fixed once made: the API takes these on PUT only with their current value.
  const fixed = editing;
  const field = (label: string, name: keyof ServiceDraft, input: unknown, hint?: string) =>
    html`<${Field} label=${label} name=${name === 'check_kind' ? 'health_check' : name} error=${error} errorField=${errorField} hint=${hint}>${input}<//>`;
  return html`<form class="card service-form" onSubmit=${submit} aria-label=${editing ? 'edit service' : 'create a service'}>
    <h2>${editing ? 'Edit service' : 'Create a service'}</h2>
    <div class="grid">
      ${field(
        'Target peer (exit)',
        'target_peer_id',
        html`<select id="f-target_peer_id" required disabled=${fixed} onChange=${set('target_peer_id')}>
          <option value="" selected=${d.target_peer_id === ''}>choose a peer</option>${peerOptions(d.target_peer_id)}
        </select>`,
      )}
      ${field(
        'Source peer (ingress)',
        'source_peer_id',
        html`<select id="f-source_peer_id" disabled=${fixed} onChange=${set('source_peer_id')}>${peerOptions(d.source_peer_id)}</select>`,
      )}
      ${field(
        'Transport',
        'transport_type',
        html`<select id="f-transport_type" disabled=${fixed} onChange=${set('transport_type')}>
          <option value="tcp" selected=${d.transport_type === 'tcp'}>tcp</option>
          <option value="kcp" selected=${d.transport_type === 'kcp'}>kcp</option>
        </select>`,
      )}
      ${field(
        'Bandwidth limit (Mbit/s, 0 = none)',
        'bandwidth_limit_mbps',
        html`<input id="f-bandwidth_limit_mbps" inputmode="numeric" value=${d.bandwidth_limit_mbps} onInput=${set('bandwidth_limit_mbps')} />`,
      )}
      <div class="field check">
        <input type="checkbox" id="f-requires_interface" checked=${d.requires_interface} onChange=${set('requires_interface')} />
        <label for="f-requires_interface">Interface at the exit (MACVLAN)</label>
        ${errorField === 'requires_interface' ? html`<span class="field-error" role="alert">${String((error as ApiFailure).message)}</span>` : null}
      </div>
      <div class="field check">
        <input type="checkbox" id="f-fully_transparent" disabled=${fixed} checked=${d.fully_transparent} onChange=${set('fully_transparent')} />
        <label for="f-fully_transparent">Fully transparent</label>
        ${errorField === 'fully_transparent' ? html`<span class="field-error" role="alert">${String((error as ApiFailure).message)}</span>` : null}
      </div>
      ${field(
        'Interface IPv4 (CIDR)',
        'desired_ipv4_cidr',
        html`<input id="f-desired_ipv4_cidr" placeholder="192.168.50.10/24" value=${d.desired_ipv4_cidr} onInput=${set('desired_ipv4_cidr')} />`,
      )}
      ${field(
        'Interface IPv6 (CIDR)',
        'desired_ipv6_cidr',
        html`<input id="f-desired_ipv6_cidr" placeholder="fd00::10/64" value=${d.desired_ipv6_cidr} onInput=${set('desired_ipv6_cidr')} />`,
      )}
      ${field(
        'Health check',
        'check_kind',
        html`<select id="f-health_check" onChange=${set('check_kind')}>
          <option value="none" selected=${d.check_kind === 'none'}>none</option>
          <option value="tcp" selected=${d.check_kind === 'tcp'}>TCP connect</option>
          <option value="icmp" selected=${d.check_kind === 'icmp'}>ICMP echo</option>
        </select>`,
      )}
      ${
        d.check_kind === 'none'
          ? null
          : html`
            <div class="field"><label for="f-check_target">${d.check_kind === 'tcp' ? 'Probe address:port' : 'Probe address'}</label>
              <input id="f-check_target" value=${d.check_target} onInput=${set('check_target')} /></div>
            <div class="field"><label for="f-check_interval_ms">Probe interval (ms)</label>
              <input id="f-check_interval_ms" inputmode="numeric" value=${d.check_interval_ms} onInput=${set('check_interval_ms')} /></div>
            <div class="field"><label for="f-check_failures">Failures before down</label>
              <input id="f-check_failures" inputmode="numeric" value=${d.check_failures} onInput=${set('check_failures')} /></div>`
      }
    </div>
    ${errorField ? null : html`<${ErrorBox} error=${error} />`}
    <div class="buttons">
      <${Submit} need="services.write">${editing ? 'Save changes' : 'Create service'}<//>
      ${props.onCancel ? html`<button type="button" onClick=${props.onCancel}>Close</button>` : null}
    </div>
  </form>`;
}

const ROUTE_FIELDS = ['priority', 'source_cidr', 'dest_cidr'] as const;

function RouteRow(props: { serviceId: string; route?: Route; onDone: () => void }) {
  const r = props.route;
  const start = {
    priority: String(r?.priority ?? 100),
    source_cidr: r?.source_cidr ?? '',
    dest_cidr: r?.dest_cidr ?? '',
  };
  const [d, setD] = useState(start);
  const [error, setError] = useState<unknown>(undefined);
  const errorField = fieldOf(error, ROUTE_FIELDS);
  const base = `/v1/services/${encodeURIComponent(props.serviceId)}/routes`;
  const key = r ? `r${r.id}` : 'new';
  const save = async (e: Event) => {
    e.preventDefault();
    setError(undefined);
    const body: Record<string, unknown> = {};
    const priority = Number(d.priority);
    const cidr = (v: string) => (v.trim() === '' ? null : v.trim());
    try {
      if (r) {
        if (d.priority !== start.priority) body.priority = priority;
        if (d.source_cidr !== start.source_cidr) body.source_cidr = cidr(d.source_cidr);
        if (d.dest_cidr !== start.dest_cidr) body.dest_cidr = cidr(d.dest_cidr);
        if (Object.keys(body).length > 0) await call('PUT', `${base}/${r.id}`, body);
      } else {
        const route: Record<string, unknown> = { priority };
        if (cidr(d.source_cidr)) route.source_cidr = cidr(d.source_cidr);
        if (cidr(d.dest_cidr)) route.dest_cidr = cidr(d.dest_cidr);
        await call('POST', base, { routes: [route] });
        setD({ priority: '100', source_cidr: '', dest_cidr: '' });
      }
      props.onDone();
    } catch (err) {
      setError(err);
    }
  };
  const input = (name: (typeof ROUTE_FIELDS)[number], label: string) => {
    const id = `${key}-${name}`;
    return html`<td class=${errorField === name ? 'invalid' : ''}>
      <label class="sr-only" for=${id}>${label}</label>
      <input id=${id} name=${name} form=${`form-${key}`} value=${d[name]}
        inputmode=${name === 'priority' ? 'numeric' : undefined}
        aria-invalid=${errorField === name ? 'true' : undefined}
        aria-describedby=${errorField === name ? `${id}-error` : undefined}
        onInput=${(e: Event) => setD({ ...d, [name]: (e.target as HTMLInputElement).value })} />
      ${errorField === name ? html`<span class="field-error" role="alert" id=${`${id}-error`}>${(error as ApiFailure).code}: ${(error as ApiFailure).message}</span>` : null}
    </td>`;
  };
  return html`<tr data-route-id=${r?.id ?? 'new'} class=${r?.active === false ? 'standby' : ''}>
    ${input('priority', 'Priority')}
    ${input('source_cidr', 'Source CIDR')}
    ${input('dest_cidr', 'Destination CIDR')}
    <td>${r ? (r.active === undefined ? '' : r.active ? 'active' : `standby${r.standby_reason ? ` (${r.standby_reason})` : ''}`) : ''}</td>
    <td class="actions">
      <form id=${`form-${key}`} onSubmit=${save} class="inline">
        <${Submit} need="services.write">${r ? 'Save' : 'Add route'}<//>
      </form>
      ${
        r
          ? html`<${Action} need="services.write" kind="danger" onClick=${async () => {
              try {
                await call('DELETE', `${base}/${r.id}`);
                props.onDone();
              } catch (err) {
                setError(err);
              }
            }}>Delete<//>`
          : null
      }
      ${error && !errorField ? html`<span class="field-error" role="alert">${(error as ApiFailure).code ?? ''}: ${(error as Error).message}</span>` : null}
    </td>
  </tr>`;
}

interface DataplaneCounters {
  state: string;
  bytes_sent: number;
  bytes_received: number;
  stream_bytes_up: number;
  stream_bytes_down: number;
}

const CHART_POINTS = 60;
const CHART_EVERY_MS = 2000;

/**
 * Throughput in each direction against the service's limit, from the data plane's byte counters
 * on GET /v1/services/{id} read every 2 s (packets and streams together), the last 2 minutes.
 */
function Throughput(props: { id: string; limitMbps: number }) {
  const [points, setPoints] = useState<{ out: number; in: number }[]>([]);
  const [state, setState] = useState<string | null | undefined>(undefined);
  useEffect(() => {
    let live = true;
    let last: { at: number; out: number; in: number } | undefined;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const tick = async () => {
      try {
        const s = await get<{ dataplane?: DataplaneCounters | null }>(
          `/v1/services/${encodeURIComponent(props.id)}`,
        );
        const d = s.dataplane;
        if (!live) return;
        setState(d ? d.state : null);
        if (d) {
          const now = {
            at: Date.now(),
            out: d.bytes_sent + d.stream_bytes_up,
            in: d.bytes_received + d.stream_bytes_down,
          };
          if (last) {
            const seconds = (now.at - last.at) / 1000;
            const mbps = (bytes: number) => Math.max(0, (bytes * 8) / 1e6 / seconds);
            const point = { out: mbps(now.out - last.out), in: mbps(now.in - last.in) };
            setPoints((p) => [...p, point].slice(-CHART_POINTS));
          }
          last = now;
        }
      } catch {
        // The detail view shows the service's own errors; the chart only pauses.
      }
      if (live) timer = setTimeout(tick, CHART_EVERY_MS);
    };
    tick();
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [props.id]);
  if (state === undefined) return null;
  if (state === null) {
    return html`<p class="muted" data-testid="throughput">Throughput: this agent runs no data plane for this service.</p>`;
  }
  const [w, hgt] = [300, 90];
  const top = Math.max(props.limitMbps, ...points.map((p) => Math.max(p.out, p.in)), 1);
  const y = (v: number) => hgt - (v / top) * (hgt - 4);
  const line = (pick: (p: { out: number; in: number }) => number) =>
    points.map((p, i) => `${(i / (CHART_POINTS - 1)) * w},${y(pick(p))}`).join(' ');
  const latest = points.at(-1);
  return html`<figure class="chart" data-testid="throughput">
    <svg viewBox=${`0 0 ${w} ${hgt}`} role="img" aria-label="throughput in each direction against the limit">
      ${props.limitMbps > 0 ? html`<line class="limit" x1="0" x2=${w} y1=${y(props.limitMbps)} y2=${y(props.limitMbps)} />` : null}
      <polyline class="out" points=${line((p) => p.out)} />
      <polyline class="in" points=${line((p) => p.in)} />
    </svg>
    <figcaption>Tunnel ${state}. Out ${latest ? latest.out.toFixed(2) : '–'} Mbit/s, in ${latest ? latest.in.toFixed(2) : '–'} Mbit/s${
      props.limitMbps > 0 ? `, limit ${props.limitMbps} Mbit/s (dashed)` : ', no limit'
    }; last 2 minutes.</figcaption>
  </figure>`;
}

function ServiceDetail(props: { id: string; peers: Peer[]; onClose: () => void; onChanged: () => void }) {
  const [service, setService] = useState<Service | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  const [n, setN] = useState(0);
  useEffect(() => {
    get<Service>(`/v1/services/${encodeURIComponent(props.id)}`)
      .then((s) => setService(s))
      .catch(setError);
  }, [props.id, n]);
  // The form is made again from what the agent answers, so the notice lives here, not in it.
  const [notice, setNotice] = useState('');
  const refresh = (said = '') => {
    setNotice(said);
    setN(n + 1);
    props.onChanged();
  };
  if (error) return html`<${ErrorBox} error=${error} />`;
  if (!service) return html`<p>Loading…</p>`;
  const routes = [...(service.routes ?? [])].sort((a, b) => a.priority - b.priority || a.id - b.id);
  return html`<div class="detail" data-service-id=${service.id}>
    <h2>Service <code>${service.id}</code></h2>
    <p>${peerName(props.peers, service.source_peer_id)} → ${peerName(props.peers, service.target_peer_id)} ·
      ${service.is_active === false ? 'inactive' : 'active'}
      ${service.health ? html` · health: <code>${JSON.stringify(service.health)}</code>` : null}</p>
    <${ServiceForm} key=${`${service.id}-${n}`} peers=${props.peers} service=${service} onSaved=${() => refresh('Saved')} onCancel=${props.onClose} />
    ${notice ? html`<p class="ok" role="status">${notice}</p>` : null}
    <${Throughput} id=${service.id} limitMbps=${service.bandwidth_limit_mbps} />
    <div class="card">
      <h3>Routes</h3>
      <${Table} label="routes">
        <thead><tr><th>Priority</th><th>Source CIDR</th><th>Destination CIDR</th><th>State</th><th>Actions</th></tr></thead>
        <tbody>
          ${routes.map((r) => html`<${RouteRow} key=${`${r.id}-${n}`} serviceId=${service.id} route=${r} onDone=${() => refresh()} />`)}
          <${RouteRow} key=${`new-${n}`} serviceId=${service.id} onDone=${() => refresh()} />
        </tbody>
      <//>
    </div>
  </div>`;
}

export function ServicesView() {
  const [filter, setFilter] = useState({ source_peer_id: '', target_peer_id: '', requires_interface: '' });
  const { items, error, reload } = useList<Service>(withQuery('/v1/services', filter));
  const peers = useList<Peer>('/v1/peers');
  // Which services failover set aside, as the topology reads it (src/console/topology.ts).
  const metrics = usePoll<string>('/metrics', 5000, getText);
  const carrying = metrics.data === undefined ? new Map<string, boolean>() : carryingServices(metrics.data);
  const [open, setOpen] = useState<string | undefined>(undefined);
  const [creating, setCreating] = useState(false);
  const { shown, pager } = usePages(items ?? []);
  const peerList = peers.items ?? [];
  const select = (k: keyof typeof filter, label: string) => html`<div class="field">
    <label for=${`filter-${k}`}>${label}</label>
    <select id=${`filter-${k}`} onChange=${(e: Event) => setFilter({ ...filter, [k]: (e.target as HTMLSelectElement).value })}>
      <option value="">any</option>
      ${peerList.map((p) => html`<option value=${p.id}>${p.name || p.address}</option>`)}
    </select></div>`;
  return html`<section aria-labelledby="services-h">
    <h1 id="services-h">Services and routes</h1>
    <div class="toolbar">
      <${Action} need="services.write" kind="primary" testid="new-service" onClick=${() => {
        setCreating(true);
        setOpen(undefined);
      }}>New service<//>
    </div>
    ${
      creating && peers.items
        ? html`<${ServiceForm} peers=${peerList} onCancel=${() => setCreating(false)} onSaved=${(
            id: string,
          ) => {
            setCreating(false);
            setOpen(id);
            reload();
          }} />`
        : null
    }
    ${open && peers.items ? html`<${ServiceDetail} key=${open} id=${open} peers=${peerList} onClose=${() => setOpen(undefined)} onChanged=${reload} />` : null}
    <form class="filters" aria-label="filter services" onSubmit=${(e: Event) => e.preventDefault()}>
      ${select('source_peer_id', 'Source peer')}
      ${select('target_peer_id', 'Target peer')}
      <div class="field"><label for="filter-requires_interface">Interface</label>
        <select id="filter-requires_interface" onChange=${(e: Event) => setFilter({ ...filter, requires_interface: (e.target as HTMLSelectElement).value })}>
          <option value="">any</option><option value="true">with interface</option><option value="false">without</option>
        </select></div>
    </form>
    <${ErrorBox} error=${error ?? peers.error ?? metrics.error} />
    ${
      items
        ? html`<${Table} label="services">
            <thead><tr><th>Id</th><th>From → to</th><th>Transport</th><th>Bandwidth</th><th>Routes</th><th>State</th><th></th></tr></thead>
            <tbody>${shown.map(
              (s) => html`<tr data-service-id=${s.id}>
                <td><code title=${s.id}>${shortId(s.id)}</code></td>
                <td>${peerName(peers.items, s.source_peer_id)} → ${peerName(peers.items, s.target_peer_id)}</td>
                <td>${s.transport_type}${s.fully_transparent ? ' · transparent' : ''}${s.requires_interface ? ' · interface' : ''}</td>
                <td>${s.bandwidth_limit_mbps ? `${s.bandwidth_limit_mbps} Mbit/s` : 'unlimited'}</td>
                <td>${s.route_count ?? ''}</td>
                <td><span class=${`state ${{ active: 'reachable', standby: 'unreachable', inactive: 'inactive' }[serviceState(s, carrying)]}`}>${serviceState(s, carrying)}</span></td>
                <td><button type="button" onClick=${() => {
                  setOpen(s.id);
                  setCreating(false);
                }}>Open<span class="sr-only"> service ${s.id}</span></button></td>
              </tr>`,
            )}</tbody>
          <//>${pager}${items.length === 0 ? html`<p>No services.</p>` : null}`
        : null
    }
  </section>`;
}

// ---------------------------------------------------------------------------- credentials

interface Credential {
  client_id: string;
  scopes: string[];
  created_at: string;
  last_used_at?: string | null;
  license_id?: string;
}

export function CredentialsView() {
  const { items, error, reload } = useList<Credential>('/v1/credentials');
  const [chosen, setChosen] = useState<string[]>([]);
  const [created, setCreated] = useState<(Credential & { client_secret: string }) | undefined>(undefined);
  const [createError, setCreateError] = useState<unknown>(undefined);
  const [rowError, setRowError] = useState<unknown>(undefined);
  const [copied, setCopied] = useState(false);
  const { shown, pager } = usePages(items ?? []);
  const create = async (e: Event) => {
    e.preventDefault();
    setCreateError(undefined);
    setCopied(false);
    try {
      setCreated(await call('POST', '/v1/credentials', { scopes: chosen.map((s) => SCOPE_PREFIX + s) }));
      setChosen([]);
      reload();
    } catch (err) {
      setCreateError(err);
    }
  };
  return html`<section aria-labelledby="cred-h">
    <h1 id="cred-h">Credentials</h1>
    <form class="card" onSubmit=${create} aria-label="create a credential">
      <h2>Create a credential</h2>
      <fieldset>
        <legend>Scopes (none chosen: admin)</legend>
        ${SCOPE_NAMES.map(
          (
            s,
          ) => html`<span class="check"><input type="checkbox" id=${`scope-${s}`} checked=${chosen.includes(s)}
            onChange=${(e: Event) => setChosen((e.target as HTMLInputElement).checked ? [...chosen, s] : chosen.filter((x) => x !== s))} />
            <label for=${`scope-${s}`}>${s}</label></span>`,
        )}
      </fieldset>
      <${ErrorBox} error=${createError} />
      <${Submit} need="credentials.write">Create credential<//>
    </form>
    ${
      created
        ? html`<div class="card secret" role="status" data-testid="new-secret">
            <h2>New credential</h2>
            <p><strong>Copy the secret now: it is shown only this once and cannot be read again.</strong></p>
            <p>Client id: <code data-testid="new-client-id">${created.client_id}</code></p>
            <p>Client secret: <code data-testid="new-client-secret">${created.client_secret}</code></p>
            <button type="button" onClick=${async () => {
              await navigator.clipboard?.writeText(created.client_secret).catch(() => undefined);
              setCopied(true);
            }}>${copied ? 'Copied' : 'Copy secret'}</button>
            <button type="button" onClick=${() => setCreated(undefined)}>I have stored it</button>
          </div>`
        : null
    }
    <${ErrorBox} error=${error ?? rowError} />
    ${
      items
        ? html`<${Table} label="credentials">
          <thead><tr><th>Client id</th><th>Scopes</th><th>Created</th><th>Last used</th><th></th></tr></thead>
          <tbody>${shown.map(
            (c) => html`<tr data-client-id=${c.client_id}>
              <td><code>${c.client_id}</code></td>
              <td>${c.scopes.map((s) => s.replace(SCOPE_PREFIX, '')).join(', ')}</td>
              <td>${new Date(c.created_at).toLocaleString()}</td>
              <td>${c.last_used_at ? new Date(c.last_used_at).toLocaleString() : 'never'}</td>
              <td class="actions"><${Confirm} need="credentials.write" label="Revoke"
                explain=${`Revoke ${c.client_id}? Its tokens stop working at once.`}
                onConfirm=${async () => {
                  try {
                    await call('DELETE', `/v1/credentials/${encodeURIComponent(c.client_id)}`);
                    reload();
                  } catch (err) {
                    setRowError(err);
                  }
                }} /></td>
            </tr>`,
          )}</tbody>
        <//>${pager}`
        : null
    }
  </section>`;
}

export { useList };
export const isFailure = (e: unknown): e is ApiFailure => e instanceof ApiFailure;
