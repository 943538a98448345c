/**
 * Whole-buffer forms of the tunnel's and the stream mux's frame encoders, for tests and benches
 * that write raw frames: the product sends frames as pieces (`dataFrameChunks`,
 * `encodeDataParts`) and never needs them copied into one buffer.
 */
import { encodeDataParts } from '../../src/dataplane/stream-frames.js';
import { dataFrameChunks } from '../../src/transports/frames.js';
import type { MessageParts, TunnelMessage } from '../../src/transports/tunnel.js';

/** The tunnel DATA frames of `messages` in one buffer. */
export function encodeDataFrames(messages: readonly TunnelMessage[]): Buffer {
  return Buffer.concat(dataFrameChunks(messages));
}

/** A stream DATA frame in one buffer. */
export function encodeData(id: number, chunks: readonly Buffer[], length: number): Buffer {
  const frame = encodeDataParts(id, chunks, length);
  return Buffer.concat(frame.parts, frame.length);
}

/** A tunnel message made of the given pieces. */
export function messageParts(parts: readonly Buffer[]): MessageParts {
  let length = 0;
  for (const p of parts) length += p.length;
  return { parts, length };
}
