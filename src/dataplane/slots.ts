/**
 * Slot numbers for the services this agent carries (1..MAX_SLOT): they name the TUN, tables and
 * mark of a service (kernel/ownership.ts). A service keeps its slot while the agent runs; a new
 * one starts probing at a hash of its id, so slots rarely move between restarts. Pure.
 */
import { MAX_SLOT } from './kernel/ownership.js';

export class SlotTable {
  private readonly slots = new Map<string, number>();

  /** Assigns slots to exactly these services (freeing the others'); throws past MAX_SLOT. */
  assign(serviceIds: readonly string[]): ReadonlyMap<string, number> {
    const wanted = new Set(serviceIds);
    for (const id of this.slots.keys()) if (!wanted.has(id)) this.slots.delete(id);
    const used = new Set(this.slots.values());
    for (const id of [...wanted].sort()) {
      if (this.slots.has(id)) continue;
      if (used.size >= MAX_SLOT) throw new Error(`this agent carries more than ${MAX_SLOT} services`);
      let slot = (fnv1a(id) % MAX_SLOT) + 1;
      while (used.has(slot)) slot = (slot % MAX_SLOT) + 1;
      used.add(slot);
      this.slots.set(id, slot);
    }
    return this.slots;
  }
}

function fnv1a(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}
