/**
 * The merge rule of a join (docs/decisions.md §5), as pure functions: which cluster survives, and the
 * cluster and credential records both agents adopt. Real agents merging are in
 * test/cluster/merge.test.ts; the tie on equal ages cannot be staged there.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type HandshakePeerInfo, mergedClusterRecords, survivingCluster } from './handshake-protocol.js';
import { encodeStamp } from './hlc.js';
import { epochOf, makeVkey, parseVkey, type WireRecord } from './replicated-records.js';

function info(oldestPeerId: string, oldestCreatedAt: string): HandshakePeerInfo {
  return { oldest_peer_id: oldestPeerId, oldest_peer_created_at: oldestCreatedAt } as HandshakePeerInfo;
}

function records(tag: string, epoch: number, wall: number): WireRecord[] {
  const stamp = encodeStamp({ wall, counter: 0, origin: 'ab' });
  return [
    { key: 'cluster', vkey: makeVkey(epoch, 0, stamp), body: { cluster_id: tag } },
    { key: 'credential', vkey: makeVkey(epoch, 3, stamp), body: { client_id: tag } },
  ];
}

describe('survivingCluster', () => {
  const older = info('ffff', '2026-01-01T00:00:00.000Z');
  const younger = info('0000', '2026-01-01T00:00:00.001Z');
  const tieLow = info('1111', '2026-01-01T00:00:00.000Z');
  const tieHigh = info('2222', '2026-01-01T00:00:00.000Z');

  it('the cluster whose oldest peer is older survives, whichever side asks', () => {
    assert.equal(survivingCluster(older, younger), older);
    assert.equal(survivingCluster(younger, older), older);
  });

  it('on equal ages the lower oldest-peer id survives, whichever side asks', () => {
    assert.equal(survivingCluster(tieLow, tieHigh), tieLow);
    assert.equal(survivingCluster(tieHigh, tieLow), tieLow);
  });

  it('compares instants, not their text (the same instant written with an offset)', () => {
    const sameInstant = info('0001', '2026-01-01T01:00:00.000+01:00');
    assert.equal(survivingCluster(sameInstant, tieHigh), sameInstant, 'a tie: lower id');
    assert.equal(survivingCluster(tieHigh, sameInstant), sameInstant);
  });
});

describe('mergedClusterRecords', () => {
  it('is the winner’s records lifted one epoch above all four, keeping ordinal and stamp', () => {
    const winner = records('x', 0, 1_000);
    const loser = records('y', 2, 5_000);
    const merged = mergedClusterRecords(winner, loser);
    assert.deepEqual(
      merged.map((r) => r.body),
      winner.map((r) => r.body),
    );
    for (const [i, r] of merged.entries()) {
      assert.equal(epochOf(r.vkey), 3);
      const before = parseVkey(winner[i]!.vkey)!;
      const after = parseVkey(r.vkey)!;
      assert.equal(after.ordinal, before.ordinal);
      assert.equal(after.stamp, before.stamp);
    }
  });

  it('beats every record either cluster held, so gossip spreads it to both former clusters', () => {
    const winner = records('x', 1, 1_000);
    const loser = records('y', 4, 9_000);
    const merged = mergedClusterRecords(winner, loser);
    for (const r of merged) {
      for (const old of [...winner, ...loser].filter((o) => o.key === r.key)) {
        assert.ok(r.vkey > old.vkey, `${r.vkey} sorts after ${old.vkey}`);
      }
    }
  });
});
