/**
 * When a webhook endpoint that fails is tried again, and when an event is given up for it
 * (docs/events.md, "Webhooks"). Pure: the dispatcher (dispatcher.ts) asks with the time it reads.
 *
 * The schedule is the endpoint's, not the event's: deliveries are in order, so an endpoint that
 * fails holds its whole queue behind the event at its head, and every attempt is made with that
 * event. The first retries come within seconds (a receiver restarting, a deploy), then they grow,
 * so a receiver that is down for hours is asked about once every 6 h and not hammered.
 */

/** The wait before the next attempt after the n-th failure in a row: index n - 1, the last repeats. */
export const RETRY_DELAYS_MS: readonly number[] = [
  5_000,
  30_000,
  2 * 60_000,
  10 * 60_000,
  60 * 60_000,
  6 * 60 * 60_000,
];

/** An event still undelivered this long after it (or after the failures began) is given up. */
export const GIVE_UP_AFTER_MS = 24 * 60 * 60_000;

/**
 * The last moment at which an event is tried: 24 h after the event, or after the endpoint
 * began to fail if that is later (an event that reached this agent's log late, from another
 * agent, keeps its origin's time; it still gets the endpoint's 24 h). An attempt at or after it
 * that fails gives the event up.
 */
export function giveUpAt(eventTimeMs: number, failingSinceMs: number): number {
  return Math.max(eventTimeMs, failingSinceMs) + GIVE_UP_AFTER_MS;
}

/**
 * When to try again after `failures` failed attempts in a row (1 or more), at `nowMs`, with the
 * head event's give-up moment `deadlineMs`: the schedule's wait, but never past the deadline, so
 * the last attempt for an event is made about 24 h after it and not up to 6 h later.
 */
export function nextAttemptAt(failures: number, nowMs: number, deadlineMs: number): number {
  const delay = RETRY_DELAYS_MS[Math.min(Math.max(failures, 1), RETRY_DELAYS_MS.length) - 1]!;
  return Math.max(nowMs, Math.min(nowMs + delay, deadlineMs));
}
