import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseHostPort, parseKcpTuning, parseServeOptions, UsageError } from './serve-options.js';

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
  it('gossips every 1000 ms by default; --gossip-interval-ms takes whole ms from 50 to 60000', () => {
    assert.equal(parseServeOptions([], {}).gossipIntervalMs, 1000);
    assert.equal(parseServeOptions(['--gossip-interval-ms', '50'], {}).gossipIntervalMs, 50);
    assert.equal(parseServeOptions(['--gossip-interval-ms', '60000'], {}).gossipIntervalMs, 60_000);
    assert.equal(parseServeOptions([], { MESH_GOSSIP_INTERVAL_MS: '250' }).gossipIntervalMs, 250);
    for (const bad of ['49', '60001', '1.5', '-200', '1e3', '']) {
      assert.throws(() => parseServeOptions(['--gossip-interval-ms', bad], {}), UsageError, bad);
    }
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

describe('--kcp', () => {
  it("reads kcptun's names into the engine's parameters; MESH_KCP too; empty is none", () => {
    assert.deepEqual(
      parseKcpTuning('mtu=1400,interval=20,nodelay=0,resend=3,nc=1,sndwnd=512,rcvwnd=2048,minrto=50'),
      {
        mtu: 1400,
        interval: 20,
        nodelay: false,
        resend: 3,
        noCongestionControl: true,
        sndWnd: 512,
        rcvWnd: 2048,
        minRtoMs: 50,
      },
    );
    assert.deepEqual(parseKcpTuning(undefined), {});
    assert.deepEqual(parseServeOptions([], { MESH_KCP: 'sndwnd=256' }).kcp, { sndWnd: 256 });
    assert.deepEqual(parseServeOptions(['--kcp', 'nodelay=1'], { MESH_KCP: 'sndwnd=256' }).kcp, {
      nodelay: true,
    });
  });

  it('refuses unknown keys, non-integers and booleans other than 0 and 1, naming the item', () => {
    for (const bad of ['window=5', 'mtu=abc', 'mtu', 'nodelay=2', 'mtu=-1', 'mtu=1350;nc=1']) {
      assert.throws(
        () => parseKcpTuning(bad),
        (err: Error) => err instanceof UsageError && err.message.includes('--kcp'),
        bad,
      );
    }
  });
});
