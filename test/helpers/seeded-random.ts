/**
 * Seeded randomness for tests that must be replayable: the seed comes from CRASH_SEED when set,
 * otherwise from the clock, and the test prints it.
 */

export const SEED =
  process.env.CRASH_SEED === undefined ? (Date.now() ^ process.pid) >>> 0 : Number(process.env.CRASH_SEED);

/** mulberry32: a small seeded PRNG, so a failing run can be replayed. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}
