import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { describe, it } from 'node:test';
import pino from 'pino';
import { FaultLog } from './fault-log.js';

describe('FaultLog', () => {
  it('counts every fault but logs each reason at most once per interval, saying how many it skipped', () => {
    const lines: { level: string; details: Record<string, unknown>; message: string }[] = [];
    const logger = {
      info: (details: object, message: string) =>
        lines.push({ level: 'info', details: { ...details }, message }),
      warn: (details: object, message: string) =>
        lines.push({ level: 'warn', details: { ...details }, message }),
      debug: () => {},
    };
    let now = 0;
    const log = new FaultLog(logger, 'tcp', 10_000, () => now);
    for (let i = 0; i < 100; i++) log.record('unknown-peer', { remote: '10.0.0.1' });
    log.record('dead', { peer: 'p' });
    assert.equal(log.snapshot()['unknown-peer'], 100);
    assert.equal(log.snapshot().dead, 1);
    assert.equal(log.snapshot().corrupt, 0);
    assert.equal(lines.length, 2);
    assert.deepEqual(lines[0], {
      level: 'warn',
      details: { transport: 'tcp', reason: 'unknown-peer', remote: '10.0.0.1' },
      message: 'tunnel connection refused',
    });
    // A dead peer is ordinary: info, not a warning.
    assert.equal(lines[1]!.level, 'info');
    now = 10_001;
    log.record('unknown-peer', { remote: '10.0.0.2' });
    assert.equal(lines.length, 3);
    assert.equal(lines[2]!.details.suppressed, 99);
    assert.equal(lines[2]!.details.remote, '10.0.0.2');
  });

  it('counts without a logger, and hands out copies', () => {
    const log = new FaultLog(undefined, 'memory');
    log.record('busy', {});
    const snapshot = log.snapshot() as Record<string, number>;
    snapshot.busy = 99;
    assert.equal(log.snapshot().busy, 1);
  });

  it('takes the agent’s pino logger as it is', () => {
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk, _encoding, done) {
        lines.push(chunk.toString());
        done();
      },
    });
    const log = new FaultLog(pino({ level: 'info' }, sink), 'tcp');
    log.record('wrong-key', { peer: 'p' });
    return new Promise<void>((resolve) =>
      setImmediate(() => {
        assert.equal(lines.length, 1);
        const line = JSON.parse(lines[0]!) as Record<string, unknown>;
        assert.equal(line.msg, 'tunnel connection refused');
        assert.equal(line.reason, 'wrong-key');
        assert.equal(line.level, 40);
        resolve();
      }),
    );
  });
});
