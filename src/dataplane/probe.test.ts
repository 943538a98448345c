import assert from 'node:assert/strict';
import net from 'node:net';
import { describe, it } from 'node:test';
import type { HealthProbe } from '../domain/health-check.js';
import { ProbeVerdicts, probeOnce } from './probe.js';

const tcp = (port: number, intervalMs = 1000, failures = 3): HealthProbe => ({
  kind: 'tcp',
  target: `127.0.0.1:${port}`,
  address: '127.0.0.1',
  family: 4,
  port,
  intervalMs,
  failures,
});

describe('ProbeVerdicts', () => {
  it('starts each probe once per interval, never two at once', () => {
    const v = new ProbeVerdicts();
    const probes = new Map([['s', tcp(1)]]);
    assert.deepEqual(v.due(probes, 0), ['s']);
    assert.deepEqual(v.due(probes, 500), [], 'in flight');
    v.record('s', tcp(1), true, '');
    assert.deepEqual(v.due(probes, 999), [], 'not due yet');
    assert.deepEqual(v.due(probes, 1000), ['s']);
    // Its result late: the next is not started before it arrives.
    assert.deepEqual(v.due(probes, 2500), []);
  });

  it('fails after `failures` failures in a row, passes again at the first success', () => {
    const v = new ProbeVerdicts();
    const p = tcp(1, 100, 3);
    const probes = new Map([['s', p]]);
    const run = (t: number, ok: boolean) => {
      assert.deepEqual(v.due(probes, t), ['s']);
      return v.record('s', p, ok, ok ? '' : `failure at ${t}`);
    };
    assert.equal(v.passing('s'), null, 'no verdict before the first result');
    assert.equal(run(0, true), true);
    assert.equal(v.passing('s'), true);
    assert.equal(run(100, false), false);
    assert.equal(run(200, false), false);
    assert.equal(run(300, true), false, 'two failures and a success: still passing');
    assert.equal(run(400, false), false);
    assert.equal(run(500, false), false);
    assert.equal(run(600, false), true, 'the third in a row');
    assert.equal(v.passing('s'), false);
    assert.equal(v.detail('s'), 'failure at 600');
    assert.equal(run(700, true), true);
    assert.equal(v.detail('s'), '');
  });

  it('a changed check starts over; a service without one is forgotten', () => {
    const v = new ProbeVerdicts();
    const p = tcp(1, 100, 1);
    assert.deepEqual(v.due(new Map([['s', p]]), 0), ['s']);
    v.record('s', p, false, 'x');
    assert.equal(v.passing('s'), false);
    const q = tcp(2, 100, 1);
    assert.deepEqual(v.due(new Map([['s', q]]), 50), ['s']);
    assert.equal(v.passing('s'), null);
    assert.equal(v.record('s', p, true, ''), false, "the old check's late result is ignored");
    v.due(new Map(), 100);
    assert.equal(v.size, 0);
  });
});

describe('probeOnce', () => {
  it('tcp: passes when the connection is accepted, fails with the reason when refused', async () => {
    const server = net.createServer((s) => s.destroy());
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as net.AddressInfo).port;
    try {
      assert.deepEqual(await probeOnce(tcp(port)), { ok: true, detail: '' });
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
    assert.deepEqual(await probeOnce(tcp(port)), {
      ok: false,
      detail: `tcp 127.0.0.1:${port}: ECONNREFUSED`,
    });
  });

  it('icmp: passes on an echo; fails when ping cannot send from the address given', async () => {
    const icmp: HealthProbe = {
      kind: 'icmp',
      target: '127.0.0.1',
      address: '127.0.0.1',
      family: 4,
      intervalMs: 1000,
      failures: 3,
    };
    assert.deepEqual(await probeOnce(icmp), { ok: true, detail: '' });
    // An address this host does not have: ping refuses to bind it, and sends nothing.
    assert.deepEqual(await probeOnce(icmp, { address: '198.18.255.254' }), {
      ok: false,
      detail: 'icmp 127.0.0.1: no echo',
    });
  });
});
