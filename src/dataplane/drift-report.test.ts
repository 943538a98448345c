// DataPlane.driftReport (GET /v1/dataplane) without root: the recording kernel stands in for the
// kernel, the in-memory transport for the network.
import assert from 'node:assert/strict';
import { afterEach, it } from 'node:test';
import { pino } from 'pino';
import { planRoute, planService, S1 } from '../../test/helpers/plan-fixtures.js';
import { MemoryNetwork, memoryPublicKey } from '../transports/memory.js';
import { StaticPeerDirectory } from '../transports/static-directory.js';
import { DataPlane } from './dataplane.js';
import { tableOf } from './kernel/ownership.js';
import { RecordingKernel } from './kernel/recording.js';
import { SlotTable } from './slots.js';

const LOCAL = 'f'.repeat(32);
const EXIT = '1'.repeat(32);
const stops: (() => Promise<void>)[] = [];
/** One service from this agent to EXIT, one route. */
const VIEW = {
  localPeerId: LOCAL,
  services: [planService(S1, LOCAL, EXIT)],
  routes: [planRoute(7, S1, 10, null, '10.92.0.0/16')],
  peers: [
    { id: LOCAL, address: '10.91.0.15:7480' },
    { id: EXIT, address: '10.91.0.1:7480' },
  ],
};

afterEach(async () => {
  for (const stop of stops.splice(0)) await stop();
});

function started() {
  const kernel = new RecordingKernel({
    foreignLinks: { lo: 65_536, eth0: 1500 },
    sysctls: { 'net.ipv4.ip_forward': '1', 'net.ipv6.conf.all.forwarding': '1' },
    uplink: { dev: 'eth0', gateway4: '10.91.0.254', gateway6: null },
  });
  const directory = new StaticPeerDirectory();
  for (const id of [LOCAL, EXIT]) directory.set(id, memoryPublicKey(id), 'memory');
  const transport = new MemoryNetwork().transport({ localPeerId: LOCAL, directory });
  const dp = new DataPlane({
    kernel,
    transports: { tcp: transport },
    logger: pino({ level: 'silent' }),
    apiPort: 7480,
    macvlanParent: null,
    reconcileIntervalMs: 3_600_000,
  });
  stops.push(async () => {
    await dp.stop();
    await transport.close();
  });
  return { kernel, dp };
}

it('owned against wanted, the last reconcile, and each repair with what it put back', async () => {
  const { kernel, dp } = started();
  const before = await dp.driftReport();
  assert.equal(before.wanted, null, 'nothing wanted before the first reconcile');
  assert.equal(before.lastReconcile, null);

  const startedAt = Date.now();
  await dp.start(VIEW);
  const settled = await dp.driftReport();
  assert.deepEqual(settled.owned, settled.wanted);
  assert.equal(settled.wanted?.nft, true);
  assert.ok((settled.wanted?.rules ?? 0) > 0);
  assert.deepEqual(settled.differences, []);
  assert.equal(settled.differenceCount, 0);
  assert.ok(settled.lastReconcile !== null);
  assert.ok(settled.reconciles >= 1);
  assert.equal(settled.lastReconcile.drift, false);
  assert.equal(settled.lastReconcile.error, null);
  assert.ok(settled.lastReconcile.at >= startedAt - 1000 && settled.lastReconcile.at <= Date.now());
  assert.ok(settled.lastReconcile.durationMs >= 0);
  assert.equal(settled.repairs, 0);

  // The route's rule removed by hand: the report names it before the reconciler puts it back.
  const slot = new SlotTable().assign([S1]).get(S1)!;
  const rule = { family: 4 as const, pref: 22_000, to: '10.92.0.0/16', table: tableOf(slot) };
  await kernel.apply([{ op: 'del', rule }]);
  const drifted = await dp.driftReport();
  assert.equal(drifted.differenceCount, 1);
  assert.deepEqual(drifted.differences, [
    `ip -4 rule add pref 22000 to 10.92.0.0/16 lookup ${tableOf(slot)}`,
  ]);
  assert.equal(drifted.owned.rules, (drifted.wanted?.rules ?? 0) - 1);
  assert.equal(drifted.repairs, 0);

  await dp.settle();
  const repaired = await dp.driftReport();
  assert.equal(repaired.differenceCount, 0);
  assert.equal(repaired.repairs, 1);
  assert.equal(repaired.recentRepairs.length, 1);
  assert.deepEqual(repaired.recentRepairs[0]!.repaired, drifted.differences);
  assert.equal(repaired.lastReconcile?.drift, true);
  assert.equal(repaired.lastReconcile?.changes, 1);
  assert.equal(repaired.reconciles, settled.reconciles + 1);

  // A quiet reconcile changes nothing and repairs nothing.
  await dp.settle();
  const quiet = await dp.driftReport();
  assert.equal(quiet.repairs, 1);
  assert.equal(quiet.lastReconcile?.changes, 0);
  assert.equal(quiet.lastReconcile?.drift, false);
});

it("explain's kernel view: the TUN the kernel answers, the rule the packet matches, the nft lines, the repairs", async () => {
  const { kernel, dp } = started();
  await dp.start(VIEW);
  const slot = new SlotTable().assign([S1]).get(S1)!;
  const tun = `mesh-t${slot}`;
  kernel.answerRouteGet('10.91.7.7', {
    dev: 'veth-c',
    gateway: null,
    prefix: '10.91.7.0/24',
    usable: true,
    operstate: 'UP',
  });
  kernel.answerRouteGet('10.92.1.1', {
    dev: tun,
    gateway: null,
    prefix: '0.0.0.0/0',
    usable: true,
    operstate: 'UNKNOWN',
  });
  const packet = { source: '10.91.7.7', destination: '10.92.1.1', protocol: 'udp' };
  const view = await dp.kernelView(packet, S1);
  assert.equal(view.iif, 'veth-c');
  assert.equal(view.lookup, 'ip route get fibmatch 10.92.1.1 from 10.91.7.7 iif veth-c');
  assert.deepEqual(kernel.routeQueries.slice(-2), [
    { dst: '10.91.7.7' },
    { dst: '10.92.1.1', from: '10.91.7.7', iif: 'veth-c' },
  ]);
  assert.equal(view.service_id, S1);
  assert.equal(view.rule, `pref 22000 to 10.92.0.0/16 lookup ${tableOf(slot)}`);
  assert.deepEqual(view.repairs, []);
  // The tunnel is down (no peer answers here): the refuse lines are met, not TCP's.
  assert.ok(
    view.nft.some((l) => l.startsWith('refuse_forward: ') && l.includes(`"${tun}"`) && l.endsWith('reject')),
    view.nft.join('\n'),
  );
  assert.ok(
    view.nft.every((l) => !/\btcp\b/.test(l)),
    view.nft.join('\n'),
  );

  // The rule removed by hand: the kernel goes elsewhere, and the view names what will repair it.
  await kernel.apply([
    { op: 'del', rule: { family: 4, pref: 22_000, to: '10.92.0.0/16', table: tableOf(slot) } },
  ]);
  kernel.answerRouteGet('10.92.1.1', {
    dev: 'eth0',
    gateway: '10.91.0.254',
    prefix: '0.0.0.0/0',
    usable: true,
    operstate: 'UP',
  });
  const drifted = await dp.kernelView(packet, S1);
  assert.equal(drifted.service_id, null);
  assert.equal(drifted.rule, null);
  assert.deepEqual(drifted.repairs, [`ip -4 rule add pref 22000 to 10.92.0.0/16 lookup ${tableOf(slot)}`]);
  // A source of this host itself: no input interface.
  kernel.answerRouteGet('10.91.0.15', {
    dev: 'eth0',
    gateway: null,
    prefix: '10.91.0.15/32',
    usable: true,
    operstate: 'UP',
    local: true,
  });
  const own = await dp.kernelView({ ...packet, source: '10.91.0.15' }, S1);
  assert.equal(own.iif, null);
  assert.equal(own.lookup, 'ip route get fibmatch 10.92.1.1 from 10.91.0.15');
});
