/**
 * Prometheus metrics of the data plane (docs/decisions.md §7), read from the data plane's own counters
 * at scrape time: IP bytes and packets per service and direction (sent into / received from the
 * tunnel), drops by cause (and per service), TCP connections carried as streams (open, opened,
 * bytes per direction, resets, refusals) per service, and tunnel state and round-trip time per peer.
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
    help: 'Packets the data plane dropped, by cause (tunnel_down, unauthorized, unknown_service, malformed, tun_write, shaped).',
    labelNames: ['reason'] as const,
    registers,
    collect() {
      this.reset();
      for (const [reason, n] of dataplane.dropCounts()) this.labels(reason).inc(n);
    },
  });
  new Counter({
    name: 'mesh_dataplane_service_dropped_packets_total',
    help: 'Packets of a service the data plane dropped, by cause (tunnel_down, unauthorized, tun_write, shaped).',
    labelNames: ['service_id', 'reason'] as const,
    registers,
    collect() {
      this.reset();
      for (const [id, byReason] of dataplane.serviceDrops())
        for (const [reason, n] of byReason) this.labels(id, reason).inc(n);
    },
  });
  new Gauge({
    name: 'mesh_dataplane_service_carrying',
    help: 'Whether a service this agent is the ingress of carries its routes now (1), or stands aside for failover (0).',
    labelNames: ['service_id'] as const,
    registers,
    collect() {
      this.reset();
      for (const [id, v] of dataplane.ingressHealth()) this.labels(id).set(v.carrying ? 1 : 0);
    },
  });
  new Counter({
    name: 'mesh_dataplane_service_health_changes_total',
    help: 'Changes of the health of the services this agent is the ingress of, by what they changed to (healthy, unknown, or the reason: tunnel_silent, exit_no_route, probe_failed, inactive).',
    labelNames: ['to'] as const,
    registers,
    collect() {
      this.reset();
      for (const [to, n] of dataplane.healthChangeCounts()) this.labels(to).inc(n);
    },
  });
  new Counter({
    name: 'mesh_dataplane_tun_failures_total',
    help: 'TUN devices that failed under the agent (deleted behind its back) and were made again.',
    registers,
    collect() {
      this.reset();
      this.inc(dataplane.tunFailureCount());
    },
  });
  new Counter({
    name: 'mesh_dataplane_drift_repairs_total',
    help: 'Reconciles that found owned kernel state changed behind the agent and put it back (one dataplane.drift_repaired event each).',
    registers,
    collect() {
      this.reset();
      this.inc(dataplane.driftRepairCount());
    },
  });
  new Gauge({
    name: 'mesh_dataplane_entries',
    help: 'Entries the data plane keeps, by structure (docs/memory.md says what bounds each).',
    labelNames: ['structure'] as const,
    registers,
    collect() {
      this.reset();
      for (const [structure, n] of Object.entries(dataplane.footprint())) this.labels(structure).set(n);
    },
  });
  new Gauge({
    name: 'mesh_dataplane_connections_open',
    help: 'TCP connections of a service carried as streams now.',
    labelNames: ['service_id'] as const,
    registers,
    collect() {
      this.reset();
      for (const [id, s] of dataplane.allStreamStats()) this.labels(id).set(s.open);
    },
  });
  new Counter({
    name: 'mesh_dataplane_connections_total',
    help: 'TCP connections of a service carried as streams, by outcome so far: opened, reset, refused (destination unreachable).',
    labelNames: ['service_id', 'event'] as const,
    registers,
    collect() {
      this.reset();
      for (const [id, s] of dataplane.allStreamStats()) {
        this.labels(id, 'opened').inc(s.opened);
        this.labels(id, 'reset').inc(s.resets);
        this.labels(id, 'refused').inc(s.refused);
      }
    },
  });
  new Counter({
    name: 'mesh_dataplane_stream_bytes_total',
    help: 'Stream payload bytes of a service: up (ingress to exit) and down (exit to ingress).',
    labelNames: ['service_id', 'direction'] as const,
    registers,
    collect() {
      this.reset();
      for (const [id, s] of dataplane.allStreamStats()) {
        this.labels(id, 'up').inc(s.bytesUp);
        this.labels(id, 'down').inc(s.bytesDown);
      }
    },
  });
  new Counter({
    name: 'mesh_dataplane_dropped_stream_frames_total',
    help: 'Stream frames the data plane dropped, by cause (malformed, unauthorized, unknown_stream, protocol).',
    labelNames: ['reason'] as const,
    registers,
    collect() {
      this.reset();
      for (const [reason, n] of Object.entries(dataplane.streamDrops())) this.labels(reason).inc(n);
    },
  });
  new Gauge({
    name: 'mesh_tunnel_up',
    help: '1 while the tunnel to the peer over the transport (tcp, kcp) is up, 0 otherwise (tunnels this agent keeps).',
    labelNames: ['peer_id', 'transport'] as const,
    registers,
    collect() {
      this.reset();
      for (const t of dataplane.tunnelStates()) this.labels(t.peerId, t.transport).set(t.up ? 1 : 0);
    },
  });
  new Gauge({
    name: 'mesh_tunnel_rtt_seconds',
    help: 'The last round-trip time its keepalive PING measured on the tunnel to the peer over the transport; no series before the first answer.',
    labelNames: ['peer_id', 'transport'] as const,
    registers,
    collect() {
      this.reset();
      for (const t of dataplane.tunnelStates()) {
        const ms = dataplane.tunnelRttMs(t.peerId, t.transport);
        if (ms !== null) this.labels(t.peerId, t.transport).set(ms / 1000);
      }
    },
  });
  new Gauge({
    name: 'mesh_dataplane_transparent_ready',
    help: 'A fully_transparent service this agent is the exit of: 1 when it can carry it, 0 when not (see transparent_reasons on the service).',
    labelNames: ['service_id'] as const,
    registers,
    collect() {
      this.reset();
      for (const [id, ready] of dataplane.transparentReadiness()) this.labels(id).set(ready ? 1 : 0);
    },
  });
}
