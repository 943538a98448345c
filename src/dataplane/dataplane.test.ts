// Unit tests of the DataPlane shell without root: the recording kernel (transcript of the real
// command lines, fake TUNs) and the in-memory transport stand in for the kernel and the network.
import assert from 'node:assert/strict';
import net from 'node:net';
import { afterEach, describe, it } from 'node:test';
import { pino } from 'pino';
import { udpV4 } from '../../test/helpers/ip-packets.js';
import { planRoute, planService, S1, S2, S3 } from '../../test/helpers/plan-fixtures.js';
import type { ObservedEvent } from '../domain/observed-event.js';
import { MemoryNetwork, type MemoryTransport, memoryPublicKey } from '../transports/memory.js';
import { StaticPeerDirectory } from '../transports/static-directory.js';
import { DataPlane, type DataPlaneView, type FailoverOptions } from './dataplane.js';
import { canonicalState } from './kernel/canonical.js';
import {
  exitTableOf,
  exitTunAddress,
  MARK_MASK,
  macvlanMac,
  macvlanName,
  markOf,
  RULE_PREF,
  tableOf,
  tunName,
} from './kernel/ownership.js';
import type { KernelState, RouteSpec, RuleSpec } from './kernel/port.js';
import { RecordingKernel, type RecordingTun } from './kernel/recording.js';
import { encodePacket, uuidBytes } from './packet-frames.js';
import type { PlanRoute, PlanService } from './plan.js';
import { SlotTable } from './slots.js';

// Peer ids: the lower id dials (tunnel-keeper.ts). LOCAL is the highest, so in the one-plane
// tests it never dials and its tunnels stay down without any state event (deterministic).
const LOCAL = 'f'.repeat(32);
const P1 = '1'.repeat(32);
const P2 = '2'.repeat(32);
const P3 = '3'.repeat(32);
// Two-plane tests: A is the ingress, B the exit, Z a third peer (lowest id: it dials B itself).
const A = 'a'.repeat(32);
const B = 'b'.repeat(32);
const Z = '0'.repeat(32);

const UNKNOWN = '99999999-9999-4999-8999-999999999999';

const API_PORT = 7480;
const ADDRESSES: Record<string, string> = {
  [LOCAL]: '10.91.0.15',
  [P1]: '10.91.0.1',
  [P2]: '10.91.0.2',
  [P3]: '10.91.0.3',
  [A]: '10.91.0.10',
  [B]: '10.91.0.11',
  [Z]: '10.91.0.12',
};

const svc = planService;
const route = (id: number, serviceId: string, priority: number, dest: string | null): PlanRoute =>
  planRoute(id, serviceId, priority, null, dest);

function view(
  localPeerId: string,
  services: PlanService[],
  routes: PlanRoute[],
  peers: string[] = Object.keys(ADDRESSES),
): DataPlaneView {
  return {
    localPeerId,
    services,
    routes,
    peers: peers.map((id) => ({ id, address: `${ADDRESSES[id]}:${API_PORT}` })),
  };
}

/** The slots the data plane will give these services (SlotTable is pure and deterministic). */
function slotsOf(...ids: string[]): number[] {
  const table = new SlotTable().assign(ids);
  return ids.map((id) => table.get(id)!);
}

function newKernel(extra: Partial<ConstructorParameters<typeof RecordingKernel>[0]> = {}): RecordingKernel {
  return new RecordingKernel({
    foreignLinks: { lo: 65_536, eth0: 1500 },
    sysctls: {
      'net.ipv4.ip_forward': '1',
      'net.ipv6.conf.all.forwarding': '1',
      'net.ipv4.conf.all.rp_filter': '2',
      'net.ipv4.conf.default.rp_filter': '2',
    },
    uplink: { dev: 'eth0', gateway4: '10.91.0.254', gateway6: null },
    ...extra,
  });
}

interface Plane {
  id: string;
  /** The runtime events it reported, in order. */
  events: ObservedEvent[];
  kernel: RecordingKernel;
  transport: MemoryTransport;
  /** The second transport (as `kcp`), when the plane was given a second network. */
  kcp: MemoryTransport | null;
  dp: DataPlane;
}

const live: Plane[] = [];

afterEach(async () => {
  for (const p of live.splice(0)) {
    await p.dp.stop();
    await p.transport.close();
    await p.kcp?.close();
  }
});

function directory(): StaticPeerDirectory {
  const d = new StaticPeerDirectory();
  for (const id of Object.keys(ADDRESSES)) d.set(id, memoryPublicKey(id), 'memory');
  return d;
}

function plane(
  network: MemoryNetwork,
  id: string,
  options: {
    kernel?: RecordingKernel;
    highWaterMark?: number;
    macvlanParent?: string | null;
    reconcileIntervalMs?: number;
    /** A second memory network whose transport plays `kcp`. */
    kcpNetwork?: MemoryNetwork;
    failover?: FailoverOptions;
  } = {},
): Plane {
  const kernel = options.kernel ?? newKernel();
  const transport = network.transport({
    localPeerId: id,
    directory: directory(),
    ...(options.highWaterMark === undefined ? {} : { highWaterMark: options.highWaterMark }),
  });
  const kcp = options.kcpNetwork?.transport({ localPeerId: id, directory: directory() }) ?? null;
  const events: ObservedEvent[] = [];
  const dp = new DataPlane({
    observed: (e) => events.push(e),
    kernel,
    transports: kcp ? { tcp: transport, kcp } : { tcp: transport },
    logger: pino({ level: 'silent' }),
    apiPort: API_PORT,
    macvlanParent: options.macvlanParent ?? null,
    // Large: the timer must not reconcile behind a test's back (unless the test asks for it).
    reconcileIntervalMs: options.reconcileIntervalMs ?? 3_600_000,
    ...(options.failover ? { failover: options.failover } : {}),
  });
  const p = { id, events, kernel, transport, kcp, dp };
  live.push(p);
  return p;
}

/** The events of `type` a plane reported. */
const eventsOf = (p: Plane, type: string) => p.events.filter((e) => e.type === type);

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` (after `step`, if given) until it holds; fails after timeoutMs. */
async function eventually(
  what: string,
  check: () => boolean,
  step?: () => Promise<void>,
  timeoutMs = 5000,
): Promise<void> {
  const start = performance.now();
  for (;;) {
    if (step) await step();
    if (check()) return;
    if (performance.now() - start > timeoutMs) assert.fail(`timed out waiting for: ${what}`);
    await sleep(5);
  }
}

function tunOf(p: Plane, serviceId: string): RecordingTun {
  const name = p.dp.status(serviceId).interface;
  assert.ok(name, `service ${serviceId} has no interface at ${p.id}`);
  const tun = p.kernel.tuns.get(name);
  assert.ok(tun, `no open TUN ${name} at ${p.id}`);
  return tun;
}

const both = <T>(f: (family: 4 | 6) => T): T[] => [f(4), f(6)];

/**
 * What the kernel must hold for the one-plane scenario, written out by hand (not by plan()):
 * `ingress` services LOCAL is the source of (with their routes' destinations), `exits` it is
 * the NAT exit of.
 */
function expectedState(
  ingress: { slot: number; dests: string[] }[],
  exits: number[],
): Omit<KernelState, 'nft'> {
  const all = [...ingress.map((i) => i.slot), ...exits];
  const rules: RuleSpec[] = [];
  const routes: RouteSpec[] = [];
  for (const slot of all) {
    rules.push(
      ...both((family) => ({ family, pref: RULE_PREF.FROM_TUN, iif: tunName(slot), table: 'main' as const })),
    );
    routes.push(...both((family) => ({ family, table: tableOf(slot), dst: 'default', dev: tunName(slot) })));
  }
  for (const slot of exits) {
    rules.push(
      ...both((family) => ({
        family,
        pref: RULE_PREF.REPLY,
        fwmark: { value: markOf(slot), mask: MARK_MASK },
        table: tableOf(slot),
      })),
    );
  }
  let pref = RULE_PREF.ROUTES_FIRST;
  for (const i of ingress)
    for (const to of i.dests) rules.push({ family: 4, pref: pref++, to, table: tableOf(i.slot) });
  if (ingress.some((i) => i.dests.length > 0)) {
    for (const ip of Object.values(ADDRESSES))
      rules.push({ family: 4, pref: RULE_PREF.EXCLUDE, to: `${ip}/32`, table: 'main' });
    rules.push(
      { family: 4, pref: RULE_PREF.EXCLUDE, to: '127.0.0.0/8', table: 'main' },
      { family: 6, pref: RULE_PREF.EXCLUDE, to: '::1/128', table: 'main' },
      ...both((family) => ({
        family,
        pref: RULE_PREF.EXCLUDE,
        ipproto: 'tcp' as const,
        sport: API_PORT,
        table: 'main' as const,
      })),
    );
  }
  return {
    links: all.map((slot) => ({ name: tunName(slot), kind: 'tun' as const, mtu: 1500 })),
    // Exits' TUNs hold their link-local address (ownership.ts exitTunAddress).
    addresses: exits.map((slot) => ({ dev: tunName(slot), cidr: exitTunAddress(slot) })),
    rules,
    routes,
  };
}

async function assertKernel(
  kernel: RecordingKernel,
  expected: Omit<KernelState, 'nft'>,
): Promise<string | null> {
  const observed = await kernel.observe();
  const { nft, ...rest } = canonicalState(observed);
  const { nft: _ignored, ...want } = canonicalState({ ...expected, nft: null });
  assert.deepStrictEqual(rest, want);
  return nft;
}

/** The refuse chains' interface set, or [] when there are no refuse chains. */
function refusedTuns(nft: string | null): string[] {
  const m = nft === null ? null : /oifname \{ ([^}]*) \} meta l4proto tcp reject with tcp reset/.exec(nft);
  return m ? m[1]!.split(', ').map((s) => JSON.parse(s) as string) : [];
}

// The one-plane scenario: LOCAL is the ingress of S1 (to P1, one route) and the NAT exit of S2 (from P2).
const [SLOT1, SLOT2] = slotsOf(S1, S2) as [number, number];
const TUN1 = tunName(SLOT1);
const TUN2 = tunName(SLOT2);
const baseServices = () => [svc(S1, LOCAL, P1), svc(S2, P2, LOCAL)];
const baseRoutes = () => [route(1, S1, 100, '10.92.0.0/16')];
const baseView = () => view(LOCAL, baseServices(), baseRoutes());
const baseExpected = () => expectedState([{ slot: SLOT1, dests: ['10.92.0.0/16'] }], [SLOT2]);

describe('DataPlane with a recording kernel: reconciling', { timeout: 60_000 }, () => {
  it("start() removes a predecessor's state first, then applies the plan for an ingress and an exit", async () => {
    assert.notEqual(SLOT1, SLOT2);
    const kernel = newKernel();
    // A crashed predecessor's state: a MACVLAN, a route through it, a selection rule, a table.
    await kernel.apply([
      { op: 'add', link: { name: 'mesh-m9', kind: 'macvlan', parent: 'eth0', mtu: 1500 } },
      { op: 'add', route: { family: 4, table: tableOf(9), dst: 'default', dev: 'mesh-m9' } },
      { op: 'add', rule: { family: 4, pref: 22_000, to: '10.1.0.0/16', table: tableOf(9) } },
      { op: 'nft', ruleset: '  chain stale {\n  }' },
    ]);
    const mark = kernel.transcript.length;
    const { dp } = plane(new MemoryNetwork(), LOCAL, { kernel });
    await dp.start(baseView());
    const lines = kernel.transcript.slice(mark);

    assert.deepEqual(lines.slice(0, 5), [
      'ip -4 rule del pref 22000',
      `ip -4 route flush table ${tableOf(9)}`,
      'nft table inet mesh_agent {}',
      'nft delete table inet mesh_agent',
      'ip link del mesh-m9',
    ]);
    const applied = lines.slice(5);
    assert.deepEqual(
      applied.filter((l) => / del |flush/.test(l)),
      [],
      'nothing removed after the flush',
    );
    // TUNs set up before the routes through them, rules after routes, the table last.
    assert.deepEqual(
      applied.slice(0, 2).sort(),
      [
        `ip link set ${TUN1} mtu 1500 txqueuelen 1000 up`,
        `ip link set ${TUN2} mtu 1500 txqueuelen 1000 up`,
      ].sort(),
    );
    const expected = baseExpected();
    const routeAdds = applied.filter((l) => / route add /.test(l));
    assert.deepEqual(
      routeAdds.sort(),
      [
        `ip -4 route add default dev ${TUN1} table ${tableOf(SLOT1)}`,
        `ip -4 route add default dev ${TUN2} table ${tableOf(SLOT2)}`,
        `ip -6 route add default dev ${TUN1} table ${tableOf(SLOT1)}`,
        `ip -6 route add default dev ${TUN2} table ${tableOf(SLOT2)}`,
      ].sort(),
    );
    const ruleAdds = applied.filter((l) => / rule add /.test(l));
    assert.equal(ruleAdds.length, expected.rules.length);
    assert.ok(ruleAdds.includes(`ip -4 rule add pref 22000 to 10.92.0.0/16 lookup ${tableOf(SLOT1)}`));
    assert.ok(ruleAdds.includes(`ip -6 rule add pref 21200 iif ${TUN2} lookup main`));
    assert.ok(
      ruleAdds.includes(
        `ip -4 rule add pref 21100 fwmark 0x${markOf(SLOT2).toString(16)}/0x${MARK_MASK.toString(16)} lookup ${tableOf(SLOT2)}`,
      ),
    );
    const lastRoute = applied.findLastIndex((l) => / route add /.test(l));
    assert.ok(lastRoute < applied.findIndex((l) => / rule add /.test(l)));
    assert.deepEqual(applied.slice(-3, -1), [
      'nft table inet mesh_agent {}',
      'nft delete table inet mesh_agent',
    ]);
    assert.match(applied.at(-1)!, /^nft table inet mesh_agent \{\n/);
    // The exit's TUN gets its link-local address (ownership.ts exitTunAddress).
    const addressAdds = applied.filter((l) => / address add /.test(l));
    assert.deepEqual(addressAdds, [`ip address add ${exitTunAddress(SLOT2)} dev ${TUN2} noprefixroute`]);
    assert.equal(
      applied.length,
      2 + addressAdds.length + routeAdds.length + ruleAdds.length + 3,
      'nothing else',
    );

    const nft = (await assertKernel(kernel, expected)) ?? assert.fail('no nft table');
    assert.ok(
      nft.includes(`iifname "${TUN2}" ct mark set 0x${markOf(SLOT2).toString(16).padStart(8, '0')}`),
      nft,
    );
    assert.ok(nft.includes(`iifname "${TUN2}" oifname != "${TUN2}" masquerade`), nft);
    assert.ok(!nft.includes('chain stale'));
    assert.deepEqual([...kernel.tuns.keys()].sort(), [TUN1, TUN2].sort());

    // Both tunnels are down (LOCAL does not dial; nobody dials it): both TUNs are refused.
    assert.deepEqual(refusedTuns(nft).sort(), [TUN1, TUN2].sort());
    // The ingress's verdict on S1: its tunnel never up, unknown, standing aside (owing no hold-down).
    const { health, ...status } = dp.status(S1);
    assert.deepEqual(
      { ...health, since: 0 },
      {
        state: 'unknown',
        reason: null,
        since: 0,
        carrying: false,
        standbyReason: 'unknown',
        holdDownUntil: null,
      },
    );
    assert.ok(Math.abs(health!.since - Date.now()) < 60_000, 'since is wall-clock time');
    assert.deepEqual(status, {
      role: 'ingress',
      state: 'down',
      exit_mode: null,
      interface: TUN1,
      problem: null,
      transparent: null,
      exitStatus: null,
      streams: { open: 0, opened: 0, bytesUp: 0, bytesDown: 0, resets: 0, refused: 0 },
      counters: { packetsSent: 0, bytesSent: 0, packetsReceived: 0, bytesReceived: 0, dropped: 0 },
    });
    assert.equal(dp.status(S2).role, 'exit');
    assert.equal(dp.status(S2).exit_mode, 'nat');
    assert.equal(dp.status(S2).interface, TUN2);
    assert.deepEqual(dp.problems(), []);
    assert.deepEqual(
      dp.tunnelStates().sort((x, y) => x.peerId.localeCompare(y.peerId)),
      [
        { peerId: P1, transport: 'tcp', up: false },
        { peerId: P2, transport: 'tcp', up: false },
      ].sort((x, y) => x.peerId.localeCompare(y.peerId)),
    );
  });

  it('update(): an unchanged view applies nothing, a new route only its rule, a removed service goes with its TUN', async () => {
    const { dp, kernel, transport } = plane(new MemoryNetwork(), LOCAL);
    await dp.start(baseView());
    const tun2 = kernel.tuns.get(TUN2)!;

    let mark = kernel.transcript.length;
    dp.update(baseView());
    await dp.settle();
    assert.deepEqual(kernel.transcript.slice(mark), [], 'an equal view changes nothing');

    mark = kernel.transcript.length;
    const routes = [...baseRoutes(), route(2, S1, 200, '10.93.0.0/16')];
    dp.update(view(LOCAL, baseServices(), routes));
    await dp.settle();
    assert.deepEqual(kernel.transcript.slice(mark), [
      `ip -4 rule add pref 22001 to 10.93.0.0/16 lookup ${tableOf(SLOT1)}`,
    ]);

    mark = kernel.transcript.length;
    dp.update(view(LOCAL, [svc(S1, LOCAL, P1)], routes));
    await dp.settle();
    assert.ok(tun2.closed, "the removed service's TUN is closed");
    assert.deepEqual([...kernel.tuns.keys()], [TUN1]);
    const lines = kernel.transcript.slice(mark);
    // Its routes went with the TUN; its rules and its part of the table are removed.
    const hexMark = `0x${markOf(SLOT2).toString(16)}`;
    assert.deepEqual(
      lines.filter((l) => !l.startsWith('nft ')).sort(),
      [
        `ip -4 rule del pref 21100 fwmark ${hexMark}/0x${MARK_MASK.toString(16)} lookup ${tableOf(SLOT2)}`,
        `ip -4 rule del pref 21200 iif ${TUN2} lookup main`,
        `ip -6 rule del pref 21100 fwmark ${hexMark}/0x${MARK_MASK.toString(16)} lookup ${tableOf(SLOT2)}`,
        `ip -6 rule del pref 21200 iif ${TUN2} lookup main`,
      ].sort(),
    );
    assert.equal(lines.filter((l) => l.startsWith('nft ')).length, 3, 'the table replaced once');
    const nft = await assertKernel(
      kernel,
      expectedState([{ slot: SLOT1, dests: ['10.92.0.0/16', '10.93.0.0/16'] }], []),
    );
    assert.ok(nft !== null && !nft.includes(TUN2) && !nft.includes('masquerade'), nft ?? 'null');
    assert.deepEqual(dp.status(S2), {
      role: 'none',
      state: 'inactive',
      exit_mode: null,
      interface: null,
      problem: null,
      transparent: null,
      health: null,
      exitStatus: null,
      streams: { open: 0, opened: 0, bytesUp: 0, bytesDown: 0, resets: 0, refused: 0 },
      counters: { packetsSent: 0, bytesSent: 0, packetsReceived: 0, bytesReceived: 0, dropped: 0 },
    });
    assert.equal(transport.tunnel(P2), undefined, "the tunnel to the removed service's peer is released");
    assert.ok(transport.tunnel(P1));

    // Nothing carried any more: everything owned is gone, the table too.
    mark = kernel.transcript.length;
    dp.update(view(LOCAL, [svc(S1, LOCAL, P1, { isActive: false })], routes));
    await dp.settle();
    assert.deepEqual(await kernel.observe(), { links: [], addresses: [], rules: [], routes: [], nft: null });
    assert.equal(kernel.tuns.size, 0);
    assert.equal(dp.status(S1).state, 'inactive');
    assert.equal(transport.tunnel(P1), undefined);
  });

  it('a deleted service takes its counters with it; one that only stops being carried here keeps them', async () => {
    const { dp, kernel } = plane(new MemoryNetwork(), LOCAL);
    await dp.start(baseView());
    // The tunnels are down: a packet read from each TUN is dropped and counted.
    const drop = (tun: string) =>
      kernel.tuns.get(tun)!.inject([udpV4('10.91.9.1', '10.92.0.5', 4000, 53, Buffer.alloc(10))]);
    drop(TUN1);
    drop(TUN2);
    assert.deepEqual([...dp.allCounters().keys()].sort(), [S1, S2].sort());
    assert.deepEqual([...dp.serviceDrops().keys()].sort(), [S1, S2].sort());

    // S1 inactive (still in the cluster), S2 deleted.
    dp.update(view(LOCAL, [svc(S1, LOCAL, P1, { isActive: false })], baseRoutes()));
    await dp.settle();
    assert.deepEqual([...dp.allCounters().keys()], [S1]);
    assert.deepEqual([...dp.serviceDrops().keys()], [S1]);
    assert.equal(dp.status(S1).counters.dropped, 1, 'kept while the service exists');
    assert.equal(dp.status(S2).counters.dropped, 0);
  });

  it('update()s in quick succession coalesce: the last view is applied, a view overtaken while queued never', async () => {
    const { dp, kernel } = plane(new MemoryNetwork(), LOCAL);
    await dp.start(baseView());
    const mark = kernel.transcript.length;
    dp.update(view(LOCAL, baseServices(), [...baseRoutes(), route(2, S1, 200, '10.93.0.0/16')]));
    dp.update(view(LOCAL, baseServices(), [...baseRoutes(), route(3, S1, 200, '10.94.0.0/16')]));
    dp.update(view(LOCAL, baseServices(), [...baseRoutes(), route(4, S1, 200, '10.95.0.0/16')]));
    await dp.settle();
    assert.ok(
      !kernel.transcript.slice(mark).some((l) => l.includes('10.94.0.0/16')),
      'the middle view was skipped',
    );
    await assertKernel(
      kernel,
      expectedState([{ slot: SLOT1, dests: ['10.92.0.0/16', '10.95.0.0/16'] }], [SLOT2]),
    );
  });

  it('a service whose other end changes gets a new TUN of the same name, its routes again, its counters kept', async () => {
    const { dp, kernel, transport } = plane(new MemoryNetwork(), LOCAL);
    await dp.start(baseView());
    const before = kernel.tuns.get(TUN1)!;
    // The tunnel is down: a packet read from the TUN is dropped and counted.
    before.inject([udpV4('10.91.9.1', '10.92.0.5', 4000, 53, Buffer.alloc(10))]);
    assert.equal(dp.status(S1).counters.dropped, 1);
    assert.equal(dp.dropCounts().get('tunnel_down'), 1);

    const mark = kernel.transcript.length;
    dp.update(view(LOCAL, [svc(S1, LOCAL, P3), svc(S2, P2, LOCAL)], baseRoutes()));
    await dp.settle();
    const after = kernel.tuns.get(TUN1)!;
    assert.ok(before.closed);
    assert.notEqual(after, before);
    assert.ok(!after.closed && !after.detached);
    assert.deepEqual(kernel.transcript.slice(mark).sort(), [
      `ip -4 route add default dev ${TUN1} table ${tableOf(SLOT1)}`,
      `ip -6 route add default dev ${TUN1} table ${tableOf(SLOT1)}`,
      `ip link set ${TUN1} mtu 1500 txqueuelen 1000 up`,
    ]);
    await assertKernel(kernel, baseExpected());
    assert.equal(dp.status(S1).counters.dropped, 1, 'counters survive the TUN being re-opened');
    assert.equal(transport.tunnel(P1), undefined);
    assert.ok(transport.tunnel(P3));
  });

  it('repairs drift: owned state changed behind its back is put back at the next settle', async () => {
    const p = plane(new MemoryNetwork(), LOCAL);
    const { dp, kernel } = p;
    await dp.start(baseView());
    assert.deepEqual(eventsOf(p, 'dataplane.drift_repaired'), [], 'the first apply is no repair');
    const expected = baseExpected();
    const nftBefore = await assertKernel(kernel, expected);

    await kernel.apply([
      { op: 'del', rule: { family: 4, pref: 22_000, to: '10.92.0.0/16', table: tableOf(SLOT1) } },
      { op: 'add', rule: { family: 4, pref: 22_500, to: '10.50.0.0/16', table: tableOf(SLOT1) } },
      { op: 'del', route: { family: 6, table: tableOf(SLOT2), dst: 'default', dev: TUN2 } },
      { op: 'nft', ruleset: '  chain other {\n  }' },
    ]);
    const mark = kernel.transcript.length;
    await dp.settle();
    const lines = kernel.transcript.slice(mark);
    // The stray rule goes after the wanted one is back (never a moment with neither).
    assert.deepEqual(lines.slice(0, 4), [
      `ip -6 route add default dev ${TUN2} table ${tableOf(SLOT2)}`,
      `ip -4 rule add pref 22000 to 10.92.0.0/16 lookup ${tableOf(SLOT1)}`,
      `ip -4 rule del pref 22500 to 10.50.0.0/16 lookup ${tableOf(SLOT1)}`,
      'nft table inet mesh_agent {}',
    ]);
    assert.equal(lines.length, 6);
    assert.equal(await assertKernel(kernel, expected), nftBefore);
    // One event for the repair, naming what it ran (the nftables table by name only).
    const [repair, ...more] = eventsOf(p, 'dataplane.drift_repaired');
    assert.deepEqual(more, []);
    assert.deepEqual(repair!.resource, { kind: 'agent', id: LOCAL });
    assert.equal(repair!.data.changes, 4);
    assert.deepEqual(repair!.data.repaired, [
      `ip -6 route add default dev ${TUN2} table ${tableOf(SLOT2)}`,
      `ip -4 rule add pref 22000 to 10.92.0.0/16 lookup ${tableOf(SLOT1)}`,
      `ip -4 rule del pref 22500 to 10.50.0.0/16 lookup ${tableOf(SLOT1)}`,
      'nft: table replaced',
    ]);

    // The table deleted outright comes back too; a repaired state is then left alone.
    await kernel.apply([{ op: 'nft', ruleset: null }]);
    await dp.settle();
    assert.equal(await assertKernel(kernel, expected), nftBefore);
    const quiet = kernel.transcript.length;
    await dp.settle();
    assert.equal(kernel.transcript.length, quiet);
    assert.equal(
      eventsOf(p, 'dataplane.drift_repaired').length,
      2,
      'one per repair, none for a quiet reconcile',
    );
    assert.equal(dp.driftRepairCount(), 2);

    // A change of the view is applied, and is no drift.
    dp.update(view(LOCAL, baseServices(), [...baseRoutes(), route(2, S1, 200, '10.93.0.0/16')]));
    await dp.settle();
    assert.ok(kernel.transcript.length > quiet);
    assert.equal(eventsOf(p, 'dataplane.drift_repaired').length, 2);
  });

  it('repairs a TUN link deleted behind its back (ip link del mesh-tN): the TUN is re-opened', async () => {
    const p = plane(new MemoryNetwork(), LOCAL);
    const { dp, kernel } = p;
    await dp.start(baseView());
    const old = kernel.tuns.get(TUN1)!;
    await kernel.apply([{ op: 'del', link: { name: TUN1, kind: 'tun', mtu: 1500 } }]);
    assert.ok(old.detached);
    await dp.settle();
    assert.deepEqual(dp.problems(), []);
    const now = kernel.tuns.get(TUN1);
    assert.ok(now && now !== old && !now.detached, 'a new TUN device is open');
    await assertKernel(kernel, baseExpected());
    assert.equal(eventsOf(p, 'dataplane.drift_repaired').length, 1);
  });

  it("a view that arrives while start removes a predecessor's state waits for it: nothing opened is removed", async () => {
    const kernel = newKernel();
    // The removal of a killed predecessor's state takes a while (many rules and routes).
    let removed!: () => void;
    const gate = new Promise<void>((resolve) => {
      removed = resolve;
    });
    const flush = kernel.flush.bind(kernel);
    kernel.flush = async () => {
      await gate;
      await flush();
    };
    const { dp } = plane(new MemoryNetwork(), LOCAL, { kernel });
    const starting = dp.start(view(LOCAL, [svc(S1, LOCAL, P1)], baseRoutes()));
    // The cluster delivers a newer view (a write made while this agent was down) meanwhile.
    dp.update(baseView());
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(kernel.tuns.size, 0, 'nothing opened before the old state is gone');
    removed();
    await starting;
    await dp.settle();
    assert.equal(dp.tunFailureCount(), 0);
    for (const tun of kernel.tuns.values()) assert.ok(!tun.detached && !tun.closed);
    await assertKernel(kernel, baseExpected());
  });

  it('keeps the answers for peer host names only while a peer uses the name', async () => {
    const { dp } = plane(new MemoryNetwork(), LOCAL);
    const named = baseView();
    named.peers = [...named.peers, { id: 'd'.repeat(32), address: `localhost:${API_PORT}` }];
    await dp.start(named);
    assert.equal(dp.footprint().peer_names, 1);
    dp.update(baseView());
    await dp.settle();
    assert.equal(dp.footprint().peer_names, 0);
  });

  it('a TUN whose device fails under it is made again at once, counted, and set up again', async () => {
    const { dp, kernel } = plane(new MemoryNetwork(), LOCAL);
    await dp.start(baseView());
    const old = kernel.tuns.get(TUN1)!;
    const other = kernel.tuns.get(TUN2)!;
    await kernel.apply([{ op: 'del', link: { name: TUN1, kind: 'tun', mtu: 1500 } }]);
    // The device's poll reports the failure on a later turn; the data plane opens it again then,
    // before any reconcile of its own.
    await new Promise((resolve) => setImmediate(resolve));
    const now = kernel.tuns.get(TUN1);
    assert.ok(now && now !== old && !now.detached && old.closed, 'a new TUN device is open');
    assert.equal(dp.tunFailureCount(), 1);
    await dp.settle();
    await assertKernel(kernel, baseExpected());
    assert.deepEqual(dp.problems(), []);
    // The other service's TUN never noticed.
    assert.equal(kernel.tuns.get(TUN2), other);
    assert.ok(!other.closed && !other.detached);
    assert.equal(dp.tunFailureCount(), 1);
  });

  it('a kernel apply failure shows in status(id).problem and problems(), and the next settle retries', async () => {
    const kernel = newKernel();
    kernel.failOn(`rule add pref 22000 to 10.92.0.0/16`);
    const { dp } = plane(new MemoryNetwork(), LOCAL, { kernel });
    await dp.start(baseView());
    const problem = dp.status(S1).problem;
    assert.match(
      problem ?? '',
      /ip -4 rule add pref 22000 to 10\.92\.0\.0\/16 .*: RTNETLINK answers: Operation not permitted/,
    );
    assert.equal(dp.status(S1).state, 'error');
    // The error is the data plane's, so every carried service shows it.
    assert.equal(dp.status(S2).problem, problem);
    assert.deepEqual(dp.problems(), [problem]);

    await dp.settle();
    assert.deepEqual(dp.problems(), []);
    assert.equal(dp.status(S1).problem, null);
    assert.equal(dp.status(S1).state, 'down');
    await assertKernel(kernel, baseExpected());
  });

  it('a failed apply is retried by the reconcile timer too', async () => {
    const kernel = newKernel();
    kernel.failOn('nft table inet mesh_agent {\n');
    const { dp } = plane(new MemoryNetwork(), LOCAL, { kernel, reconcileIntervalMs: 20 });
    await dp.start(baseView());
    assert.equal(dp.problems().length, 1);
    assert.equal((await kernel.observe()).nft, null, 'the nft transaction failed whole');
    await eventually('the timer repaired it', () => dp.problems().length === 0);
    await dp.settle();
    const nft = await assertKernel(kernel, baseExpected());
    assert.deepEqual(refusedTuns(nft).sort(), [TUN1, TUN2].sort());
  });

  it("recovers when an apply fails at a freshly opened TUN's link-up line", async () => {
    const kernel = newKernel();
    kernel.failOn(`link set ${TUN1} mtu`);
    const { dp } = plane(new MemoryNetwork(), LOCAL, { kernel });
    await dp.start(baseView());
    assert.equal(dp.problems().length, 1);
    await dp.settle();
    await dp.settle();
    assert.deepEqual(dp.problems(), []);
    await assertKernel(kernel, baseExpected());
  });

  it('a failing flush at start is reported, and the first reconcile removes the stale state anyway', async () => {
    const kernel = newKernel();
    await kernel.apply([
      { op: 'add', rule: { family: 4, pref: 22_000, to: '10.1.0.0/16', table: tableOf(9) } },
    ]);
    kernel.failOn('rule del pref 22000');
    const { dp } = plane(new MemoryNetwork(), LOCAL, { kernel });
    await dp.start(baseView());
    assert.deepEqual(dp.problems(), [], 'the reconcile after it succeeded');
    await assertKernel(kernel, baseExpected());
  });

  it('a host that does not forward is a problem of every carried service', async () => {
    const kernel = newKernel({
      sysctls: { 'net.ipv4.ip_forward': '0', 'net.ipv6.conf.all.forwarding': '1' },
    });
    const { dp } = plane(new MemoryNetwork(), LOCAL, { kernel });
    await dp.start(baseView());
    assert.equal(dp.problems().length, 1);
    assert.match(dp.problems()[0]!, /net\.ipv4\.ip_forward is 0/);
    assert.equal(dp.status(S1).state, 'error');
    assert.match(dp.status(S2).problem ?? '', /ip_forward/);
    kernel.sysctls.set('net.ipv4.ip_forward', '1');
    await dp.settle();
    assert.deepEqual(dp.problems(), []);
    assert.equal(dp.status(S1).problem, null);
  });

  it('IPv6 forwarding matters only once a route selects IPv6', async () => {
    const kernel = newKernel({
      sysctls: { 'net.ipv4.ip_forward': '1', 'net.ipv6.conf.all.forwarding': '0' },
    });
    const { dp } = plane(new MemoryNetwork(), LOCAL, { kernel });
    await dp.start(baseView()); // IPv4 routes only
    assert.deepEqual(dp.problems(), []);
    dp.update(view(LOCAL, baseServices(), [...baseRoutes(), route(2, S1, 100, 'fd92::/64')]));
    await dp.settle();
    assert.equal(dp.problems().length, 1);
    assert.match(dp.problems()[0]!, /net\.ipv6\.conf\.all\.forwarding is 0/);
    await dp.stop();
  });

  it('a MACVLAN exit: the MACVLAN on the uplink with its address and table; without an uplink, a problem', async () => {
    const S = svc(S2, P2, LOCAL, { requiresInterface: true, desiredIpv4Cidr: '10.91.0.50/24' });
    const [slot] = slotsOf(S2) as [number];
    const { dp, kernel } = plane(new MemoryNetwork(), LOCAL);
    await dp.start(view(LOCAL, [S], []));
    const observed = await kernel.observe();
    assert.deepEqual(
      observed.links.find((l) => l.kind === 'macvlan'),
      { name: macvlanName(slot), kind: 'macvlan', parent: 'eth0', mac: macvlanMac(S2), mtu: 1500 },
    );
    assert.deepEqual(observed.addresses, [
      { dev: tunName(slot), cidr: exitTunAddress(slot) },
      { dev: macvlanName(slot), cidr: '10.91.0.50/24' },
    ]);
    assert.ok(
      observed.routes.some(
        (r) => r.table === exitTableOf(slot) && r.dst === 'default' && r.via === '10.91.0.254',
      ),
    );
    assert.equal(dp.status(S2).exit_mode, 'macvlan');
    assert.equal(dp.status(S2).problem, null);

    const bare = newKernel({ uplink: null });
    const other = plane(new MemoryNetwork(), LOCAL, { kernel: bare });
    await other.dp.start(view(LOCAL, [S], []));
    assert.match(other.dp.status(S2).problem ?? '', /requires_interface/);
    assert.equal(other.dp.status(S2).state, 'error');
    assert.ok(!(await bare.observe()).links.some((l) => l.kind === 'macvlan'));
  });
});

describe('DataPlane with a recording kernel: stop()', { timeout: 60_000 }, () => {
  it('closes the TUNs, releases the tunnels, flushes, and does nothing after', async () => {
    const { dp, kernel, transport } = plane(new MemoryNetwork(), LOCAL);
    await dp.start(baseView());
    const tuns = [...kernel.tuns.values()];
    const rules = (await kernel.observe()).rules.length;
    const mark = kernel.transcript.length;
    await dp.stop();
    assert.ok(tuns.length === 2 && tuns.every((t) => t.closed));
    assert.equal(transport.tunnel(P1), undefined);
    assert.equal(transport.tunnel(P2), undefined);
    const lines = kernel.transcript.slice(mark);
    // The TUNs took their routes along; the rules and the table are flushed.
    assert.equal(lines.filter((l) => /^ip -[46] rule del pref \d+$/.test(l)).length, rules);
    assert.deepEqual(lines.slice(rules), [
      'nft table inet mesh_agent {}',
      'nft delete table inet mesh_agent',
    ]);
    assert.deepEqual(await kernel.observe(), { links: [], addresses: [], rules: [], routes: [], nft: null });
    assert.equal(dp.status(S1).state, 'inactive');

    const quiet = kernel.transcript.length;
    dp.update(baseView());
    await dp.settle();
    assert.equal(kernel.transcript.length, quiet, 'a stopped data plane does not reconcile');
    assert.equal(kernel.tuns.size, 0);
  });
});

describe('DataPlane with a memory network: tunnels and packets', { timeout: 60_000 }, () => {
  // S1: A -> B (A ingress, B exit); S3: Z -> B (B exit; Z runs no data plane, only a transport).
  const services = () => [svc(S1, A, B), svc(S3, Z, B)];
  const routes = () => [route(1, S1, 100, '10.92.0.0/16')];
  const ping = (n: number, size = 40) => udpV4('10.91.9.1', '10.92.0.5', 4000 + n, 53, Buffer.alloc(size, n));

  /** A (ingress) and B (exit) on one memory network, both started with S1 and S2, S1 up at both. */
  async function twoPlanesUp(aOptions: Parameters<typeof plane>[2] = {}) {
    const network = new MemoryNetwork();
    const a = plane(network, A, aOptions);
    const b = plane(network, B);
    await Promise.all([a.dp.start(view(A, services(), routes())), b.dp.start(view(B, services(), routes()))]);
    await bothUp(a, b);
    return { network, a, b };
  }

  async function bothUp(a: Plane, b: Plane): Promise<void> {
    await eventually(
      'S1 up at both ends',
      () => a.dp.status(S1).state === 'up' && b.dp.status(S1).state === 'up',
      async () => {
        await a.dp.settle();
        await b.dp.settle();
      },
    );
  }

  it("refuses a service's traffic while its tunnel is down, not once it is up; status follows", async () => {
    const network = new MemoryNetwork();
    const a = plane(network, A);
    await a.dp.start(view(A, services(), routes()));
    // B is not on the network yet: A's dials fail and it keeps redialing.
    const tunA = tunOf(a, S1);
    assert.deepEqual(refusedTuns((await a.kernel.observe()).nft), [tunA.name]);
    assert.ok(['down', 'connecting'].includes(a.dp.status(S1).state), a.dp.status(S1).state);
    tunA.inject([ping(1)]);
    assert.equal(a.dp.dropCounts().get('tunnel_down'), 1);
    assert.equal(a.dp.status(S1).counters.packetsSent, 0);

    // Seen from the transport's own 'state' listener (after the data plane's): up, still refusing.
    const seen: string[] = [];
    a.transport.on('state', (peer, state) => {
      if (peer === B && state === 'up') seen.push(a.dp.status(S1).state);
    });
    const b = plane(network, B);
    await b.dp.start(view(B, services(), routes()));
    await bothUp(a, b);
    assert.equal(seen[0], 'connecting', 'not up before the kernel stopped refusing');
    assert.deepEqual(refusedTuns((await a.kernel.observe()).nft), []);
    // At B, S1 is up and no longer refused; S3's peer Z is not connected, so S3 still is.
    const nftB = (await b.kernel.observe()).nft;
    assert.deepEqual(refusedTuns(nftB), [tunOf(b, S3).name]);
    assert.ok(nftB?.includes('chain refuse_forward') && nftB.includes('chain refuse_output'));
    assert.deepEqual(a.dp.tunnelStates(), [{ peerId: B, transport: 'tcp', up: true }]);
    // What mesh_tunnel_rtt_seconds reports: the kept tunnel's own measure; none without one.
    assert.equal(a.dp.tunnelRttMs(B, 'tcp'), a.transport.tunnel(B)?.stats().lastRttMs ?? null);
    assert.equal(a.dp.tunnelRttMs(B, 'kcp'), null);

    // The pair stops hearing each other: refused again, then up again once healed.
    network.partition(A, B);
    let nftA: string | null = null;
    await eventually(
      'S1 refused again at A',
      () => a.dp.status(S1).state !== 'up' && refusedTuns(nftA).includes(tunA.name),
      async () => {
        await a.dp.settle();
        nftA = (await a.kernel.observe()).nft;
      },
    );
    network.heal(A, B);
    await bothUp(a, b);
    assert.deepEqual(refusedTuns((await a.kernel.observe()).nft), []);
  });

  it('failover: a service whose tunnel dies stands aside for the next route, and takes it back after the hold-down', async () => {
    // S1: A -> B, priority 100; S3: A -> Z, priority 200, the same destination.
    const failover = { intervalMs: 20, misses: 3, holdDownMs: 600 };
    const services = [svc(S1, A, B), svc(S3, A, Z)];
    const routes = [route(1, S1, 100, '10.92.0.0/16'), route(2, S3, 200, '10.92.0.0/16')];
    const network = new MemoryNetwork();
    const a = plane(network, A, { failover });
    const b = plane(network, B, { failover });
    const z = plane(network, Z, { failover });
    await Promise.all([
      a.dp.start(view(A, services, routes)),
      b.dp.start(view(B, services, routes)),
      z.dp.start(view(Z, services, routes)),
    ]);
    const first = async () => {
      await a.dp.settle();
      const rules = (await a.kernel.observe()).rules.filter(
        (r) => r.family === 4 && r.pref >= RULE_PREF.ROUTES_FIRST,
      );
      return rules.sort((x, y) => x.pref - y.pref)[0]?.table;
    };
    const tableOfService = (id: string) => tableOf(Number(a.dp.status(id).interface!.slice('mesh-t'.length)));
    const S1_TABLE = tableOfService(S1);
    const S3_TABLE = tableOfService(S3);
    await eventually(
      'both carrying',
      () => a.dp.healthOf(S1)?.carrying === true && a.dp.healthOf(S3)?.carrying === true,
    );
    assert.equal(await first(), S1_TABLE);

    network.partition(A, B);
    await eventually('S1 stands aside', () => a.dp.healthOf(S1)?.carrying === false);
    assert.equal(a.dp.healthOf(S1)?.reason, 'tunnel_silent');
    let aside: string | number | undefined;
    await eventually(
      'the next route carries',
      () => aside === S3_TABLE,
      async () => {
        aside = await first();
      },
    );

    network.heal(A, B);
    await eventually('S1 healthy again', () => a.dp.healthOf(S1)?.state === 'healthy');
    const healthyAt = performance.now();
    assert.equal(a.dp.healthOf(S1)?.standbyReason, 'hold_down');
    assert.equal(await first(), S3_TABLE, 'not before the hold-down');
    // The verdict turns at the deadline; the routes follow at the next judgement.
    let table: string | number | undefined;
    await eventually(
      "S1's route first again",
      () => table === S1_TABLE,
      async () => {
        table = await first();
      },
    );
    assert.ok(performance.now() - healthyAt >= failover.holdDownMs * 0.9, 'the hold-down was waited out');
    assert.equal(a.dp.healthChangeCounts().get('tunnel_silent'), 1);

    // The events: S1's health at each change (the first, healthy, is the one the log's default
    // absorbs: runtime-events.ts), one failover each way, none at start.
    assert.deepEqual(
      eventsOf(a, 'service.health_changed')
        .filter((e) => e.resource.id === S1)
        .map((e) => [e.data.state, e.data.reason]),
      [
        ['healthy', null],
        ['unhealthy', 'tunnel_silent'],
        ['healthy', null],
      ],
    );
    assert.deepEqual(
      eventsOf(a, 'service.failover').map((e) => [e.resource.id, e.data]),
      [
        [
          S1,
          {
            from_service: S1,
            to_service: S3,
            reason: 'tunnel_silent',
            routes: [{ id: 1, source_cidr: null, dest_cidr: '10.92.0.0/16' }],
          },
        ],
        [
          S1,
          {
            from_service: S3,
            to_service: S1,
            reason: 'healthy',
            routes: [{ id: 1, source_cidr: null, dest_cidr: '10.92.0.0/16' }],
          },
        ],
      ],
    );
    // Tunnels: each up at start, then up and down in turn.
    for (const peer of [B, Z]) {
      const states = a.events.filter((e) => e.resource.id === peer).map((e) => e.type);
      assert.equal(states[0], 'tunnel.up', `${peer}: ${states}`);
      assert.deepEqual(
        states,
        states.map((_, i) => (i % 2 === 0 ? 'tunnel.up' : 'tunnel.down')),
      );
      assert.deepEqual(a.events.find((e) => e.resource.id === peer)?.data, {
        peer_id: peer,
        transport: 'tcp',
      });
    }
  });

  it("failover: the exit's own route check, told to the ingress: no route, a LAN route gone, back", async () => {
    const failover = { intervalMs: 20, misses: 3, holdDownMs: 0 };
    const network = new MemoryNetwork();
    const a = plane(network, A, { failover });
    const b = plane(network, B, { failover });
    const lan = { dev: 'lan0', gateway: null, prefix: '10.92.0.0/16', usable: true, operstate: 'UP' };
    b.kernel.answerRouteGet('10.92.0.1', lan);
    await Promise.all([a.dp.start(view(A, services(), routes())), b.dp.start(view(B, services(), routes()))]);
    await bothUp(a, b);
    await eventually('S1 healthy', () => a.dp.healthOf(S1)?.state === 'healthy');
    assert.ok(
      b.kernel.routeQueries.some((q) => q.dst === '10.92.0.1'),
      'the exit asked about the destination',
    );

    // No route at all toward the destination.
    b.kernel.answerRouteGet('10.92.0.1', null);
    await eventually('S1 stands aside: exit_no_route', () => a.dp.healthOf(S1)?.reason === 'exit_no_route');
    assert.equal(a.dp.healthOf(S1)?.carrying, false);
    b.kernel.answerRouteGet('10.92.0.1', lan);
    await eventually('S1 carries again', () => a.dp.healthOf(S1)?.carrying === true);
    // The LAN's route gone, the lookup falling through to the default route: no route either.
    b.kernel.answerRouteGet('10.92.0.1', { ...lan, dev: 'eth0', gateway: '192.0.2.1', prefix: '0.0.0.0/0' });
    await eventually('S1 stands aside again', () => a.dp.healthOf(S1)?.reason === 'exit_no_route');
    b.kernel.answerRouteGet('10.92.0.1', lan);
    await eventually('S1 carries once more', () => a.dp.healthOf(S1)?.carrying === true);
    // A device without carrier: the route is there, the link is not.
    b.kernel.answerRouteGet('10.92.0.1', { ...lan, usable: false, operstate: 'LOWERLAYERDOWN' });
    await eventually('S1 stands aside a third time', () => a.dp.healthOf(S1)?.reason === 'exit_no_route');
    assert.equal(a.dp.healthChangeCounts().get('exit_no_route'), 3);
  });

  it("failover: the exit's probe (health_check), told to the ingress: fails after its failures in a row, passes again", async () => {
    const failover = { intervalMs: 20, misses: 3, holdDownMs: 0 };
    const target = net.createServer((s) => s.destroy());
    await new Promise<void>((resolve) => target.listen(0, '127.0.0.1', resolve));
    const port = (target.address() as net.AddressInfo).port;
    const probed = {
      ...svc(S1, A, B),
      healthCheck: {
        kind: 'tcp' as const,
        target: `127.0.0.1:${port}`,
        address: '127.0.0.1',
        family: 4 as const,
        port,
        intervalMs: 100,
        failures: 2,
      },
    };
    const network = new MemoryNetwork();
    const a = plane(network, A, { failover });
    const b = plane(network, B, { failover });
    await Promise.all([a.dp.start(view(A, [probed], routes())), b.dp.start(view(B, [probed], routes()))]);
    await bothUp(a, b);
    await eventually('the probe passes', () => b.dp.status(S1).exitStatus?.probePassing === true);
    assert.equal(a.dp.healthOf(S1)?.carrying, true);

    await new Promise((resolve) => target.close(resolve));
    await eventually('S1 stands aside: probe_failed', () => a.dp.healthOf(S1)?.reason === 'probe_failed');
    assert.match(b.dp.status(S1).exitStatus?.detail ?? '', /ECONNREFUSED/);
    await new Promise<void>((resolve) => target.listen(port, '127.0.0.1', resolve));
    await eventually('S1 carries again', () => a.dp.healthOf(S1)?.carrying === true);
    target.close();
  });

  it('carries packets between the TUNs of two data planes both ways, in one TUN write per batch, with counters', async () => {
    const { a, b } = await twoPlanesUp();
    const tunA = tunOf(a, S1);
    const tunB = tunOf(b, S1);
    const writes: number[] = [];
    const write = tunB.write.bind(tunB);
    tunB.write = (packets) => {
      writes.push(packets.length);
      return write(packets);
    };

    const out = [ping(1, 10), ping(2, 1400), ping(3, 0), ping(4, 100), ping(5, 60)];
    tunA.inject(out);
    await eventually('5 packets at B', () => tunB.written.length === 5);
    assert.deepEqual(tunB.written, out);
    assert.deepEqual(writes, [5], 'one TUN write for the batch');
    const bytes = out.reduce((n, p) => n + p.length, 0);
    assert.deepEqual(a.dp.status(S1).counters, {
      packetsSent: 5,
      bytesSent: bytes,
      packetsReceived: 0,
      bytesReceived: 0,
      dropped: 0,
    });
    assert.deepEqual(b.dp.status(S1).counters, {
      packetsSent: 0,
      bytesSent: 0,
      packetsReceived: 5,
      bytesReceived: bytes,
      dropped: 0,
    });

    const back = [udpV4('10.92.0.5', '10.91.9.1', 53, 4001, Buffer.from('reply'))];
    tunB.inject(back);
    await eventually('the reply at A', () => tunA.written.length === 1);
    assert.deepEqual(tunA.written, back);
    assert.equal(b.dp.status(S1).counters.packetsSent, 1);
    assert.equal(a.dp.status(S1).counters.packetsReceived, 1);
    assert.equal(a.dp.status(S1).counters.bytesReceived, back[0]!.length);
    assert.deepEqual(a.dp.allCounters().get(S1), a.dp.status(S1).counters);
    assert.equal(a.dp.dropCounts().size, 0);
    assert.equal(b.dp.dropCounts().size, 0);

    // A TUN that takes fewer packets than written: the rest are counted as tun_write drops.
    tunB.writeLimit = 1;
    tunA.inject([ping(6), ping(7), ping(8)]);
    await eventually('the partial write counted', () => (b.dp.dropCounts().get('tun_write') ?? 0) === 2);
    assert.equal(tunB.written.length, 6);
    assert.equal(b.dp.status(S1).counters.dropped, 2);
  });

  it("carries each service over its own transport_type's tunnel, and drops its packets from the other transport; a transport the agent lacks is the service's problem", async () => {
    const tcpNet = new MemoryNetwork();
    const kcpNet = new MemoryNetwork();
    const kcpServices = () => [svc(S1, A, B, { transportType: 'kcp' }), svc(S3, Z, B)];
    const a = plane(tcpNet, A, { kcpNetwork: kcpNet });
    const b = plane(tcpNet, B, { kcpNetwork: kcpNet });
    await Promise.all([
      a.dp.start(view(A, kcpServices(), routes())),
      b.dp.start(view(B, kcpServices(), routes())),
    ]);
    await bothUp(a, b);
    // S1 (kcp) keeps a kcp tunnel between A and B, and no tcp one.
    assert.deepEqual(a.dp.tunnelStates(), [{ peerId: B, transport: 'kcp', up: true }]);
    assert.equal(a.transport.tunnel(B), undefined);
    const tunA = tunOf(a, S1);
    const tunB = tunOf(b, S1);
    tunA.inject([ping(1)]);
    await eventually('the packet at B over kcp', () => tunB.written.length === 1);
    assert.equal(a.kcp!.tunnel(B)!.stats().messagesSent, 1);
    // The same peer sending S1's packet over its tcp tunnel: not the service's transport.
    const tcpAB = a.transport.ensure(B);
    await eventually('a tcp tunnel A-B', () => tcpAB.state === 'up');
    tcpAB.send([encodePacket(uuidBytes(S1), ping(2))]);
    await eventually('dropped as unauthorized', () => b.dp.dropCounts().get('unauthorized') === 1);
    assert.equal(tunB.written.length, 1);

    // An agent without a kcp transport: the kcp service is its problem, not silently unserved.
    const c = plane(new MemoryNetwork(), A);
    await c.dp.start(view(A, kcpServices(), routes()));
    assert.equal(c.dp.status(S1).state, 'error');
    assert.match(c.dp.status(S1).problem ?? '', /transport_type kcp is not available/);
  });

  it("drops a message from a peer that is not the service's other end, for an unknown service, or malformed", async () => {
    const { network, a, b } = await twoPlanesUp();
    // Z is a peer of the cluster and the other end of S3 at B; it runs no data plane.
    const z = network.transport({ localPeerId: Z, directory: directory() });
    try {
      const toB = z.ensure(B);
      await eventually(
        'S3 up at B',
        () => b.dp.status(S3).state === 'up',
        () => b.dp.settle(),
      );
      const tunB1 = tunOf(b, S1);
      const tunB3 = tunOf(b, S3);
      const p = ping(1);

      toB.send([encodePacket(uuidBytes(S1), p)]); // S1's other end is A, not Z
      a.transport.tunnel(B)!.send([encodePacket(uuidBytes(S3), p)]); // S3's other end is Z, not A
      toB.send([encodePacket(uuidBytes(UNKNOWN), p)]);
      toB.send([Buffer.from([1, 2, 3])]); // too short
      const badVersion = encodePacket(uuidBytes(S3), p);
      badVersion[17] = 0x55;
      toB.send([badVersion]); // IP version 5
      toB.send([Buffer.concat([Buffer.from([7]), encodePacket(uuidBytes(S3), p).subarray(1)])]); // unknown kind
      toB.send([encodePacket(uuidBytes(S3), p)]); // the one that is allowed
      const dropped = () => [...b.dp.dropCounts().values()].reduce((n, x) => n + x, 0);
      await eventually('all 7 messages handled at B', () => tunB3.written.length === 1 && dropped() === 6);
      assert.deepEqual(tunB3.written, [p]);
      assert.deepEqual(tunB1.written, []);
      assert.deepEqual(Object.fromEntries(b.dp.dropCounts()), {
        unauthorized: 2,
        unknown_service: 1,
        malformed: 3,
      });
      // Unauthorized drops count against the service named; nothing was received for it.
      assert.equal(b.dp.status(S1).counters.dropped, 1);
      assert.equal(b.dp.status(S1).counters.packetsReceived, 0);
      assert.equal(b.dp.status(S3).counters.dropped, 1);
      assert.equal(b.dp.status(S3).counters.packetsReceived, 1);
      assert.equal(a.dp.dropCounts().size, 0);
    } finally {
      await z.close();
    }
  });

  it('pauses reading a TUN while the tunnel is above its high-water mark, resumes on drain', async () => {
    const { a, b } = await twoPlanesUp({ highWaterMark: 1000 });
    const tunA = tunOf(a, S1);
    const tunB = tunOf(b, S1);
    const burst = Array.from({ length: 20 }, (_, i) => ping(i, 100));
    tunA.inject(burst);
    assert.ok(tunA.isPaused, 'paused: 20 messages of 145 bytes are above 1000 bytes');
    // Injected while paused: queued by the (fake) kernel, read after the drain.
    tunA.inject([ping(20, 100)]);
    assert.equal(tunB.written.length, 0);
    await eventually('resumed and all delivered', () => !tunA.isPaused && tunB.written.length === 21);
    assert.deepEqual(tunB.written, [...burst, ping(20, 100)]);
    assert.equal(tunA.dropped, 0);
  });

  it('stop() at one end: its TUN closed and tunnel released; the other end sees the tunnel down and refuses', async () => {
    const { a, b } = await twoPlanesUp();
    const tunA = tunOf(a, S1);
    const tunB = tunOf(b, S1);
    await a.dp.stop();
    assert.ok(tunA.closed);
    assert.equal(a.transport.tunnel(B), undefined);
    assert.deepEqual(await a.kernel.observe(), {
      links: [],
      addresses: [],
      rules: [],
      routes: [],
      nft: null,
    });
    let nftB: string | null = null;
    await eventually(
      'B refuses S1',
      () => b.dp.status(S1).state !== 'up' && refusedTuns(nftB).includes(tunB.name),
      async () => {
        await b.dp.settle();
        nftB = (await b.kernel.observe()).nft;
      },
    );
    tunB.inject([ping(1)]);
    assert.equal(b.dp.dropCounts().get('tunnel_down'), 1);
  });
});
