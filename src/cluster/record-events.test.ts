import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { encodeStamp } from './hlc.js';
import { actorOf, originOf, recordEvent } from './record-events.js';
import { makeVkey, type WireRecord } from './replicated-records.js';

const WRITER = 'a'.repeat(32);
const vk = (epoch: number, ordinal: number, wall: number) =>
  makeVkey(epoch, ordinal, encodeStamp({ wall, counter: 0, origin: WRITER }));
const BY = { client_id: 'mcl_x', agent: WRITER };
const peer = (over: Record<string, unknown> = {}, vkey = vk(0, 0, 1000)): WireRecord => ({
  key: `peer/${WRITER}`,
  vkey,
  body: {
    id: WRITER,
    name: 'a',
    public_key: 'k',
    address: 'h:1',
    is_active: true,
    version: 1,
    deactivated_at: null,
    created_at: 't',
    updated_at: 't',
    ...over,
  },
});

describe('recordEvent', () => {
  it('names the change, keeps only changed fields, and leaves bookkeeping out', () => {
    const renamed = recordEvent(
      peer(),
      peer({ name: 'b', version: 2, updated_at: 'u' }, vk(0, 0, 2000)),
      BY,
    )!;
    assert.equal(renamed.type, 'peer.renamed');
    assert.deepEqual(renamed.data, { before: { name: 'a' }, after: { name: 'b' } });
    const left = recordEvent(peer(), peer({ is_active: false, deactivated_at: 'd' }, vk(0, 1, 2000)), BY)!;
    assert.equal(left.type, 'peer.left');
    const moved = recordEvent(peer(), peer({ address: 'h:2' }, vk(0, 0, 2000)), BY)!;
    assert.equal(moved.type, 'peer.updated');
    assert.equal(recordEvent(undefined, peer(), BY)!.type, 'peer.added');
    const removed = recordEvent(peer(), { key: `peer/${WRITER}`, vkey: vk(0, 2, 3000), body: null }, BY)!;
    assert.equal(removed.type, 'peer.removed');
    assert.equal(removed.data.after, null);
  });

  it('gives one change the same id and time wherever it is derived', () => {
    const after = peer({ name: 'b' }, vk(0, 0, Date.UTC(2026, 0, 1)));
    const e = recordEvent(peer(), after, BY)!;
    assert.equal(e.id, `peer/${WRITER}@${after.vkey}`);
    assert.equal(e.time, '2026-01-01T00:00:00.000Z');
    assert.deepEqual(recordEvent(peer(), after, BY), e);
  });

  it('records nothing when nothing visible changed, or nothing was ever held', () => {
    assert.equal(recordEvent(peer(), peer({ version: 9 }, vk(1, 0, 2000)), BY), undefined);
    assert.equal(recordEvent(undefined, { key: 'service/s', vkey: vk(0, 1, 1), body: null }, BY), undefined);
  });

  it('shows the cluster credential without its key, and tells a merge from an init', () => {
    const cred = (version: number, key: string, epoch = 0): WireRecord => ({
      key: 'credential',
      vkey: vk(epoch, version, version),
      body: {
        current: { client_id: 'mcc', version, key, rotated_by: WRITER, rotated_at: 't', valid_until: null },
        previous: [],
      },
    });
    const e = recordEvent(cred(1, 'SECRETHASH1'), cred(2, 'SECRETHASH2'), BY)!;
    assert.equal(e.type, 'cluster_credential.rotated');
    assert.deepEqual(e.data, { before: { version: 1 }, after: { version: 2 } });
    assert.doesNotMatch(JSON.stringify(e), /SECRETHASH/);
    const cluster = (id: string, epoch: number): WireRecord => ({
      key: 'cluster',
      vkey: vk(epoch, 0, 5 + epoch),
      body: { cluster_id: id, created_by: WRITER },
    });
    assert.equal(recordEvent(cluster('c1', 0), cluster('c2', 0), BY)!.type, 'cluster.initialized');
    assert.equal(recordEvent(cluster('c1', 0), cluster('c2', 1), BY)!.type, 'cluster.merged');
    assert.deepEqual(recordEvent(cluster('c1', 0), cluster('c2', 1), BY)!.resource, {
      kind: 'cluster',
      id: 'c2',
    });
  });
});

describe('actorOf', () => {
  it('takes the actor a record carries, else the writer of its stamp with no client', () => {
    const r = peer();
    assert.deepEqual(actorOf({ ...r, actor: BY }, 'local'), BY);
    assert.deepEqual(actorOf(r, 'local'), { client_id: null, agent: WRITER });
    assert.equal(originOf(r.vkey), WRITER);
    // A malformed actor (from a buggy or hostile member) is not shown as given.
    assert.deepEqual(actorOf({ ...r, actor: { client_id: 7, agent: 'x' } as never }, 'local'), {
      client_id: null,
      agent: WRITER,
    });
  });
});
