/**
 * The served OpenAPI document: a valid OpenAPI 3.1 document by a stock validator, holding every
 * path and status that the API document and docs/decisions.md give for the endpoints served. Real
 * responses are checked against it by every API test (test/helpers/api-client.ts).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { Validator } from '@seriousme/openapi-schema-validator';
import { SCOPE_NAMES, type ScopeName, scope } from '../../src/domain/scopes.js';
import { AgentProcess, bootstrap } from '../helpers/agent-process.js';
import { makeVendor } from '../helpers/licenses.js';

const REQUIRED_STATUSES = JSON.parse(
  readFileSync(new URL('../../../test/fixtures/api-statuses.json', import.meta.url), 'utf8'),
) as Record<string, number[]>;
delete (REQUIRED_STATUSES as Record<string, unknown>).$comment;

describe('OpenAPI document', () => {
  const vendor = makeVendor();
  let agent: AgentProcess;
  // biome-ignore lint/suspicious/noExplicitAny: an OpenAPI document is arbitrary JSON
  let doc: any;
  before(async () => {
    agent = await AgentProcess.start({ vendor });
    await bootstrap(agent, vendor);
    doc = (await agent.client.get('/openapi.json')).body;
  });
  after(async () => {
    assert.equal(await agent.stop(), 0);
  });

  it('is a valid OpenAPI 3.1 document', async () => {
    assert.equal(doc.openapi, '3.1.0');
    const result = await new Validator().validate(structuredClone(doc));
    assert.equal(result.valid, true, JSON.stringify(result.errors, null, 2));
  });

  it('documents every path and status of the served endpoints', () => {
    const problems: string[] = [];
    for (const [key, statuses] of Object.entries(REQUIRED_STATUSES)) {
      const [method, path] = key.split(' ') as [string, string];
      const op = doc.paths[path]?.[method.toLowerCase()];
      if (!op) {
        problems.push(`${key} is not documented`);
        continue;
      }
      for (const s of statuses) if (!op.responses?.[String(s)]) problems.push(`${key} lacks ${s}`);
    }
    assert.deepEqual(problems, []);
  });

  it('declares how each operation authenticates, as the hand-written scope table says', () => {
    const expected: Record<string, string> = JSON.parse(
      readFileSync(new URL('../../../test/fixtures/route-scopes.json', import.meta.url), 'utf8'),
    );
    const reads = [...SCOPE_NAMES.filter((n) => n.endsWith('.read')), 'admin' as const]
      .map((n) => scope(n))
      .sort();
    const problems: string[] = [];
    let checked = 0;
    for (const [key, guard] of Object.entries(expected)) {
      if (key === '$comment') continue;
      const [method, route] = key.split(' ') as [string, string];
      const op = (doc.paths as Record<string, Record<string, { security?: { oauth2: string[] }[] }>>)[
        route.replace(/:(\w+)/g, '{$1}')
      ]?.[method.toLowerCase()];
      if (!op) continue; // documented or not: openapi's other checks
      checked++;
      const want =
        guard === 'public' || guard === 'peer-signed'
          ? undefined
          : guard === 'any-read'
            ? reads
            : [scope(guard as ScopeName)];
      const got = op.security?.map((s) => [...s.oauth2].sort());
      if (JSON.stringify(got) !== JSON.stringify(want && [want]))
        problems.push(`${key}: ${JSON.stringify(got)}`);
    }
    assert.ok(checked >= 30, `only ${checked} operations compared`);
    assert.deepEqual(problems, []);
    assert.equal(doc.components.securitySchemes.oauth2.type, 'oauth2');
  });
});
