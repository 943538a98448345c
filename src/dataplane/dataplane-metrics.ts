/**
 * Prometheus metrics of the data plane (DECISIONS §7), read from the data plane's own counters
 * at scrape time: IP bytes and packets per service and direction (sent into / received from the
 * tunnel), drops by cause, and tunnel state per peer.
 */
import { Counter, Gauge, type Registry } from 'prom-client';
import type { DataPlane } from './dataplane.js';

export function registerDataPlaneMetrics(registry: Registry, dataplane: DataPlane): void {
  const registers = [registry];
  new Counter({
    name: 'mesh_dataplane_bytes_total',
    help: 'IP bytes of a service this agent sent into (sent) or received from (received) its tunnel.',
    labelNames: ['service_id', 'direction'] as const,
    registers,
    collect() {
      this.reset();
      for (const [id, c] of dataplane.allCounters()) {
        this.labels(id, 'sent').inc(c.bytesSent);
        this.labels(id, 'received').inc(c.bytesReceived);
      }
    },
  });
  new Counter({
    name: 'mesh_dataplane_packets_total',
    help: 'IP packets of a service this agent sent into (sent) or received from (received) its tunnel.',
    labelNames: ['service_id', 'direction'] as const,
    registers,
    collect() {
      this.reset();
      for (const [id, c] of dataplane.allCounters()) {
        this.labels(id, 'sent').inc(c.packetsSent);
        this.labels(id, 'received').inc(c.packetsReceived);
      }
    },
  });
  new Counter({
    name: 'mesh_dataplane_dropped_packets_total',
    help: 'Packets the data plane dropped, by cause (tunnel_down, unauthorized, unknown_service, malformed, tun_write).',
    labelNames: ['reason'] as const,
    registers,
    collect() {
      this.reset();
      for (const [reason, n] of dataplane.dropCounts()) this.labels(reason).inc(n);
    },
  });
  new Gauge({
    name: 'mesh_tunnel_up',
    help: '1 while the tunnel to the peer is up, 0 otherwise (peers this agent keeps a tunnel with).',
    labelNames: ['peer_id'] as const,
    registers,
    collect() {
      this.reset();
      for (const [peerId, up] of dataplane.tunnelStates()) this.labels(peerId).set(up ? 1 : 0);
    },
  });
}
