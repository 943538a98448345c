/**
 * The health of the services this agent is the ingress of, and whether each carries its routes'
 * traffic now (failover). Pure: evidence and the time come in, verdicts go out.
 *
 * A service is healthy when it is active, its tunnel answers keepalives, its exit says it can
 * forward toward the routes' destinations and its probe (if it has one) passes. Each piece of
 * evidence arrives already debounced by whoever produces it (missed keepalives in a row, failed
 * probes in a row): one lost packet is never evidence. The first failing check, in that order,
 * is the reason.
 *
 * A service carries traffic while healthy, except that after it was unhealthy it waits out a
 * hold-down first: an exit that flaps cannot make traffic flap. A service never seen unhealthy
 * carries as soon as it is healthy (an agent that starts does not wait). One whose tunnel has not
 * answered yet is `unknown` and stands aside, like an unhealthy one, but owes no hold-down.
 */

export type HealthReason = 'inactive' | 'tunnel_silent' | 'exit_no_route' | 'probe_failed';
export type HealthState = 'healthy' | 'unhealthy' | 'unknown';

/** Why a route of a service stands aside: its health's reason, or waiting out the hold-down. */
export type StandbyReason = HealthReason | 'unknown' | 'hold_down';

/** What is known about a service now. `null`: nothing heard yet (no evidence either way). */
export interface HealthEvidence {
  /** Neither of its peers has left. */
  active: boolean;
  /** Its tunnel answered a keepalive within the detection time; null: no tunnel up yet. */
  tunnelAnswering: boolean | null;
  /** The exit's word that it has a usable route toward every route's destination. */
  exitCanForward: boolean | null;
  /** The exit's probe; null: the service has none, or no verdict yet. */
  probePassing: boolean | null;
}

export interface ServiceHealth {
  state: HealthState;
  /** Set when unhealthy. */
  reason: HealthReason | null;
  /** When the state last changed (the caller's clock, ms). */
  since: number;
}

export interface HealthVerdict extends ServiceHealth {
  /** Its routes take their traffic now. */
  carrying: boolean;
  /** Why not, when not carrying. */
  standbyReason: StandbyReason | null;
  /** While waiting out the hold-down: when it ends. */
  holdDownUntil: number | null;
}

interface Tracked extends ServiceHealth {
  /** Healthy again after being unhealthy: it carries from this time on. */
  carriesFrom: number;
  /** Unhealthy since it last carried: the next healthy state starts a hold-down. */
  owesHoldDown: boolean;
  /** Whether it carried at the last observe(): a hold-down ending between two is a change. */
  reportedCarrying: boolean;
}

/** The state and reason the evidence says, before any hold-down. */
export function assess(e: HealthEvidence): { state: HealthState; reason: HealthReason | null } {
  if (!e.active) return { state: 'unhealthy', reason: 'inactive' };
  if (e.tunnelAnswering === false) return { state: 'unhealthy', reason: 'tunnel_silent' };
  if (e.exitCanForward === false) return { state: 'unhealthy', reason: 'exit_no_route' };
  if (e.probePassing === false) return { state: 'unhealthy', reason: 'probe_failed' };
  if (e.tunnelAnswering === null) return { state: 'unknown', reason: null };
  return { state: 'healthy', reason: null };
}

export class HealthTracker {
  private readonly services = new Map<string, Tracked>();

  /** @param holdDownMs how long a service healthy again waits before it carries (0: at once). */
  constructor(private readonly holdDownMs: number) {
    if (!Number.isFinite(holdDownMs) || holdDownMs < 0) throw new Error('holdDownMs must be >= 0');
  }

  /**
   * Takes a service's evidence at `now`. Returns what changed: `state` (its state or reason, the
   * thing to log once and count), `carrying` (whether it carries; the routes to redo).
   */
  observe(serviceId: string, evidence: HealthEvidence, now: number): { state: boolean; carrying: boolean } {
    const before = this.services.get(serviceId);
    const carriedBefore = before?.reportedCarrying ?? false;
    const stateBefore = before?.state;
    const reasonBefore = before?.reason;
    const { state, reason } = assess(evidence);
    let t: Tracked;
    if (!before) {
      t = {
        state,
        reason,
        since: now,
        carriesFrom: now,
        owesHoldDown: state === 'unhealthy',
        reportedCarrying: false,
      };
      this.services.set(serviceId, t);
    } else {
      t = before;
      if (state !== t.state) {
        if (state === 'unhealthy') t.owesHoldDown = true;
        // Healthy after being unhealthy (through unknown too: an exit that restarts is not
        // trusted at once): the hold-down starts now.
        if (state === 'healthy' && t.owesHoldDown) {
          t.carriesFrom = now + this.holdDownMs;
          t.owesHoldDown = false;
        }
        t.state = state;
        t.since = now;
      }
      t.reason = reason;
    }
    const stateChanged = stateBefore !== state || reasonBefore !== reason;
    t.reportedCarrying = this.carries(t, now);
    return { state: stateChanged, carrying: carriedBefore !== t.reportedCarrying };
  }

  /** The verdict on a service at `now`; a service never observed is unknown and carries nothing. */
  verdict(serviceId: string, now: number): HealthVerdict {
    const t = this.services.get(serviceId);
    if (!t)
      return {
        state: 'unknown',
        reason: null,
        since: now,
        carrying: false,
        standbyReason: 'unknown',
        holdDownUntil: null,
      };
    const carrying = this.carries(t, now);
    const holding = t.state === 'healthy' && now < t.carriesFrom;
    return {
      state: t.state,
      reason: t.reason,
      since: t.since,
      carrying,
      standbyReason: carrying ? null : holding ? 'hold_down' : (t.reason ?? 'unknown'),
      holdDownUntil: holding ? t.carriesFrom : null,
    };
  }

  /** The earliest time after `now` at which a verdict changes by itself (a hold-down ends), or null. */
  nextChange(now: number): number | null {
    let next: number | null = null;
    for (const t of this.services.values())
      if (t.state === 'healthy' && t.carriesFrom > now && (next === null || t.carriesFrom < next))
        next = t.carriesFrom;
    return next;
  }

  /** Drops the services not in `keep` (no longer this agent's to judge). */
  retain(keep: ReadonlySet<string>): void {
    for (const id of this.services.keys()) if (!keep.has(id)) this.services.delete(id);
  }

  get size(): number {
    return this.services.size;
  }

  private carries(t: Tracked, now: number): boolean {
    return t.state === 'healthy' && now >= t.carriesFrom;
  }
}
