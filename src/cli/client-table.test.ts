import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { renderStatus } from './client-commands.js';
import { bytes, cell, renderObject, renderTable } from './client-table.js';

describe('client tables', () => {
  it('columns are aligned to the widest cell; null is "-", arrays comma-joined', () => {
    assert.equal(
      renderTable(
        ['ID', 'NAME', 'X'],
        [
          ['a', null, [1, 2]],
          ['longer-id', 'n', true],
        ],
      ),
      ['ID         NAME  X', 'a          -     1,2', 'longer-id  n     true'].join('\n'),
    );
    assert.equal(cell('line\nbreak'), 'line break');
    assert.equal(renderObject({ a: 1, long_key: null }), 'a         1\nlong_key  -');
    assert.equal(bytes(0), '0 B');
    assert.equal(bytes(1536), '1.5 KiB');
    assert.equal(bytes(5 * 1024 * 1024), '5.0 MiB');
  });

  it('status shows the data plane state and traffic of a service when the agent has one', () => {
    const text = renderStatus({
      identity: { cluster_id: 'c1', peer_id: 'p1', version: '1.2.3', license_id: 'L' },
      license: null,
      peers: [
        { id: 'p1', name: 'a', address: '10.0.0.1:7480', is_local: true, is_active: true, reachable: true },
        {
          id: 'p2',
          name: 'b',
          address: '10.0.0.2:7480',
          is_local: false,
          is_active: true,
          reachable: false,
          last_seen_at: '2026-01-01T00:00:00.000Z',
        },
      ],
      services: [
        {
          id: 's1',
          source_peer_id: 'p1',
          target_peer_id: 'p2',
          transport_type: 'tcp',
          is_active: true,
          routes: [{ id: 7, priority: 10, source_cidr: null, dest_cidr: '10.9.0.0/16' }],
          dataplane: {
            role: 'ingress',
            state: 'up',
            problem: null,
            bytes_sent: 2048,
            packets_sent: 3,
            bytes_received: 100,
            packets_received: 2,
            dropped: 1,
            streams_open: 1,
            streams_opened: 4,
          },
        },
      ],
    });
    assert.match(text, /^cluster\s+c1$/m);
    assert.match(text, /^license\s+L$/m);
    assert.match(text, /^p2\s+b\s+10\.0\.0\.2:7480\s+false\s+true\s+false\s+2026-01-01T00:00:00\.000Z$/m);
    assert.match(text, /^s1 {2}p1 -> p2 {2}tcp {2}active {2}state up \(ingress\)$/m);
    assert.match(
      text,
      /^ {4}traffic {2}sent 2\.0 KiB \(3 pkts\), received 100 B \(2 pkts\), dropped 1, streams open 1 of 4 opened$/m,
    );
    assert.match(text, /^ {4}route 7 {2}priority 10 {2}- -> 10\.9\.0\.0\/16$/m);
  });

  it('status shows which routes carry at their ingress and why the others stand aside', () => {
    const service = (
      id: string,
      health: Record<string, unknown>,
      active: boolean,
      reason: string | null,
    ) => ({
      id,
      source_peer_id: 'p1',
      target_peer_id: 'p2',
      transport_type: 'tcp',
      is_active: true,
      health,
      routes: [
        { id: 7, priority: 10, source_cidr: null, dest_cidr: '10.9.0.0/16', active, standby_reason: reason },
      ],
      dataplane: { role: 'ingress', state: 'up', problem: null },
    });
    const text = renderStatus({
      identity: { cluster_id: 'c1', peer_id: 'p1', version: '1', license_id: 'L' },
      license: null,
      peers: [],
      services: [
        service(
          's1',
          {
            state: 'unhealthy',
            reason: 'exit_no_route',
            since: 'T1',
            carrying: false,
            hold_down_until: null,
          },
          false,
          'exit_no_route',
        ),
        service(
          's2',
          { state: 'healthy', reason: null, since: 'T2', carrying: false, hold_down_until: 'T3' },
          false,
          'hold_down',
        ),
        service(
          's3',
          { state: 'healthy', reason: null, since: 'T4', carrying: true, hold_down_until: null },
          true,
          null,
        ),
      ],
    });
    assert.match(
      text,
      /^ {4}health {3}unhealthy \(exit_no_route\) since T1, standing aside: its routes yield to the next$/m,
    );
    assert.match(text, /^ {4}route 7 {2}priority 10 {2}- -> 10\.9\.0\.0\/16 {2}standby \(exit_no_route\)$/m);
    assert.match(text, /^ {4}health {3}healthy since T2, standing aside until T3 \(hold-down\)$/m);
    assert.match(text, /standby \(hold_down\)$/m);
    assert.match(text, /^ {4}health {3}healthy since T4, carrying its routes$/m);
    assert.match(text, /-> 10\.9\.0\.0\/16 {2}active$/m);
  });
});
