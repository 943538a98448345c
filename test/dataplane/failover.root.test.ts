/**
 * Failover between two exits (docs/dataplane.md): two services from the ingress to two exits
 * with the same route, the first preferred. For each fault of the first exit, new connections
 * go through the second within seconds, and so does a UDP flow (its source port unchanged);
 * when the fault is gone, traffic returns to the first only after the hold-down. That streams
 * through a failed exit end with an error is checked in traffic-suite ("never a hang") and
 * timed by bench/failover.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import {
  APPS,
  createService,
  HTTP,
  type MeshNetns,
  meshNetnsUp,
  serviceAt,
  UDP,
  until,
  waitUp,
} from '../helpers/mesh-netns.js';
import { IP, requireNetnsSupport, spawnIn } from '../helpers/netns-topology.js';

const HOLD_DOWN_MS = 4000;
/** Generous bounds that still tell a switch from a hang; bench/failover measures the real times. */
const MOVE_WITHIN_MS = 15_000;

describe('data plane: failover between two exits', { timeout: 600_000 }, () => {
  let mesh: MeshNetns;
  let first: string;
  let second: string;

  before(async () => {
    await requireNetnsSupport();
    mesh = await meshNetnsUp('mdfo', 47, { agentArgs: ['--failover-hold-down-ms', String(HOLD_DOWN_MS)] });
    const { ingress, exit, exit2 } = mesh;
    const route = { source_cidr: '10.91.1.0/24', dest_cidr: '10.91.2.0/24' };
    first = await createService(ingress, { target_peer_id: exit.peerId, transport_type: 'tcp' }, [
      { priority: 10, ...route },
    ]);
    second = await createService(ingress, { target_peer_id: exit2.peerId, transport_type: 'tcp' }, [
      { priority: 20, ...route },
    ]);
    await waitUp(first, ingress, exit);
    await waitUp(second, ingress, exit2);
  });
  after(async () => {
    await mesh?.down();
  });

  /** The address the destination saw the request from: the exit it left by. */
  const seenFrom = async (): Promise<string> => {
    const out = await mesh.topo.run(mesh.topo.ns.client, 'curl', [
      '-sS',
      '--max-time',
      '2',
      `http://${IP.dest}:${HTTP}/`,
    ]);
    return (JSON.parse(out) as { remote: string }).remote;
  };

  /** One UDP flow (one source port) from the client, an echo every 100 ms; its answers so far. */
  const udpFlow = () => {
    const flow = spawnIn(mesh.topo.ns.client, process.execPath, [
      APPS,
      'udp-flow',
      IP.dest,
      String(UDP),
      '100',
    ]);
    let echoes = 0;
    flow.stdout.on('data', (d: Buffer) => {
      echoes += d
        .toString()
        .split('\n')
        .filter((l) => l.startsWith('echo ')).length;
    });
    return { echoes: () => echoes, stop: () => flow.kill() };
  };

  /**
   * One fault of the first exit: traffic through it, a UDP flow through it, the fault; then new
   * connections and the flow through the second exit, the service unhealthy for `reason`; then
   * the fault undone and the traffic back through the first after the hold-down.
   */
  async function trial(
    name: string,
    reason: string,
    inject: () => Promise<void>,
    undo: () => Promise<void>,
  ): Promise<void> {
    await until('through the first exit', async () => assert.equal(await seenFrom(), IP.exitOut), 30_000);
    const flow = udpFlow();
    await until(
      'the UDP flow answered through the first exit',
      async () => {
        assert.ok(flow.echoes() > 0);
        assert.match(mesh.destLog(), new RegExp(`^udp-remote ${IP.exitOut}$`, 'm'));
      },
      10_000,
    );
    await inject();
    const faultAt = performance.now();
    const logAtFault = mesh.destLog().length;
    try {
      await until(
        'through the second exit',
        async () => assert.equal(await seenFrom(), IP.exit2Out),
        MOVE_WITHIN_MS,
      );
      const movedMs = performance.now() - faultAt;
      console.log(`# ${name}: new connections through the second exit after ${movedMs.toFixed(0)} ms`);
      // The same UDP flow (its source port unchanged) moves too, and is answered.
      const echoesAtMove = flow.echoes();
      await until(
        'the UDP flow through the second exit',
        async () => {
          assert.match(mesh.destLog().slice(logAtFault), new RegExp(`^udp-remote ${IP.exit2Out}$`, 'm'));
          assert.ok(flow.echoes() > echoesAtMove);
        },
        10_000,
      );
      const seen = (await serviceAt(mesh.ingress, first)) as unknown as {
        health: { state: string; reason: string | null; carrying: boolean };
        routes: { active: boolean; standby_reason: string | null }[];
      };
      assert.equal(seen.health.state, 'unhealthy', `${name}: ${JSON.stringify(seen.health)}`);
      assert.equal(seen.health.reason, reason);
      assert.deepEqual(
        seen.routes.map((r) => [r.active, r.standby_reason]),
        [[false, reason]],
      );
    } finally {
      flow.stop();
      await undo();
    }
    const undoneAt = performance.now();
    await until(
      'back through the first exit',
      async () => assert.equal(await seenFrom(), IP.exitOut),
      60_000,
    );
    const backMs = performance.now() - undoneAt;
    console.log(`# ${name} undone: traffic back through the first exit after ${backMs.toFixed(0)} ms`);
    assert.ok(
      backMs >= HOLD_DOWN_MS * 0.5,
      `${name}: back after ${backMs.toFixed(0)} ms, before the hold-down`,
    );
  }

  it('the first exit killed (kill -9): moves, and returns after the hold-down once it is back', async () => {
    const { ingress, exit } = mesh;
    await trial(
      'kill -9',
      'tunnel_silent',
      () => exit.agent.kill9(),
      async () => {
        await exit.agent.restart();
        await waitUp(first, exit);
      },
    );
    const metrics = (await ingress.agent.client.get('/metrics', { token: ingress.token })).text;
    assert.match(metrics, new RegExp(`^mesh_dataplane_service_carrying\\{service_id="${first}"\\} 1$`, 'm'));
    assert.match(metrics, new RegExp(`^mesh_dataplane_service_carrying\\{service_id="${second}"\\} 1$`, 'm'));
    assert.match(metrics, /^mesh_dataplane_service_health_changes_total\{to="tunnel_silent"\} [1-9]/m);
  });

  it('the first exit hung (SIGSTOP: its tunnel silent, not closed)', async () => {
    const { pid } = mesh.exit.agent;
    await trial(
      'SIGSTOP',
      'tunnel_silent',
      async () => {
        process.kill(pid, 'SIGSTOP');
      },
      async () => {
        process.kill(pid, 'SIGCONT');
      },
    );
  });

  it('the underlay between the ingress and the first exit cut (an nftables drop at the exit)', async () => {
    const nft = (...args: string[]) => mesh.topo.run(mesh.topo.ns.exit, 'nft', args);
    await trial(
      'underlay cut',
      'tunnel_silent',
      async () => {
        await nft('add', 'table', 'inet', 'mdfo_cut');
        await nft('add', 'chain', 'inet', 'mdfo_cut', 'in', '{ type filter hook input priority -10; }');
        await nft('add', 'chain', 'inet', 'mdfo_cut', 'out', '{ type filter hook output priority -10; }');
        await nft('add', 'rule', 'inet', 'mdfo_cut', 'in', 'iifname', 'e1', 'drop');
        await nft('add', 'rule', 'inet', 'mdfo_cut', 'out', 'oifname', 'e1', 'drop');
      },
      async () => {
        await nft('delete', 'table', 'inet', 'mdfo_cut');
      },
    );
  });

  it("the first exit's LAN interface down: its own route check, even with a default route to fall to", async () => {
    const { topo, ingress } = mesh;
    const ip = (...args: string[]) => topo.run(topo.ns.exit, 'ip', args);
    // Like most hosts, the exit has a default route (here toward the ingress): with its LAN
    // down, the lookup for the destination falls through to it rather than failing.
    await ip('route', 'add', 'default', 'via', IP.ingressUl);
    try {
      await trial(
        'LAN down',
        'exit_no_route',
        () => ip('link', 'set', 'e0', 'down').then(() => undefined),
        async () => {
          await ip('link', 'set', 'e0', 'up');
        },
      );
    } finally {
      await ip('route', 'del', 'default', 'via', IP.ingressUl).catch(() => undefined);
    }
    const metrics = (await ingress.agent.client.get('/metrics', { token: ingress.token })).text;
    assert.match(metrics, /^mesh_dataplane_service_health_changes_total\{to="exit_no_route"\} [1-9]/m);
  });

  it('a /25 via the first exit falls back to the /24 via the second; with neither up, nothing gets through', async () => {
    const { ingress, exit, exit2 } = mesh;
    const routesOf = async (id: string) =>
      (await ingress.agent.client.get(`/v1/services/${id}/routes`, { token: ingress.token })).body as {
        id: number;
      }[];
    const [firstRoute] = await routesOf(first);
    const put = async (body: Record<string, unknown>) => {
      const res = await ingress.agent.client.put(`/v1/services/${first}/routes/${firstRoute!.id}`, {
        token: ingress.token,
        json: body,
      });
      assert.equal(res.status, 200, res.text);
    };
    // The same priority as the second's /24: the first wins by its longer destination.
    await put({ priority: 20, dest_cidr: '10.91.2.0/25' });
    try {
      await until(
        'through the first exit (/25)',
        async () => assert.equal(await seenFrom(), IP.exitOut),
        30_000,
      );
      await exit.agent.kill9();
      await until(
        'through the second exit (/24)',
        async () => assert.equal(await seenFrom(), IP.exit2Out),
        MOVE_WITHIN_MS,
      );
      process.kill(exit2.agent.pid, 'SIGSTOP');
      try {
        await until(
          'the second stands aside too',
          async () => {
            const health = (
              (await serviceAt(ingress, second)) as unknown as { health: { carrying: boolean } }
            ).health;
            assert.equal(health.carrying, false);
          },
          MOVE_WITHIN_MS,
        );
        // No route left: the request fails, as it does without failover.
        await assert.rejects(seenFrom(), 'a request got through with both exits down');
      } finally {
        process.kill(exit2.agent.pid, 'SIGCONT');
      }
    } finally {
      await exit.agent.restart().catch(() => undefined);
      await put({ priority: 10, dest_cidr: '10.91.2.0/24' });
    }
    await waitUp(first, exit);
    await until(
      'through the first exit again',
      async () => assert.equal(await seenFrom(), IP.exitOut),
      60_000,
    );
  });
});
