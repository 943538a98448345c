/** A worker thread of seed-pool.ts: runs each simulator run it is sent and posts its result. */
import { parentPort } from 'node:worker_threads';
import type { PoolOptions } from './seed-pool.js';
import { simulate } from './simulator.js';

parentPort!.on('message', (o: PoolOptions) => {
  void simulate(o).then((r) => parentPort!.postMessage(r));
});
