/**
 * Real gossip faults for multi-process tests: an nftables table of the test's own
 * (`mesh_test_gossip_<pid>_<n>`, in the root network namespace, on the output hook, which sees
 * loopback traffic) that drops chosen agents' gossip. Needs root; it fails loudly otherwise.
 *
 * The agents are started with `ownAddress` (agent-process.ts): each listens on a loopback
 * address of its own and sends its gossip from it (gossipSourceAddress), so "A to B" is
 * `ip saddr A ip daddr B tcp dport B's port`, while the test's own requests, from 127.0.0.1,
 * pass. Every cut holds for requests on new and kept-alive connections alike: the requests are
 * lost, the sender's exchange times out, as on a real partition.
 *
 * The table is deleted by close() (call it in an after hook) and, failing that, when the test
 * process exits; one left by a test process killed outright is deleted by the next GossipCut.
 */
import { execFileSync } from 'node:child_process';
import type { AgentProcess } from './agent-process.js';
import { processAlive } from './exclusive.js';

let tables = 0;

function nft(script: string): void {
  execFileSync('nft', ['-f', '-'], { input: script, stdio: ['pipe', 'ignore', 'pipe'] });
}

function hostPort(agent: AgentProcess): { host: string; port: number } {
  const host = agent.address.slice(0, agent.address.lastIndexOf(':'));
  if (!/^127\.\d+\.\d+\.\d+$/.test(host) || host.startsWith('127.0.0.')) {
    throw new Error(
      `gossip cuts need agents started with ownAddress (listening on ${host}: the cut would also drop the test's own requests)`,
    );
  }
  return { host, port: agent.port };
}

/** Deletes the tables of test processes that died without their exit hook (kill -9). */
function removeOrphans(): void {
  const listed = execFileSync('nft', ['list', 'tables', 'inet'], { encoding: 'utf8' });
  for (const [, name, pid] of listed.matchAll(/table inet (mesh_test_gossip_(\d+)_\d+)/g)) {
    if (!processAlive(Number(pid))) nft(`delete table inet ${name}\n`);
  }
}

export class GossipCut {
  readonly table: string;
  private open = true;
  private readonly onExit = () => this.deleteTable();

  constructor() {
    if (process.getuid?.() !== 0) {
      throw new Error('gossip cuts are nftables rules: this test needs root (as npm test runs)');
    }
    removeOrphans();
    this.table = `mesh_test_gossip_${process.pid}_${tables++}`;
    nft(
      `table inet ${this.table} {\n  chain output {\n    type filter hook output priority 0; policy accept;\n  }\n}\n`,
    );
    process.once('exit', this.onExit);
  }

  /** Drops every gossip request `from` sends to each of `to` (one direction). */
  drop(from: AgentProcess, to: readonly AgentProcess[]): void {
    nft(this.dropRules(from, to));
  }

  /** Replaces every cut with `drop(from, to)`, at once (one nft transaction: no gap between). */
  dropOnly(from: AgentProcess, to: readonly AgentProcess[]): void {
    nft(`flush chain inet ${this.table} output\n${this.dropRules(from, to)}`);
  }

  /** Cuts `agent` off from each of `others`, both directions. */
  isolate(agent: AgentProcess, others: readonly AgentProcess[]): void {
    this.drop(agent, others);
    for (const o of others) this.drop(o, [agent]);
  }

  /** Removes every cut. */
  heal(): void {
    nft(`flush chain inet ${this.table} output\n`);
  }

  /** Deletes the table (every cut with it). */
  close(): void {
    process.removeListener('exit', this.onExit);
    this.deleteTable();
  }

  private dropRules(from: AgentProcess, to: readonly AgentProcess[]): string {
    const f = hostPort(from);
    const rules = to.map((agent) => {
      const t = hostPort(agent);
      return `add rule inet ${this.table} output ip saddr ${f.host} ip daddr ${t.host} tcp dport ${t.port} drop\n`;
    });
    return rules.join('');
  }

  private deleteTable(): void {
    if (!this.open) return;
    this.open = false;
    nft(`delete table inet ${this.table}\n`);
  }
}
