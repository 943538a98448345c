/**
 * Explain against the real kernel, in network namespaces (netns-topology.ts: client, ingress, two
 * exits, dest; three real agents with their data planes): for random sets of services from the
 * ingress (either exit or both, each over tcp or kcp) with random routes (overlapping
 * prefixes, priorities, sources, both families) and random packets, explain's winner at the
 * ingress is where the packet really goes, sent for real from the client and seen at the
 * destination through that service's exit (or nowhere when nothing selects it), and the kernel's
 * view agrees (the kernel sends it into that very service's TUN); the test prints its seed and
 * how many packets it tried (CRASH_SEED replays a run). Then a
 * rule and a route removed by hand: `kernel_agrees` false naming what is missing, repaired by the
 * reconciler and shown in GET /v1/dataplane. Then a failed exit: its route stands aside with the
 * health reason, and once back, waits out the hold-down.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  createService,
  type MeshNetns,
  meshNetnsUp,
  removeService,
  UDP,
  until,
  waitUp,
} from '../helpers/mesh-netns.js';
import { IP, requireNetnsSupport } from '../helpers/netns-topology.js';
import type { Node } from '../helpers/nodes.js';
import { prng, SEED } from '../helpers/seeded-random.js';

const PROBE = fileURLToPath(new URL('../helpers/udp-probe.js', import.meta.url));
const HOLD_DOWN_MS = 4000;
/** Random sets of services, and packets tried against each: about 60 s in all on 2 cores. */
const ROUNDS = 6;
const PACKETS_PER_ROUND = 15;
/** The client's addresses (sources) and the destination's (destinations), both families. */
const HOSTS = Array.from({ length: 8 }, (_, i) => i + 2);
const DEST_HOSTS = Array.from({ length: 30 }, (_, i) => i + 2);
const v4 = (net: number, host: number) => `10.91.${net}.${host}`;
const v6 = (net: number, host: number) => `fd91:${net}::${host.toString(16)}`;

type Obj = Record<string, unknown>;
type Exit = 'exit' | 'exit2';
interface Ranked {
  route_id: number | null;
  service_id: string;
  outcome: string;
  standby_reason: string | null;
}
interface Explained {
  selected: boolean;
  ranking: Ranked[];
  winner: { service_id: string; route_id: number } | null;
  kernel: Obj | null;
  kernel_agrees: boolean | null;
  kernel_difference: string | null;
  verdict: string;
}

describe('explain against the kernel (network namespaces)', { timeout: 900_000 }, () => {
  let mesh: MeshNetns;
  let ingress: Node;
  let sB = ''; // ingress -> exit
  let sC = ''; // ingress -> exit2
  let probe: ChildProcess;
  let probeOut = '';

  /** How long each explain took, kernel view included (printed, never asserted). */
  const explainMs: number[] = [];
  const explain = async (source: string, destination: string): Promise<Explained> => {
    const q = new URLSearchParams({ source, destination, protocol: 'udp', port: String(UDP) });
    const started = performance.now();
    const res = await ingress.agent.client.get(`/v1/explain?${q}`, { token: ingress.token });
    explainMs.push(performance.now() - started);
    assert.equal(res.status, 200, res.text);
    return res.body as Explained;
  };

  /** Replaces every route of both services, then waits until the ingress's kernel follows. */
  const setRoutes = async (routes: { service: string; route: Obj }[]) => {
    for (const s of [sB, sC]) {
      const list = await ingress.agent.client.get(`/v1/services/${s}/routes`, { token: ingress.token });
      for (const r of list.body as { id: number }[]) {
        const del = await ingress.agent.client.delete(`/v1/services/${s}/routes/${r.id}`, {
          token: ingress.token,
        });
        assert.equal(del.status, 200, del.text);
      }
      const mine = routes.filter((r) => r.service === s).map((r) => r.route);
      if (mine.length === 0) continue;
      const add = await ingress.agent.client.post(`/v1/services/${s}/routes`, {
        token: ingress.token,
        json: { routes: mine },
      });
      assert.equal(add.status, 201, add.text);
    }
    const sync = await ingress.agent.client.post('/v1/cluster/sync', { token: ingress.token });
    assert.equal(sync.status, 200, sync.text);
  };

  let sent = 0;
  /**
   * Sends one datagram from the client and says which exit it crossed (by the source the
   * destination saw: each exit's NAT address), or null when none arrived within `waitMs`.
   */
  const sendVia = async (source: string, destination: string, waitMs: number): Promise<Exit | null> => {
    const id = `p${sent++}`;
    const mark = mesh.destLog().length;
    probe.stdin!.write(`${source} ${destination} ${UDP} ${id}\n`);
    await until(`${id} sent`, async () => assert.match(probeOut, new RegExp(`(sent|error) ${id}\\b`)), 5000);
    assert.doesNotMatch(probeOut, new RegExp(`error ${id}\\b`));
    const end = Date.now() + waitMs;
    for (;;) {
      const m = /udp-remote (\S+)/.exec(mesh.destLog().slice(mark));
      if (m) {
        const remote = m[1]!;
        if (remote === IP.exitOut || remote === IP.exitOut6) return 'exit';
        if (remote === IP.exit2Out || remote === IP.exit2Out6) return 'exit2';
        assert.fail(`the destination saw ${remote}: neither exit`);
      }
      if (Date.now() > end) return null;
      await new Promise((r) => setTimeout(r, 20));
    }
  };
  /** sendVia for the tests with the two fixed services: the service whose exit the packet crossed. */
  const send = async (source: string, destination: string, waitMs: number): Promise<string | null> => {
    const exit = await sendVia(source, destination, waitMs);
    return exit === null ? null : exit === 'exit' ? sB : sC;
  };

  /**
   * The two fixed services of the tests after the property test (one service per source and
   * target: the property test's random ones go first).
   */
  const fixedServices = async () => {
    if (sB !== '') return;
    const left = await ingress.agent.client.get('/v1/services', { token: ingress.token });
    for (const s of left.body as { id: string }[]) await removeService(ingress, s.id);
    sB = await createService(ingress, { target_peer_id: mesh.exit.peerId }, [
      { priority: 100, dest_cidr: '10.91.2.0/24' },
    ]);
    sC = await createService(ingress, { target_peer_id: mesh.exit2.peerId }, [
      { priority: 100, dest_cidr: '10.91.2.0/24' },
    ]);
    await waitUp(sB, ingress, mesh.exit);
    await waitUp(sC, ingress, mesh.exit2);
  };

  before(async () => {
    await requireNetnsSupport();
    mesh = await meshNetnsUp('mdex', 57, {
      agentArgs: ['--failover-hold-down-ms', String(HOLD_DOWN_MS)],
      prepare: async (topo) => {
        for (const h of HOSTS.slice(1)) {
          await topo.run(topo.ns.client, 'ip', ['addr', 'add', `${v4(1, h)}/24`, 'dev', 'c0']);
          await topo.run(topo.ns.client, 'ip', ['addr', 'add', `${v6(1, h)}/64`, 'dev', 'c0', 'nodad']);
        }
        for (const h of DEST_HOSTS.slice(1)) {
          await topo.run(topo.ns.dest, 'ip', ['addr', 'add', `${v4(2, h)}/24`, 'dev', 'd0']);
          await topo.run(topo.ns.dest, 'ip', ['addr', 'add', `${v6(2, h)}/64`, 'dev', 'd0', 'nodad']);
        }
      },
    });
    ingress = mesh.ingress;
    probe = spawn('ip', ['netns', 'exec', mesh.topo.ns.client, process.execPath, PROBE], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    probe.stdout!.on('data', (c: Buffer) => {
      probeOut += c.toString();
    });
  });

  after(async () => {
    probe?.kill('SIGKILL');
    await mesh?.down();
  });

  it("explain's winner is where the packet really goes, for random services, routes and packets", async () => {
    console.log(`explain property test: seed ${SEED} (CRASH_SEED=${SEED} replays it)`);
    const rand = prng(SEED);
    const int = (n: number) => Math.floor(rand() * n);
    const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)]!;
    /** A network of the given prefix that holds host `host` of net 10.91.N.0/24 (fd91:N::/64). */
    const cidr = (family: 4 | 6, net: number, host: number, prefix: number) => {
      if (family === 4)
        return `${v4(net, host & (prefix >= 32 ? 0xff : (0xff << (32 - prefix)) & 0xff))}/${prefix}`;
      if (prefix <= 64) return `fd91:${net}::/${prefix}`;
      const kept = host & (prefix >= 128 ? 0xffff : (0xffff << (128 - prefix)) & 0xffff);
      return `${kept === 0 ? `fd91:${net}::` : v6(net, kept)}/${prefix}`;
    };
    const randomRoute = (): Obj => {
      const family = rand() < 0.6 ? 4 : 6;
      const dest = cidr(
        family,
        2,
        pick(DEST_HOSTS),
        family === 4 ? pick([24, 26, 27, 28, 29, 30, 32]) : pick([64, 120, 123, 124, 126, 128]),
      );
      const route: Obj = { priority: int(3), dest_cidr: dest };
      if (rand() < 0.5) {
        route.source_cidr = cidr(
          family,
          1,
          pick(HOSTS),
          family === 4 ? pick([24, 29, 30, 31, 32]) : pick([64, 124, 126, 127, 128]),
        );
      }
      return route;
    };
    const exits = { exit: mesh.exit, exit2: mesh.exit2 };

    let cases = 0;
    let carried = 0;
    let serviceCount = 0;
    const started = Date.now();
    for (let round = 0; round < ROUNDS; round++) {
      // A random set of services (one per exit at most: one service per source and target), each
      // with its transport and 1 to 6 routes; sometimes both exits, sometimes either alone.
      const chosen = pick([['exit'], ['exit2'], ['exit', 'exit2'], ['exit', 'exit2']] as const);
      const specs = chosen.map((exit) => ({
        exit,
        transport: pick(['tcp', 'kcp'] as const),
        routes: Array.from({ length: 1 + int(6) }, randomRoute),
      }));
      const services = new Map<string, (typeof specs)[number]>();
      for (const spec of specs) {
        const id = await createService(
          ingress,
          { target_peer_id: exits[spec.exit].peerId, transport_type: spec.transport },
          spec.routes,
        );
        services.set(id, spec);
      }
      serviceCount += specs.length;
      for (const [id, spec] of services) await waitUp(id, ingress, exits[spec.exit]);
      const sync = await ingress.agent.client.post('/v1/cluster/sync', { token: ingress.token });
      assert.equal(sync.status, 200, sync.text);
      const described = JSON.stringify([...services].map(([id, s]) => ({ id, ...s })));
      for (let k = 0; k < PACKETS_PER_ROUND; k++) {
        const family = rand() < 0.6 ? 4 : 6;
        const source = family === 4 ? v4(1, pick(HOSTS)) : v6(1, pick(HOSTS));
        const destination = family === 4 ? v4(2, pick(DEST_HOSTS)) : v6(2, pick(DEST_HOSTS));
        const e = await explain(source, destination);
        const what = `seed ${SEED} round ${round}: ${source} -> ${destination}; services ${described}; ${e.verdict}`;
        assert.equal(e.kernel_agrees, true, `${what}: ${e.kernel_difference}`);
        const expected = e.winner ? services.get(e.winner.service_id)! : null;
        const went = await sendVia(source, destination, expected ? 3000 : 800);
        assert.equal(went, expected?.exit ?? null, what);
        cases++;
        if (went) carried++;
      }
      for (const id of services.keys()) await removeService(ingress, id);
    }
    const sorted = [...explainMs].sort((a, b) => a - b);
    const at = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!.toFixed(1);
    console.log(`explain with the kernel view (a few routes): p50 ${at(0.5)} ms, p99 ${at(0.99)} ms`);
    console.log(
      `explain property test: ${cases} packets tried over ${ROUNDS} random sets of services ` +
        `(${serviceCount} services in all; seed ${SEED}), ${carried} carried through an exit, ` +
        `${cases - carried} selected by no route; explain's winner and the kernel agreed on every one ` +
        `(${((Date.now() - started) / 1000).toFixed(0)} s)`,
    );
    assert.ok(
      carried > cases / 4 && carried < cases,
      `both outcomes must occur: ${carried} of ${cases} carried`,
    );
  });

  it('a rule, then a route, removed by hand: kernel_agrees false naming it, repaired, shown in /v1/dataplane', async () => {
    await fixedServices();
    await setRoutes([{ service: sB, route: { priority: 1, dest_cidr: '10.91.2.0/24' } }]);
    const before = (await ingress.agent.client.get('/v1/dataplane', { token: ingress.token })).body as Obj;
    assert.equal(before.running, true);
    assert.equal(before.in_step, true, JSON.stringify(before));
    const rules = await mesh.topo.run(mesh.topo.ns.ingress, 'ip', ['-4', 'rule', 'show']);
    const line = rules.split('\n').find((l) => /to 10\.91\.2\.0\/24 lookup 5\d{4}/.test(l));
    assert.ok(line, rules);
    const pref = line.split(':')[0]!.trim();
    const table = /lookup (\d+)/.exec(line)![1]!;
    const routeLine = `ip -4 route add default dev ${(await ingress.agent.client.get(`/v1/services/${sB}`, { token: ingress.token })).body.dataplane.interface} table ${table}`;

    for (const [what, remove, names] of [
      [
        'rule',
        ['-4', 'rule', 'del', 'pref', pref],
        `ip -4 rule add pref ${pref} to 10.91.2.0/24 lookup ${table}`,
      ],
      ['route', ['-4', 'route', 'flush', 'table', table], routeLine],
    ] as const) {
      // The reconciler may repair between the removal and the question (every 10 s): again then.
      let e: Explained | undefined;
      for (let attempt = 0; attempt < 3; attempt++) {
        await mesh.topo.run(mesh.topo.ns.ingress, 'ip', [...remove]);
        e = await explain(IP.client, '10.91.2.7');
        if (e.kernel_agrees === false) break;
      }
      assert.equal(e!.kernel_agrees, false, `${what}: ${e!.verdict}`);
      assert.equal(e!.winner?.service_id, sB);
      assert.match(e!.kernel_difference ?? '', new RegExp(names.replace(/[.*+?^$()|[\]\\/]/g, '\\$&')), what);
      const drifted = (await ingress.agent.client.get('/v1/dataplane', { token: ingress.token })).body as Obj;
      assert.equal(drifted.in_step, false);
      assert.ok((drifted.differences as string[]).includes(names), JSON.stringify(drifted.differences));

      // The reconciler repairs it (a sync runs one now), and says so.
      const sync = await ingress.agent.client.post('/v1/cluster/sync', { token: ingress.token });
      assert.equal(sync.status, 200);
      const report = (await ingress.agent.client.get('/v1/dataplane', { token: ingress.token })).body as Obj;
      assert.equal(report.in_step, true, JSON.stringify(report));
      const repairs = report.recent_repairs as { repaired: string[] }[];
      assert.ok(
        repairs.some((r) => r.repaired.includes(names)),
        JSON.stringify(repairs),
      );
      assert.ok((report.repairs as number) >= 1);
      const again = await explain(IP.client, '10.91.2.7');
      assert.equal(again.kernel_agrees, true, again.verdict);
      assert.equal(await send(IP.client, '10.91.2.7', 3000), sB);
    }
  });

  it('a failed exit: its route stands aside with the health reason, then waits out the hold-down', async () => {
    await fixedServices();
    await setRoutes([
      { service: sB, route: { priority: 1, dest_cidr: '10.91.2.0/24' } },
      { service: sC, route: { priority: 5, dest_cidr: '10.91.2.0/24' } },
    ]);
    assert.equal((await explain(IP.client, '10.91.2.9')).winner?.service_id, sB);
    const pid = mesh.exit.agent.pid;
    process.kill(pid, 'SIGSTOP');
    try {
      await until(
        'the first exit stands aside',
        async () => {
          const e = await explain(IP.client, '10.91.2.9');
          assert.equal(e.winner?.service_id, sC, e.verdict);
          const r = e.ranking.find((x) => x.service_id === sB)!;
          assert.equal(r.outcome, 'stands_aside');
          assert.equal(r.standby_reason, 'tunnel_silent');
          assert.equal(e.kernel_agrees, true, e.kernel_difference ?? '');
        },
        20_000,
      );
      assert.equal(await send(IP.client, '10.91.2.9', 3000), sC);
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    await until(
      'the first exit waits out the hold-down',
      async () => {
        const e = await explain(IP.client, '10.91.2.9');
        const r = e.ranking.find((x) => x.service_id === sB)!;
        assert.equal(r.standby_reason, 'hold_down', e.verdict);
        assert.equal(e.winner?.service_id, sC);
      },
      HOLD_DOWN_MS + 10_000,
    );
    await until(
      'the first exit carries again',
      async () => {
        const e = await explain(IP.client, '10.91.2.9');
        assert.equal(e.winner?.service_id, sB, e.verdict);
        assert.equal(e.kernel_agrees, true);
      },
      HOLD_DOWN_MS + 10_000,
    );
    assert.equal(await send(IP.client, '10.91.2.9', 3000), sB);
  });
});
