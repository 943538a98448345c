/**
 * Bootstrapped agents for tests that need one or more cluster members: the process, an admin
 * token, the peer id, and tokens of new credentials with chosen scopes.
 */
import assert from 'node:assert/strict';
import { type ScopeName, scope } from '../../src/domain/scopes.js';
import { AgentProcess, bootstrap } from './agent-process.js';
import type { Vendor } from './licenses.js';

export interface Node {
  agent: AgentProcess;
  /** Admin token of the first credential. */
  token: string;
  peerId: string;
}

/** Bootstraps a running agent with a license of the vendor and gets an admin token. */
export async function bootstrapNode(
  agent: AgentProcess,
  vendor: Vendor,
  overrides: Parameters<Vendor['sign']>[0] = {},
): Promise<Node> {
  const creds = await bootstrap(agent, vendor, overrides);
  const token = await agent.client.token(creds.clientId, creds.clientSecret);
  return { agent, token, peerId: creds.body.peer_id as string };
}

/** Starts an agent trusting the vendor and bootstraps it. */
export async function startNode(
  vendor: Vendor,
  overrides: Parameters<Vendor['sign']>[0] = {},
): Promise<Node> {
  return bootstrapNode(await AgentProcess.start({ vendor }), vendor, overrides);
}

/** A token of a new credential that holds exactly the given scopes. */
export async function scopedToken(node: Node, ...scopes: ScopeName[]): Promise<string> {
  const res = await node.agent.client.post('/v1/credentials', {
    token: node.token,
    json: { scopes: scopes.map(scope) },
  });
  assert.equal(res.status, 201, res.text);
  return node.agent.client.token(res.body.client_id, res.body.client_secret);
}

/** `a` adds `b` as a peer by the handshake. */
export async function join(a: Node, b: Node): Promise<void> {
  const res = await a.agent.client.post('/v1/peers', {
    token: a.token,
    json: { address: b.agent.address },
  });
  assert.equal(res.status, 201, res.text);
}
