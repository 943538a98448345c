import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Gauge, Registry } from 'prom-client';
import {
  arrows,
  carryingServices,
  NODE_STROKE,
  placePeers,
  type ServiceLike,
  samples,
  serviceState,
  tunnelLinks,
} from './topology.js';

/** Prometheus text as the agent's own library writes it, with the tunnel metrics' label sets. */
async function metricsText(
  up: [string, string, number][],
  rtt: [string, string, number][],
  kcpRtt: [string, number][],
): Promise<string> {
  const registry = new Registry();
  const registers = [registry];
  const g = (name: string, labelNames: string[]) =>
    new Gauge({ name, help: `${name} "help"`, labelNames, registers });
  const tunnelUp = g('mesh_tunnel_up', ['peer_id', 'transport']);
  for (const [p, t, v] of up) tunnelUp.labels(p, t).set(v);
  const tunnelRtt = g('mesh_tunnel_rtt_seconds', ['peer_id', 'transport']);
  for (const [p, t, v] of rtt) tunnelRtt.labels(p, t).set(v);
  const kcp = g('mesh_kcp_rtt_seconds', ['peer_id']);
  for (const [p, v] of kcpRtt) kcp.labels(p).set(v);
  g('mesh_tunnel_up_decoy', ['peer_id']).labels('x').set(1);
  return registry.metrics();
}

describe('the console topology model', () => {
  it('reads each tunnel, its state and its round-trip time from /metrics text', async () => {
    const text = await metricsText(
      [
        ['peer-b', 'tcp', 1],
        ['peer-b', 'kcp', 0],
        ['peer-a', 'tcp', 1],
      ],
      [
        ['peer-b', 'tcp', 0.0042],
        ['peer-b', 'kcp', 0.5],
      ],
      [['peer-b', 0.012]],
    );
    assert.deepEqual(tunnelLinks(text), [
      { peerId: 'peer-a', transport: 'tcp', up: true, rttMs: null },
      { peerId: 'peer-b', transport: 'kcp', up: false, rttMs: 12 },
      { peerId: 'peer-b', transport: 'tcp', up: true, rttMs: 4.2 },
    ]);
    assert.deepEqual(tunnelLinks(await metricsText([], [], [])), [], 'no data plane: no tunnels');
  });

  it('unescapes label values and skips other metrics and comments', () => {
    const m = samples('# HELP x a{b="c"} 1\nx{a="q\\"d\\\\e"} 2\nxy 3\nx 4\n', ['x']);
    assert.deepEqual(m.get('x'), [
      { labels: { a: 'q"d\\e' }, value: 2 },
      { labels: {}, value: 4 },
    ]);
  });

  it('tells active, standby (not carrying after failover) and inactive services apart', () => {
    const metrics = [
      '# HELP mesh_dataplane_service_carrying 1 while the service carries its routes',
      '# TYPE mesh_dataplane_service_carrying gauge',
      'mesh_dataplane_service_carrying{service_id="svc_up"} 1',
      'mesh_dataplane_service_carrying{service_id="svc_aside"} 0',
      'mesh_tunnel_up{peer_id="b",transport="tcp"} 0',
    ].join('\n');
    const carrying = carryingServices(metrics);
    assert.deepEqual(
      [...carrying],
      [
        ['svc_up', true],
        ['svc_aside', false],
      ],
    );
    const s = (id: string, is_active = true): ServiceLike => ({
      id,
      source_peer_id: 'a',
      target_peer_id: 'b',
      is_active,
    });
    assert.equal(serviceState(s('svc_up'), carrying), 'active');
    assert.equal(serviceState(s('svc_aside'), carrying), 'standby');
    assert.equal(serviceState(s('svc_aside', false), carrying), 'inactive');
    assert.equal(serviceState(s('svc_other'), carrying), 'active', 'not its ingress, or no data plane');
    assert.equal(serviceState(s('svc_aside'), new Map()), 'active', 'no /metrics read');
  });

  it('draws a thousand services as one arrow per ingress, exit and state, bounded', () => {
    const services: ServiceLike[] = [];
    for (let i = 0; i < 1000; i++) {
      services.push({
        id: `svc_${i}`,
        source_peer_id: 'ingress',
        target_peer_id: `exit-${i % 3}`,
      });
    }
    const carrying = new Map(services.map((s, i) => [s.id, i % 10 !== 0]));
    const all = arrows(services, carrying, 100);
    assert.equal(all.arrows.length, 6, '3 exits × active and standby');
    assert.equal(all.hidden, 0);
    assert.equal(
      all.arrows.reduce((n, a) => n + a.count, 0),
      1000,
    );
    const standby = all.arrows.filter((a) => a.state === 'standby');
    assert.equal(
      standby.reduce((n, a) => n + a.count, 0),
      100,
    );
    assert.ok(all.arrows.every((a) => a.ids.length <= 5));
    const few = arrows(services, carrying, 2);
    assert.equal(few.arrows.length, 2);
    assert.equal(few.hidden, 1000 - few.arrows[0]!.count - few.arrows[1]!.count);
    assert.ok(few.arrows[0]!.count >= few.arrows[1]!.count, 'the busiest first');
  });

  it('places up to a hundred peers apart and inside the drawing, names beside them up to 24', () => {
    const size = 520;
    for (const count of [1, 2, 3, 24, 25, 33, 100]) {
      const { at, nodeRadius, labelled } = placePeers(count, size);
      assert.equal(at.length, count);
      assert.equal(labelled, count <= 24, `${count} peers labelled`);
      assert.ok(nodeRadius >= 5, `${count} peers: radius ${nodeRadius}`);
      for (const p of at) {
        assert.ok(p.x - nodeRadius >= 0 && p.x + nodeRadius <= size, `${count} peers: x ${p.x} inside`);
        assert.ok(p.y - nodeRadius >= 0 && p.y + nodeRadius <= size, `${count} peers: y ${p.y} inside`);
      }
      // Any two nodes leave a gap between their edges, outlines included.
      const drawn = nodeRadius + NODE_STROKE / 2;
      let closest = Number.POSITIVE_INFINITY;
      for (let i = 0; i < at.length; i++)
        for (let j = i + 1; j < at.length; j++)
          closest = Math.min(closest, Math.hypot(at[i]!.x - at[j]!.x, at[i]!.y - at[j]!.y));
      if (count > 1)
        assert.ok(
          closest > 2 * drawn + 1,
          `${count} peers: centres ${closest.toFixed(1)} apart, drawn radius ${drawn}`,
        );
    }
    assert.deepEqual(placePeers(1, size).at, [{ x: 260, y: 260 }], 'one peer in the middle');
    assert.ok(Math.abs(placePeers(4, size).at[0]!.x - 260) < 1e-9, 'the first at the top');
  });
});
