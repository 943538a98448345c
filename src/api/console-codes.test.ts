import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { scope } from '../domain/scopes.js';
import { CODE_TTL_MS, ConsoleCodes, MAX_OUTSTANDING_CODES } from './console-codes.js';

describe('console one-time codes', () => {
  const grant = { clientId: 'mc_a', scopes: [scope('services.read')] };

  it('gives the grant once, within 60 s, and never after', () => {
    let now = 1_000_000;
    const codes = new ConsoleCodes({ now: () => now });
    const first = codes.issue(grant);
    assert.equal(first.expiresInSeconds, 60);
    assert.match(first.code, /^[A-Za-z0-9_-]{43}$/);
    now += CODE_TTL_MS - 1;
    assert.deepEqual(codes.redeem(first.code), grant);
    assert.equal(codes.redeem(first.code), undefined, 'a second use');
    const late = codes.issue(grant);
    now += CODE_TTL_MS;
    assert.equal(codes.redeem(late.code), undefined, 'at 60 s');
    assert.equal(codes.redeem('not-a-code'), undefined);
  });

  it('keeps at most MAX_OUTSTANDING_CODES, dropping the oldest', () => {
    const codes = new ConsoleCodes({ now: () => 0 });
    const oldest = codes.issue(grant).code;
    const issued = Array.from({ length: MAX_OUTSTANDING_CODES }, () => codes.issue(grant).code);
    assert.equal(codes.redeem(oldest), undefined);
    assert.deepEqual(codes.redeem(issued.at(-1)!), grant);
    assert.notEqual(new Set(issued).size, 1);
  });
});
