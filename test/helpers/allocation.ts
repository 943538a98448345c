/**
 * How much memory a piece of work allocates, read from V8's own garbage-collection statistics: the
 * growth of the heap (JavaScript objects) and of external memory (Buffers' backing stores) between
 * one collection and the next, summed over the work, plus the growth since the last collection.
 * What a collection frees is not subtracted, so the figure is what was allocated, live or garbage.
 * For tests that hold a path's allocation per relayed megabyte against a baseline in the same run.
 */
import { GCProfiler, getHeapStatistics } from 'node:v8';

export interface Allocated {
  /** Bytes of JavaScript objects. */
  heap: number;
  /** Bytes of memory outside the heap that V8 accounts for (ArrayBuffer and Buffer contents). */
  external: number;
}

export async function allocatedDuring(work: () => Promise<void>): Promise<Allocated> {
  const profiler = new GCProfiler();
  const before = getHeapStatistics();
  profiler.start();
  await work();
  const after = getHeapStatistics();
  const { statistics } = profiler.stop();
  let heap = 0;
  let external = 0;
  let used = before.used_heap_size;
  let outside = before.external_memory;
  for (const gc of statistics) {
    heap += Math.max(0, gc.beforeGC.heapStatistics.usedHeapSize - used);
    external += Math.max(0, gc.beforeGC.heapStatistics.externalMemory - outside);
    used = gc.afterGC.heapStatistics.usedHeapSize;
    outside = gc.afterGC.heapStatistics.externalMemory;
  }
  heap += Math.max(0, after.used_heap_size - used);
  external += Math.max(0, after.external_memory - outside);
  return { heap, external };
}
