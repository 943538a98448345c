/**
 * Prometheus metrics of gossip, registered in the agent's own registry (docs/decisions.md §7): messages
 * and bytes by type and direction, refused messages by reason (the counter that shows forged,
 * replayed, stale or unauthorized gossip), records merged, how long a change took to reach this
 * agent (convergence), peers by liveness, and this agent's own SWIM incarnation (it rises each
 * time the agent refutes a suspicion of itself, so a flapping agent shows).
 */
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

export class GossipMetrics {
  readonly messages: Counter<'type' | 'direction'>;
  readonly bytes: Counter<'direction'>;
  readonly httpBytes: Counter<'type' | 'direction'>;
  readonly rejected: Counter<'reason'>;
  readonly recordsApplied: Counter;
  readonly recordsMalformed: Counter;
  readonly convergenceSeconds: Histogram;
  readonly sendFailures: Counter<'type'>;
  readonly peers: Gauge<'state'>;
  readonly antiEntropyRounds: Counter;
  readonly incarnation: Gauge;

  constructor(registry: Registry) {
    const registers = [registry];
    this.messages = new Counter({
      name: 'mesh_gossip_messages_total',
      help: 'Authenticated gossip messages, by type and direction (sent, received).',
      labelNames: ['type', 'direction'] as const,
      registers,
    });
    this.bytes = new Counter({
      name: 'mesh_gossip_bytes_total',
      help: 'Bytes of gossip envelopes, by direction (sent counts requests and replies this agent sealed).',
      labelNames: ['direction'] as const,
      registers,
    });
    this.httpBytes = new Counter({
      name: 'mesh_gossip_http_bytes_total',
      help:
        'HTTP bytes of the gossip exchanges this agent started, counted on the connection with headers, ' +
        'by request type: its requests (sent) and their answers (received).',
      labelNames: ['type', 'direction'] as const,
      registers,
    });
    this.rejected = new Counter({
      name: 'mesh_gossip_rejected_total',
      help: 'Gossip messages refused and ignored, by reason (bad_signature, bad_mac, replay, stale, ...).',
      labelNames: ['reason'] as const,
      registers,
    });
    this.recordsApplied = new Counter({
      name: 'mesh_gossip_records_applied_total',
      help: 'Replicated records received by gossip that changed this agent’s state.',
      registers,
    });
    this.recordsMalformed = new Counter({
      name: 'mesh_gossip_records_malformed_total',
      help: 'Replicated records received from an authenticated peer but refused as malformed.',
      registers,
    });
    this.convergenceSeconds = new Histogram({
      name: 'mesh_gossip_convergence_seconds',
      help: 'Age of each write gossip applied here, from its writer’s hybrid-clock stamp (tombstones left out; includes clock skew, negatives count as 0; a joining agent’s catch-up counts full ages).',
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300],
      registers,
    });
    this.sendFailures = new Counter({
      name: 'mesh_gossip_send_failures_total',
      help: 'Gossip requests that got no valid answer (timeout, refused, unreachable), by type.',
      labelNames: ['type'] as const,
      registers,
    });
    this.peers = new Gauge({
      name: 'mesh_gossip_peers',
      help: 'Active remote peers by liveness as this agent sees them (alive, suspect, dead).',
      labelNames: ['state'] as const,
      registers,
    });
    this.antiEntropyRounds = new Counter({
      name: 'mesh_gossip_anti_entropy_total',
      help: 'Anti-entropy exchanges this agent started (digest, then the missing records).',
      registers,
    });
    this.incarnation = new Gauge({
      name: 'mesh_gossip_incarnation',
      help: "This agent's SWIM incarnation: raised each time it refutes a suspicion of itself.",
      registers,
    });
    this.bytesSent = this.bytes.labels('sent');
    this.bytesReceived = this.bytes.labels('received');
  }

  private readonly bytesSent: Counter.Internal;
  private readonly bytesReceived: Counter.Internal;
  /** `messages` children by "type direction": labels() hashes its arguments on every call. */
  private readonly messageCounters = new Map<string, Counter.Internal>();

  /**
   * One gossip message sealed or opened here, and its payload bytes (plus a flat 200 for the
   * envelope, docs/metrics.md). Every message passes here, so the labelled children are kept.
   */
  countMessage(type: string, direction: 'sent' | 'received', payloadLength: number): void {
    const id = `${type} ${direction}`;
    let counter = this.messageCounters.get(id);
    if (!counter) {
      counter = this.messages.labels(type, direction);
      this.messageCounters.set(id, counter);
    }
    counter.inc();
    this.countBytes(direction, payloadLength);
  }

  /** Envelope bytes alone: a reply this agent opened counts here, not as a message. */
  countBytes(direction: 'sent' | 'received', payloadLength: number): void {
    (direction === 'sent' ? this.bytesSent : this.bytesReceived).inc(payloadLength + 200);
  }
}
