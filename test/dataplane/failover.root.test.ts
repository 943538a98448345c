/**
 * Failover between two exits (docs/dataplane.md): two services from the ingress to two exits
 * with the same route, the first preferred. When the first exit's agent is killed, new
 * connections go through the second within seconds; when it is back, they return to it only
 * after the hold-down.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createService, HTTP, type MeshNetns, meshNetnsUp, until, waitUp } from '../helpers/mesh-netns.js';
import { IP, requireNetnsSupport } from '../helpers/netns-topology.js';

const HOLD_DOWN_MS = 4000;

describe('data plane: failover between two exits', { timeout: 300_000 }, () => {
  let mesh: MeshNetns;

  before(async () => {
    await requireNetnsSupport();
    mesh = await meshNetnsUp('mdfo', 47, { agentArgs: ['--failover-hold-down-ms', String(HOLD_DOWN_MS)] });
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

  it('moves new connections to the second exit when the first dies, and back after the hold-down', async () => {
    const { ingress, exit, exit2 } = mesh;
    const route = { source_cidr: '10.91.1.0/24', dest_cidr: '10.91.2.0/24' };
    const first = await createService(ingress, { target_peer_id: exit.peerId, transport_type: 'tcp' }, [
      { priority: 10, ...route },
    ]);
    const second = await createService(ingress, { target_peer_id: exit2.peerId, transport_type: 'tcp' }, [
      { priority: 20, ...route },
    ]);
    await waitUp(first, ingress, exit);
    await waitUp(second, ingress, exit2);
    await until('through the first exit', async () => assert.equal(await seenFrom(), IP.exitOut), 10_000);

    await exit.agent.kill9();
    const killedAt = performance.now();
    await until('through the second exit', async () => assert.equal(await seenFrom(), IP.exit2Out), 15_000);
    const movedMs = performance.now() - killedAt;
    console.log(
      `# kill -9 of the first exit: new connections through the second after ${movedMs.toFixed(0)} ms`,
    );

    await exit.agent.restart();
    await waitUp(first, exit);
    const backAt = performance.now();
    // Healthy again, but within the hold-down the second exit keeps the traffic.
    assert.equal(await seenFrom(), IP.exit2Out, 'not before the hold-down');
    await until(
      'back through the first exit',
      async () => assert.equal(await seenFrom(), IP.exitOut),
      30_000,
    );
    const backMs = performance.now() - backAt;
    console.log(
      `# the first exit back: its traffic returned after ${backMs.toFixed(0)} ms (hold-down ${HOLD_DOWN_MS})`,
    );
    assert.ok(backMs >= HOLD_DOWN_MS * 0.5, `returned after ${backMs.toFixed(0)} ms, before the hold-down`);
    const metrics = (await ingress.agent.client.get('/metrics', { token: ingress.token })).text;
    assert.match(metrics, new RegExp(`^mesh_dataplane_service_carrying\\{service_id="${first}"\\} 1$`, 'm'));
    assert.match(metrics, new RegExp(`^mesh_dataplane_service_carrying\\{service_id="${second}"\\} 1$`, 'm'));
    assert.match(metrics, /^mesh_dataplane_service_health_changes_total\{to="tunnel_silent"\} [1-9]/m);
  });

  it('a hung first exit (SIGSTOP: its tunnel silent, not closed) loses its traffic too, and gets it back', async () => {
    const { exit } = mesh;
    await until('through the first exit', async () => assert.equal(await seenFrom(), IP.exitOut), 30_000);
    process.kill(exit.agent.pid, 'SIGSTOP');
    const stoppedAt = performance.now();
    try {
      await until('through the second exit', async () => assert.equal(await seenFrom(), IP.exit2Out), 15_000);
      console.log(
        `# SIGSTOP of the first exit: new connections through the second after ${(performance.now() - stoppedAt).toFixed(0)} ms`,
      );
    } finally {
      process.kill(exit.agent.pid, 'SIGCONT');
    }
    await until(
      'back through the first exit',
      async () => assert.equal(await seenFrom(), IP.exitOut),
      30_000,
    );
  });
});
