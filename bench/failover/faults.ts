/**
 * The faults the failover bench (run.ts) injects into the preferred exit (`exit` of
 * test/helpers/mesh-netns.ts), one table entry each: how to inject it, how to undo it. A new kind
 * is a new entry. Used by run.ts only.
 */
import assert from 'node:assert/strict';
import { HTTP, type MeshNetns, serviceAt, until } from '../../test/helpers/mesh-netns.js';
import { IP } from '../../test/helpers/netns-topology.js';
import { cutUp, portBlockUp, tableDown } from '../../test/helpers/underlay-rules.js';

/** The clock of the whole bench: epoch ms with a fraction, as client-loop.ts stamps its lines. */
export const now = () => performance.timeOrigin + performance.now();

export interface FaultContext {
  mesh: MeshNetns;
  /** The bench's nftables table name for a cut (test/helpers/underlay-rules.ts). */
  cutTable: string;
  /** The preferred exit's service. */
  first: string;
}

export interface FaultKind {
  name: string;
  /** What is done to the exit, for the table and the docs. */
  what: string;
  /**
   * Why the agent cannot fail over on this fault at all yet (checked in its source), when it
   * cannot; such a kind has no inject, is left out of the default run and refused by --faults.
   */
  notYet?: string;
  /** Injects the fault; resolves with the time (now()) from which it is surely in effect. */
  inject?(c: FaultContext): Promise<number>;
  /** Undoes it. */
  recover?(c: FaultContext): Promise<void>;
  /** Before the kind's first trial (e.g. a health_check to fail), and after its last. */
  setUp?(c: FaultContext): Promise<void>;
  tearDown?(c: FaultContext): Promise<void>;
}

/** The probe the `probe` kind gives exit's service: the destination's second TCP server. */
const PROBE_PORT = HTTP + 1;

async function setHealthCheck(
  { mesh, first }: FaultContext,
  check: Record<string, unknown> | null,
): Promise<void> {
  const res = await mesh.ingress.agent.client.put(`/v1/services/${first}`, {
    token: mesh.ingress.token,
    json: { health_check: check },
  });
  if (res.status !== 200) throw new Error(`PUT health_check: ${res.status} ${res.text}`);
}

export const FAULTS: readonly FaultKind[] = [
  {
    name: 'kill9',
    what: "kill -9 of the exit's agent, restarted to recover",
    async inject({ mesh }) {
      const at = now();
      await mesh.exit.agent.kill9();
      return at;
    },
    recover: ({ mesh }) => mesh.exit.agent.restart(),
  },
  {
    name: 'sigstop',
    what: "SIGSTOP of the exit's agent (its tunnel silent, not closed), SIGCONT to recover",
    async inject({ mesh }) {
      const at = now();
      process.kill(mesh.exit.agent.pid, 'SIGSTOP');
      return at;
    },
    async recover({ mesh }) {
      process.kill(mesh.exit.agent.pid, 'SIGCONT');
    },
  },
  {
    name: 'underlay',
    what: "every packet on the exit's underlay link (e1, to the ingress) dropped by nftables in its namespace",
    async inject({ mesh, cutTable }) {
      await cutUp(mesh.topo, mesh.topo.ns.exit, 'e1', cutTable);
      return now();
    },
    recover: ({ mesh, cutTable }) => tableDown(mesh.topo, mesh.topo.ns.exit, cutTable),
  },
  {
    // Seen by the exit's own route check (src/dataplane/exit-reach.ts), which tells the ingress
    // over the tunnel (status message kind 9): the tunnel itself stays healthy.
    name: 'lan-down',
    what: "the exit's LAN link (e0, toward the destination) set down",
    async inject({ mesh }) {
      await mesh.topo.run(mesh.topo.ns.exit, 'ip', ['link', 'set', 'e0', 'down']);
      return now();
    },
    async recover({ mesh }) {
      const ns = mesh.topo.ns.exit;
      await mesh.topo.run(ns, 'ip', ['link', 'set', 'e0', 'up']);
      // Linux drops a link's IPv6 addresses when it goes down (IPv4 ones stay).
      const v6 = await mesh.topo.run(ns, 'ip', ['-6', 'addr', 'show', 'dev', 'e0']);
      if (!v6.includes(IP.exitOut6))
        await mesh.topo.run(ns, 'ip', ['addr', 'add', `${IP.exitOut6}/64`, 'dev', 'e0', 'nodad']);
    },
  },
  {
    // Seen by the exit's probe (src/dataplane/probe.ts: every 200 ms, 3 failures in a row),
    // told to the ingress like the route check's verdict. Only the probe's port is blocked: the
    // traffic itself would still get through the exit.
    name: 'probe',
    what: `the exit's probe target (tcp ${IP.dest}:${PROBE_PORT}, every 200 ms, 3 failures) blocked at the destination`,
    async setUp(c) {
      await setHealthCheck(c, { tcp: `${IP.dest}:${PROBE_PORT}`, interval_ms: 200, failures: 3 });
      await until(
        'the probe passes at exit',
        async () => assert.equal((await serviceAt(c.mesh.exit, c.first)).dataplane.probe_passing, true),
        30_000,
      );
    },
    tearDown: (c) => setHealthCheck(c, null),
    async inject({ mesh, cutTable }) {
      await portBlockUp(mesh.topo, mesh.topo.ns.dest, PROBE_PORT, cutTable);
      return now();
    },
    recover: ({ mesh, cutTable }) => tableDown(mesh.topo, mesh.topo.ns.dest, cutTable),
  },
];
