import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { waitUntil } from '../../test/helpers/wait-until.js';
import { MemoryNetwork, memoryPublicKey } from './memory.js';
import { StaticPeerDirectory } from './static-directory.js';
import type { TunnelState } from './tunnel.js';

const A = 'a'.repeat(32);
const B = 'b'.repeat(32);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

const eventually = (what: string, check: () => boolean, timeoutMs = 2000) =>
  waitUntil(what, check, timeoutMs, undefined, 2);

function twoPeers(options: { deadAfterMs?: number } = {}) {
  const network = new MemoryNetwork();
  const directory = new StaticPeerDirectory()
    .set(A, memoryPublicKey(A), 'memory')
    .set(B, memoryPublicKey(B), 'memory');
  const a = network.transport({ localPeerId: A, directory, ...options });
  const b = network.transport({ localPeerId: B, directory, ...options });
  return { network, directory, a, b };
}

describe('memory transport', { timeout: 30_000 }, () => {
  it('one live transport per peer id on a network; a killed one may come back', () => {
    const { network, directory } = twoPeers();
    assert.throws(() => network.transport({ localPeerId: A, directory }), /already on the memory network/);
    network.kill(A);
    assert.throws(() => network.transport({ localPeerId: B, directory }), /already/);
    const again = network.transport({ localPeerId: A, directory });
    assert.equal(again.kind, 'memory');
  });

  it('delivers on a later turn of the event loop, in order across sends, and counts rtt 0', async () => {
    const { a, b } = twoPeers();
    const got: string[] = [];
    b.on('message', (_p, m) => got.push(m.toString()));
    const tunnel = a.ensure(B);
    await eventually('up', () => tunnel.state === 'up' && b.tunnel(A)?.state === 'up');
    tunnel.send([Buffer.from('1'), Buffer.from('2')]);
    tunnel.send([Buffer.from('3')]);
    assert.deepEqual(got, [], 'not synchronously');
    await eventually('delivered', () => got.length === 3);
    assert.deepEqual(got, ['1', '2', '3']);
    assert.equal(tunnel.stats().lastRttMs, 0);
    await Promise.all([a.close(), b.close()]);
  });

  it('with the default deadAfterMs of 0, a partition is noticed on the next turn; dials fail until healed', async () => {
    const { network, a, b } = twoPeers();
    const states: TunnelState[] = [];
    a.on('state', (_p, s) => states.push(s));
    const tunnel = a.ensure(B);
    b.ensure(A);
    await eventually('up', () => tunnel.state === 'up');
    network.partition(A, B);
    tunnel.send([Buffer.from('into the void')]);
    await eventually('down', () => tunnel.state !== 'up' && b.tunnel(A)!.state === 'down', 100);
    assert.equal(a.faults().dead, 1);
    assert.equal(b.faults().dead, 1);
    // Redials keep failing (connecting, down, connecting...) while partitioned.
    await eventually('three redials', () => states.filter((s) => s === 'connecting').length >= 3, 2000);
    assert.equal(tunnel.stats().connects, 1);
    network.heal(A, B);
    await eventually('up again', () => tunnel.state === 'up' && b.tunnel(A)!.state === 'up');
    assert.equal(tunnel.stats().messagesSent, 1, 'the message sent into the partition counted as sent');
    await Promise.all([a.close(), b.close()]);
  });

  it('silentMs: 0 while connected (every keepalive answered), growing from a partition on', async () => {
    const { network, a, b } = twoPeers({ deadAfterMs: 5000 });
    const tunnel = a.ensure(B);
    assert.equal(tunnel.silentMs(), null, 'null while not up');
    b.ensure(A);
    await eventually('up', () => tunnel.state === 'up');
    assert.equal(tunnel.silentMs(), 0);
    network.partition(A, B);
    await new Promise((resolve) => setTimeout(resolve, 200));
    assert.equal(tunnel.state, 'up', 'not dead before deadAfterMs');
    assert.ok(tunnel.silentMs()! >= 150, `silent ${tunnel.silentMs()} ms`);
    await Promise.all([a.close(), b.close()]);
  });

  it('checks keys both ways: a dialer refuses a peer presenting another key, an acceptor an unknown one', async () => {
    const network = new MemoryNetwork();
    const directory = new StaticPeerDirectory()
      .set(A, memoryPublicKey(A), 'memory')
      .set(B, memoryPublicKey(B), 'memory');
    const a = network.transport({ localPeerId: A, directory });
    // B presents a key that is not the directory's for B.
    const b = network.transport({ localPeerId: B, directory, publicKey: Buffer.alloc(32, 1) });
    a.ensure(B);
    await eventually('wrong key seen', () => a.faults()['wrong-key'] >= 1);
    assert.equal(b.tunnel(A), undefined);
    network.kill(B);
    // A presents an unknown key to a genuine B.
    network.kill(A);
    const impostor = network.transport({ localPeerId: A, directory, publicKey: Buffer.alloc(32, 2) });
    const genuine = network.transport({ localPeerId: B, directory });
    impostor.ensure(B);
    await eventually('unknown key refused', () => genuine.faults()['unknown-peer'] >= 1);
    assert.equal(genuine.tunnel(A), undefined);
    assert.notEqual(impostor.tunnel(B)!.state, 'up');
    await Promise.all([impostor.close(), genuine.close()]);
  });

  it('a killed transport is closed, and its peer only learns of it after deadAfterMs', async () => {
    const network = new MemoryNetwork();
    const directory = new StaticPeerDirectory()
      .set(A, memoryPublicKey(A), 'memory')
      .set(B, memoryPublicKey(B), 'memory');
    const a = network.transport({ localPeerId: A, directory, deadAfterMs: 200 });
    const b = network.transport({ localPeerId: B, directory, deadAfterMs: 200 });
    const tunnel = a.ensure(B);
    await eventually('up', () => tunnel.state === 'up');
    const killedAt = performance.now();
    network.kill(B);
    assert.throws(() => b.ensure(A), /closed/);
    await sleep(100);
    assert.equal(tunnel.state, 'up', 'not told');
    await eventually('down', () => tunnel.state !== 'up', 1000);
    assert.ok(performance.now() - killedAt >= 195);
    await a.close();
  });
});

describe('StaticPeerDirectory', () => {
  it('finds peers by id and by key, forgets deleted ones, and keeps its own copy of keys', () => {
    const key = Buffer.alloc(32, 7);
    const directory = new StaticPeerDirectory().set('p1', key, '10.0.0.1:443');
    key.fill(0);
    assert.deepEqual(directory.peer('p1'), { publicKey: Buffer.alloc(32, 7), address: '10.0.0.1:443' });
    assert.deepEqual(directory.peerByKey(Buffer.alloc(32, 7)), { id: 'p1' });
    assert.equal(directory.peerByKey(Buffer.alloc(32, 0)), undefined);
    directory.set('p1', Buffer.alloc(32, 8), '10.0.0.1:443');
    assert.equal(directory.peerByKey(Buffer.alloc(32, 7)), undefined, 'the old key is gone');
    assert.ok(directory.delete('p1'));
    assert.equal(directory.peer('p1'), undefined);
    assert.equal(directory.peerByKey(Buffer.alloc(32, 8)), undefined);
    assert.ok(!directory.delete('p1'));
  });
});
