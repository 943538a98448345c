import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import pino from 'pino';
import { RecordingKernel } from './kernel/recording.js';
import { asymmetricRouteReason, TransparentChecks } from './transparent.js';

const S = '11111111-1111-4111-8111-111111111111';
const EXIT = { serviceId: S, macvlan: 'mesh-m3', families: [4, 6] as (4 | 6)[] };

/** A kernel with the exit's MACVLAN and the given sysctls; a logger whose lines are kept. */
function setUp(sysctls: Record<string, string>, opts: { readOnly?: boolean; netAdmin?: boolean } = {}) {
  const kernel = new RecordingKernel({
    foreignLinks: { lo: 65_536, 'mesh-m3': 1500 },
    sysctls: {
      'net.ipv4.ip_forward': '1',
      'net.ipv6.conf.all.forwarding': '1',
      ...sysctls,
    },
    readOnlySysctls: opts.readOnly ?? false,
  });
  const lines: Record<string, unknown>[] = [];
  const logger = pino({ level: 'info' }, { write: (l: string) => lines.push(JSON.parse(l)) });
  const checks = new TransparentChecks({
    kernel,
    logger,
    netAdmin: () => opts.netAdmin ?? true,
    streams: () => true,
  });
  return { kernel, checks, lines };
}

const strict = {
  'net.ipv4.conf.all.rp_filter': '1',
  'net.ipv4.conf.default.rp_filter': '1',
  'net.ipv4.conf.mesh-m3.rp_filter': '1',
};

describe('TransparentChecks', () => {
  it('sets rp_filter 2 where it is 1, on exactly all, default and the MACVLAN; says each once with the old value', async () => {
    const { kernel, checks, lines } = setUp({ ...strict, 'net.ipv4.conf.e0.rp_filter': '1' });
    await checks.check([EXIT]);
    assert.deepEqual(kernel.sysctlWrites, [
      'net.ipv4.conf.all.rp_filter=2',
      'net.ipv4.conf.default.rp_filter=2',
      'net.ipv4.conf.mesh-m3.rp_filter=2',
    ]);
    assert.equal(kernel.sysctls.get('net.ipv4.conf.e0.rp_filter'), '1', 'no other key');
    assert.deepEqual(checks.readiness(S), { ready: true, reasons: [] });
    const said = lines.filter((l) => l.key !== undefined).map((l) => [l.key, l.from, l.to]);
    assert.deepEqual(said, [
      ['net.ipv4.conf.all.rp_filter', '1', '2'],
      ['net.ipv4.conf.default.rp_filter', '1', '2'],
      ['net.ipv4.conf.mesh-m3.rp_filter', '1', '2'],
    ]);
    // Checked again: nothing more to set or say.
    await checks.check([EXIT]);
    assert.equal(kernel.sysctlWrites.length, 3);
    assert.equal(lines.length, 3);
  });

  it('leaves 0 (off) and 2 (loose) alone, and rp_filter entirely for an IPv6-only service', async () => {
    const { kernel, checks } = setUp({
      'net.ipv4.conf.all.rp_filter': '0',
      'net.ipv4.conf.default.rp_filter': '2',
      'net.ipv4.conf.mesh-m3.rp_filter': '0',
    });
    await checks.check([EXIT]);
    const v6 = setUp(strict);
    await v6.checks.check([{ ...EXIT, families: [6] }]);
    assert.deepEqual([...kernel.sysctlWrites, ...v6.kernel.sysctlWrites], []);
    assert.equal(checks.readiness(S)!.ready, true);
    assert.equal(v6.checks.readiness(S)!.ready, true);
  });

  it('without the right to set them: not ready, each key named with the command, in problems(), logged once', async () => {
    const { kernel, checks, lines } = setUp(strict, { readOnly: true });
    for (let i = 0; i < 3; i++) await checks.check([EXIT]);
    assert.deepEqual(kernel.sysctlWrites, []);
    const r = checks.readiness(S)!;
    assert.equal(r.ready, false);
    assert.equal(r.reasons.length, 3);
    for (const [i, key] of ['all', 'default', 'mesh-m3'].entries()) {
      assert.match(
        r.reasons[i]!,
        new RegExp(`net\\.ipv4\\.conf\\.${key}\\.rp_filter is 1 .*could not set it to 2`),
      );
      assert.match(r.reasons[i]!, new RegExp(`sysctl -w net\\.ipv4\\.conf\\.${key}\\.rp_filter=2`));
    }
    assert.deepEqual(
      checks.problems(),
      r.reasons.map((x) => `transparent service ${S}: ${x}`),
    );
    assert.deepEqual([...checks.readyByService()], [[S, false]]);
    assert.equal(lines.filter((l) => l.msg === 'transparent service not ready').length, 1);
  });

  it('reports a missing CAP_NET_ADMIN, forwarding off, and a MACVLAN without addresses', async () => {
    const { checks } = setUp({ 'net.ipv4.ip_forward': '0' }, { netAdmin: false });
    await checks.check([EXIT, { serviceId: 'other', macvlan: 'mesh-m4', families: [] }]);
    const reasons = checks.readiness(S)!.reasons.join('\n');
    assert.match(reasons, /CAP_NET_ADMIN/);
    assert.match(reasons, /net\.ipv4\.ip_forward is 0/);
    assert.doesNotMatch(reasons, /ipv6/);
    assert.match(checks.readiness('other')!.reasons.join('\n'), /no desired_ipv4_cidr or desired_ipv6_cidr/);
  });

  it('an unanswered connection makes the service not ready with the return route, until one is answered; services not checked are not its', async () => {
    const { checks, lines } = setUp({});
    await checks.check([EXIT]);
    const u = {
      client: '10.91.1.2',
      destination: '10.91.2.2',
      port: 8080,
      via: '10.91.2.50',
      clientNetwork: '10.91.1.0/24',
    };
    checks.unansweredButReachable(S, u);
    checks.unansweredButReachable('not-a-transparent-exit', u);
    assert.equal(checks.readiness('not-a-transparent-exit'), null);
    assert.deepEqual(checks.readiness(S), { ready: false, reasons: [asymmetricRouteReason(u)] });
    assert.match(asymmetricRouteReason(u), /ip route add 10\.91\.1\.0\/24 via 10\.91\.2\.50/);
    // A reconcile in between keeps it; an answered connection ends it.
    await checks.check([EXIT]);
    assert.equal(checks.readiness(S)!.ready, false);
    checks.answered(S);
    assert.deepEqual(checks.readiness(S), { ready: true, reasons: [] });
    assert.deepEqual(
      lines.map((l) => l.msg),
      ['transparent service not ready', 'transparent service ready'],
    );
    // The service gone: nothing is reported for it any more.
    await checks.check([]);
    assert.equal(checks.readiness(S), null);
    assert.deepEqual(checks.problems(), []);
  });
});
