/**
 * Clusters of real agents for the replication tests: start n agents with a short gossip interval
 * (on request on loopback addresses of their own and on movable clocks), bootstrap them under one
 * license, join them, and compare what each one
 * serves. Agents' answers are compared without the liveness fields (`reachable`, `last_seen_at`)
 * and `is_local`: those are each agent's own observation, not replicated state.
 */
import assert from 'node:assert/strict';
import { AgentProcess, type StartOptions } from './agent-process.js';
import type { ApiResponse } from './api-client.js';
import type { Vendor } from './licenses.js';
import { bootstrapNode, join, type Node } from './nodes.js';

export const GOSSIP_INTERVAL_MS = 200;
export const CLUSTER_ARGS = ['--gossip-interval-ms', String(GOSSIP_INTERVAL_MS)];

export type LicenseOverrides = Parameters<Vendor['sign']>[0];

/** What a test needs of its agents beyond a short gossip interval: a cut (gossip-cut.ts), a clock. */
export type ClusterAgentOptions = Pick<StartOptions, 'ownAddress' | 'movableClock'>;

/**
 * Polls `fn` until it returns something other than undefined, or throws after `ms` with `what`
 * and the last value `describe` gives (or the last error fn threw).
 */
export async function eventually<T>(
  what: string,
  fn: () => Promise<T | undefined>,
  ms = 15_000,
  describe?: () => Promise<unknown> | unknown,
): Promise<T> {
  const end = Date.now() + ms;
  let lastError: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined) return v;
      lastError = undefined;
    } catch (err) {
      lastError = err;
    }
    if (Date.now() > end) {
      const detail = lastError ? `; last error: ${(lastError as Error).message}` : '';
      const state = describe ? `; last state: ${JSON.stringify(await describe())}` : '';
      throw new Error(`timed out after ${ms} ms waiting for ${what}${detail}${state}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Starts one agent for a cluster test and bootstraps it. */
export async function startNode(
  vendor: Vendor,
  license: LicenseOverrides,
  options: ClusterAgentOptions = {},
): Promise<Node> {
  const agent = await AgentProcess.start({ vendor, extraArgs: CLUSTER_ARGS, ...options });
  return bootstrapNode(agent, vendor, license);
}

/**
 * Starts n agents, bootstraps them in order (the first is the oldest peer, so the allocator)
 * and joins each of the others to the first; returns once every agent lists all n peers.
 */
export async function startCluster(
  vendor: Vendor,
  n: number,
  license: LicenseOverrides,
  options: ClusterAgentOptions = {},
): Promise<Node[]> {
  const agents = await Promise.all(
    Array.from({ length: n }, () => AgentProcess.start({ vendor, extraArgs: CLUSTER_ARGS, ...options })),
  );
  const nodes: Node[] = [];
  try {
    // One at a time: created_at orders the peers, and the first must be the oldest.
    for (const agent of agents) {
      nodes.push(await bootstrapNode(agent, vendor, license));
      await new Promise((r) => setTimeout(r, 5));
    }
    for (const node of nodes.slice(1)) await join(nodes[0]!, node);
    await waitForPeerCount(nodes, n);
  } catch (err) {
    await stopAll(agents);
    throw err;
  }
  return nodes;
}

/** Waits until every node lists `count` peers. */
export async function waitForPeerCount(nodes: readonly Node[], count: number, ms = 15_000): Promise<void> {
  for (const n of nodes) {
    await eventually(
      `${count} peers on ${n.agent.url}`,
      async () => {
        const res = await n.agent.client.get('/v1/peers', { token: n.token });
        return res.status === 200 && res.body.length === count ? true : undefined;
      },
      ms,
    );
  }
}

/** Stops every agent still running; a failure to stop one does not leave the others running. */
export async function stopAll(agents: readonly AgentProcess[]): Promise<void> {
  const results = await Promise.allSettled(agents.map((a) => a.stop()));
  const failed = results.find((r) => r.status === 'rejected');
  if (failed) throw (failed as PromiseRejectedResult).reason;
}

/** Everything an agent serves about the replicated configuration, in the API's own forms. */
export interface ClusterView {
  peers: Record<string, unknown>[];
  services: Record<string, unknown>[];
  /** GET /v1/services/{id} per service id of the list. */
  single: Record<string, unknown>;
  /** GET /v1/services/{id}/routes per service id of the list. */
  routes: Record<string, unknown>;
}

/** A peer of GET /v1/peers without what the agent observes itself. */
export function replicatedPeer(peer: Record<string, unknown>): Record<string, unknown> {
  const { reachable: _r, last_seen_at: _l, is_local: _i, ...rest } = peer;
  return rest;
}

async function getOk(node: Node, path: string): Promise<unknown> {
  const res = await node.agent.client.get(path, { token: node.token });
  assert.equal(res.status, 200, `GET ${path} on ${node.agent.url}: ${res.status} ${res.text}`);
  return res.body;
}

/** The full view of one agent: peers, the service list, every single service, every route list. */
export async function viewOf(node: Node): Promise<ClusterView> {
  const peers = ((await getOk(node, '/v1/peers')) as Record<string, unknown>[]).map(replicatedPeer);
  const services = (await getOk(node, '/v1/services')) as Record<string, unknown>[];
  const single: Record<string, unknown> = {};
  const routes: Record<string, unknown> = {};
  for (const s of services) {
    single[s.id as string] = await getOk(node, `/v1/services/${s.id}`);
    routes[s.id as string] = await getOk(node, `/v1/services/${s.id}/routes`);
  }
  return { peers, services, single, routes };
}

/** The nodes' views when they are all deep-equal, otherwise undefined. */
export async function converged(nodes: readonly Node[]): Promise<ClusterView | undefined> {
  let views: ClusterView[];
  try {
    views = await Promise.all(nodes.map(viewOf));
  } catch {
    // A service deleted between the list and the single read: not settled yet.
    return undefined;
  }
  const first = JSON.stringify(views[0]);
  return views.every((v) => JSON.stringify(v) === first) ? views[0] : undefined;
}

/**
 * Waits until every node serves the same view and returns it; on timeout fails with the
 * difference between the first node's view and the first one that differs.
 */
export async function waitConverged(nodes: readonly Node[], ms = 15_000): Promise<ClusterView> {
  const end = Date.now() + ms;
  for (;;) {
    const view = await converged(nodes);
    if (view) return view;
    if (Date.now() > end) {
      const views = await Promise.all(nodes.map(viewOf));
      for (let i = 1; i < views.length; i++) {
        assert.deepEqual(views[i], views[0], `view of ${nodes[i]!.agent.url} vs ${nodes[0]!.agent.url}`);
      }
      throw new Error('views differed until the deadline');
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Requests as a node's admin: the shorthands the cluster tests write their steps in. */
export const get = (n: Node, path: string) => n.agent.client.get(path, { token: n.token });
export const put = (n: Node, path: string, json: unknown) =>
  n.agent.client.put(path, { token: n.token, json });
export const post = (n: Node, path: string, json?: unknown) =>
  n.agent.client.post(path, { token: n.token, json });
export const del = (n: Node, path: string) => n.agent.client.delete(path, { token: n.token });

export function expectStatus(res: ApiResponse, status: number, what: string): void {
  assert.equal(res.status, status, `${what}: ${res.status} ${res.text}`);
}
