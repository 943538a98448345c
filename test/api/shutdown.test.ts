/**
 * Clean stop (docs/decisions.md §1): on SIGTERM and on SIGINT a request in flight finishes with its normal
 * answer, the process exits 0, the database is closed cleanly (integrity check passes, no WAL
 * left behind) and what the request wrote is there after a restart on the same data dir.
 *
 * The request is a POST /v1/credentials whose ~800 KB JSON body is streamed over about a second
 * with node:http; the signal is sent a third of the way through the upload.
 */
import assert from 'node:assert/strict';
import { existsSync, statSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import Database from 'better-sqlite3';
import { scope } from '../../src/domain/scopes.js';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import { sleep } from '../helpers/api-assertions.js';
import type { ApiResponse } from '../helpers/api-client.js';
import { makeVendor } from '../helpers/licenses.js';

const DB_FILE = 'mesh-agent.db';
const CHUNKS = 20;
const CHUNK_GAP_MS = 50;

/** Streams `body` in CHUNKS pieces CHUNK_GAP_MS apart; calls onChunk(i) after writing piece i. */
function slowPost(
  agent: AgentProcess,
  path: string,
  token: string,
  body: Buffer,
  onChunk: (i: number) => void,
): Promise<ApiResponse> {
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: '127.0.0.1',
        port: agent.port,
        method: 'POST',
        path,
        agent: false,
        headers: {
          authorization: `Bearer ${token}`,
          'content-type': 'application/json',
          'content-length': String(body.length),
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let parsed: unknown;
          try {
            parsed = JSON.parse(text);
          } catch {
            parsed = undefined;
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, text, body: parsed });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    const size = Math.ceil(body.length / CHUNKS);
    (async () => {
      for (let i = 0; i < CHUNKS; i++) {
        req.write(body.subarray(i * size, Math.min(body.length, (i + 1) * size)));
        onChunk(i);
        await sleep(CHUNK_GAP_MS);
      }
      req.end();
    })().catch(reject);
  });
}

async function waitForExit(agent: AgentProcess, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (agent.exitCode === null && agent.exitSignal === null) {
    if (Date.now() > deadline) throw new Error(`agent did not exit in ${timeoutMs} ms:\n${agent.logs}`);
    await sleep(20);
  }
}

for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  describe(`clean stop on ${signal} with a request in flight`, () => {
    const vendor = makeVendor();
    let agent: AgentProcess;
    let admin: { clientId: string; clientSecret: string };

    before(async () => {
      agent = await AgentProcess.start({ vendor });
      admin = await bootstrap(agent, vendor);
    });
    after(async () => {
      // The agent was restarted by the test; this stop must be clean too.
      assert.equal(await agent.stop(), 0);
      const db = new Database(join(agent.dataDir, DB_FILE), { readonly: true, fileMustExist: true });
      try {
        assert.deepEqual(db.pragma('integrity_check'), [{ integrity_check: 'ok' }]);
      } finally {
        db.close();
      }
    });

    it(`finishes the upload with 201, exits 0, and the credential exists after a restart`, async () => {
      const token = await agent.client.token(admin.clientId, admin.clientSecret);
      const conformance = await agent.client.conformance();
      const wanted = [scope('peers.read'), scope('credentials.read')];
      const body = Buffer.from(JSON.stringify({ scopes: wanted, padding: 'p'.repeat(800 * 1024) }), 'utf8');
      assert.ok(body.length > 800_000 && body.length < 1024 * 1024);

      let signalledAt = 0;
      let probe: Promise<string> | undefined;
      const started = Date.now();
      const res = await slowPost(agent, '/v1/credentials', token, body, (i) => {
        if (i === Math.floor(CHUNKS / 3)) {
          signalledAt = Date.now();
          agent.proc.kill(signal);
        }
        // While the upload goes on, the stopping agent takes no new work.
        if (i === CHUNKS - 1) {
          probe = agent.client.raw('GET', '/readyz', { timeoutMs: 2000 }).then(
            (r) => String(r.status),
            (err: Error) => err.message,
          );
        }
      });
      const finished = Date.now();
      assert.ok(signalledAt > 0, 'the signal was sent during the upload');
      assert.ok(
        finished - signalledAt >= 400,
        `the upload went on after the signal (${finished - signalledAt} ms)`,
      );
      assert.ok(finished - started >= 800, 'the upload took about a second');

      assert.equal(res.status, 201, res.text);
      const probed = await probe!;
      assert.ok(
        probed === '503' || /ECONNREFUSED|ECONNRESET|socket hang up/.test(probed),
        `new request while stopping: ${probed}`,
      );
      conformance.check('POST', '/v1/credentials', res);
      assert.deepEqual([...res.body.scopes].sort(), [...wanted].sort());
      agent.client.secretsSeen.add(res.body.client_secret);

      await waitForExit(agent);
      assert.equal(agent.exitSignal, null, `exited by itself, not killed by ${agent.exitSignal}`);
      assert.equal(agent.exitCode, 0, agent.logs);
      assert.match(agent.logs, new RegExp(`"signal":"${signal}"`));
      agent.assertNoSecretsInLogs();

      // Closed cleanly: the database passes an integrity check and no WAL is left to replay.
      const wal = join(agent.dataDir, `${DB_FILE}-wal`);
      assert.ok(!existsSync(wal) || statSync(wal).size === 0, 'the WAL was checkpointed on close');
      const db = new Database(join(agent.dataDir, DB_FILE), { readonly: true, fileMustExist: true });
      try {
        assert.deepEqual(db.pragma('integrity_check'), [{ integrity_check: 'ok' }]);
      } finally {
        db.close();
      }

      // After a restart on the same data dir the credential made by that request is there and works.
      await agent.restart();
      const list = await agent.client.get('/v1/credentials', { token });
      assert.equal(list.status, 200, 'tokens issued before the restart still work');
      const found = list.body.find((c: { client_id: string }) => c.client_id === res.body.client_id);
      assert.ok(found, 'the credential created during the shutdown exists after the restart');
      assert.deepEqual([...found.scopes].sort(), [...wanted].sort());
      const tok = await agent.client.tokenResponse(res.body.client_id, res.body.client_secret);
      assert.equal(tok.status, 200, 'its secret works after the restart');
    });
  });
}
