import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  envName,
  parseHostPort,
  parseKcpTuning,
  parseServeOptions,
  SERVE_FLAGS,
  SERVE_USAGE,
  type ServeFlag,
  type ServeFlagName,
  UsageError,
} from './serve-options.js';

describe('serve options', () => {
  it('has the defaults of docs/decisions.md §1', () => {
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
  it('failover: health every 500 ms, 3 misses, 30 s hold-down by default; each checked', () => {
    const o = parseServeOptions([], {});
    assert.deepEqual([o.healthIntervalMs, o.healthMisses, o.failoverHoldDownMs], [500, 3, 30_000]);
    const set = parseServeOptions(
      ['--health-interval-ms', '100', '--health-misses', '10', '--failover-hold-down-ms', '0'],
      {},
    );
    assert.deepEqual([set.healthIntervalMs, set.healthMisses, set.failoverHoldDownMs], [100, 10, 0]);
    assert.equal(parseServeOptions([], { MESH_FAILOVER_HOLD_DOWN_MS: '5000' }).failoverHoldDownMs, 5000);
    for (const [flag, bad] of [
      ['--health-interval-ms', '49'],
      ['--health-interval-ms', '1.5'],
      ['--health-misses', '1'],
      ['--health-misses', '101'],
      ['--failover-hold-down-ms', '-1'],
      ['--failover-hold-down-ms', '3600001'],
    ] as const)
      assert.throws(() => parseServeOptions([flag, bad], {}), UsageError, `${flag} ${bad}`);
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
  it('has no test hooks: --test-hooks is an unknown flag, MESH_TEST_HOOKS changes nothing', () => {
    assert.throws(() => parseServeOptions(['--test-hooks'], {}), UsageError);
    assert.deepEqual(parseServeOptions([], { MESH_TEST_HOOKS: '1' }), parseServeOptions([], {}));
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

describe('SERVE_FLAGS, the one table of the serve flags', () => {
  /** A valid value of each flag (none for a switch), and the flags it needs beside it. */
  const SAMPLES: Record<ServeFlagName, { value?: string; needs?: string[] }> = {
    listen: { value: '127.0.0.1:9000' },
    advertise: { value: '10.0.0.1:7480' },
    'data-dir': { value: '/srv/mesh' },
    'license-public-key': { value: 'AAAA' },
    'tls-cert': { value: 'cert.pem', needs: ['--tls-key', 'key.pem'] },
    'tls-key': { value: 'key.pem', needs: ['--tls-cert', 'cert.pem'] },
    'public-url': { value: 'https://mesh.example:8443' },
    dataplane: { value: 'off' },
    'macvlan-parent': { value: 'eth1' },
    dev: {},
    'metrics-public': {},
    'log-level': { value: 'debug' },
    'gossip-interval-ms': { value: '250' },
    'health-interval-ms': { value: '200' },
    'health-misses': { value: '5' },
    'failover-hold-down-ms': { value: '0' },
    'events-max-age-days': { value: '7' },
    'events-max-count': { value: '5000' },
    kcp: { value: 'mtu=1400' },
  };
  const names = Object.keys(SERVE_FLAGS) as ServeFlagName[];

  it('has a sample here for every flag', () => {
    assert.deepEqual(Object.keys(SAMPLES).sort(), [...names].sort());
  });

  it('lists every flag in the help with its value, and no flag that is not in the table', () => {
    for (const name of names) {
      const flag: ServeFlag = SERVE_FLAGS[name];
      const words = flag.value === undefined ? `--${name}` : `--${name} ${flag.value}`;
      assert.ok(SERVE_USAGE.includes(words), `the help lacks ${words}`);
    }
    const listed = new Set(SERVE_USAGE.match(/--[a-z][a-z-]*/g));
    assert.deepEqual([...listed].sort(), names.map((n) => `--${n}`).sort());
  });

  it('reads every flag from its MESH_ variable as from the flag itself', () => {
    for (const name of names) {
      const { value, needs = [] } = SAMPLES[name];
      const fromFlag = parseServeOptions(
        [...(value === undefined ? [`--${name}`] : [`--${name}`, value]), ...needs],
        {},
      );
      const fromEnv = parseServeOptions(needs, { [envName(name)]: value ?? 'true' });
      assert.deepEqual(fromEnv, fromFlag, envName(name));
      // Without it, the options differ, or are refused (the other half of --tls-cert --tls-key).
      let without: unknown;
      try {
        without = parseServeOptions(needs, {});
      } catch (err) {
        assert.ok(err instanceof UsageError, envName(name));
        without = err;
      }
      assert.notDeepEqual(fromEnv, without, `${envName(name)} changes nothing`);
    }
  });

  it('means by an unset flag what its default says', () => {
    for (const name of names) {
      const flag: ServeFlag = SERVE_FLAGS[name];
      if (flag.default === undefined) continue;
      assert.deepEqual(parseServeOptions([`--${name}`, flag.default], {}), parseServeOptions([], {}), name);
    }
  });
});
