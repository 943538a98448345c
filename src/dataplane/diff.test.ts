import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { diff, kernelDuplicate } from './diff.js';
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
    assert.equal(kernelDuplicate(wider, old), true);
    assert.equal(kernelDuplicate(old, wider), false, 'the new rule sets from: it must match');
    assert.equal(kernelDuplicate({ ...wider, table: 200 }, old), false);
    assert.equal(kernelDuplicate({ ...wider, pref: 22001 }, old), false);
    assert.equal(kernelDuplicate({ ...wider, iif: 'mesh-t1' }, old), false);
    const changes = diff(state([old]), state([wider]), NFT);
    assert.deepEqual(
      changes.map((c) => c.op),
      ['del', 'add'],
    );
  });
});
