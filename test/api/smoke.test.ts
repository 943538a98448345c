import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import { makeVendor } from '../helpers/licenses.js';

describe('agent process smoke', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  before(async () => {
    agent = await AgentProcess.start({ vendor });
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('bootstraps, issues a token and lists the local peer', async () => {
    const creds = await bootstrap(agent, vendor);
    const token = await agent.client.token(creds.clientId, creds.clientSecret);
    const peers = await agent.client.get('/v1/peers', { token });
    assert.equal(peers.status, 200);
    assert.equal(peers.body.length, 1);
    assert.equal(peers.body[0].is_local, true);
  });
});
