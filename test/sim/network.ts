/**
 * An in-memory gossip network (memberlist's MockNetwork, with faults): each agent gets a
 * GossipTransport whose post() hands the envelope to the addressed agent's Gossip.handle() after
 * a virtual delay, and its reply back after another. Every fault comes from the seeded source:
 * loss (each direction), delay with jitter (which reorders), duplicates, and partitions.
 * A crashed agent receives nothing, and what it was waiting for never arrives.
 */
import type { Envelope } from '../../src/cluster/gossip-envelope.js';
import type { GossipReply, GossipTransport } from '../../src/cluster/gossip-transport.js';
import type { Prng } from './prng.js';
import type { VirtualTime } from './virtual-time.js';

export interface NetNode {
  readonly index: number;
  /** False while crashed. */
  up: boolean;
  /** Bumped at every crash: replies addressed to an earlier life are dropped. */
  life: number;
  handle(envelope: Envelope): Promise<{ status: number; body: unknown }>;
}

export interface NetFaults {
  /** Share of messages lost, each direction on its own. */
  loss: number;
  /** One-way delay: base plus a uniform jitter (jitter above base reorders messages). */
  delayMs: number;
  jitterMs: number;
  /** Share of requests delivered twice. */
  duplicate: number;
  /**
   * A lost message fails at once at its sender instead of leaving it to its timeout: how the
   * agents' former in-process fault switch lost messages, which the multi-process bench figures
   * of docs/benchmarks.md were measured with. A real network tells the sender nothing.
   */
  lossKnown?: boolean;
}

export const CALM: NetFaults = { loss: 0, delayMs: 5, jitterMs: 5, duplicate: 0 };

export class SimNetwork {
  faults: NetFaults = { ...CALM };
  /** Partition group of each agent; agents in different groups cannot reach each other. */
  private readonly group = new Map<number, number>();
  private readonly byAddress = new Map<string, NetNode>();
  /** Bytes each agent sent (requests and replies), as JSON. */
  readonly bytesSent: number[] = [];
  messages = 0;

  constructor(
    private readonly time: VirtualTime,
    private readonly random: Prng,
    private readonly trace: (line: string) => void,
  ) {}

  attach(address: string, node: NetNode): void {
    this.byAddress.set(address, node);
    this.bytesSent[node.index] = 0;
  }

  node(address: string): NetNode | undefined {
    return this.byAddress.get(address);
  }

  partition(groups: readonly (readonly number[])[]): void {
    this.group.clear();
    groups.forEach((members, g) => {
      for (const i of members) this.group.set(i, g);
    });
  }

  heal(): void {
    this.group.clear();
  }

  reachable(a: number, b: number): boolean {
    return (this.group.get(a) ?? 0) === (this.group.get(b) ?? 0);
  }

  private passes(a: NetNode, b: NetNode): boolean {
    return this.reachable(a.index, b.index) && !this.random.chance(this.faults.loss);
  }

  private delay(): number {
    return this.faults.delayMs + this.random.int(this.faults.jitterMs + 1);
  }

  transport(from: NetNode): GossipTransport {
    return {
      post: (address, envelope, timeoutMs) => this.post(from, address, envelope, timeoutMs),
      close: () => {},
    };
  }

  private post(from: NetNode, address: string, envelope: Envelope, timeoutMs: number): Promise<GossipReply> {
    const life = from.life;
    return new Promise((resolve, reject) => {
      let done = false;
      const settle = (f: () => void) => {
        if (done || !from.up || from.life !== life) return;
        done = true;
        f();
      };
      this.time.at(timeoutMs, () => settle(() => reject(new Error(`no answer within ${timeoutMs} ms`))));
      const to = this.byAddress.get(address);
      const size = envelope.payload.length + 200;
      this.bytesSent[from.index]! += size;
      this.messages++;
      if (!to || !this.passes(from, to)) {
        this.trace(`drop ${from.index}>${to?.index ?? address} ${size}`);
        if (this.faults.lossKnown) this.time.at(0, () => settle(() => reject(new Error('lost'))));
        return;
      }
      const copies = this.random.chance(this.faults.duplicate) ? 2 : 1;
      for (let c = 0; c < copies; c++) {
        this.time.at(this.delay(), () => {
          if (!to.up) return;
          const toLife = to.life;
          void to.handle(envelope).then((reply) => {
            if (!to.up || to.life !== toLife) return;
            const replySize = JSON.stringify(reply.body).length;
            this.bytesSent[to.index]! += replySize;
            this.trace(`msg ${from.index}>${to.index} ${size} ${reply.status} ${replySize}`);
            if (!this.passes(to, from)) {
              if (this.faults.lossKnown) this.time.at(0, () => settle(() => reject(new Error('lost'))));
              return;
            }
            this.time.at(this.delay(), () =>
              settle(() =>
                resolve({
                  status: reply.status,
                  body: reply.body,
                  wireBytes: { sent: size, received: replySize },
                }),
              ),
            );
          });
        });
      }
    });
  }
}
