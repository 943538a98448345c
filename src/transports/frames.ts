/**
 * The tcp transport's framing inside its TLS stream (src/transports/tcp.ts only).
 *
 * Wire format, the same in both directions, frames back to back:
 *
 *     frame   = type:u8  length:u24 (big-endian)  payload[length]
 *     type 1  DATA  payload = one message, 0..65536 bytes
 *     type 2  PING  payload = 8 opaque bytes (the sender's monotonic clock)
 *     type 3  PONG  payload = the 8 bytes of the PING it answers
 *     type 4  ACCEPT  no payload: the acceptor's first frame, sent once it has authenticated the
 *                     dialer and adopted the connection (the dialer counts the tunnel up only then,
 *                     not when its own TLS handshake ends, which in TLS 1.3 is before the acceptor
 *                     has checked the dialer's certificate)
 *
 * Anything else (an unknown type, a DATA payload over 65536 bytes, a PING or PONG that is not 8
 * bytes, an ACCEPT with a payload, or out of place) is a protocol error and the connection is
 * closed. TLS already authenticates and orders
 * every byte, so frames carry no checksum or sequence number; the version is that of the HTTP
 * Upgrade token (`mesh-tunnel/1`).
 */
import { MAX_MESSAGE_BYTES, type TunnelMessage } from './tunnel.js';

export const FRAME_HEADER_BYTES = 4;
export const FRAME_DATA = 1;
export const FRAME_PING = 2;
export const FRAME_PONG = 3;
export const FRAME_ACCEPT = 4;
export const PING_PAYLOAD_BYTES = 8;

/**
 * Pieces at least this long are written by reference, not copied: a copy of each 64 KiB of a
 * stream into a fresh buffer is what fed V8's major-GC storms (docs/benchmarks.md). Shorter ones
 * (IP packets, stream control frames, headers) are copied into shared chunks: one write each
 * would cost more than the copy.
 */
export const BY_REFERENCE_BYTES = 8192;

/**
 * A long DATA payload is received as views only when it lies in at most this many chunks (TLS
 * reads are up to 16 KiB: a 64 KiB frame lies in 5 at most). A peer that sends tiny records gets
 * one copy instead of a payload in thousands of pieces, each of which would be a write.
 */
const MAX_VIEW_PIECES = 8;

/** The bytes of a piece dataFrameChunks copies (a short one), or 0 (written by reference). */
const copiedBytes = (piece: Buffer): number => (piece.length < BY_REFERENCE_BYTES ? piece.length : 0);

/**
 * The bytes of DATA frames for `messages`, as few chunks as possible for one corked write: the
 * frame headers and short pieces coalesced into fresh chunks, long pieces as they are (TLS
 * encrypts all of one write into records together, so the chunking does not show on the wire).
 * The caller has checked each message's size.
 */
export function dataFrameChunks(messages: readonly TunnelMessage[]): Buffer[] {
  let copied = 0;
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!;
    copied += FRAME_HEADER_BYTES;
    if (Buffer.isBuffer(m)) copied += copiedBytes(m);
    else for (let j = 0; j < m.parts.length; j++) copied += copiedBytes(m.parts[j]!);
  }
  // Indexed loops and no per-message arrays: this runs for every batch a tunnel sends, and an
  // iterator or array made per message is garbage made per relayed chunk.
  const chunks: Buffer[] = [];
  const out = Buffer.allocUnsafe(copied);
  let start = 0;
  let at = 0;
  const piece = (p: Buffer) => {
    if (p.length < BY_REFERENCE_BYTES) {
      at += p.copy(out, at);
      return;
    }
    if (at > start) chunks.push(out.subarray(start, at));
    start = at;
    chunks.push(p);
  };
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!;
    out.writeUInt32BE((FRAME_DATA << 24) | m.length, at);
    at += FRAME_HEADER_BYTES;
    if (Buffer.isBuffer(m)) piece(m);
    else for (let j = 0; j < m.parts.length; j++) piece(m.parts[j]!);
  }
  if (at > start) chunks.push(start === 0 && at === out.length ? out : out.subarray(start, at));
  return chunks;
}

export function encodeControlFrame(type: typeof FRAME_PING | typeof FRAME_PONG, payload: Buffer): Buffer {
  const out = Buffer.allocUnsafe(FRAME_HEADER_BYTES + PING_PAYLOAD_BYTES);
  out.writeUInt32BE((type << 24) | PING_PAYLOAD_BYTES, 0);
  payload.copy(out, FRAME_HEADER_BYTES, 0, PING_PAYLOAD_BYTES);
  return out;
}

/** The acceptor's first frame. */
export const ACCEPT_FRAME: Buffer = Buffer.from([FRAME_ACCEPT, 0, 0, 0]);

export interface FrameSink {
  /**
   * A valid frame. The payload may be a view into a received chunk, or views of several (a long
   * DATA payload); it is the sink's to keep. Control frames' payloads are always one buffer.
   */
  frame(type: number, payload: TunnelMessage): void;
}

/**
 * Splits a byte stream into frames. A frame inside one chunk is handed over as a view of it (no
 * copy). A DATA payload of BY_REFERENCE_BYTES or more that spans chunks is handed over as views
 * of them (TLS delivers at most 16 KiB a read, so every 64 KiB frame spans four or five); any
 * other frame spanning chunks is copied once, when its last byte arrives. So each byte is copied
 * at most once whatever the chunk boundaries, and the bytes of long frames never.
 */
export class FrameDecoder {
  /**
   * Chunks holding the start of an incomplete frame: pending[first] is the oldest still in use,
   * `offset` bytes of it consumed. An index rather than shift(), which would make a frame that
   * arrives in many small chunks quadratic.
   */
  private pending: Buffer[] = [];
  private first = 0;
  private offset = 0;
  private buffered = 0;
  private failed: string | undefined;
  private readonly scratch = Buffer.alloc(FRAME_HEADER_BYTES);

  constructor(private readonly sink: FrameSink) {}

  /** Feeds a chunk. Returns a description of the protocol error, if any; later chunks are ignored. */
  push(chunk: Buffer): string | undefined {
    if (this.failed !== undefined) return this.failed;
    if (chunk.length === 0) return undefined;
    if (this.buffered === 0) return this.parse(chunk);
    this.pending.push(chunk);
    this.buffered += chunk.length;
    for (;;) {
      if (this.buffered < FRAME_HEADER_BYTES) return undefined;
      const header = this.peekHeader();
      const length = header & 0xff_ffff;
      const error = check(header >>> 24, length);
      if (error) return this.fail(error);
      if (this.buffered < FRAME_HEADER_BYTES + length) return undefined;
      this.take(FRAME_HEADER_BYTES);
      const payload =
        header >>> 24 === FRAME_DATA &&
        length >= BY_REFERENCE_BYTES &&
        this.piecesFor(length) <= MAX_VIEW_PIECES
          ? this.takeViews(length)
          : this.take(length);
      this.sink.frame(header >>> 24, payload);
      if (this.failed !== undefined) return this.failed;
      if (this.buffered === 0) {
        this.reset();
        return undefined;
      }
      if (this.pending.length - this.first === 1) {
        // Back to the single-buffer path for whatever follows in the last chunk.
        const rest = this.pending[this.first]!.subarray(this.offset);
        this.reset();
        return this.parse(rest);
      }
      if (this.first > 1024) {
        this.pending = this.pending.slice(this.first);
        this.first = 0;
      }
    }
  }

  /** Frames directly out of one buffer; keeps the incomplete tail (a view) for the next chunk. */
  private parse(buf: Buffer): string | undefined {
    let at = 0;
    while (buf.length - at >= FRAME_HEADER_BYTES) {
      const header = buf.readUInt32BE(at);
      const length = header & 0xff_ffff;
      const error = check(header >>> 24, length);
      if (error) return this.fail(error);
      const end = at + FRAME_HEADER_BYTES + length;
      if (end > buf.length) break;
      this.sink.frame(header >>> 24, buf.subarray(at + FRAME_HEADER_BYTES, end));
      at = end;
      // A sink may have failed us (it closed the connection): stop at once.
      if (this.failed !== undefined) return this.failed;
    }
    if (at < buf.length) {
      this.pending = [buf.subarray(at)];
      this.first = 0;
      this.offset = 0;
      this.buffered = buf.length - at;
    }
    return undefined;
  }

  /** Stops decoding: later chunks are ignored (the connection is closing). */
  stop(reason: string): void {
    this.fail(reason);
  }

  private fail(error: string): string {
    this.failed = error;
    this.reset();
    return error;
  }

  private reset(): void {
    this.pending = [];
    this.first = 0;
    this.offset = 0;
    this.buffered = 0;
  }

  private peekHeader(): number {
    const head = this.pending[this.first]!;
    if (head.length - this.offset >= FRAME_HEADER_BYTES) return head.readUInt32BE(this.offset);
    let filled = 0;
    let index = this.first;
    let from = this.offset;
    while (filled < FRAME_HEADER_BYTES) {
      const chunk = this.pending[index++]!;
      filled += chunk.copy(
        this.scratch,
        filled,
        from,
        Math.min(chunk.length, from + FRAME_HEADER_BYTES - filled),
      );
      from = 0;
    }
    return this.scratch.readUInt32BE(0);
  }

  /** Removes n buffered bytes (n <= buffered): a view if they sit in one chunk, else one copy. */
  private take(n: number): Buffer {
    this.buffered -= n;
    const head = this.pending[this.first]!;
    if (head.length - this.offset >= n) {
      const out = head.subarray(this.offset, this.offset + n);
      this.advance(head, n);
      return out;
    }
    const out = Buffer.allocUnsafe(n);
    let filled = 0;
    while (filled < n) {
      const chunk = this.pending[this.first]!;
      const copied = chunk.copy(out, filled, this.offset, Math.min(chunk.length, this.offset + n - filled));
      filled += copied;
      this.advance(chunk, copied);
    }
    return out;
  }

  /** How many chunks the next n buffered bytes (n <= buffered) lie in. */
  private piecesFor(n: number): number {
    let pieces = 0;
    let left = n + this.offset;
    for (let i = this.first; left > 0; i++, pieces++) left -= this.pending[i]!.length;
    return pieces;
  }

  /** Removes n buffered bytes (n <= buffered) as views of the chunks that hold them. */
  private takeViews(n: number): TunnelMessage {
    const parts: Buffer[] = [];
    let left = n;
    while (left > 0) {
      const chunk = this.pending[this.first]!;
      const piece = chunk.subarray(this.offset, Math.min(chunk.length, this.offset + left));
      parts.push(piece);
      left -= piece.length;
      this.advance(chunk, piece.length);
    }
    this.buffered -= n;
    return parts.length === 1 ? parts[0]! : { parts, length: n };
  }

  /** Consumes n bytes of the oldest chunk, moving to the next one when it is used up. */
  private advance(chunk: Buffer, n: number): void {
    this.offset += n;
    if (this.offset === chunk.length && this.first < this.pending.length - 1) {
      this.first++;
      this.offset = 0;
    }
  }
}

function check(type: number, length: number): string | undefined {
  if (type === FRAME_DATA) return length <= MAX_MESSAGE_BYTES ? undefined : `DATA frame of ${length} bytes`;
  if (type === FRAME_PING || type === FRAME_PONG)
    return length === PING_PAYLOAD_BYTES ? undefined : `control frame of ${length} bytes`;
  if (type === FRAME_ACCEPT) return length === 0 ? undefined : `ACCEPT frame of ${length} bytes`;
  return `unknown frame type ${type}`;
}
