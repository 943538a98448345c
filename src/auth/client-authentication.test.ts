import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { OAuthError } from '../domain/errors.js';
import { parseTokenForm, readClientCredentials } from './client-authentication.js';

const basic = (text: string) => `Basic ${Buffer.from(text).toString('base64')}`;
const oauthCode = (fn: () => unknown) => {
  try {
    fn();
  } catch (err) {
    return (err as OAuthError).oauthCode;
  }
  return 'no error';
};

describe('readClientCredentials', () => {
  it('decodes form-urlencoded Basic credentials (RFC 6749 appendix B)', () => {
    const c = readClientCredentials(basic('my%20client:s%3Acret+x'), new Map());
    assert.deepEqual(c, { clientId: 'my client', clientSecret: 's:cret x', method: 'client_secret_basic' });
  });
  it('reads client_secret_post', () => {
    const c = readClientCredentials(
      undefined,
      new Map([
        ['client_id', 'a'],
        ['client_secret', 'b'],
      ]),
    );
    assert.equal(c?.method, 'client_secret_post');
  });
  it('refuses two methods at once: invalid_request', () => {
    assert.equal(
      oauthCode(() => readClientCredentials(basic('a:b'), new Map([['client_id', 'a']]))),
      'invalid_request',
    );
  });
  it('refuses malformed Basic: invalid_client', () => {
    for (const h of ['Basic', 'Basic !!!', basic('nocolon'), basic(':secret'), 'Bearer x', basic('a%zz:b')]) {
      assert.equal(
        oauthCode(() => readClientCredentials(h, new Map())),
        'invalid_client',
        h,
      );
    }
  });
});

describe('parseTokenForm', () => {
  it('refuses a repeated parameter', () => {
    assert.equal(
      oauthCode(() => parseTokenForm('grant_type=a&grant_type=b')),
      'invalid_request',
    );
  });
  it('treats a parameter without a value as omitted', () => {
    assert.equal(parseTokenForm('scope=&grant_type=x').has('scope'), false);
  });
  it('returns an OAuthError instance', () => {
    assert.throws(() => parseTokenForm('a=1&a=2'), OAuthError);
  });
});
