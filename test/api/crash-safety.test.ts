/**
 * Crash safety of acknowledged writes, against a real agent process killed with SIGKILL.
 *
 * Each round starts 50 concurrent credential creations (each with its own scope set), waits
 * until a random number of them have been answered 201, kills the agent at a random moment
 * while the others are in flight, and restarts it on the same data dir and port. Then every
 * credential whose creation was answered 201, in this round or any before, must be listed with
 * its scopes and its secret must obtain a token; `PRAGMA integrity_check` must be ok; and the
 * admin token issued before the first kill must still be accepted, which proves the token
 * signing key was loaded from its file rather than made anew (the JWKS `kid` is compared too).
 *
 * SIGKILL ends the process, not the machine: this covers a crashed agent, not a power cut
 * (the page cache survives). Reproduce a run with CRASH_SEED=<seed in the diagnostics>.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { ALL_SCOPES, type Scope } from '../../src/domain/scopes.js';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import type { ApiResponse } from '../helpers/api-client.js';
import { integrityCheck } from '../helpers/db-dump.js';
import { makeVendor } from '../helpers/licenses.js';
import { prng, SEED } from '../helpers/seeded-random.js';

// 30 kill/restart rounds: enough different kill moments (after 1 to 49 answers, at once or a
// few ms later) to catch a lost write, while one round (restart included) takes about a second,
// so the file stays well inside its 4-minute budget on 2 cores.
const ROUNDS = 30;
/** Credential creations in flight per round. */
const CONCURRENT = 50;

/** `count` different non-empty scope sets, in ALL_SCOPES order. */
function distinctScopeSets(random: () => number, count: number): Scope[][] {
  const masks = Array.from({ length: 2 ** ALL_SCOPES.length - 1 }, (_, i) => i + 1);
  for (let i = masks.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [masks[i], masks[j]] = [masks[j]!, masks[i]!];
  }
  return masks.slice(0, count).map((mask) => ALL_SCOPES.filter((_, bit) => (mask >> bit) & 1));
}

const scopeKey = (scopes: readonly string[]): string => [...scopes].sort().join(' ');

interface Acknowledged {
  clientId: string;
  clientSecret: string;
  scopes: string[];
  round: number;
}

interface RoundStats {
  round: number;
  waitedFor: number;
  killMode: string;
  acknowledged: number;
  inFlightAtKill: number;
  committedUnacknowledged: number;
}

describe('crash safety: credentials acknowledged before a SIGKILL survive the restart', () => {
  const vendor = makeVendor();
  const random = prng(SEED);
  let agent: AgentProcess;
  let adminToken: string;
  let kid: string;
  let peerId: string;

  before(async () => {
    agent = await AgentProcess.start({ vendor });
    const creds = await bootstrap(agent, vendor);
    adminToken = await agent.client.token(creds.clientId, creds.clientSecret);
    kid = (await agent.client.get('/.well-known/jwks.json')).body.keys[0].kid;
    peerId = (await agent.client.get('/v1/cluster/identity')).body.peer_id;
  });
  after(async () => {
    if (agent) assert.equal(await agent.stop(), 0);
  });

  it(`keeps every acknowledged credential over ${ROUNDS} kill -9 rounds with ${CONCURRENT} creations in flight`, async (t) => {
    t.diagnostic(`CRASH_SEED=${SEED}`);
    const acknowledged = new Map<string, Acknowledged>();
    const known = new Set<string>((await listCredentials()).map((c) => c.client_id));
    const stats: RoundStats[] = [];

    for (let round = 0; round < ROUNDS; round++) {
      const sets = distinctScopeSets(random, CONCURRENT);
      const waitFor = 1 + Math.floor(random() * (CONCURRENT - 1));
      // every other kill lands at an answer, when requests are surely in flight: half the rounds
      // by construction, not by the seed's luck (the in-flight check below counts on them)
      const delayMs = round % 2 === 0 ? 0 : Math.floor(random() * 12);
      const killMode = delayMs === 0 ? 'at the answer' : `${delayMs} ms after it`;
      const where = `round ${round} (CRASH_SEED=${SEED}, kill after ${waitFor} answers, ${killMode})`;

      let answered = 0;
      let settled = 0;
      let inFlightAtKill = -1;
      let killed: Promise<void> | undefined;
      const kill = () => {
        if (killed) return;
        inFlightAtKill = CONCURRENT - settled;
        killed = agent.kill9();
      };
      const thisRound: Acknowledged[] = [];
      const unexpected: string[] = [];

      const creations = sets.map((scopes) =>
        agent.client
          .raw('POST', '/v1/credentials', { json: { scopes }, token: adminToken, timeoutMs: 20_000 })
          .then(
            (res: ApiResponse) => {
              settled++;
              if (res.status !== 201) {
                unexpected.push(`${res.status} ${res.text}`);
                return;
              }
              assert.deepEqual(scopeKey(res.body.scopes), scopeKey(scopes), `${where}: scopes of the answer`);
              const ack = {
                clientId: res.body.client_id,
                clientSecret: res.body.client_secret,
                scopes,
                round,
              };
              thisRound.push(ack);
              acknowledged.set(ack.clientId, ack);
              answered++;
              if (answered === waitFor) {
                if (delayMs === 0) kill();
                else setTimeout(kill, delayMs);
              }
            },
            () => {
              settled++; // the connection died with the agent: outcome unknown, nothing promised
            },
          ),
      );
      await Promise.all(creations);
      kill(); // in case every request was answered before the timer fired
      await killed;
      assert.deepEqual(unexpected, [], `${where}: answers other than 201 before the kill`);
      assert.ok(thisRound.length >= waitFor, `${where}: only ${thisRound.length} answers`);

      await agent.restart();

      // The file is sound.
      assert.equal(integrityCheck(agent.dataDir), 'ok', `${where}: integrity_check`);

      // The token issued before the first kill still verifies: the signing key was loaded, not regenerated.
      const jwks = await agent.client.get('/.well-known/jwks.json');
      assert.equal(jwks.body.keys[0].kid, kid, `${where}: the token signing key changed`);
      const identity = await agent.client.get('/v1/cluster/identity');
      assert.equal(identity.body.peer_id, peerId, `${where}: the identity key changed`);
      const listed = await listCredentials(where);
      const byId = new Map(listed.map((c) => [c.client_id, c]));

      // Every acknowledged credential, of any round, is still there with its scopes.
      for (const ack of acknowledged.values()) {
        const row = byId.get(ack.clientId);
        assert.ok(row, `${where}: credential ${ack.clientId} acknowledged in round ${ack.round} is lost`);
        assert.equal(scopeKey(row.scopes), scopeKey(ack.scopes), `${where}: scopes of ${ack.clientId}`);
      }

      // What this round added: the acknowledged ones plus at most the unanswered ones, one per request.
      const added = listed.filter((c) => !known.has(c.client_id));
      assert.ok(
        added.length <= CONCURRENT,
        `${where}: ${added.length} credentials added by ${CONCURRENT} requests`,
      );
      const requested = new Set(sets.map(scopeKey));
      const addedKeys = added.map((c) => scopeKey(c.scopes));
      for (const key of addedKeys)
        assert.ok(requested.has(key), `${where}: a credential nobody asked for: ${key}`);
      assert.equal(
        new Set(addedKeys).size,
        addedKeys.length,
        `${where}: one request created two credentials`,
      );
      for (const c of added) known.add(c.client_id);

      // Each credential acknowledged in this round obtains a token with its secret and its scopes.
      const tokens = await Promise.all(
        thisRound.map((ack) => agent.client.tokenResponse(ack.clientId, ack.clientSecret)),
      );
      tokens.forEach((res, i) => {
        const ack = thisRound[i]!;
        assert.equal(res.status, 200, `${where}: token for ${ack.clientId}: ${res.status} ${res.text}`);
        assert.equal(scopeKey(res.body.scope.split(' ')), scopeKey(ack.scopes), `${where}: token scopes`);
      });

      stats.push({
        round,
        waitedFor: waitFor,
        killMode,
        acknowledged: thisRound.length,
        inFlightAtKill,
        committedUnacknowledged: added.length - thisRound.length,
      });
    }

    const withInFlight = stats.filter((s) => s.inFlightAtKill > 0).length;
    const committedUnacknowledged = stats.reduce((n, s) => n + s.committedUnacknowledged, 0);
    t.diagnostic(
      `${acknowledged.size} acknowledged credentials kept; ${withInFlight}/${ROUNDS} kills with requests in flight; ` +
        `${committedUnacknowledged} credentials committed whose answer the kill cut off`,
    );
    for (const s of stats) {
      t.diagnostic(
        `round ${s.round}: killed ${s.killMode} #${s.waitedFor}, ${s.acknowledged} acknowledged, ` +
          `${s.inFlightAtKill} unanswered at the kill, ${s.committedUnacknowledged} committed unacknowledged`,
      );
    }
    // The kill must really land among in-flight requests, or the rounds test nothing.
    assert.ok(withInFlight >= ROUNDS / 2, `only ${withInFlight} of ${ROUNDS} kills had requests in flight`);
  });

  async function listCredentials(where = 'start'): Promise<{ client_id: string; scopes: string[] }[]> {
    const res = await agent.client.get('/v1/credentials', { token: adminToken });
    assert.equal(
      res.status,
      200,
      `${where}: the admin token issued before the kills is refused: ${res.text}`,
    );
    return res.body;
  }
});
