/**
 * GET /v1/dataplane over real HTTP on an agent that runs no data plane (`--dataplane off`, as the
 * test agents do): 200 and says so, with nothing owned or wanted; services.read, like the rest of
 * the service configuration. The report of a running data plane: src/dataplane/drift-report.test.ts
 * (recording kernel) and test/dataplane/explain.root.test.ts (real kernel).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { assertError } from '../helpers/api-assertions.js';
import { makeVendor } from '../helpers/licenses.js';
import { type Node, scopedToken, startNode } from '../helpers/nodes.js';

describe('GET /v1/dataplane without a data plane', { timeout: 60_000 }, () => {
  let node: Node;

  before(async () => {
    node = await startNode(makeVendor());
  });
  after(async () => {
    await node.agent.stop();
  });

  it('answers 200 and says this agent runs no data plane', async () => {
    const res = await node.agent.client.get('/v1/dataplane', {
      token: await scopedToken(node, 'services.read'),
    });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.running, false);
    assert.match(res.body.reason, /runs no data plane/);
    assert.equal(res.body.wanted, null);
    assert.equal(res.body.owned, null);
    assert.equal(res.body.last_reconcile, null);
    assert.equal(res.body.repairs, 0);
  });

  it('needs services.read', async () => {
    assertError(
      await node.agent.client.get('/v1/dataplane', { token: await scopedToken(node, 'peers.read') }),
      403,
      'FORBIDDEN',
    );
    assertError(await node.agent.client.get('/v1/dataplane'), 401, 'UNAUTHORIZED');
  });
});
