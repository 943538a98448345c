/**
 * What the data-plane test files share: three real agents with their data planes on (ingress,
 * exit, exit2), each in its namespace of the test topology (netns-topology.ts), joined into one
 * cluster over the underlay, and the destination's server (netns-apps.ts `serve`) whose stdout is
 * its own log. Plus the service calls those tests make through the agents' APIs.
 */
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { AgentProcess } from './agent-process.js';
import { eventually } from './cluster.js';
import { exclusive } from './exclusive.js';
import { makeVendor } from './licenses.js';
import { IP, spawnIn, type Topology, topologyUp } from './netns-topology.js';
import { bootstrapNode, type Node } from './nodes.js';

export const APPS = fileURLToPath(new URL('./netns-apps.js', import.meta.url));
export const PORT = 7480;
export const HTTP = 8080;
export const UDP = 9090;

type Role = 'ingress' | 'exit' | 'exit2';

/** Retries fn until it stops throwing, for at most ms; `describe` says the state when it gives up. */
export const until = (
  what: string,
  fn: () => Promise<void>,
  ms: number,
  describe?: () => Promise<unknown> | unknown,
) =>
  eventually(
    what,
    async () => {
      await fn();
      return true;
    },
    ms,
    describe,
  );

export interface MeshNetns {
  topo: Topology;
  ingress: Node;
  exit: Node;
  exit2: Node;
  /** Everything the destination's server printed so far. */
  destLog(): string;
  /** Stops the agents and the server, removes the namespaces. */
  down(): Promise<void>;
}

/**
 * Builds the topology (with the second exit), runs `prepare` on it, starts the destination's
 * server and the three agents (the exits' MACVLANs on their destination-side links) and joins
 * them. `readOnlySysctls`: agents started without the right to change sysctls.
 */
export async function meshNetnsUp(
  prefix: string,
  index: number,
  opts: {
    readOnlySysctls?: Role[];
    prepare?: (topo: Topology) => Promise<void>;
    /** More `serve` flags for every agent. */
    agentArgs?: string[];
    /** Node's own flags for each agent (a bench's --cpu-prof, say). */
    agentNodeArgs?: string[];
  } = {},
): Promise<MeshNetns> {
  // One traffic suite at a time: their throughput figures must not share the cores (exclusive.ts).
  const release = await exclusive('mesh-netns', 240_000);
  let topo: Topology;
  try {
    topo = await topologyUp(prefix, index, { secondExit: true });
  } catch (err) {
    release();
    throw err;
  }
  const vendor = makeVendor();
  const agents: Node[] = [];
  let server: ChildProcess | undefined;
  let log = '';
  const mesh = {
    topo,
    destLog: () => log,
    async down() {
      try {
        await Promise.all(agents.map((n) => n.agent.stop()));
        server?.kill('SIGKILL');
        await topo.down();
      } finally {
        release();
      }
    },
  };
  try {
    await opts.prepare?.(topo);
    server = spawnIn(topo.ns.dest, process.execPath, [APPS, 'serve', String(HTTP), String(UDP)]);
    server.stdout!.on('data', (c: Buffer) => {
      log += c.toString();
    });
    const license = { max_nodes: 5, max_services: 20 };
    const start = async (role: Role, advertise: string, parent?: string) => {
      const agent = await AgentProcess.start({
        vendor,
        netns: topo.ns[role]!,
        port: PORT,
        listen: `0.0.0.0:${PORT}`,
        apiHost: topo.mgmt[role],
        readOnlySysctls: opts.readOnlySysctls?.includes(role) ?? false,
        nodeArgs: opts.agentNodeArgs,
        extraArgs: [
          '--advertise',
          `${advertise}:${PORT}`,
          '--dataplane',
          'on',
          '--gossip-interval-ms',
          '200',
          ...(parent ? ['--macvlan-parent', parent] : []),
          ...(opts.agentArgs ?? []),
        ],
      });
      const node = await bootstrapNode(agent, vendor, license);
      agents.push(node);
      return node;
    };
    const ingress = await start('ingress', IP.ingressUl);
    const exit = await start('exit', IP.exitUl, 'e0');
    const exit2 = await start('exit2', IP.exit2Ul, 'f0');
    for (const address of [IP.exitUl, IP.exit2Ul]) {
      const res = await ingress.agent.client.post('/v1/peers', {
        token: ingress.token,
        json: { address: `${address}:${PORT}` },
      });
      assert.equal(res.status, 201, res.text);
    }
    await until('the destination server', async () => assert.match(log, /listening/), 10_000);
    return { ...mesh, ingress, exit, exit2 };
  } catch (err) {
    await mesh.down();
    throw err;
  }
}

/** Creates a service and its routes through a node; its id. */
export async function createService(
  node: Node,
  body: Record<string, unknown>,
  routes: Record<string, unknown>[],
): Promise<string> {
  const res = await node.agent.client.post('/v1/services', { token: node.token, json: body });
  assert.equal(res.status, 201, res.text);
  const id = res.body.id as string;
  const r = await node.agent.client.post(`/v1/services/${id}/routes`, {
    token: node.token,
    json: { routes },
  });
  assert.equal(r.status, 201, r.text);
  return id;
}

/** GET /v1/services/{id} on a node: the single form with its extra fields. */
export async function serviceAt(node: Node, id: string) {
  const res = await node.agent.client.get(`/v1/services/${id}`, { token: node.token });
  assert.equal(res.status, 200, res.text);
  return res.body as Record<string, unknown> & { dataplane: Record<string, unknown> };
}

/**
 * Sets a service's bandwidth limit through its ingress, pushes it to the exit at once and waits
 * until the exit holds it: each direction is shaped by the agent that sends it.
 */
export async function setBandwidthLimit(ingress: Node, exit: Node, id: string, mbps: number): Promise<void> {
  const res = await ingress.agent.client.put(`/v1/services/${id}`, {
    token: ingress.token,
    json: { bandwidth_limit_mbps: mbps },
  });
  assert.equal(res.status, 200, res.text);
  await ingress.agent.client.post('/v1/cluster/sync', { token: ingress.token });
  await exit.agent.client.post('/v1/cluster/sync', { token: exit.token });
  await until(
    `the limit of ${mbps} Mbit/s at the exit`,
    async () => assert.equal((await serviceAt(exit, id)).bandwidth_limit_mbps, mbps),
    10_000,
  );
}

/** The `dataplane` extra field of a service on a node. */
export const dataplaneOf = async (node: Node, id: string) => (await serviceAt(node, id)).dataplane;

/** Waits until the service is up on every node given; fails with their last log lines. */
export async function waitUp(id: string, ...nodes: Node[]): Promise<void> {
  try {
    await until(
      `service ${id} up`,
      async () => {
        for (const n of nodes)
          assert.equal((await dataplaneOf(n, id)).state, 'up', `service ${id} on ${n.peerId}`);
      },
      20_000,
    );
  } catch (err) {
    const logs = nodes.map((n) => `--- ${n.peerId}\n${n.agent.logs.split('\n').slice(-40).join('\n')}`);
    throw new Error(`${(err as Error).message}\n${logs.join('\n')}`);
  }
}

export async function removeService(node: Node, id: string): Promise<void> {
  const res = await node.agent.client.delete(`/v1/services/${id}`, { token: node.token });
  assert.equal(res.status, 200, res.text);
}

/** The agents' underlay addresses: gossip between the two exits crosses the ingress's underlay too. */
export const AGENT_UNDERLAY: readonly string[] = [IP.ingressUl, IP.exitUl, IP.exit2Ul, IP.ingressUl2];

/** One packet of an underlay capture: addresses, ports (when tcpdump printed them), and the text after. */
export interface CapturedPacket {
  line: string;
  src: string;
  srcPort: string | undefined;
  dst: string;
  dstPort: string | undefined;
  /** What follows the addresses: `UDP, length N`, `Flags [P.], ...`, `ICMP ...`. */
  rest: string;
}

/**
 * tcpdump (text, -A: payload printed) on a link of the ingress's namespace while `during` runs:
 * the packets and the raw text (to look for payload in clear).
 */
export async function underlayCapture(
  topo: Topology,
  dev: string,
  during: () => Promise<void>,
): Promise<{ packets: CapturedPacket[]; text: string }> {
  const capture = spawnIn(topo.ns.ingress, 'tcpdump', [
    '-i',
    dev,
    '-n',
    '-l',
    '-A',
    '-s',
    '256',
    '-c',
    '30000',
    'ip or ip6',
  ]);
  let text = '';
  capture.stdout!.on('data', (c: Buffer) => {
    text += c.toString('latin1');
  });
  await new Promise((r) => setTimeout(r, 500));
  try {
    await during();
  } finally {
    capture.kill('SIGINT');
    await new Promise((r) => setTimeout(r, 300));
  }
  const packets: CapturedPacket[] = [];
  for (const line of text.split('\n')) {
    const m = / IP6? (\S+?)(?:\.(\d+))? > (\S+?)(?:\.(\d+))?: (.*)$/.exec(line);
    if (m) packets.push({ line, src: m[1]!, srcPort: m[2], dst: m[3]!, dstPort: m[4], rest: m[5]! });
  }
  return { packets, text };
}
