/**
 * The Tunnel contract every transport keeps (the data plane's, docs/dataplane.md): one authenticated, ordered
 * message pipe per pair of peers, kept up by the transport, carrying opaque messages (IP packets)
 * of at most 64 KiB. The dataplane uses only these types; transports (tcp, kcp, memory)
 * implement them, and test/compliance/tunnel-suite.ts holds every transport to the same rules.
 * Imported by src/transports and src/dataplane; imports only Node built-ins.
 */
import type { Writable } from 'node:stream';

/** The largest message a tunnel carries: an IP packet never exceeds 64 KiB. */
export const MAX_MESSAGE_BYTES = 65_536;

/**
 * `up`: a connection to the peer is authenticated and carrying messages.
 * `connecting`: this side is dialing the peer.
 * `down`: not connected; the dialing side retries after a backoff, the other side waits.
 */
export type TunnelState = 'connecting' | 'up' | 'down';

export interface TunnelStats {
  /** Payload bytes of the messages handed to a connection (framing not counted). */
  bytesSent: number;
  /** Payload bytes of the messages delivered from the peer. */
  bytesReceived: number;
  messagesSent: number;
  messagesReceived: number;
  /** Messages dropped by send(): the tunnel was not up, or the message was over 64 KiB. */
  dropped: number;
  /** Connections that came up (the first and every reconnection or replacement). */
  connects: number;
  /** The last round-trip time measured on a connection, kept after it closes; null if none yet. */
  lastRttMs: number | null;
}

/**
 * A message given in pieces: they are sent back to back and arrive as one message. It lets a
 * sender put a small header before a large payload without copying the payload (the stream
 * path's DATA frames). `length` is the sum of the pieces' lengths.
 */
export interface MessageParts {
  readonly parts: readonly Buffer[];
  readonly length: number;
}

/**
 * A message whole or in pieces: what send() takes, and what a receiver gets (a long message
 * that arrived across several reads comes as the pieces it arrived in, not copied together).
 */
export type TunnelMessage = Buffer | MessageParts;

/** The message in one buffer: the message itself if whole, else a copy of its pieces. */
export const wholeOf = (m: TunnelMessage): Buffer =>
  Buffer.isBuffer(m) ? m : Buffer.concat(m.parts, m.length);

/** Writes a message, whole or in pieces, to a stream (writePieces); returns the stream's verdict. */
export const writeMessage = (stream: Writable, m: TunnelMessage): boolean =>
  Buffer.isBuffer(m) ? stream.write(m) : writePieces(stream, m.parts);

/**
 * Writes pieces back to back in one corked write: one writev, so for a TLS socket one SSL_write
 * (as few records and socket writes as one buffer gives). Returns the stream's verdict after
 * the last piece (false: above its high-water mark).
 */
export function writePieces(stream: Writable, pieces: readonly Buffer[]): boolean {
  if (pieces.length === 1) return stream.write(pieces[0]!);
  stream.cork();
  let below = true;
  for (let i = 0; i < pieces.length; i++) below = stream.write(pieces[i]!);
  stream.uncork();
  return below;
}

export interface Tunnel {
  readonly peerId: string;
  readonly state: TunnelState;
  /**
   * Queues messages for the peer, in order, coalesced into as few writes as possible. Large
   * buffers may be written by reference, after send() returned: the caller must not change a
   * buffer it has sent (fresh buffers, or views of them, are what callers send).
   * Returns false when the bytes waiting to be written exceed the high-water mark (or less, for a
   * transport that sizes its queue by its send rate: tcp), and the caller
   * should pause its input until the transport's `drain` event for this peer (the messages of
   * this call are queued all the same). While not up, messages are dropped and counted (they are
   * IP packets; the protocols inside recover) and send returns true, as there is nothing to wait
   * for. A message over 64 KiB is dropped and counted too. The array itself is not kept: the
   * caller may empty and reuse it once send returns.
   */
  send(messages: readonly TunnelMessage[]): boolean;
  stats(): TunnelStats;
  /**
   * While up: milliseconds since the peer was last heard on this tunnel (keepalive answers
   * included), by the clock. Null while not up. Read it after the input that waited has been
   * read (from a setImmediate queued by a timer: Node runs timers before input), so that a stall
   * of this process is not taken for the peer's silence. Nothing is taken off for stalls: the
   * dead timer's credit for them (tcp.ts) hid real silence for as long as the process was
   * starved of CPU, and made a silent exit look healthy again.
   */
  silentMs(): number | null;
}

/** Provided by the agent from the replicated store. Only ACTIVE cluster peers are visible. */
export interface PeerDirectory {
  /** The ACTIVE cluster peer that owns this raw 32-byte Ed25519 public key, if any. */
  peerByKey(rawPublicKey: Buffer): { id: string } | undefined;
  /** Raw public key and address ("host:port", IPv6 in brackets) of an ACTIVE peer, if any. */
  peer(peerId: string): { publicKey: Buffer; address: string } | undefined;
}

export interface TunnelTransportEvents {
  /** One message from the peer, whole or in pieces. The buffers are the receiver's to keep. */
  message(peerId: string, message: TunnelMessage): void;
  /** Every change of a tunnel's state, including `down` when a tunnel is released or closed. */
  state(peerId: string, state: TunnelState): void;
  /**
   * After send() returned false: the backlog fell below the high-water mark, or the connection
   * was lost (sends are dropped now, so there is no reason to keep the input paused).
   */
  drain(peerId: string): void;
}

/**
 * Why a transport refused or dropped a connection, counted by faults():
 * - `upgrade`: an HTTP request for the tunnel that was not a valid upgrade, or a dialed peer
 *   that did not answer 101;
 * - `handshake`: the TLS handshake failed or timed out;
 * - `certificate`: no peer certificate, or not a valid self-signed Ed25519 one;
 * - `unknown-peer`: the key belongs to no active peer (unknown, removed, inactive);
 * - `wrong-key`: the dialed peer presented a key other than the directory's;
 * - `not-dialer`: an inbound connection from a peer whose id is not lower than ours (the lower
 *   id dials; accepting both directions would let two connections fight over the pair);
 * - `resumed`: a resumed TLS session (never offered by our dialer, so not ours);
 * - `busy`: too many handshakes in progress;
 * - `protocol`: a malformed frame from an authenticated peer;
 * - `corrupt`: a TLS record failed to authenticate after the handshake (tampering);
 * - `dead`: nothing received for deadAfterMs;
 * - `revoked`: revalidate() found the peer no longer active.
 */
export type FaultReason =
  | 'upgrade'
  | 'handshake'
  | 'certificate'
  | 'unknown-peer'
  | 'wrong-key'
  | 'not-dialer'
  | 'resumed'
  | 'busy'
  | 'protocol'
  | 'corrupt'
  | 'dead'
  | 'revoked';

export interface TunnelTransport {
  /** 'tcp' | 'kcp' | 'memory'. */
  readonly kind: string;
  /**
   * Keeps a tunnel to the peer: the side with the LOWER peer id dials (and redials with backoff);
   * the other side waits for it. Idempotent. Throws for our own id.
   */
  ensure(peerId: string): Tunnel;
  /**
   * Stops keeping it: closes the connection; this side does not redial. (If the peer still keeps
   * its side and is the dialer, it reconnects, and the connection is accepted as any inbound one.)
   */
  release(peerId: string): void;
  /** The tunnel to the peer: ensured, or up because the peer connected. */
  tunnel(peerId: string): Tunnel | undefined;
  /** Re-checks every open connection against the directory: closes those of peers no longer active. */
  revalidate(): void;
  /** Connections refused or dropped, by reason, since start. */
  faults(): Readonly<Record<FaultReason, number>>;
  on<E extends keyof TunnelTransportEvents>(event: E, listener: TunnelTransportEvents[E]): this;
  off<E extends keyof TunnelTransportEvents>(event: E, listener: TunnelTransportEvents[E]): this;
  /** Closes every connection and stops dialing; the transport is unusable afterwards. */
  close(): Promise<void>;
}

/** The part of a pino logger the transports use. */
export interface TransportLogger {
  info(details: object, message: string): void;
  warn(details: object, message: string): void;
  debug(details: object, message: string): void;
}
