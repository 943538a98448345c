/**
 * Runs simulator seeds on worker threads, one seed at a time per worker, so a sweep uses every
 * core: each worker has its own copy of the modules (and of the seeded crypto patch), so runs
 * on different threads share nothing. Results come back in the order of the options given.
 * Broken parts (SimOptions.factories) are functions and cannot cross to a worker: the
 * invariant tests run those in the calling thread.
 */
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import type { SimOptions, SimResult } from './simulator.js';

export type PoolOptions = Omit<SimOptions, 'factories' | 'onFormed'>;

export async function simulateOnThreads(
  runs: readonly PoolOptions[],
  threads = availableParallelism(),
  onResult?: (r: SimResult) => void,
): Promise<SimResult[]> {
  const results: SimResult[] = new Array(runs.length);
  let next = 0;
  const work = (): Promise<void> =>
    new Promise((resolve, reject) => {
      const worker = new Worker(new URL('./seed-worker.js', import.meta.url));
      const give = () => {
        if (next >= runs.length) {
          void worker.terminate().then(() => resolve());
          return;
        }
        const i = next++;
        worker.once('message', (r: SimResult) => {
          results[i] = r;
          onResult?.(r);
          give();
        });
        worker.postMessage(runs[i]);
      };
      worker.once('error', reject);
      give();
    });
  await Promise.all(Array.from({ length: Math.max(1, Math.min(threads, runs.length)) }, work));
  return results;
}
