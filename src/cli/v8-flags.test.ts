import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { AGENT_V8_FLAGS, missingV8Flags } from './v8-flags.js';

describe('missingV8Flags', () => {
  it('names every agent flag absent from execArgv', () => {
    assert.deepEqual(missingV8Flags([]), [...AGENT_V8_FLAGS]);
    assert.deepEqual(missingV8Flags(['--enable-source-maps']), [...AGENT_V8_FLAGS]);
  });

  it("leaves out a flag given with the operator's own value, in either spelling", () => {
    assert.deepEqual(missingV8Flags(['--initial-old-space-size=200']), []);
    assert.deepEqual(missingV8Flags(['--initial_old_space_size=512']), []);
  });
});
