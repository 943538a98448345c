/**
 * The scope matrix: every route the agent serves is in the fixture written from the API
 * document, and for every route each single-scope token is refused (403) exactly when the
 * fixture says its scope does not grant the route. Tokens with no scope answer 401.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { SCOPE_NAMES, scope } from '../../src/domain/scopes.js';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import { makeVendor } from '../helpers/licenses.js';
import { SseClient } from '../helpers/sse-client.js';

const FIXTURE = JSON.parse(
  readFileSync(new URL('../../../test/fixtures/route-scopes.json', import.meta.url), 'utf8'),
) as Record<string, string>;
delete FIXTURE.$comment;

const STREAM = '/v1/events/stream';

const isTokenless = (guard: string) => guard === 'public' || guard === 'peer-signed';

const expectedGrant = (guard: string, held: string): boolean =>
  isTokenless(guard) ||
  held === 'admin' ||
  held === guard ||
  (guard === 'any-read' && held.endsWith('.read'));

describe('scope matrix', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  let served: { method: string; path: string }[];
  const tokens = new Map<string, string>();

  before(async () => {
    agent = await AgentProcess.start({ vendor });
    const admin = await bootstrap(agent, vendor);
    for (const name of SCOPE_NAMES) {
      tokens.set(name, await agent.client.token(admin.clientId, admin.clientSecret, scope(name)));
    }
    const doc = (await agent.client.get('/openapi.json')).body as {
      paths: Record<string, Record<string, unknown>>;
    };
    served = Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.keys(ops)
        .filter((m) => ['get', 'post', 'put', 'delete', 'patch'].includes(m))
        .map((m) => ({ method: m.toUpperCase(), path })),
    );
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('lists every served route in the fixture written from the API document', () => {
    assert.ok(served.length >= 14, `only ${served.length} routes served`);
    const missing = served.map((r) => `${r.method} ${r.path}`).filter((k) => !(k in FIXTURE));
    assert.deepEqual(missing, [], 'routes served but missing from test/fixtures/route-scopes.json');
  });

  it('answers 401 without a token on every non-public route, and never 401 on a public one', async () => {
    for (const { method, path } of served) {
      const guard = FIXTURE[`${method} ${path}`]!;
      const res = await agent.client.request(method, concrete(path), {
        json: method === 'GET' ? undefined : {},
      });
      if (isTokenless(guard)) assert.notEqual(res.status, 401, `${method} ${path} takes no token`);
      else assert.equal(res.status, 401, `${method} ${path} without a token: ${res.text}`);
    }
  });

  it('answers 403 exactly when the token scope does not grant the route', async () => {
    for (const { method, path } of served) {
      const guard = FIXTURE[`${method} ${path}`]!;
      if (isTokenless(guard)) continue;
      for (const name of SCOPE_NAMES) {
        if (path === STREAM) {
          // An admitted stream never ends: its status is all there is to compare.
          const stream = await SseClient.open(agent.url, { token: tokens.get(name)! });
          stream.close();
          const granted = expectedGrant(guard, name);
          assert.equal(stream.status === 403, !granted, `${method} ${path} with ${name}: ${stream.status}`);
          continue;
        }
        const res = await agent.client.request(method, concrete(path), {
          token: tokens.get(name)!,
          json: bodyFor(method, path, name),
        });
        const granted = expectedGrant(guard, name);
        if (granted) assert.notEqual(res.status, 403, `${method} ${path} with ${name}: ${res.text}`);
        else assert.equal(res.status, 403, `${method} ${path} with ${name}: ${res.status} ${res.text}`);
        assert.notEqual(res.status, 401, `${method} ${path} with ${name}`);
      }
    }
  });
});

/**
 * A body that passes every check after the scope guard where it can: a credential asks only
 * for the scope the caller holds, so the answer isolates the route guard from escalation rules.
 */
function bodyFor(method: string, path: string, held: string): unknown {
  if (method === 'GET') return undefined;
  if (method === 'POST' && path === '/v1/credentials')
    return { scopes: [scope(held as (typeof SCOPE_NAMES)[number])] };
  return {};
}

/** A path template with made-up ids: existence does not matter for the scope check (403 comes before 404). */
function concrete(path: string): string {
  return path.replace(/\{route_id\}/g, '1').replace(/\{[^}]+\}/g, 'does-not-exist');
}
