/**
 * Failure detection in a running cluster (SWIM with Lifeguard's refutation, docs/gossip.md "The
 * round"): an agent frozen with SIGSTOP is suspected by the others; once it runs again it hears of
 * the suspicion, refutes it with a higher incarnation (mesh_gossip_incarnation), and every agent
 * reports it alive and reachable again without anyone touching it. The frozen agent's own view of
 * the others is not trusted either way while it was frozen, so only the others' views are read.
 */
import { after, before, describe, it } from 'node:test';
import {
  eventually,
  type Member,
  metricsOf,
  reachableOn,
  seriesValue,
  startCluster,
  stopAll,
} from '../helpers/gossip-forge.js';
import { makeVendor } from '../helpers/licenses.js';

const vendor = makeVendor();

const peersIn = (text: string, state: 'alive' | 'suspect' | 'dead') =>
  seriesValue(text, `mesh_gossip_peers{state="${state}"}`);

describe('failure detection: suspicion and refutation between real agents', { timeout: 60_000 }, () => {
  let members: Member[] = [];
  let a: Member;
  let b: Member;
  let c: Member;

  before(async () => {
    members = await startCluster(vendor, 3, { license_id: 'L-live', max_nodes: 3, max_services: 3 });
    [a, b, c] = members as [Member, Member, Member];
  });

  after(async () => {
    // Never leave a stopped process behind.
    try {
      process.kill(c.agent.pid, 'SIGCONT');
    } catch {
      // already gone
    }
    await stopAll(members);
  });

  it('a frozen agent is suspected, refutes once it runs again, and is alive everywhere', async (t) => {
    for (const m of [a, b]) {
      await eventually(`${m.peerId} sees both others alive`, async () =>
        peersIn(await metricsOf(m), 'alive') === 2 ? true : undefined,
      );
    }
    // Usually 0; a slow start on a loaded machine can already have made C refute a suspicion,
    // so the check below compares with this value rather than with 0.
    const incarnationBefore = seriesValue(await metricsOf(c), 'mesh_gossip_incarnation');

    process.kill(c.agent.pid, 'SIGSTOP');
    let suspectedAt: number | undefined;
    const frozenAt = Date.now();
    try {
      // At a 200 ms interval a missed probe plus the indirect probes take well under 2 s.
      await eventually(
        'A or B holds C suspect or dead',
        async () => {
          for (const m of [a, b]) {
            const text = await metricsOf(m);
            if (peersIn(text, 'suspect') + peersIn(text, 'dead') >= 1) return true;
          }
          return undefined;
        },
        10_000,
        20,
      );
      suspectedAt = Date.now() - frozenAt;
      // Long enough for the suspicion to have spread (a rumor) and possibly timed out to dead.
      await new Promise((r) => setTimeout(r, 1_500));
    } finally {
      process.kill(c.agent.pid, 'SIGCONT');
    }
    const resumedAt = Date.now();

    await eventually(
      'C raised its incarnation (it refuted the suspicion)',
      async () =>
        seriesValue(await metricsOf(c), 'mesh_gossip_incarnation') > incarnationBefore ? true : undefined,
      10_000,
    );
    for (const m of [a, b]) {
      await eventually(
        `${m.peerId} holds both others alive and C reachable`,
        async () => {
          const text = await metricsOf(m);
          return peersIn(text, 'alive') === 2 && (await reachableOn(m, c.peerId)) ? true : undefined;
        },
        10_000,
      );
    }
    t.diagnostic(
      `suspected ${suspectedAt} ms after SIGSTOP; alive again everywhere ${Date.now() - resumedAt} ms after SIGCONT`,
    );
  });
});
