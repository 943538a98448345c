import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { ApiError } from './errors.js';
import {
  type HealthCheck,
  healthCheckJson,
  healthProbe,
  parseHealthCheck,
  readHealthCheck,
  sameHealthCheck,
} from './health-check.js';

const problemOf = (value: unknown): string | undefined => {
  const r = readHealthCheck(value);
  return 'problem' in r ? r.problem : undefined;
};

describe('readHealthCheck', () => {
  it('fills the defaults and gives addresses in canonical form', () => {
    const defaults = { interval_ms: 1000, failures: 3 };
    const cases: [name: string, input: unknown, want: HealthCheck][] = [
      ['tcp IPv4', { tcp: '10.1.2.3:443' }, { tcp: '10.1.2.3:443', ...defaults }],
      [
        'tcp IPv6, RFC 5952, both bounds',
        { tcp: '[FD00:0:0::0001]:443', interval_ms: 100, failures: 10 },
        { tcp: '[fd00::1]:443', interval_ms: 100, failures: 10 },
      ],
      ['icmp IPv4', { icmp: '10.1.2.3' }, { icmp: '10.1.2.3', ...defaults }],
      [
        'icmp IPv6, the other bounds',
        { icmp: 'FD00::0:1', interval_ms: 60_000, failures: 1 },
        { icmp: 'fd00::1', interval_ms: 60_000, failures: 1 },
      ],
      ['tcp port 65535, loopback', { tcp: '127.0.0.1:65535' }, { tcp: '127.0.0.1:65535', ...defaults }],
      ['unknown keys dropped', { tcp: '10.0.0.1:1', timeout_ms: 5 }, { tcp: '10.0.0.1:1', ...defaults }],
    ];
    for (const [name, input, want] of cases) {
      const r = readHealthCheck(input);
      assert.ok('check' in r, `${name}: ${JSON.stringify(r)}`);
      assert.deepEqual(r.check, want, name);
      // Key order is part of the canonical form: the store keeps its JSON text.
      assert.equal(JSON.stringify(r.check), JSON.stringify(want), name);
    }
  });

  it('refuses every malformed value, naming the field; the longest target passes', () => {
    const cases: { in: unknown; want: RegExp }[] = [
      { in: 'tcp:10.1.2.3:443', want: /^health_check must be an object/ },
      { in: [], want: /^health_check must be an object/ },
      { in: 5, want: /^health_check must be an object/ },
      { in: {}, want: /exactly one of tcp and icmp/ },
      { in: { interval_ms: 500 }, want: /exactly one of tcp and icmp/ },
      { in: { tcp: '10.1.2.3:443', icmp: '10.1.2.3' }, want: /exactly one of tcp and icmp/ },
      {
        in: { tcp: 'example.com:443' },
        want: /^health_check\.tcp must be an IP address and a port.*no host names/,
      },
      { in: { tcp: 'localhost:80' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: '10.1.2.3' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: '10.1.2.3:0' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: '10.1.2.3:65536' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: '10.1.2.3:0443' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: '10.01.2.3:443' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: 'fd00::1:443' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: '[fd00::1]' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: '[fe80::1%eth0]:443' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: '[10.1.2.3]:443' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: 443 }, want: /^health_check\.tcp must be/ },
      { in: { tcp: null }, want: /^health_check\.tcp must be/ },
      { in: { tcp: '10.1.2.3:443 ' }, want: /^health_check\.tcp must be/ },
      { in: { tcp: `[fd00:${'ffff:'.repeat(6)}ffff]:65535` }, want: /^accepted$/ },
      { in: { tcp: '0.0.0.0:443' }, want: /^health_check\.tcp cannot be the unspecified address$/ },
      { in: { tcp: '[::]:443' }, want: /^health_check\.tcp cannot be the unspecified address$/ },
      { in: { tcp: '224.0.0.1:443' }, want: /^health_check\.tcp cannot be a multicast address$/ },
      { in: { icmp: 'ff02::1' }, want: /^health_check\.icmp cannot be a multicast address$/ },
      { in: { icmp: '255.255.255.255' }, want: /^health_check\.icmp cannot be the broadcast address$/ },
      { in: { icmp: '10.1.2.3:443' }, want: /^health_check\.icmp must be an IP address.*no port/ },
      { in: { icmp: '[fd00::1]' }, want: /^health_check\.icmp must be/ },
      { in: { icmp: 'gateway.lan' }, want: /^health_check\.icmp must be/ },
      { in: { icmp: '10.1.2.3/32' }, want: /^health_check\.icmp must be/ },
      { in: { icmp: '' }, want: /^health_check\.icmp must be/ },
      { in: { icmp: '1'.repeat(100) }, want: /^health_check\.icmp must be/ },
      {
        in: { icmp: '10.1.2.3', interval_ms: 99 },
        want: /^health_check\.interval_ms must be an integer from 100 to 60000$/,
      },
      { in: { icmp: '10.1.2.3', interval_ms: 60_001 }, want: /^health_check\.interval_ms/ },
      { in: { icmp: '10.1.2.3', interval_ms: 1000.5 }, want: /^health_check\.interval_ms/ },
      { in: { icmp: '10.1.2.3', interval_ms: '1000' }, want: /^health_check\.interval_ms/ },
      { in: { icmp: '10.1.2.3', interval_ms: null }, want: /^health_check\.interval_ms/ },
      {
        in: { icmp: '10.1.2.3', failures: 0 },
        want: /^health_check\.failures must be an integer from 1 to 10$/,
      },
      { in: { icmp: '10.1.2.3', failures: 11 }, want: /^health_check\.failures/ },
      { in: { icmp: '10.1.2.3', failures: true }, want: /^health_check\.failures/ },
    ];
    for (const c of cases) assert.match(problemOf(c.in) ?? 'accepted', c.want, JSON.stringify(c.in));
  });

  it('reads only own keys: an inherited tcp is not a target', () => {
    const inherited = Object.create({ tcp: '10.1.2.3:443' }) as object;
    assert.match(problemOf(inherited) ?? 'accepted', /exactly one of tcp and icmp/);
  });
});

describe('parseHealthCheck', () => {
  it('throws 400 INVALID_REQUEST with the problem as its text', () => {
    try {
      parseHealthCheck({ tcp: 'example.com:443' });
      assert.fail('accepted a host name');
    } catch (e) {
      assert.equal((e as ApiError).code, 'INVALID_REQUEST');
      assert.match((e as ApiError).message, /^health_check\.tcp must be/);
    }
  });
});

describe('healthCheckJson and sameHealthCheck', () => {
  it('write the keys in canonical order whatever order they came in', () => {
    const shuffled = { failures: 3, interval_ms: 1000, tcp: '10.1.2.3:443' } as HealthCheck;
    assert.equal(healthCheckJson(shuffled), '{"tcp":"10.1.2.3:443","interval_ms":1000,"failures":3}');
    assert.equal(
      healthCheckJson(parseHealthCheck({ icmp: 'fd00::1' })),
      '{"icmp":"fd00::1","interval_ms":1000,"failures":3}',
    );
  });
  it('compares by value, null only equal to null', () => {
    const a = parseHealthCheck({ tcp: '10.1.2.3:443' });
    assert.equal(sameHealthCheck(a, { failures: 3, interval_ms: 1000, tcp: '10.1.2.3:443' }), true);
    assert.equal(sameHealthCheck(a, parseHealthCheck({ tcp: '10.1.2.3:443', failures: 4 })), false);
    assert.equal(sameHealthCheck(a, parseHealthCheck({ icmp: '10.1.2.3' })), false);
    assert.equal(sameHealthCheck(a, null), false);
    assert.equal(sameHealthCheck(null, a), false);
    assert.equal(sameHealthCheck(null, null), true);
  });
});

describe('healthProbe', () => {
  it('splits the target into address, family and port', () => {
    assert.deepEqual(healthProbe(parseHealthCheck({ tcp: '10.1.2.3:443', interval_ms: 500 })), {
      kind: 'tcp',
      target: '10.1.2.3:443',
      address: '10.1.2.3',
      family: 4,
      port: 443,
      intervalMs: 500,
      failures: 3,
    });
    assert.deepEqual(healthProbe(parseHealthCheck({ tcp: '[fd00::1]:8443', failures: 5 })), {
      kind: 'tcp',
      target: '[fd00::1]:8443',
      address: 'fd00::1',
      family: 6,
      port: 8443,
      intervalMs: 1000,
      failures: 5,
    });
    assert.deepEqual(healthProbe(parseHealthCheck({ icmp: 'fd00::1' })), {
      kind: 'icmp',
      target: 'fd00::1',
      address: 'fd00::1',
      family: 6,
      intervalMs: 1000,
      failures: 3,
    });
  });
  it('is null for a value that never passed the check, instead of throwing', () => {
    assert.equal(healthProbe({ tcp: 'example.com:443', interval_ms: 1000, failures: 3 }), null);
    assert.equal(healthProbe({ icmp: 'nope', interval_ms: 1000, failures: 3 }), null);
  });
});
