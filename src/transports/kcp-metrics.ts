/**
 * Prometheus metrics of the kcp transport (docs/decisions.md §7), read from its counters at scrape time:
 * datagrams and bytes per direction, dropped datagrams by reason (a failed authentication, a
 * replay, ... : what an attacker or a broken path costs), handshakes, and per peer the current
 * link's KCP figures: retransmissions (by timeout and fast), RTT and pacing rate. The per-peer
 * figures belong to the link: they start again at 0 when a new link replaces it (as counters of a
 * restarted process do). The agent registers them beside the data plane's.
 */
import { Counter, Gauge, type Registry } from 'prom-client';
import type { KcpTransport } from './kcp-transport.js';

/** `peers`: the peers this agent keeps a kcp tunnel with. */
export function registerKcpMetrics(registry: Registry, kcp: KcpTransport, peers: () => string[]): void {
  const registers = [registry];
  new Counter({
    name: 'mesh_kcp_datagrams_total',
    help: 'UDP datagrams of the kcp transport, received (in) and sent (out).',
    labelNames: ['direction'] as const,
    registers,
    collect() {
      this.reset();
      const s = kcp.datagramStats();
      this.labels('in').inc(s.datagramsIn);
      this.labels('out').inc(s.datagramsOut);
    },
  });
  new Counter({
    name: 'mesh_kcp_bytes_total',
    help: 'UDP payload bytes of the kcp transport, received (in) and sent (out).',
    labelNames: ['direction'] as const,
    registers,
    collect() {
      this.reset();
      const s = kcp.datagramStats();
      this.labels('in').inc(s.bytesIn);
      this.labels('out').inc(s.bytesOut);
    },
  });
  new Counter({
    name: 'mesh_kcp_dropped_datagrams_total',
    help: 'Datagrams the kcp transport dropped before any link saw them, by reason (auth: failed authentication; replay; malformed; noSession; handshake; staleConv; kcpRejected; refused).',
    labelNames: ['reason'] as const,
    registers,
    collect() {
      this.reset();
      for (const [reason, n] of Object.entries(kcp.datagramStats().dropped)) this.labels(reason).inc(n);
    },
  });
  new Counter({
    name: 'mesh_kcp_handshakes_refused_total',
    help: 'Handshake datagrams (INIT, RESPONSE) refused, by reason (rate limits included).',
    labelNames: ['reason'] as const,
    registers,
    collect() {
      this.reset();
      for (const [reason, n] of Object.entries(kcp.datagramStats().secure.handshakesRefused))
        this.labels(reason).inc(n);
    },
  });
  new Counter({
    name: 'mesh_kcp_retransmissions_total',
    help: "Segments the peer link's KCP engine sent again: after a timeout (rto) or on skipped acks (fast). Per link: 0 again on a new link.",
    labelNames: ['peer_id', 'kind'] as const,
    registers,
    collect() {
      this.reset();
      for (const peerId of peers()) {
        const s = kcp.kcpStats(peerId);
        if (!s) continue;
        this.labels(peerId, 'rto').inc(s.retransmissions - s.fastRetransmissions);
        this.labels(peerId, 'fast').inc(s.fastRetransmissions);
      }
    },
  });
  new Gauge({
    name: 'mesh_kcp_rtt_seconds',
    help: "The peer link's smoothed round-trip time as its KCP engine measures it.",
    labelNames: ['peer_id'] as const,
    registers,
    collect() {
      this.reset();
      for (const peerId of peers()) {
        const s = kcp.kcpStats(peerId);
        if (s) this.labels(peerId).set(s.rttMs / 1000);
      }
    },
  });
  new Gauge({
    name: 'mesh_kcp_pacing_rate_bytes_per_second',
    help: 'The rate (bytes/s) new data may leave on the peer link: gain x the measured delivery rate, within the configured bounds.',
    labelNames: ['peer_id'] as const,
    registers,
    collect() {
      this.reset();
      for (const peerId of peers()) {
        const s = kcp.kcpStats(peerId);
        if (s) this.labels(peerId).set(s.pacingRateBytesPerSec);
      }
    },
  });
}
