/**
 * An exit killed with SIGKILL and started again on the same data dir, many times, while the
 * configuration changes under it (another service's route priority, a service of its own created
 * and deleted): it must come back every time and carry its service, never die at start.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createService, HTTP, type MeshNetns, meshNetnsUp, until, waitUp } from '../helpers/mesh-netns.js';
import { IP, requireNetnsSupport } from '../helpers/netns-topology.js';

const ROUNDS = 8;

describe('data plane: an exit restarted while the configuration changes', { timeout: 600_000 }, () => {
  let mesh: MeshNetns;

  before(async () => {
    await requireNetnsSupport();
    // Failover would keep the traffic on the second exit for its hold-down after each restart;
    // this test is about the restart, not about failback.
    mesh = await meshNetnsUp('mdrs', 46, { agentArgs: ['--failover-hold-down-ms', '0'] });
  });
  after(async () => {
    await mesh?.down();
  });

  it(`comes back ${ROUNDS} times out of ${ROUNDS} and carries its service each time`, async () => {
    const { ingress, exit, exit2 } = mesh;
    const first = await createService(ingress, { target_peer_id: exit.peerId, transport_type: 'tcp' }, [
      { priority: 10, source_cidr: '10.91.1.0/24', dest_cidr: '10.91.2.0/24' },
    ]);
    const second = await createService(ingress, { target_peer_id: exit2.peerId, transport_type: 'tcp' }, [
      { priority: 20, source_cidr: '10.91.1.0/24', dest_cidr: '10.91.2.0/24' },
    ]);
    await waitUp(first, ingress, exit);
    await waitUp(second, ingress, exit2);
    const routeOf = async (id: string) => {
      const res = await ingress.agent.client.get(`/v1/services/${id}`, { token: ingress.token });
      return (res.body.routes as { id: number }[])[0]!.id;
    };
    const secondRoute = await routeOf(second);
    let own: string | null = null;
    for (let round = 1; round <= ROUNDS; round++) {
      await exit.agent.kill9();
      // While the exit is down: another service's route moves, and a service the exit carries
      // comes or goes (its slot, TUN and tables with it).
      const res = await ingress.agent.client.put(`/v1/services/${second}/routes/${secondRoute}`, {
        token: ingress.token,
        json: { priority: round % 2 ? 30 : 20, source_cidr: '10.91.1.0/24', dest_cidr: '10.91.2.0/24' },
      });
      assert.equal(res.status, 200, res.text);
      if (own === null) {
        own = await createService(
          ingress,
          { source_peer_id: exit2.peerId, target_peer_id: exit.peerId, transport_type: 'tcp' },
          [{ priority: 5, source_cidr: '10.91.9.0/24', dest_cidr: `10.91.${100 + round}.0/24` }],
        );
      } else {
        const del = await ingress.agent.client.delete(`/v1/services/${own}`, { token: ingress.token });
        assert.equal(del.status, 200, del.text);
        own = null;
      }
      await exit.agent.restart();
      await waitUp(first, ingress, exit);
      // Alive a while after start, past the first reconciles and the gossip that follows.
      await until(
        'the exit has synced',
        async () => {
          const r = await exit.agent.client.post('/v1/cluster/sync', { token: exit.token });
          assert.equal(r.status, 200, r.text);
        },
        10_000,
      );
      await new Promise((resolve) => setTimeout(resolve, 2000));
      assert.equal(
        exit.agent.exitCode,
        null,
        `round ${round}: the exit died\n${exit.agent.logs.slice(-3000)}`,
      );
      assert.equal(exit.agent.exitSignal, null, `round ${round}: the exit died`);
      await until(
        `round ${round}: through the exit`,
        async () => {
          const out = await mesh.topo.run(mesh.topo.ns.client, 'curl', [
            '-sS',
            '--max-time',
            '5',
            `http://${IP.dest}:${HTTP}/`,
          ]);
          assert.equal((JSON.parse(out) as { remote: string }).remote, IP.exitOut);
        },
        10_000,
      );
    }
  });
});
