/**
 * Virtual time for the cluster simulator: one clock and one event queue for every agent in the
 * process. Nothing waits for real time; `runUntil` jumps from event to event and lets the
 * promise chains each event starts run to their end (all microtasks) before the next one.
 */
import type { Clock, Timers } from '../../src/domain/clock.js';

interface Event {
  at: number;
  seq: number;
  fn: () => void;
}

/** A small binary heap ordered by (time, insertion): equal times run in the order scheduled. */
class EventQueue {
  private readonly items: Event[] = [];
  get size(): number {
    return this.items.length;
  }
  peek(): Event | undefined {
    return this.items[0];
  }
  push(e: Event): void {
    const a = this.items;
    a.push(e);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (!before(a[i]!, a[p]!)) break;
      [a[i], a[p]] = [a[p]!, a[i]!];
      i = p;
    }
  }
  pop(): Event | undefined {
    const a = this.items;
    const top = a[0];
    const last = a.pop();
    if (a.length > 0 && last) {
      a[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < a.length && before(a[l]!, a[m]!)) m = l;
        if (r < a.length && before(a[r]!, a[m]!)) m = r;
        if (m === i) break;
        [a[i], a[m]] = [a[m]!, a[i]!];
        i = m;
      }
    }
    return top;
  }
}

const before = (x: Event, y: Event): boolean => x.at < y.at || (x.at === y.at && x.seq < y.seq);

/**
 * Lets the promise chains an event started run on: SETTLE_HOPS turns of the microtask queue,
 * which ends every chain the cluster layer starts (a message's handling and reply, a round).
 * A longer chain goes on during the next event's turns, in the same order on every run, so it
 * changes no outcome of a seed. A macrotask (setImmediate) instead of the turns drained every
 * chain but cost about a sixth of a run's wall time in event-loop turns (profile: "(idle)").
 */
const SETTLE_HOPS = 64;
const settle = async (): Promise<void> => {
  for (let i = 0; i < SETTLE_HOPS; i++) await undefined;
};

export class VirtualTime implements Clock, Timers {
  private t: number;
  private seq = 0;
  private readonly queue = new EventQueue();
  /** Events run so far: a measure of the simulation's work. */
  events = 0;

  constructor(start: number) {
    this.t = start;
  }

  now(): number {
    return this.t;
  }

  at(delayMs: number, fn: () => void): void {
    this.queue.push({ at: this.t + Math.max(0, delayMs), seq: this.seq++, fn });
  }

  every(ms: number, fn: () => void): () => void {
    let stopped = false;
    const step = () => {
      if (stopped) return;
      fn();
      this.at(ms, step);
    };
    this.at(ms, step);
    return () => {
      stopped = true;
    };
  }

  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => this.at(ms, resolve));
  }

  /** Runs every event due until `end` (absolute virtual ms), then sets the clock to `end`. */
  async runUntil(end: number): Promise<void> {
    await settle();
    for (;;) {
      const next = this.queue.peek();
      if (!next || next.at > end) break;
      this.queue.pop();
      this.t = next.at;
      this.events++;
      next.fn();
      await settle();
    }
    this.t = Math.max(this.t, end);
  }
}
