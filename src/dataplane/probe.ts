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

/** How long one probe may take: its interval, within 0.5 to 5 s. */
export const probeTimeoutMs = (p: HealthProbe) => Math.min(Math.max(p.intervalMs, 500), 5000);

/**
 * Runs one probe, from `from` when given (a MACVLAN's address). A TCP probe succeeds when the
 * connection is accepted; an ICMP probe when `ping` gets its echo (iputils ping: Node has no
 * raw sockets). Never throws.
 */
export function probeOnce(
  p: HealthProbe,
  from: string | undefined,
): Promise<{ ok: boolean; detail: string }> {
  const timeoutMs = probeTimeoutMs(p);
  if (p.kind === 'icmp') {
    const args = ['-n', '-q', '-c', '1', '-W', String(Math.ceil(timeoutMs / 1000))];
    if (from !== undefined) args.push('-I', from);
    args.push(p.address);
    return new Promise((resolve) =>
      execFile('ping', args, { timeout: timeoutMs + 1000 }, (err) =>
        resolve(err ? { ok: false, detail: `icmp ${p.target}: no echo` } : { ok: true, detail: '' }),
      ),
    );
  }
  return new Promise((resolve) => {
    const socket = net.connect({
      host: p.address,
      port: p.port,
      family: p.family,
      ...(from !== undefined ? { localAddress: from } : {}),
    });
    const done = (ok: boolean, detail: string) => {
      clearTimeout(timer);
      socket.destroy();
      resolve({ ok, detail });
    };
    const timer = setTimeout(
      () => done(false, `tcp ${p.target}: no answer within ${timeoutMs} ms`),
      timeoutMs,
    );
    socket.once('connect', () => done(true, ''));
    socket.once('error', (err: NodeJS.ErrnoException) =>
      done(false, `tcp ${p.target}: ${err.code ?? err.message}`),
    );
  });
}
