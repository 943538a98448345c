/**
 * Replays one simulator run: node dist/test/sim/replay.js --seed N [--agents 20] [--seconds 120] [--calm]
 * Prints the violations (if any), the trace hash and the run's counts.
 */
import { parseArgs } from 'node:util';
import { simulate } from './simulator.js';

const { values } = parseArgs({
  options: {
    seed: { type: 'string' },
    agents: { type: 'string', default: '20' },
    seconds: { type: 'string', default: '120' },
    calm: { type: 'boolean', default: false },
  },
});
const started = performance.now();
const result = await simulate({
  seed: Number(values.seed ?? 1),
  agents: Number(values.agents),
  seconds: Number(values.seconds),
  faults: !values.calm,
  stopAtFirst: false,
});
console.log(JSON.stringify({ ...result, wallMs: Math.round(performance.now() - started) }, null, 2));
process.exit(result.violations.length > 0 ? 1 : 0);
