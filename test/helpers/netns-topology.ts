/**
 * The data-plane tests' network: four network namespaces of the test's own in a line, client,
 * ingress, exit and dest, joined by veth pairs; the client and dest networks sit behind ingress
 * and exit, which share an underlay (the addresses and interface names below, the same layout as
 * the data-plane benchmark's, docs/benchmarks.md). Unlike the benchmark's, it has no plain
 * forwarding routes between the client and destination networks (nothing crosses unless the
 * agents carry it), IPv6 ULAs on every link (nodad) and an optional second exit. Each agent
 * namespace also has a management veth to the test's namespace, so the test reaches the agents'
 * APIs while the agents talk to each other over the underlay.
 *
 *  client 10.91.1.2 --c0/i0-- 10.91.1.1 ingress 10.91.0.1 --i1/e1-- 10.91.0.2 exit 10.91.2.1 --e0/d0-- 10.91.2.2 dest
 *                                        ingress 10.91.3.1 --i2/f1-- 10.91.3.2 exit2 10.91.4.1 --f0/d1-- 10.91.4.2 dest
 *  IPv6: fd91:N::/64 beside each 10.91.N.0/24, same host numbers.
 *
 * Requires root, iproute2 and nftables; fails loudly otherwise (never skips).
 */
import { execFile, spawn } from 'node:child_process';
import { promisify } from 'node:util';

const exec = promisify(execFile);

export interface Topology {
  prefix: string;
  ns: { client: string; ingress: string; exit: string; dest: string; exit2: string | null };
  /** Management address (in the test's namespace's reach) of each agent namespace. */
  mgmt: Record<'ingress' | 'exit' | 'exit2', string>;
  /** Runs a command in a namespace; rejects with its output on a non-zero exit. */
  run(ns: string, command: string, args: string[], timeoutMs?: number): Promise<string>;
  down(): Promise<void>;
}

export const IP = {
  client: '10.91.1.2',
  ingressIn: '10.91.1.1',
  ingressUl: '10.91.0.1',
  exitUl: '10.91.0.2',
  exitOut: '10.91.2.1',
  dest: '10.91.2.2',
  ingressUl2: '10.91.3.1',
  exit2Ul: '10.91.3.2',
  exit2Out: '10.91.4.1',
  dest2: '10.91.4.2',
  client6: 'fd91:1::2',
  ingressIn6: 'fd91:1::1',
  exitOut6: 'fd91:2::1',
  dest6: 'fd91:2::2',
  exit2Out6: 'fd91:4::1',
  dest26: 'fd91:4::2',
} as const;

async function sh(command: string, args: string[], timeoutMs = 10_000): Promise<string> {
  try {
    const { stdout } = await exec(command, args, { timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024 });
    return stdout;
  } catch (err) {
    const e = err as { stderr?: string; stdout?: string; message: string };
    throw new Error(`${command} ${args.join(' ')} failed: ${e.stderr || e.stdout || e.message}`);
  }
}

/** Fails with the reason when this process cannot build namespaces (not root, no tools). */
export async function requireNetnsSupport(): Promise<void> {
  if (process.getuid?.() !== 0)
    throw new Error('data-plane tests need root (network namespaces, TUN, nftables)');
  await sh('ip', ['-V']);
  await sh('nft', ['--version']).catch(() => {
    throw new Error('data-plane tests need nftables (apt-get install nftables)');
  });
}

/**
 * Builds the topology. `index` (1..250) keeps the management subnets of test files that run at
 * the same time apart (they are the only addresses in the test's own namespace).
 */
export async function topologyUp(
  prefix: string,
  index: number,
  opts: { secondExit?: boolean } = {},
): Promise<Topology> {
  await requireNetnsSupport();
  const ns = {
    client: `${prefix}-client`,
    ingress: `${prefix}-ingress`,
    exit: `${prefix}-exit`,
    dest: `${prefix}-dest`,
    exit2: opts.secondExit ? `${prefix}-exit2` : null,
  };
  const all = [ns.client, ns.ingress, ns.exit, ns.dest, ...(ns.exit2 ? [ns.exit2] : [])];
  const mgmt = { ingress: `10.254.${index}.2`, exit: `10.254.${index}.6`, exit2: `10.254.${index}.10` };
  const hostLinks: string[] = [];
  const topo: Topology = {
    prefix,
    ns,
    mgmt,
    run: (n, command, args, timeoutMs) => sh('ip', ['netns', 'exec', n, command, ...args], timeoutMs),
    async down() {
      for (const n of all) {
        const pids = (await sh('ip', ['netns', 'pids', n]).catch(() => '')).split(/\s+/).filter(Boolean);
        for (const pid of pids) {
          try {
            process.kill(Number(pid), 'SIGKILL');
          } catch {
            // already gone
          }
        }
      }
      for (const n of all) await sh('ip', ['netns', 'del', n]).catch(() => '');
      for (const l of hostLinks) await sh('ip', ['link', 'del', l]).catch(() => '');
    },
  };
  // A leftover of an interrupted run with the same prefix goes first.
  await topo.down();
  try {
    for (const n of all) {
      await sh('ip', ['netns', 'add', n]);
      await sh('ip', ['-n', n, 'link', 'set', 'lo', 'up']);
    }
    const veth = async (a: string, ifA: string, b: string, ifB: string) =>
      sh('ip', ['-n', a, 'link', 'add', ifA, 'type', 'veth', 'peer', 'name', ifB, 'netns', b]);
    const addr = async (n: string, dev: string, v4: string, v6: string | null) => {
      await sh('ip', ['-n', n, 'addr', 'add', v4, 'dev', dev]);
      if (v6) await sh('ip', ['-n', n, 'addr', 'add', v6, 'dev', dev, 'nodad']);
      await sh('ip', ['-n', n, 'link', 'set', dev, 'up']);
    };
    await veth(ns.client, 'c0', ns.ingress, 'i0');
    await veth(ns.ingress, 'i1', ns.exit, 'e1');
    await veth(ns.exit, 'e0', ns.dest, 'd0');
    await addr(ns.client, 'c0', `${IP.client}/24`, `${IP.client6}/64`);
    await addr(ns.ingress, 'i0', `${IP.ingressIn}/24`, `${IP.ingressIn6}/64`);
    await addr(ns.ingress, 'i1', `${IP.ingressUl}/24`, 'fd91::1/64');
    await addr(ns.exit, 'e1', `${IP.exitUl}/24`, 'fd91::2/64');
    await addr(ns.exit, 'e0', `${IP.exitOut}/24`, `${IP.exitOut6}/64`);
    await addr(ns.dest, 'd0', `${IP.dest}/24`, `${IP.dest6}/64`);
    await sh('ip', ['-n', ns.client, 'route', 'add', 'default', 'via', IP.ingressIn]);
    await sh('ip', ['-n', ns.client, '-6', 'route', 'add', 'default', 'via', IP.ingressIn6]);
    await sh('ip', ['-n', ns.dest, 'route', 'add', 'default', 'via', IP.exitOut]);
    await sh('ip', ['-n', ns.dest, '-6', 'route', 'add', 'default', 'via', IP.exitOut6]);
    if (ns.exit2) {
      await veth(ns.ingress, 'i2', ns.exit2, 'f1');
      await veth(ns.exit2, 'f0', ns.dest, 'd1');
      await addr(ns.ingress, 'i2', `${IP.ingressUl2}/24`, 'fd91:3::1/64');
      await addr(ns.exit2, 'f1', `${IP.exit2Ul}/24`, 'fd91:3::2/64');
      await addr(ns.exit2, 'f0', `${IP.exit2Out}/24`, `${IP.exit2Out6}/64`);
      await addr(ns.dest, 'd1', `${IP.dest2}/24`, `${IP.dest26}/64`);
      // The two exits reach each other's underlay through the ingress (gossip, not client traffic).
      await sh('ip', ['-n', ns.exit, 'route', 'add', '10.91.3.0/24', 'via', IP.ingressUl]);
      await sh('ip', ['-n', ns.exit2, 'route', 'add', '10.91.0.0/24', 'via', IP.ingressUl2]);
      // exit2 reaches the first destination network through dest's second leg.
      await sh('ip', ['-n', ns.exit2, 'route', 'add', '10.91.2.0/24', 'via', IP.dest2]);
      await sh('ip', ['-n', ns.exit2, '-6', 'route', 'add', 'fd91:2::/64', 'via', IP.dest26]);
    }
    for (const n of [ns.ingress, ns.exit, ...(ns.exit2 ? [ns.exit2] : [])]) {
      await sh('ip', [
        'netns',
        'exec',
        n,
        'sysctl',
        '-qw',
        'net.ipv4.ip_forward=1',
        'net.ipv6.conf.all.forwarding=1',
      ]);
    }
    // Management links: test namespace <-> each agent namespace.
    const agentNs: ['ingress' | 'exit' | 'exit2', string | null][] = [
      ['ingress', ns.ingress],
      ['exit', ns.exit],
      ['exit2', ns.exit2],
    ];
    for (const [i, [role, n]] of agentNs.entries()) {
      if (!n) continue;
      const host = `${prefix.slice(0, 8)}m${i}`;
      hostLinks.push(host);
      await sh('ip', ['link', 'add', host, 'type', 'veth', 'peer', 'name', 'mg0', 'netns', n]);
      await sh('ip', ['addr', 'add', `10.254.${index}.${4 * i + 1}/30`, 'dev', host]);
      await sh('ip', ['link', 'set', host, 'up']);
      await sh('ip', ['-n', n, 'addr', 'add', `${mgmt[role]}/30`, 'dev', 'mg0']);
      await sh('ip', ['-n', n, 'link', 'set', 'mg0', 'up']);
    }
  } catch (err) {
    await topo.down();
    throw err;
  }
  return topo;
}

/** Starts a long-running process in a namespace; killed by topology.down() at the latest. */
export function spawnIn(ns: string, command: string, args: string[]) {
  return spawn('ip', ['netns', 'exec', ns, command, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
}
