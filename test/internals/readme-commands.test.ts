/**
 * The README opens with exactly two commands, one that installs and runs the agent and one that
 * runs every test; CI must run that second command and nothing more, so that CI proves what the
 * README tells a newcomer. This reads both files and compares.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));

/** The commands of a shell text: comments and blank lines dropped. */
const commandsOf = (text: string): string[] =>
  text
    .split('\n')
    .map((line) => line.replace(/(^|\s)#.*$/, '').trim())
    .filter((line) => line !== '');

/** The README's opening commands: the first fenced block, which must come before any heading but the title. */
function readmeCommands(): string[] {
  const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
  const block = /^```(?:sh|bash)?\n([\s\S]*?)^```/m.exec(readme);
  assert.ok(block, 'README.md has no fenced command block');
  const before = readme.slice(0, block.index);
  assert.deepEqual(
    before.split('\n').filter((l) => l.startsWith('#')),
    ['# mesh-agent'],
    'the commands come first, under the title only',
  );
  return commandsOf(block[1]!);
}

/** What .ci/run runs, besides the shell's own set-up (`set -euo pipefail`, `cd` to the repository). */
function ciCommands(): string[] {
  const text = readFileSync(join(ROOT, '.ci/run'), 'utf8');
  return commandsOf(text).filter((c) => !/^set -[a-z]+( pipefail)?$/.test(c) && !/^cd "\$\(dirname /.test(c));
}

describe('README and CI', () => {
  it('the README opens with exactly two commands: install and run the agent, run the tests', () => {
    const commands = readmeCommands();
    assert.equal(commands.length, 2, `expected two commands, found: ${JSON.stringify(commands)}`);
    assert.match(commands[0]!, /^npm (install|ci)\b.*&& npm start$/);
  });

  it('.ci/run runs the README’s second command and nothing more', () => {
    assert.deepEqual(ciCommands(), [readmeCommands()[1]]);
  });

  it('the test command sets itself up before it runs: npm test has a pretest step', () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
      scripts: Record<string, string>;
    };
    assert.equal(readmeCommands()[1], 'npm test');
    assert.equal(pkg.scripts.pretest, 'node scripts/test-setup.mjs');
    assert.match(pkg.scripts['test:unit'] ?? '', /run-tests\.mjs --unit$/);
  });
});
