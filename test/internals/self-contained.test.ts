/**
 * Keeps the repository explaining itself: comments and docs point only at paths inside it and say
 * what they mean instead of citing an issue. The API document is docs/api.md and the decisions
 * filling its gaps are docs/decisions.md (§1..§8); nothing may send a reader to the copies that
 * lived beside the repository, to their old names, or to "issue 6". Upstream references of the
 * form `project#123` (tailscale#16357) are fine. The benchmarks' reference measurements
 * (bench-anchors) do live beside the repository, so that one path stays allowed.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
/** Where comments and docs live; bench/results holds measurements, not prose. */
const SCANNED = ['src', 'test', 'scripts', 'bench', 'docs', 'native', 'deploy', 'README.md'];
const SKIPPED = new Set(['node_modules', 'dist', 'build', join('bench', 'results')]);
/** This file names the patterns it looks for. */
const SELF = join('test', 'internals', 'self-contained.test.ts');

/** What no scanned file may say, each with the reason a reader would trip over it. */
const FORBIDDEN: [RegExp, string][] = [
  [/\.\.\/shared\/(?!bench-anchors)/, 'a path outside the repository (the API document is docs/api.md)'],
  [/\bDECISIONS\b/, 'the decisions are docs/decisions.md'],
  [/\bissues? #?\d+/i, 'an issue number: say the thing itself'],
  [/(^|[\s([])#\d+\b/, 'an issue number: say the thing itself'],
];

function files(path: string, out: string[] = []): string[] {
  const rel = relative(ROOT, path);
  if (SKIPPED.has(rel) || SKIPPED.has(rel.split('/').pop() ?? '')) return out;
  if (statSync(path).isDirectory()) for (const name of readdirSync(path)) files(join(path, name), out);
  else if (rel !== SELF) out.push(path);
  return out;
}

/** `file:line: text` for every forbidden mention in one file's text. */
function mentions(file: string, text: string): string[] {
  const found: string[] = [];
  for (const [i, line] of text.split('\n').entries()) {
    for (const [pattern, why] of FORBIDDEN) {
      if (pattern.test(line)) found.push(`${file}:${i + 1}: ${why}: ${line.trim()}`);
    }
  }
  return found;
}

describe('the repository explains itself', () => {
  it('has the API document and its decisions in docs/', () => {
    const api = readFileSync(join(ROOT, 'docs/api.md'), 'utf8');
    assert.match(api, /\n## Endpoints\n/);
    const decisions = readFileSync(join(ROOT, 'docs/decisions.md'), 'utf8');
    const sections = [...decisions.matchAll(/^## (\d+)\. /gm)].map((m) => Number(m[1]));
    assert.deepEqual(sections, [1, 2, 3, 4, 5, 6, 7, 8], 'docs/decisions.md keeps its numbered sections');
  });

  it('points only inside the repository and never at an issue number', () => {
    const found: string[] = [];
    for (const top of SCANNED) {
      for (const file of files(join(ROOT, top))) {
        const text = readFileSync(file, 'utf8');
        if (text.includes('\0')) continue;
        found.push(...mentions(relative(ROOT, file), text));
      }
    }
    assert.deepEqual(found, []);
  });

  it('catches each kind of mention, and lets upstream references through', () => {
    const bad = [
      'see ../shared/spec/mesh-agent-api.md',
      'order of DECISIONS §3',
      'DECISIONS.md fills the gaps',
      'two speed targets of issue 6',
      "issue 8's benchmark",
      'fixed in (#12)',
    ];
    for (const line of bad) assert.equal(mentions('x', line).length, 1, line);
    const fine = [
      'docs/decisions.md §3, docs/api.md',
      'no failover when the LAN side is broken (tailscale#16357)',
      'BENCH_SHARED/bench-anchors, by default ../shared/bench-anchors',
      'tokens issued 6 minutes ago',
      "the token endpoint's issuer",
    ];
    for (const line of fine) assert.deepEqual(mentions('x', line), [], line);
  });
});
