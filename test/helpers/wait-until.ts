/**
 * Polls a synchronous check (a counter, a state a transport reports) until it holds, for tests of
 * in-process transports and proxies; the cross-process helpers poll async calls instead
 * (cluster.ts `eventually`). Fails the test with `what` (and `explain()`'s state) at the deadline.
 */
import assert from 'node:assert/strict';

/** Resolves with the milliseconds it waited. */
export async function waitUntil(
  what: string,
  check: () => boolean,
  timeoutMs = 5000,
  explain?: () => unknown,
  everyMs = 5,
): Promise<number> {
  const start = performance.now();
  while (!check()) {
    if (performance.now() - start > timeoutMs) {
      assert.fail(
        `timed out after ${timeoutMs} ms waiting for: ${what}${explain ? ` ${JSON.stringify(explain())}` : ''}`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
  return performance.now() - start;
}
