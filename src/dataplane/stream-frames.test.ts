// Unit tests of the stream wire format: every frame round-trips, exact lengths are enforced, and
// the decoder answers anything (random bytes, truncations, extensions) without throwing.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { encodeData } from '../../test/helpers/frame-builders.js';
import { KIND_PACKET } from './packet-frames.js';
import {
  decodeStreamFrame,
  encodeDataParts,
  encodeFin,
  encodeOpen,
  encodeOpenFail,
  encodeOpenOk,
  encodeRst,
  encodeWindow,
  FAIL_REASONS,
  isStreamKind,
  KIND_STREAM_DATA,
  KIND_STREAM_OPEN,
  KIND_STREAM_OPEN_FAIL,
  KIND_STREAM_RST,
  MAX_DATA_PAYLOAD,
  type StreamEnds,
} from './stream-frames.js';

const SERVICE = '0f1e2d3c-4b5a-4978-8685-a4b3c2d1e0f9';
const V4: StreamEnds = {
  family: 4,
  srcAddr: '10.1.2.3',
  srcPort: 40000,
  dstAddr: '192.0.2.80',
  dstPort: 443,
};
const V6: StreamEnds = {
  family: 6,
  srcAddr: 'fd00::1',
  srcPort: 1,
  dstAddr: '2001:db8::8:800:200c:417a',
  dstPort: 65535,
};

describe('stream frames', () => {
  it('reserves kinds 2..8, after the packet kind', () => {
    assert.equal(KIND_PACKET, 1);
    assert.equal(KIND_STREAM_OPEN, 2);
    assert.equal(KIND_STREAM_RST, 8);
    for (let k = 0; k < 256; k++) assert.equal(isStreamKind(k), k >= 2 && k <= 8, `kind ${k}`);
    assert.equal(isStreamKind(undefined), false);
  });

  it('round-trips OPEN with IPv4 and IPv6 ends, ids and windows at their limits', () => {
    for (const [id, window, ends] of [
      [1, 1, V4],
      [0xffff_ffff, 0xffff_ffff, V6],
      [42, 256 * 1024, { ...V4, srcAddr: '0.0.0.0', srcPort: 0, dstAddr: '255.255.255.255' }],
    ] as const) {
      const frame = encodeOpen(id, SERVICE, window, ends);
      assert.equal(frame.length, ends.family === 4 ? 39 : 63);
      assert.deepEqual(decodeStreamFrame(frame), {
        kind: 'open',
        id,
        serviceId: SERVICE,
        window,
        ends,
        transparent: false,
      });
    }
  });

  it('carries the transparency flag; an OPEN without the flags byte (an older sender) reads as not transparent; unknown flag bits are ignored', () => {
    const flagged = encodeOpen(7, SERVICE, 1000, V6, true);
    assert.equal(flagged.at(-1), 1);
    const decoded = decodeStreamFrame(flagged);
    assert.ok(decoded.kind === 'open' && decoded.transparent);
    assert.deepEqual(decoded.ends, V6);
    const older = encodeOpen(7, SERVICE, 1000, V4, true).subarray(0, 38);
    const read = decodeStreamFrame(older);
    assert.ok(read.kind === 'open' && !read.transparent);
    assert.deepEqual(read.ends, V4);
    const otherBits = Buffer.from(encodeOpen(7, SERVICE, 1000, V4, false));
    otherBits[38] = 0xfe;
    const other = decodeStreamFrame(otherBits);
    assert.ok(other.kind === 'open' && !other.transparent);
    // One byte too many is not an OPEN.
    assert.equal(decodeStreamFrame(Buffer.concat([flagged, Buffer.from([0])])).kind, 'malformed');
  });

  it('gives IPv6 addresses back in canonical form', () => {
    const frame = encodeOpen(3, SERVICE, 1000, { ...V6, srcAddr: 'FD00:0:0:0:0:0:0:1' });
    const decoded = decodeStreamFrame(frame);
    assert.ok(decoded.kind === 'open');
    assert.equal(decoded.ends.srcAddr, 'fd00::1');
  });

  it('refuses to encode bad arguments', () => {
    assert.throws(() => encodeOpen(1, 'not-a-uuid', 1000, V4));
    assert.throws(() => encodeOpen(1, SERVICE, 0, V4));
    assert.throws(() => encodeOpen(1, SERVICE, 1000, { ...V4, srcAddr: 'fd00::1' }));
    assert.throws(() => encodeOpen(1, SERVICE, 1000, { ...V6, dstAddr: '::ffff:1.2.3.4' }));
    assert.throws(() => encodeOpen(1, SERVICE, 1000, { ...V4, dstPort: 65536 }));
    assert.throws(() => encodeOpen(-1, SERVICE, 1000, V4));
    assert.throws(() => encodeOpen(2 ** 32, SERVICE, 1000, V4));
    assert.throws(() => encodeWindow(1, 0));
    assert.throws(() => encodeData(1, [Buffer.alloc(10)], 0));
    assert.throws(() => encodeData(1, [Buffer.alloc(10)], 11));
    assert.throws(() => encodeData(1, [Buffer.alloc(MAX_DATA_PAYLOAD + 1)], MAX_DATA_PAYLOAD + 1));
  });

  it('round-trips the small frames', () => {
    assert.deepEqual(decodeStreamFrame(encodeOpenOk(7, 65536)), { kind: 'open_ok', id: 7, window: 65536 });
    for (const reason of FAIL_REASONS)
      assert.deepEqual(decodeStreamFrame(encodeOpenFail(8, reason)), { kind: 'open_fail', id: 8, reason });
    assert.deepEqual(decodeStreamFrame(encodeWindow(9, 123456)), { kind: 'window', id: 9, credit: 123456 });
    assert.deepEqual(decodeStreamFrame(encodeFin(10)), { kind: 'fin', id: 10 });
    assert.deepEqual(decodeStreamFrame(encodeRst(11)), { kind: 'rst', id: 11 });
  });

  it('DATA in parts: a 5-byte header and views of the chunks, nothing copied', () => {
    const chunks = [Buffer.alloc(40_000, 1), Buffer.alloc(40_000, 2)];
    const frame = encodeDataParts(3, chunks, 50_000);
    assert.equal(frame.length, 5 + 50_000);
    assert.equal(frame.parts.length, 3);
    assert.equal(frame.parts[1], chunks[0], 'the first chunk itself');
    assert.equal(frame.parts[2]!.buffer, chunks[1]!.buffer, 'a view of the second');
    assert.equal(frame.parts[2]!.byteOffset, chunks[1]!.byteOffset);
    assert.equal(frame.parts[2]!.length, 10_000);
    assert.deepEqual(decodeStreamFrame(Buffer.concat(frame.parts)), {
      kind: 'data',
      id: 3,
      payload: Buffer.concat([chunks[0]!, chunks[1]!.subarray(0, 10_000)]),
    });
  });

  it('DATA takes its payload from the front of several chunks, up to a full tunnel message', () => {
    const chunks = [Buffer.from('abc'), Buffer.from('defg'), Buffer.from('hij')];
    const frame = encodeData(5, chunks, 8);
    const decoded = decodeStreamFrame(frame);
    assert.ok(decoded.kind === 'data');
    assert.equal(decoded.id, 5);
    assert.equal(decoded.payload.toString(), 'abcdefgh');
    const full = encodeData(6, [Buffer.alloc(MAX_DATA_PAYLOAD, 7)], MAX_DATA_PAYLOAD);
    assert.equal(full.length, 65_536);
    const big = decodeStreamFrame(full);
    assert.ok(big.kind === 'data' && big.payload.length === MAX_DATA_PAYLOAD);
  });

  it('an OPEN_FAIL reason this version does not know still means failure', () => {
    const frame = encodeOpenFail(4, 'refused');
    frame[5] = 200;
    assert.deepEqual(decodeStreamFrame(frame), { kind: 'open_fail', id: 4, reason: 'other' });
    frame[5] = 0;
    assert.deepEqual(decodeStreamFrame(frame), { kind: 'open_fail', id: 4, reason: 'other' });
    assert.equal(KIND_STREAM_OPEN_FAIL, 4);
  });

  it('wrong lengths, zero windows, bad families and foreign kinds are malformed', () => {
    const cases: [string, Buffer][] = [
      ['empty', Buffer.alloc(0)],
      ['short header', Buffer.from([KIND_STREAM_RST, 0, 0, 1])],
      ['packet kind', Buffer.concat([Buffer.from([1]), Buffer.alloc(40)])],
      ['kind 9', Buffer.from([9, 0, 0, 0, 1])],
      ['empty DATA', Buffer.from([KIND_STREAM_DATA, 0, 0, 0, 1])],
      ['FIN + byte', Buffer.concat([encodeFin(1), Buffer.alloc(1)])],
      ['RST + byte', Buffer.concat([encodeRst(1), Buffer.alloc(1)])],
      ['WINDOW short', encodeWindow(1, 5).subarray(0, 8)],
      ['WINDOW 0', Buffer.from([6, 0, 0, 0, 1, 0, 0, 0, 0])],
      ['OPEN_OK long', Buffer.concat([encodeOpenOk(1, 5), Buffer.alloc(1)])],
      ['OPEN_OK window 0', Buffer.from([3, 0, 0, 0, 1, 0, 0, 0, 0])],
      ['OPEN_FAIL empty', encodeOpenFail(1, 'refused').subarray(0, 5)],
      ['OPEN v4 short', encodeOpen(1, SERVICE, 5, V4).subarray(0, 37)],
      ['OPEN v4 long', Buffer.concat([encodeOpen(1, SERVICE, 5, V4), Buffer.alloc(1)])],
      ['OPEN v6 cut to v4 size', encodeOpen(1, SERVICE, 5, V6).subarray(0, 38)],
    ];
    const badFamily = encodeOpen(1, SERVICE, 5, V4);
    badFamily[25] = 5;
    cases.push(['OPEN family 5', badFamily]);
    const zeroWindow = encodeOpen(1, SERVICE, 5, V4);
    zeroWindow.writeUInt32BE(0, 21);
    cases.push(['OPEN window 0', zeroWindow]);
    for (const [name, message] of cases) assert.equal(decodeStreamFrame(message).kind, 'malformed', name);
  });

  it('never throws on random bytes, and on any truncation or extension of valid frames', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 80 }), (bytes) => {
        decodeStreamFrame(Buffer.from(bytes));
      }),
      { numRuns: 5000 },
    );
    const valid = [
      encodeOpen(1, SERVICE, 5, V4),
      encodeOpen(1, SERVICE, 5, V6),
      encodeOpenOk(1, 5),
      encodeOpenFail(1, 'timeout'),
      encodeData(1, [Buffer.from('xy')], 2),
      encodeWindow(1, 5),
      encodeFin(1),
      encodeRst(1),
    ];
    fc.assert(
      fc.property(
        fc.constantFrom(...valid),
        fc.integer({ min: 0, max: 70 }),
        fc.uint8Array({ maxLength: 8 }),
        (frame, cut, extra) => {
          const decoded = decodeStreamFrame(Buffer.concat([frame.subarray(0, cut), extra]));
          assert.ok(typeof decoded.kind === 'string');
        },
      ),
      { numRuns: 3000 },
    );
  });
});
