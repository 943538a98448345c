import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseHostPort, parseServeOptions, UsageError } from './serve-options.js';

describe('serve options', () => {
  it('has the defaults of DECISIONS §1', () => {
    const o = parseServeOptions([], {});
    assert.equal(o.listenHost, '127.0.0.1');
    assert.equal(o.listenPort, 7480);
    assert.equal(o.advertise, '127.0.0.1:7480');
    assert.equal(o.dataDir, './mesh-data');
    assert.equal(o.publicUrl, 'http://127.0.0.1:7480');
    assert.equal(o.dataplane, 'auto');
    assert.equal(o.dev, false);
    assert.equal(o.logLevel, 'info');
  });
  it('reads MESH_<NAME> variables; flags win', () => {
    const o = parseServeOptions(['--data-dir', '/flag'], {
      MESH_DATA_DIR: '/env',
      MESH_LOG_LEVEL: 'debug',
      MESH_DEV: 'true',
    });
    assert.equal(o.dataDir, '/flag');
    assert.equal(o.logLevel, 'debug');
    assert.equal(o.dev, true);
  });
  it('refuses a wildcard listen without --advertise', () => {
    assert.throws(() => parseServeOptions(['--listen', '0.0.0.0:7480'], {}), UsageError);
    assert.throws(() => parseServeOptions(['--listen', '[::]:7480'], {}), UsageError);
    const o = parseServeOptions(['--listen', '0.0.0.0:7480', '--advertise', '[fd00::1]:7480'], {});
    assert.equal(o.advertise, '[fd00::1]:7480');
    assert.equal(o.publicUrl, 'http://[fd00::1]:7480');
  });
  it('uses https in the public URL with TLS, and needs cert and key together', () => {
    assert.equal(
      parseServeOptions(['--tls-cert', 'c', '--tls-key', 'k'], {}).publicUrl,
      'https://127.0.0.1:7480',
    );
    assert.throws(() => parseServeOptions(['--tls-cert', 'c'], {}), UsageError);
  });
  it('validates host:port', () => {
    assert.deepEqual(parseHostPort('[::1]:80', 'x'), { host: '::1', port: 80 });
    for (const bad of ['::1:80', 'h:0', 'h:65536', 'h', 'h:', ':80', 'a b:1']) {
      assert.throws(() => parseHostPort(bad, 'x'), UsageError, bad);
    }
  });
  it('refuses unknown flags and bad values', () => {
    assert.throws(() => parseServeOptions(['--nope'], {}), UsageError);
    assert.throws(() => parseServeOptions(['--dataplane', 'maybe'], {}), UsageError);
    assert.throws(() => parseServeOptions(['--public-url', 'ftp://x'], {}), UsageError);
  });
});
