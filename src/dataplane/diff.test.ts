import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { diff } from './diff.js';
import type { KernelState, RuleSpec } from './kernel/port.js';

const state = (rules: RuleSpec[]): KernelState => ({
  links: [],
  addresses: [],
  routes: [],
  rules,
  nft: null,
});
const NFT = { applied: null, appliedFrom: null };

describe('diff: policy rules', () => {
  it('adds the new rules before it deletes the old: a re-ranking never leaves a gap', () => {
    // Failover swaps which service's table comes first at a pref.
    const before: RuleSpec[] = [
      { family: 4, pref: 22000, from: '10.1.0.0/24', to: '10.2.0.0/24', table: 100 },
      { family: 4, pref: 22001, from: '10.1.0.0/24', to: '10.2.0.0/24', table: 200 },
    ];
    const after: RuleSpec[] = [
      { family: 4, pref: 22000, from: '10.1.0.0/24', to: '10.2.0.0/24', table: 200 },
      { family: 4, pref: 22001, from: '10.1.0.0/24', to: '10.2.0.0/24', table: 100 },
    ];
    assert.deepEqual(
      diff(state(before), state(after), NFT).map((c) => c.op),
      ['add', 'add', 'del', 'del'],
    );
  });

  it('deletes first a rule the kernel would call a duplicate of one being added', () => {
    // The kernel refuses a rule without `from` beside one that has it, all else equal.
    const old: RuleSpec = { family: 4, pref: 22000, from: '10.1.0.0/24', to: '10.2.0.0/24', table: 100 };
    const wider: RuleSpec = { family: 4, pref: 22000, to: '10.2.0.0/24', table: 100 };
    // The old rule goes first only where the kernel would refuse the new one beside it.
    const steps = (from: RuleSpec, to: RuleSpec) => diff(state([from]), state([to]), NFT).map((c) => c.op);
    assert.deepEqual(steps(wider, old), ['add', 'del'], 'the new rule sets from: it must match');
    for (const other of [
      { ...wider, table: 200 },
      { ...wider, pref: 22001 },
      { ...wider, iif: 'mesh-t1' },
    ]) {
      assert.deepEqual(steps(old, other), ['add', 'del'], JSON.stringify(other));
    }
    const changes = diff(state([old]), state([wider]), NFT);
    assert.deepEqual(
      changes.map((c) => c.op),
      ['del', 'add'],
    );
  });
});

describe('diff: a failover that re-ranks a thousand rules', () => {
  /** `n` rules per family of one service's table at consecutive prefs, the families mixed. */
  const ranked = (n: number, table: number, firstPref: number): RuleSpec[] =>
    Array.from({ length: 2 * n }, (_, i) => {
      const k = i >> 1;
      return i % 2 === 0
        ? {
            family: 4,
            pref: firstPref + k,
            from: `10.100.${k % 256}.0/24`,
            to: `10.${k >> 8}.${k % 256}.0/24`,
            table,
          }
        : { family: 6, pref: firstPref + k, to: `fd00:${k.toString(16)}::/32`, table };
    });

  it('orders each step by family: one ip -batch per family, not one per change of family', () => {
    const changes = diff(state(ranked(50, 100, 22000)), state(ranked(50, 100, 22010)), NFT);
    const steps = changes.map((c) => `${c.op}${'rule' in c ? c.rule.family : ''}`);
    const runs = steps.filter((s, i) => s !== steps[i - 1]);
    assert.deepEqual(runs, ['add4', 'add6', 'del4', 'del6']);
    // Every rule moved to another pref: 100 come and 100 go.
    assert.equal(changes.length, 200);
  });

  it('reads each rule a bounded number of times, however many there are (linear work)', () => {
    // A quadratic search for the rules in the way held the event loop 9 s at 1,939 changes. Work
    // is counted, not timed: every read of a rule's field, through a proxy.
    const readsPerRule = (n: number) => {
      let reads = 0;
      const counted = (rules: RuleSpec[]) =>
        rules.map(
          (r) =>
            new Proxy(r, {
              get(target, key) {
                reads++;
                return target[key as keyof RuleSpec];
              },
            }),
        );
      const before = state(counted(ranked(n, 100, 22000)));
      const after = state(counted(ranked(n, 200, 22000)));
      assert.equal(diff(before, after, NFT).length, 4 * n);
      return reads / (4 * n);
    };
    const few = readsPerRule(100);
    const many = readsPerRule(2000);
    assert.ok(
      many <= few * 1.5,
      `reads per rule: ${few.toFixed(1)} at 100 per family, ${many.toFixed(1)} at 2,000`,
    );
  });
});
