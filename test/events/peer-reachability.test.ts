/**
 * Runtime events of reachability between real agents (docs/events.md "Runtime events"): one
 * agent of three killed with SIGKILL is recorded `peer.unreachable` exactly once by each of the
 * others, within the failure detector's time, and `peer.reachable` exactly once after it comes
 * back, with nothing in between and nothing about the agents that stayed up; the agent that came
 * back records nothing about the others. An observer that restarts while the peer is down neither
 * repeats `peer.unreachable` nor misses the peer's return (its log is its memory).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eventually, GOSSIP_INTERVAL_MS, startCluster, stopAll } from '../helpers/cluster.js';
import { eventsOf } from '../helpers/event-reads.js';
import { makeVendor } from '../helpers/licenses.js';
import type { Node } from '../helpers/nodes.js';

const vendor = makeVendor();

/** The reachability events a node recorded: `type peer`, oldest first. */
const reachability = async (n: Node) =>
  (await eventsOf(n, { type: 'peer.' }))
    .filter((e) => e.type === 'peer.reachable' || e.type === 'peer.unreachable')
    .map((e) => `${e.type} ${e.resource.id}`);

describe('runtime events: a peer killed and back', { timeout: 120_000 }, () => {
  let nodes: Node[] = [];

  before(async () => {
    nodes = await startCluster(vendor, 3, { license_id: 'L-reach', max_nodes: 3, max_services: 3 });
  });
  after(async () => {
    await stopAll(nodes.map((n) => n.agent));
  });

  it('kill -9: one peer.unreachable on each other agent, one peer.reachable after it returns', async (t) => {
    const [a, b, c] = nodes as [Node, Node, Node];
    // Everyone has heard from everyone (first contacts are the default state: no event).
    for (const n of [a, b]) {
      await eventually(`${n.peerId} sees the others reachable`, async () => {
        const peers = (await n.agent.client.get('/v1/peers', { token: n.token })).body as {
          id: string;
          reachable: boolean;
          last_seen_at: string | null;
        }[];
        return peers.every((p) => p.reachable && (p.id === n.peerId || p.last_seen_at !== null))
          ? true
          : undefined;
      });
      assert.deepEqual(await reachability(n), [], 'nothing recorded at start');
    }

    await c.agent.kill9();
    const killedAt = Date.now();
    const unreachableMs: number[] = [];
    for (const n of [a, b]) {
      await eventually(
        `${n.peerId} records C unreachable`,
        async () => ((await reachability(n)).length > 0 ? true : undefined),
        30_000,
        () => reachability(n),
      );
      unreachableMs.push(Date.now() - killedAt);
    }
    // SWIM here: a failed probe within a pass of 2 peers, then a suspicion of at most
    // suspicionMaxTimeoutMult (6) x suspicionMult (4) x the interval; doubled for a loaded host.
    const bound = 2 * (2 * GOSSIP_INTERVAL_MS + 6 * 4 * GOSSIP_INTERVAL_MS);
    for (const ms of unreachableMs) assert.ok(ms <= bound, `unreachable after ${ms} ms; bound ${bound} ms`);

    await c.agent.restart();
    const backAt = Date.now();
    for (const n of [a, b]) {
      await eventually(
        `${n.peerId} records C reachable again`,
        async () => ((await reachability(n)).length >= 2 ? true : undefined),
        30_000,
        () => reachability(n),
      );
    }
    const reachableMs = Date.now() - backAt;
    // A while longer: nothing late (a stale suspicion, a flap) is recorded after it.
    await new Promise((r) => setTimeout(r, 20 * GOSSIP_INTERVAL_MS));
    for (const n of [a, b]) {
      assert.deepEqual(await reachability(n), [`peer.unreachable ${c.peerId}`, `peer.reachable ${c.peerId}`]);
      const [down, up] = (await eventsOf(n, { type: 'peer.', resource: c.peerId })).filter((e) =>
        e.type.includes('reachable'),
      );
      assert.deepEqual(down!.actor, { client_id: null, agent: n.peerId });
      assert.equal(typeof down!.data.last_seen_at, 'string');
      assert.ok(Date.parse(up!.time) >= Date.parse(down!.time));
    }
    // The agent that came back starts with its peers reachable, as they are: nothing to say.
    assert.deepEqual(await reachability(c), []);
    t.diagnostic(
      `unreachable after ${unreachableMs.join(', ')} ms; reachable ${reachableMs} ms after restart`,
    );
  });

  it('the observer restarts meanwhile: its log is not repeated, and the return is recorded once', async () => {
    const [a, b, c] = nodes as [Node, Node, Node];
    const mark = new Map<Node, number>();
    for (const n of [a, b]) mark.set(n, (await eventsOf(n)).at(-1)?.seq ?? 0);
    const about = async (n: Node, peer: Node) =>
      (await eventsOf(n, { type: 'peer.', resource: peer.peerId, since: mark.get(n)! }))
        .filter((e) => e.type === 'peer.reachable' || e.type === 'peer.unreachable')
        .map((e) => e.type);

    await c.agent.kill9();
    // Both see C dead before A stops: otherwise C may return within B's suspicion, which is
    // no change of reachability for B, and nothing to record.
    for (const n of [a, b]) {
      await eventually(`${n.peerId} records C unreachable`, async () =>
        (await about(n, c)).length === 1 ? true : undefined,
      );
    }
    // A goes down while C is down, and C comes back while A is down: A never sees C return.
    await a.agent.stop();
    await c.agent.restart();
    await eventually(
      'B records C reachable',
      async () => ((await about(b, c)).length === 2 ? true : undefined),
      15_000,
      async () => ({
        events: await about(b, c),
        peers: await b.agent.client.get('/v1/peers', { token: b.token }),
      }),
    );
    await eventually('B records A unreachable', async () =>
      (await about(b, a)).length === 1 ? true : undefined,
    );
    await a.agent.restart();
    // A's first contact with C after its restart corrects the log's last word on C.
    await eventually('A records C reachable', async () =>
      (await about(a, c)).length === 2 ? true : undefined,
    );
    await new Promise((r) => setTimeout(r, 20 * GOSSIP_INTERVAL_MS));
    assert.deepEqual(await about(a, c), ['peer.unreachable', 'peer.reachable']);
    assert.deepEqual(await about(a, b), [], 'B stayed up: nothing about it');
    assert.deepEqual(await about(b, c), ['peer.unreachable', 'peer.reachable']);
    assert.deepEqual(await about(b, a), ['peer.unreachable', 'peer.reachable']);
  });
});
