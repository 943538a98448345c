import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { encodeDataFrames, messageParts } from '../../test/helpers/frame-builders.js';
import {
  ACCEPT_FRAME,
  BY_REFERENCE_BYTES,
  dataFrameChunks,
  encodeControlFrame,
  FRAME_ACCEPT,
  FRAME_DATA,
  FRAME_PING,
  FRAME_PONG,
  FrameDecoder,
} from './frames.js';
import { type TunnelMessage, wholeOf } from './tunnel.js';

interface Frame {
  type: number;
  payload: Buffer;
  /** The payload as the decoder gave it: whole (1) or in this many pieces. */
  pieces: number;
  given: TunnelMessage;
}

function decoderInto(frames: Frame[]): FrameDecoder {
  return new FrameDecoder({
    frame: (type, payload) =>
      frames.push({
        type,
        payload: wholeOf(payload),
        pieces: Buffer.isBuffer(payload) ? 1 : payload.parts.length,
        given: payload,
      }),
  });
}

/** Cuts a buffer at the given offsets (sorted, deduplicated, within bounds). */
function cut(stream: Buffer, at: number[]): Buffer[] {
  const points = [...new Set(at.map((n) => n % (stream.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let from = 0;
  for (const p of points) {
    out.push(stream.subarray(from, p));
    from = p;
  }
  out.push(stream.subarray(from));
  return out;
}

describe('frames', () => {
  it('encodes DATA frames as type, 24-bit length, payload, back to back', () => {
    const out = encodeDataFrames([Buffer.from('ab'), Buffer.alloc(0), Buffer.alloc(65_536, 9)]);
    assert.deepEqual([...out.subarray(0, 6)], [FRAME_DATA, 0, 0, 2, 0x61, 0x62]);
    assert.deepEqual([...out.subarray(6, 10)], [FRAME_DATA, 0, 0, 0]);
    assert.deepEqual([...out.subarray(10, 14)], [FRAME_DATA, 0x01, 0x00, 0x00]);
    assert.equal(out.length, 14 + 65_536);
    const ping = encodeControlFrame(FRAME_PING, Buffer.from('12345678'));
    assert.deepEqual([...ping.subarray(0, 4)], [FRAME_PING, 0, 0, 8]);
    assert.equal(ping.subarray(4).toString(), '12345678');
    assert.deepEqual([...ACCEPT_FRAME], [FRAME_ACCEPT, 0, 0, 0]);
  });

  it('writes long pieces by reference and coalesces headers and short pieces, whole or in parts', () => {
    const big = Buffer.alloc(BY_REFERENCE_BYTES, 7);
    const huge = Buffer.alloc(60_000, 8);
    const messages = [
      Buffer.from('hi'),
      messageParts([Buffer.from([1, 2, 3, 4, 5]), big]),
      huge,
      messageParts([Buffer.from('x'), Buffer.from('yz')]),
    ];
    const chunks = dataFrameChunks(messages);
    // header+'hi'+header+5 bytes | big | header | huge | header+'x'+'yz'
    assert.equal(chunks.length, 5);
    assert.equal(chunks[1], big, 'the same buffer, not a copy');
    assert.equal(chunks[3], huge);
    assert.equal(chunks[0]!.length, 4 + 2 + 4 + 5);
    assert.equal(chunks[2]!.length, 4);
    const frames: Frame[] = [];
    assert.equal(decoderInto(frames).push(Buffer.concat(chunks)), undefined);
    assert.deepEqual(
      frames.map((f) => f.payload),
      [Buffer.from('hi'), Buffer.concat([Buffer.from([1, 2, 3, 4, 5]), big]), huge, Buffer.from('xyz')],
    );
  });

  it('decodes any stream of valid frames, however it is cut into chunks', () => {
    const message = fc.uint8Array({ minLength: 0, maxLength: 3000 }).map((a) => Buffer.from(a));
    fc.assert(
      fc.property(
        fc.array(message, { maxLength: 40 }),
        fc.array(fc.nat(), { maxLength: 30 }),
        (messages, cuts) => {
          const stream = Buffer.concat([
            ACCEPT_FRAME,
            encodeDataFrames(messages),
            encodeControlFrame(FRAME_PONG, Buffer.from('abcdefgh')),
          ]);
          const frames: Frame[] = [];
          const decoder = decoderInto(frames);
          for (const chunk of cut(stream, cuts)) assert.equal(decoder.push(chunk), undefined);
          assert.equal(frames.length, messages.length + 2);
          assert.equal(frames[0]!.type, FRAME_ACCEPT);
          for (let i = 0; i < messages.length; i++) {
            assert.equal(frames[i + 1]!.type, FRAME_DATA);
            assert.ok(frames[i + 1]!.payload.equals(messages[i]!));
          }
          assert.equal(frames.at(-1)!.type, FRAME_PONG);
          assert.equal(frames.at(-1)!.payload.toString(), 'abcdefgh');
        },
      ),
      { numRuns: 300 },
    );
  });

  it('hands over a frame inside one chunk as a view of it, without copying', () => {
    const chunk = encodeDataFrames([Buffer.from('one'), Buffer.from('two')]);
    const frames: Frame[] = [];
    decoderInto(frames).push(chunk);
    assert.equal(frames.length, 2);
    for (const f of frames) assert.equal(f.payload.buffer, chunk.buffer);
  });

  it('hands a long DATA payload spanning chunks over as views of them, a tiny-chunked one as one copy', () => {
    const payload = Buffer.alloc(65_536);
    for (let i = 0; i < payload.length; i++) payload[i] = i % 251;
    const stream = Buffer.concat([encodeDataFrames([payload, Buffer.from('short')])]);
    // As TLS delivers it: 16 KiB reads.
    const frames: Frame[] = [];
    const decoder = decoderInto(frames);
    const chunks = cut(stream, [16_384, 32_768, 49_152, 65_536]);
    for (const chunk of chunks) assert.equal(decoder.push(chunk), undefined);
    assert.equal(frames.length, 2);
    assert.ok(frames[0]!.payload.equals(payload));
    assert.equal(frames[0]!.pieces, 5);
    const given = frames[0]!.given;
    assert.ok(!Buffer.isBuffer(given) && given.length === 65_536);
    assert.ok(
      !Buffer.isBuffer(given) && given.parts.every((p, i) => p.buffer === chunks[i]!.buffer),
      'views of the chunks, not copies',
    );
    assert.deepEqual(frames[1]!.payload, Buffer.from('short'));
    // 1 KiB reads: 65 chunks, so one copy.
    const copied: Frame[] = [];
    const byKiB = decoderInto(copied);
    for (const chunk of cut(
      stream,
      Array.from({ length: 70 }, (_, i) => (i + 1) * 1024),
    ))
      byKiB.push(chunk);
    assert.equal(copied[0]!.pieces, 1);
    assert.ok(copied[0]!.payload.equals(payload));
  });

  it('is linear in the stream, even fed one byte at a time', () => {
    // Fed byte by byte, 4 times the stream must take about 4 times as long, not 16 (quadratic
    // copying). A ratio measured in the same run, the faster of two tries each: the machine's
    // speed and load cancel out.
    const feed = (frameCount: number): number => {
      const stream = encodeDataFrames(Array.from({ length: frameCount }, (_, i) => Buffer.alloc(65_536, i)));
      let frames = 0;
      let bytes = 0;
      const decoder = new FrameDecoder({
        frame: (_type, payload) => {
          frames++;
          bytes += payload.length;
        },
      });
      const start = performance.now();
      for (let i = 0; i < stream.length; i++) decoder.push(stream.subarray(i, i + 1));
      const ms = performance.now() - start;
      assert.equal(frames, frameCount);
      assert.equal(bytes, frameCount * 65_536);
      return ms;
    };
    const small = Math.min(feed(8), feed(8));
    const large = Math.min(feed(32), feed(32));
    assert.ok(large / small < 8, `4x the stream took ${(large / small).toFixed(1)}x as long`);
  });

  it('refuses unknown types, oversized DATA, wrong-sized control frames, and stays failed', () => {
    const cases: [string, Buffer][] = [
      ['unknown frame type 9', Buffer.from([9, 0, 0, 0])],
      ['unknown frame type 0', Buffer.from([0, 0, 0, 0])],
      ['DATA frame of 65537 bytes', Buffer.from([FRAME_DATA, 0x01, 0x00, 0x01])],
      ['control frame of 7 bytes', Buffer.from([FRAME_PING, 0, 0, 7])],
      ['control frame of 0 bytes', Buffer.from([FRAME_PONG, 0, 0, 0])],
      ['ACCEPT frame of 1 bytes', Buffer.from([FRAME_ACCEPT, 0, 0, 1])],
    ];
    for (const [error, header] of cases) {
      const frames: Frame[] = [];
      const decoder = decoderInto(frames);
      // Also when the bad header arrives split, after a good frame.
      assert.equal(
        decoder.push(Buffer.concat([encodeDataFrames([Buffer.from('ok')]), header.subarray(0, 2)])),
        undefined,
      );
      assert.equal(decoder.push(header.subarray(2)), error);
      assert.equal(decoder.push(encodeDataFrames([Buffer.from('later')])), error);
      assert.equal(frames.length, 1);
    }
  });

  it('stops delivering at once when told to stop from inside a frame callback', () => {
    const frames: Frame[] = [];
    const decoder: FrameDecoder = new FrameDecoder({
      frame: (type, payload) => {
        frames.push({ type, payload: wholeOf(payload), pieces: 1, given: payload });
        decoder.stop('closed');
      },
    });
    assert.equal(decoder.push(encodeDataFrames([Buffer.from('a'), Buffer.from('b')])), 'closed');
    assert.equal(frames.length, 1);
  });
});
