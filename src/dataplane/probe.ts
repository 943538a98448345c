/**
 * The exit's active probe of a service (`health_check`, src/domain/health-check.ts): a TCP
 * connect or an ICMP echo toward one address every `interval_ms`, from the address the
 * service's traffic leaves from. Its verdict travels to the ingress with the route check's
 * (status-frames.ts) and makes the service `probe_failed` there.
 *
 * ProbeVerdicts is the pure part: which probes are due, and the verdict from their results. A
 * check fails after `failures` failed probes in a row (one lost answer is never evidence) and
 * passes again at the first probe that succeeds: the ingress's hold-down keeps an exit whose
 * probe flaps from getting its traffic back. probeOnce is the I/O.
 */
import { execFile } from 'node:child_process';
import net from 'node:net';
import type { HealthProbe } from '../domain/health-check.js';

interface ProbeState {
  /** The probe's settings as text: a changed check starts over. */
  key: string;
  passing: boolean | null;
  failedInRow: number;
  nextAt: number;
  inFlight: boolean;
  /** The last failure, for people. */
  detail: string;
}

const keyOf = (p: HealthProbe) => `${p.kind} ${p.target} ${p.intervalMs} ${p.failures}`;

export class ProbeVerdicts {
  private readonly states = new Map<string, ProbeState>();

  /**
   * The probes to start at `now`, by service (each marked in flight until its result is
   * recorded). Forgets the services not in `probes`.
   */
  due(probes: ReadonlyMap<string, HealthProbe>, now: number): string[] {
    for (const id of this.states.keys()) if (!probes.has(id)) this.states.delete(id);
    const out: string[] = [];
    for (const [id, probe] of probes) {
      const key = keyOf(probe);
      let s = this.states.get(id);
      if (!s || s.key !== key) {
        s = { key, passing: null, failedInRow: 0, nextAt: now, inFlight: false, detail: '' };
        this.states.set(id, s);
      }
      if (s.inFlight || now < s.nextAt) continue;
      s.inFlight = true;
      s.nextAt = now + probe.intervalMs;
      out.push(id);
    }
    return out;
  }

  /** A probe's result. Returns whether the verdict changed. */
  record(serviceId: string, probe: HealthProbe, ok: boolean, detail: string): boolean {
    const s = this.states.get(serviceId);
    if (!s || s.key !== keyOf(probe)) return false;
    s.inFlight = false;
    const before = s.passing;
    if (ok) {
      s.failedInRow = 0;
      s.passing = true;
    } else {
      s.failedInRow++;
      s.detail = detail;
      if (s.failedInRow >= probe.failures) s.passing = false;
    }
    return s.passing !== before;
  }

  /** The verdict: null while the service has no probe or none has decided yet. */
  passing(serviceId: string): boolean | null {
    return this.states.get(serviceId)?.passing ?? null;
  }

  /** Why the probe fails (its last error), or ''. */
  detail(serviceId: string): string {
    const s = this.states.get(serviceId);
    return s?.passing === false ? s.detail : '';
  }

  get size(): number {
    return this.states.size;
  }
}

/**
 * How long one probe may take: its interval, within 0.2 to 5 s. A probe that waited longer than
 * its interval would stretch `failures` probes' worth of silence past what the operator set.
 */
export const probeTimeoutMs = (p: HealthProbe) => Math.min(Math.max(p.intervalMs, 200), 5000);

/** Opens a TCP connection (the native addon's, which can set SO_MARK), or rejects. */
export type ProbeConnect = (opts: {
  family: 4 | 6;
  address: string;
  port: number;
  localAddress?: string;
  mark?: number;
  timeoutMs: number;
}) => Promise<net.Socket>;

export interface ProbeFrom {
  /** The address to send from (a MACVLAN's), else the kernel's choice. */
  address?: string;
  /**
   * SO_MARK of the probe's packets: the agent's own, so that an exit which is also an ingress
   * does not capture its own probe into a tunnel (kernel/ownership.ts).
   */
  mark?: number;
  /** The connect that can mark; without it, Node's own (no mark). */
  connect?: ProbeConnect;
}

/**
 * Runs one probe. A TCP probe succeeds when the connection is accepted; an ICMP probe when
 * `ping` gets its echo (iputils ping: Node has no raw sockets). Never throws.
 */
export function probeOnce(p: HealthProbe, from: ProbeFrom = {}): Promise<{ ok: boolean; detail: string }> {
  const timeoutMs = probeTimeoutMs(p);
  if (p.kind === 'icmp') {
    // ping's -W takes seconds with decimals; its own deadline is the one that counts.
    const args = ['-n', '-q', '-c', '1', '-W', (timeoutMs / 1000).toFixed(3)];
    if (from.address !== undefined) args.push('-I', from.address);
    if (from.mark !== undefined) args.push('-m', String(from.mark));
    args.push(p.address);
    return new Promise((resolve) =>
      execFile('ping', args, { timeout: timeoutMs + 1000 }, (err) =>
        resolve(err ? { ok: false, detail: `icmp ${p.target}: no echo` } : { ok: true, detail: '' }),
      ),
    );
  }
  const connect = from.connect ?? plainConnect;
  const timedOut = `tcp ${p.target}: no answer within ${timeoutMs} ms`;
  return connect({
    family: p.family,
    address: p.address,
    port: p.port,
    ...(from.address !== undefined ? { localAddress: from.address } : {}),
    ...(from.mark !== undefined ? { mark: from.mark } : {}),
    timeoutMs,
  }).then(
    (socket) => {
      socket.destroy();
      return { ok: true, detail: '' };
    },
    (err: NodeJS.ErrnoException) => ({
      ok: false,
      detail: err.code === 'ETIMEDOUT' ? timedOut : `tcp ${p.target}: ${err.code ?? err.message}`,
    }),
  );
}

/** Node's connect, bounded by timeoutMs (ETIMEDOUT); it cannot mark. */
const plainConnect: ProbeConnect = (opts) =>
  new Promise((resolve, reject) => {
    const socket = net.connect({
      host: opts.address,
      port: opts.port,
      family: opts.family,
      ...(opts.localAddress !== undefined ? { localAddress: opts.localAddress } : {}),
    });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' }));
    }, opts.timeoutMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      resolve(socket);
    });
    socket.once('error', (err) => {
      clearTimeout(timer);
      socket.destroy();
      reject(err);
    });
  });
