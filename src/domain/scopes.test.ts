import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ADMIN, grants, grantsAll, normalizeScopes, parseScopeParam, scope } from './scopes.js';

describe('scopes', () => {
  it('admin grants every scope; no other scope implies another', () => {
    assert.equal(grants([ADMIN], scope('peers.write')), true);
    assert.equal(grants([scope('services.write')], scope('services.read')), false);
    assert.equal(grants([scope('credentials.write')], scope('credentials.read')), false);
  });
  it('empty or absent scopes mean admin; duplicates fold', () => {
    assert.deepEqual(normalizeScopes(undefined), [ADMIN]);
    assert.deepEqual(normalizeScopes([]), [ADMIN]);
    assert.deepEqual(normalizeScopes([scope('peers.read'), scope('peers.read')]), [scope('peers.read')]);
  });
  it('parses the OAuth scope parameter; unknown values fail', () => {
    assert.deepEqual(parseScopeParam(`${scope('peers.read')} ${scope('services.read')}`), [
      scope('peers.read'),
      scope('services.read'),
    ]);
    assert.equal(parseScopeParam('peers.read'), undefined);
    assert.equal(parseScopeParam('   '), undefined);
  });
  it('grantsAll needs every wanted scope', () => {
    assert.equal(grantsAll([scope('peers.read')], [scope('peers.read'), scope('peers.write')]), false);
  });
});
