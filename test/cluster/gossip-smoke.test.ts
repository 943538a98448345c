import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentProcess } from '../helpers/agent-process.js';
import { makeVendor } from '../helpers/licenses.js';
import { bootstrapNode, join, type Node } from '../helpers/nodes.js';

const vendor = makeVendor();

async function eventually<T>(fn: () => Promise<T | undefined>, ms = 10_000): Promise<T> {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('gossip smoke', { timeout: 60_000 }, () => {
  const nodes: Node[] = [];
  before(async () => {
    for (let i = 0; i < 3; i++) {
      const agent = await AgentProcess.start({
        vendor,
        extraArgs: ['--gossip-interval-ms', '200', '--test-hooks'],
      });
      nodes.push(await bootstrapNode(agent, vendor, { license_id: 'L1', max_nodes: 5, max_services: 5 }));
    }
  });
  after(async () => {
    for (const n of nodes)
      console.log(
        n.agent.logs
          .split('\n')
          .filter((l) => !l.includes('request completed') && !l.includes('incoming request'))
          .slice(0, 60)
          .join('\n'),
      );
    for (const n of nodes) await n.agent.stop();
  });

  it('a join and a service reach the third agent', async () => {
    const [a, b, c] = nodes as [Node, Node, Node];
    await join(a, b);
    await join(b, c);
    for (const n of nodes) {
      await eventually(async () => {
        const res = await n.agent.client.get('/v1/peers', { token: n.token });
        return res.body.length === 3 ? true : undefined;
      });
    }
    const created = await c.agent.client.post('/v1/services', {
      token: c.token,
      json: { source_peer_id: a.peerId, target_peer_id: b.peerId },
    });
    assert.equal(created.status, 201, created.text);
    await eventually(async () => {
      const res = await a.agent.client.get(`/v1/services/${created.body.id}`, { token: a.token });
      return res.status === 200 ? true : undefined;
    });
    const ids = await Promise.all(
      nodes.map(async (n) => (await n.agent.client.get('/v1/cluster/identity')).body.cluster_id),
    );
    assert.equal(new Set(ids).size, 1, JSON.stringify(ids));
  });
});
