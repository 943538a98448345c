import assert from 'node:assert/strict';
import { mkdtempSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import {
  type CachedToken,
  checkProfileName,
  configDir,
  loadToken,
  normalizeUrl,
  resolveProfile,
  saveProfile,
  saveToken,
  tokenUsable,
} from './client-profile.js';

const token = (expires_at_ms: number): CachedToken => ({
  url: 'http://a:1',
  client_id: 'c',
  access_token: 't',
  expires_at_ms,
});

describe('client profile and token cache', () => {
  it('a token is used until 6 minutes (a tenth of its hour) before expiry, and only for its agent and client', () => {
    const now = 1_000_000_000;
    assert.equal(tokenUsable(token(now + 3_600_000), 'http://a:1', 'c', now), true);
    assert.equal(tokenUsable(token(now + 361_000), 'http://a:1', 'c', now), true);
    assert.equal(tokenUsable(token(now + 359_000), 'http://a:1', 'c', now), false);
    assert.equal(tokenUsable(token(now - 1), 'http://a:1', 'c', now), false);
    assert.equal(tokenUsable(token(now + 3_600_000), 'http://b:1', 'c', now), false);
    assert.equal(tokenUsable(token(now + 3_600_000), 'http://a:1', 'other', now), false);
    assert.equal(tokenUsable(undefined, 'http://a:1', 'c', now), false);
    // A short-lived token keeps a margin of at least a minute.
    assert.equal(tokenUsable(token(now + 59_000), 'http://a:1', 'c', now, 120_000), false);
    assert.equal(tokenUsable(token(now + 61_000), 'http://a:1', 'c', now, 120_000), true);
  });

  it('XDG_CONFIG_HOME is honoured; names cannot leave the directory', () => {
    assert.equal(configDir({ XDG_CONFIG_HOME: '/x' }), '/x/mesh-agent');
    assert.match(configDir({}), /\/\.config\/mesh-agent$/);
    assert.equal(checkProfileName('prod-eu_1.b'), 'prod-eu_1.b');
    for (const bad of ['', '../x', 'a/b', '.hidden', 'x'.repeat(65)])
      assert.throws(() => checkProfileName(bad));
  });

  it('URLs: http(s) only, trailing slash dropped', () => {
    assert.equal(normalizeUrl('http://127.0.0.1:7480/'), 'http://127.0.0.1:7480');
    assert.equal(normalizeUrl('https://agent.example/base/'), 'https://agent.example/base');
    assert.throws(() => normalizeUrl('ftp://x'));
    assert.throws(() => normalizeUrl('not a url'));
  });

  it('environment over the profile, unless --profile names one; files 0600 in a 0700 dir', () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'mesh-profile-')), 'mesh-agent');
    const path = saveProfile(dir, 'default', {
      url: 'http://p:1',
      client_id: 'pid',
      client_secret: 'psecret',
    });
    assert.equal(statSync(path).mode & 0o777, 0o600);
    assert.equal(statSync(dir).mode & 0o777, 0o700);
    saveProfile(dir, 'other', { url: 'http://o:1', client_id: 'oid', client_secret: 'osecret' });

    assert.deepEqual(resolveProfile(dir, {}, undefined), {
      name: 'default',
      url: 'http://p:1',
      clientId: 'pid',
      clientSecret: 'psecret',
    });
    assert.deepEqual(resolveProfile(dir, { MESH_URL: 'http://e:1', MESH_CLIENT_ID: 'eid' }, undefined), {
      name: 'default',
      url: 'http://e:1',
      clientId: 'eid',
      clientSecret: 'psecret',
    });
    assert.equal(resolveProfile(dir, { MESH_PROFILE: 'other' }, undefined).clientId, 'oid');
    assert.deepEqual(resolveProfile(dir, { MESH_URL: 'http://e:1', MESH_CLIENT_ID: 'eid' }, 'other'), {
      name: 'other',
      url: 'http://o:1',
      clientId: 'oid',
      clientSecret: 'osecret',
    });
    assert.deepEqual(resolveProfile(dir, {}, 'missing'), {
      name: 'missing',
      url: undefined,
      clientId: undefined,
      clientSecret: undefined,
    });

    writeFileSync(join(dir, 'broken.json'), '{"client_secret": "s3cret-value-1234567890" oops');
    assert.throws(
      () => resolveProfile(dir, {}, 'broken'),
      (err: Error) => /not valid JSON/.test(err.message) && !err.message.includes('s3cret'),
    );

    saveToken(dir, 'default', token(5));
    assert.equal(statSync(join(dir, 'default.token.json')).mode & 0o777, 0o600);
    assert.deepEqual(loadToken(dir, 'default'), token(5));
    writeFileSync(join(dir, 'other.token.json'), '{broken');
    assert.equal(loadToken(dir, 'other'), undefined, 'a damaged cache is ignored');
  });
});
