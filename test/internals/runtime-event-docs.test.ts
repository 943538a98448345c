/**
 * docs/events.md "Runtime events" lists every runtime event type with a table row and a JSON
 * example, and the parts that report them report no type the catalogue lacks.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { RUNTIME_EVENT_TYPES } from '../../src/events/runtime-events.js';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const read = (path: string) => readFileSync(`${ROOT}${path}`, 'utf8');

/** The modules that report runtime events through RecordObserved. */
const REPORTERS = [
  'src/cluster/gossip.ts',
  'src/dataplane/dataplane.ts',
  'src/api/limit-refusals.ts',
  'src/auth/failure-report.ts',
  'src/events/license-watch.ts',
];

describe('runtime event catalogue', () => {
  it('docs/events.md has a row and an example of each type', () => {
    const doc = read('docs/events.md');
    const section = doc.slice(
      doc.indexOf('## Runtime events'),
      doc.indexOf('\n## ', doc.indexOf('## Runtime events') + 1),
    );
    for (const type of RUNTIME_EVENT_TYPES) {
      assert.match(
        section,
        new RegExp(`^\\| \`${type.replace('.', '\\.')}\` \\|`, 'm'),
        `${type}: no table row`,
      );
      assert.ok(section.includes(`{"type": "${type}"`), `${type}: no example`);
    }
  });

  it('the reporters report only catalogued types', () => {
    const reported = new Set<string>();
    for (const file of REPORTERS) {
      const text = read(file);
      for (const m of text.matchAll(/'([a-z_]+\.[a-z_]+)'/g)) {
        if (/^(peer|tunnel|service|dataplane|license|auth)\./.test(m[1]!)) reported.add(m[1]!);
      }
    }
    const catalogued = new Set<string>(RUNTIME_EVENT_TYPES);
    assert.deepEqual(
      [...reported].filter((t) => !catalogued.has(t)),
      [],
    );
    assert.deepEqual(
      RUNTIME_EVENT_TYPES.filter((t) => !reported.has(t)),
      [],
      'a catalogued type nobody reports',
    );
  });
});
