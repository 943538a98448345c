/**
 * The `tcp` tunnel transport: TLS 1.3 over a TCP connection taken from the agent's management
 * API port by HTTP Upgrade (no second port to open), both sides authenticated by pinning the
 * peer certificate's Ed25519 key to the directory's key for that peer. Messages are framed as in
 * frames.ts; keepalive PINGs measure the round trip and a silent connection is declared dead.
 * The agent creates one TcpTransport and hooks acceptUpgrade() into its HTTP server's 'upgrade'
 * event; the dataplane uses it through the TunnelTransport interface (tunnel.ts).
 *
 * Trust: the outer HTTP(S) layer authenticates nothing (with https the dialer accepts any API
 * certificate). Inside, TLS 1.3 with client certificates: each side presents a self-signed
 * certificate over its identity key, and the other accepts the connection only if that key is
 * the directory's for the peer (dialer: the peer it dialed; acceptor: an active peer with a lower
 * id than ours). No session resumption, no early data.
 */
import { createPublicKey, type KeyObject } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { peerIdFromPublicKey } from '../domain/ids.js';
import { parsePeerAddress } from '../domain/peer-address.js';
import type { BackoffOptions } from './backoff.js';
import {
  ACCEPT_FRAME,
  dataFrameChunks,
  encodeControlFrame,
  FRAME_ACCEPT,
  FRAME_DATA,
  FRAME_PING,
  FRAME_PONG,
  FrameDecoder,
  PING_PAYLOAD_BYTES,
} from './frames.js';
import {
  isTunnelPath,
  isTunnelUpgrade,
  requestUpgrade,
  UPGRADE_RESPONSE,
  UpgradeRefused,
} from './http-upgrade.js';
import {
  type FaultReason,
  type PeerDirectory,
  type TransportLogger,
  type TunnelMessage,
  wholeOf,
  writePieces,
} from './tunnel.js';
import { certifiedKey, selfSignedCertificate } from './tunnel-certificate.js';
import { type Link, type LinkSink, SinkSlot, TunnelKeeper } from './tunnel-keeper.js';

/** AES-GCM first: every x86 server this runs on has AES-NI, where it beats ChaCha20 (bench/transports). */
export const DEFAULT_CIPHERSUITES =
  'TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384';

export interface TcpTransportOptions {
  localPeerId: string;
  /** The agent's Ed25519 identity (private) key; localPeerId must be derived from it. */
  identityKey: KeyObject;
  directory: PeerDirectory;
  /** The scheme of the peers' management API, which the tunnel shares. */
  scheme: 'http' | 'https';
  /** A PING this often (it also measures lastRttMs). Default 5000. */
  keepaliveIntervalMs?: number;
  /** A connection with nothing received for this long is closed. Default 15000. */
  deadAfterMs?: number;
  /** Redial delays. Default 250 ms to 10 s, 20 % jitter. */
  backoff?: BackoffOptions;
  /**
   * send() returns false above this many bytes waiting in the process (at least 64 KiB), or
   * above what the link's send rate fills in FOLLOW_MS (followSendRate) if that is less, 64 KiB
   * at the least. Default
   * 256 KiB: the kernel's socket buffer holds what is in flight on the wire, so a larger queue here
   * only delays every tunneled packet behind it (4 MiB at 100 Mbit/s is a third of a second) and,
   * measured on loopback, costs throughput and CPU (bench/transports/tcp-throughput.ts).
   */
  highWaterMark?: number;
  /**
   * Bounds what the kernel may hold unsent in a tunnel's TCP socket (the agent sets
   * TCP_NOTSENT_LOWAT, src/native/sockets.ts). Each link calls it as it is set up and again as
   * its send rate moves: FOLLOW_MS of that rate, so that a bulk stream's bytes wait in the
   * multiplexer, where every stream gets its turn, not in the socket's FIFO in front of them all
   * (docs/dataplane.md, "Where a tunnel's bytes wait"), and a fast tunnel still never runs dry.
   */
  boundUnsent?: (socket: Duplex, bytes: number) => void;
  /** Whole dial: TCP connect, upgrade, TLS handshake. Default 10000. */
  dialTimeoutMs?: number;
  /** Waiting for the upgrade answer's head. Default 5000. */
  upgradeTimeoutMs?: number;
  /** An inbound TLS handshake must finish within this. Default 10000. */
  handshakeTimeoutMs?: number;
  /** Inbound handshakes in progress at once; more are refused (`busy`). Default 64. */
  maxPendingHandshakes?: number;
  /** TLS 1.3 cipher suites in order of preference. Default DEFAULT_CIPHERSUITES. */
  ciphersuites?: string;
  logger?: TransportLogger;
  /** For the backoff's jitter. */
  random?: () => number;
}

/**
 * Each of a link's two queues, its socket's unsent bytes in the kernel (boundUnsent) and what
 * waits in the process (highWaterMark), holds about this long of its current send rate (longer
 * while the event loop lags: followSendRate), measured on each tick of the link: at
 * 100 Mbit/s 64 KiB each (5 ms) instead of the 1 MB the kernel and the 256 KiB the process let
 * wait, at 2 Gbit/s about 1 MB in the kernel, which the event loop refills in time. A fixed
 * 128 KiB in the kernel cost the stream bench about a tenth of its throughput.
 */
const FOLLOW_MS = 4;
/** Each queue's least bound: a frame (64 KiB) must fit in the process's. */
const FOLLOW_MIN = 64 * 1024;
const UNSENT_MAX = 4 * 1024 * 1024;

interface LinkTiming {
  keepaliveIntervalMs: number;
  deadAfterMs: number;
  highWaterMark: number;
}

export class TcpTransport extends TunnelKeeper {
  readonly kind = 'tcp';
  private readonly secureContext: tls.SecureContext;
  private readonly scheme: 'http' | 'https';
  private readonly timing: LinkTiming;
  private readonly dialTimeoutMs: number;
  private readonly upgradeTimeoutMs: number;
  private readonly handshakeTimeoutMs: number;
  private readonly maxPendingHandshakes: number;
  private readonly boundUnsent: ((socket: Duplex, bytes: number) => void) | undefined;
  /** Inbound sockets between the 101 and the end of the TLS handshake. */
  private readonly handshaking = new Set<tls.TLSSocket>();

  constructor(options: TcpTransportOptions) {
    super(options);
    const key = options.identityKey;
    if (key.type !== 'private' || key.asymmetricKeyType !== 'ed25519')
      throw new Error('the tcp transport needs the Ed25519 identity private key');
    const raw = Buffer.from(createPublicKey(key).export({ format: 'jwk' }).x as string, 'base64url');
    if (peerIdFromPublicKey(raw) !== options.localPeerId)
      throw new Error('localPeerId is not the identity key’s peer id');
    this.scheme = options.scheme;
    this.timing = {
      keepaliveIntervalMs: positive(options.keepaliveIntervalMs ?? 5000, 'keepaliveIntervalMs'),
      deadAfterMs: positive(options.deadAfterMs ?? 15_000, 'deadAfterMs'),
      highWaterMark: options.highWaterMark ?? 256 * 1024,
    };
    // Below the socket's own mark, its 'drain' event (which ours relies on) would not be promised.
    if (!(this.timing.highWaterMark >= 65_536)) throw new RangeError('highWaterMark must be at least 64 KiB');
    this.dialTimeoutMs = positive(options.dialTimeoutMs ?? 10_000, 'dialTimeoutMs');
    this.upgradeTimeoutMs = positive(options.upgradeTimeoutMs ?? 5000, 'upgradeTimeoutMs');
    this.handshakeTimeoutMs = positive(options.handshakeTimeoutMs ?? 10_000, 'handshakeTimeoutMs');
    this.maxPendingHandshakes = options.maxPendingHandshakes ?? 64;
    this.boundUnsent = options.boundUnsent;
    this.secureContext = tls.createSecureContext({
      key: key.export({ type: 'pkcs8', format: 'pem' }),
      cert: selfSignedCertificate(key, `mesh-agent ${options.localPeerId}`),
      minVersion: 'TLSv1.3',
      maxVersion: 'TLSv1.3',
      // Node hands the TLS_* names of `ciphers` to OpenSSL as the TLS 1.3 suites.
      ciphers: options.ciphersuites ?? DEFAULT_CIPHERSUITES,
      honorCipherOrder: true,
    });
  }

  /**
   * For the agent's HTTP server 'upgrade' event. Takes the socket (answering 101 and starting
   * the TLS handshake) if the request is the tunnel's upgrade and returns true; otherwise returns
   * false and the caller destroys the socket.
   */
  acceptUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): boolean {
    if (!isTunnelUpgrade(req)) {
      if (isTunnelPath(req))
        this.fault('upgrade', { remote: req.socket.remoteAddress, detail: 'not a valid upgrade' });
      return false;
    }
    if (this.closed || this.handshaking.size >= this.maxPendingHandshakes) {
      this.fault('busy', { remote: req.socket.remoteAddress });
      return false;
    }
    const remote = req.socket.remoteAddress;
    // The API server may have armed an idle timeout on the socket; the tunnel has its own.
    if (socket instanceof net.Socket) {
      socket.setTimeout(0);
      socket.setNoDelay(true);
    }
    socket.write(UPGRADE_RESPONSE);
    if (head.length > 0) socket.unshift(head);
    const secure = new tls.TLSSocket(socket, {
      isServer: true,
      secureContext: this.secureContext,
      requestCert: true,
      // Verified below by pinning, not by a CA.
      rejectUnauthorized: false,
    });
    this.handshaking.add(secure);
    const refuse = (reason: FaultReason, detail: string) => {
      finish();
      this.fault(reason, { remote, detail });
      // Late errors from the dying sockets have nobody else to go to.
      secure.on('error', ignore);
      socket.on('error', ignore);
      secure.destroy();
      socket.destroy();
    };
    const timer = setTimeout(() => refuse('handshake', 'timed out'), this.handshakeTimeoutMs);
    const onError = (error: Error) => refuse('handshake', error.message);
    const onCarrierError = () => finish();
    const onClose = () => finish();
    // Half-open (see TcpLink): a client that hangs up mid-handshake must not leave the socket open.
    const onEnd = () => {
      finish();
      secure.destroy();
    };
    const finish = () => {
      clearTimeout(timer);
      this.handshaking.delete(secure);
      secure.off('error', onError);
      secure.off('close', onClose);
      secure.off('end', onEnd);
      socket.off('error', onCarrierError);
    };
    secure.on('error', onError);
    secure.on('close', onClose);
    secure.on('end', onEnd);
    socket.on('error', onCarrierError);
    secure.once('secure', () => {
      if (!this.handshaking.has(secure)) return;
      if (secure.isSessionReused()) return refuse('resumed', 'resumed a TLS session');
      const key = certifiedKey(secure.getPeerX509Certificate());
      if (!key) return refuse('certificate', 'no valid self-signed Ed25519 certificate');
      const authorized = this.authorizeInbound(key);
      if ('refused' in authorized)
        return refuse(authorized.refused, `key ${key.toString('base64')} is not an active dialing peer`);
      finish();
      this.adopt(
        authorized.peerId,
        new TcpLink(secure, socket, key, this.timing, 'acceptor', this.boundUnsent),
      );
    });
    return true;
  }

  protected connect(peerId: string, signal: AbortSignal): Promise<Link> {
    const peer = this.directory.peer(peerId);
    if (!peer) return Promise.reject(new Error('not an active peer'));
    const address = parsePeerAddress(peer.address);
    if (!address) return Promise.reject(new Error(`unusable address ${JSON.stringify(peer.address)}`));
    return new Promise<Link>((resolve, reject) => {
      let settled = false;
      let inner: tls.TLSSocket | undefined;
      const outer: net.Socket =
        this.scheme === 'https'
          ? tls.connect({
              host: address.host,
              port: address.port,
              // The API's certificate means nothing here; the inner TLS authenticates.
              rejectUnauthorized: false,
              ...(net.isIP(address.host) ? {} : { servername: address.host }),
            })
          : net.connect({ host: address.host, port: address.port });
      outer.setNoDelay(true);
      const fail = (error: Error, reason?: FaultReason) => {
        if (settled) return;
        settled = true;
        cleanup();
        if (reason) this.fault(reason, { peer: peerId, address: peer.address, detail: error.message });
        // Late errors from the dying sockets have nobody else to go to.
        outer.on('error', ignore);
        inner?.on('error', ignore);
        inner?.destroy();
        outer.destroy();
        reject(error);
      };
      const onOuterError = (error: Error) => fail(error);
      const onOuterClose = () => fail(new Error('connection closed while dialing'));
      const onAbort = () => fail(new Error('dial aborted'));
      const timer = setTimeout(
        () => fail(new Error('dial timed out'), inner ? 'handshake' : undefined),
        this.dialTimeoutMs,
      );
      const cleanup = () => {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        outer.off('error', onOuterError);
        outer.off('close', onOuterClose);
      };
      signal.addEventListener('abort', onAbort, { once: true });
      outer.on('error', onOuterError);
      outer.on('close', onOuterClose);
      outer.once(this.scheme === 'https' ? 'secureConnect' : 'connect', () => {
        requestUpgrade(outer, address.text, this.upgradeTimeoutMs).then(
          () => {
            if (settled) return;
            const socket = tls.connect({
              socket: outer,
              secureContext: this.secureContext,
              // Verified below by pinning, not by a CA or a name.
              rejectUnauthorized: false,
            });
            inner = socket;
            const onInnerError = (error: Error) =>
              fail(
                error,
                (error as NodeJS.ErrnoException).code?.startsWith('ERR_SSL') ? 'handshake' : undefined,
              );
            socket.on('error', onInnerError);
            socket.once('secureConnect', () => {
              if (settled) return;
              if (socket.isSessionReused()) return fail(new Error('resumed a TLS session'), 'resumed');
              const key = certifiedKey(socket.getPeerX509Certificate());
              if (!key) return fail(new Error('no valid self-signed Ed25519 certificate'), 'certificate');
              const refused = this.authorizeOutbound(peerId, key);
              if (refused) return fail(new Error(`presented key ${key.toString('base64')}`), refused);
              socket.off('error', onInnerError);
              // The link owns the sockets from here; the dial still ends at the acceptor's ACCEPT.
              const link = new TcpLink(socket, outer, key, this.timing, 'dialer', this.boundUnsent);
              link.accepted.then(
                () => {
                  if (settled) return link.close();
                  settled = true;
                  cleanup();
                  resolve(link);
                },
                (error: Error) => fail(error, link.endReason),
              );
            });
          },
          (error: Error) => fail(error, error instanceof UpgradeRefused ? 'upgrade' : undefined),
        );
      });
    });
  }

  protected async shutdown(): Promise<void> {
    for (const socket of this.handshaking) socket.destroy();
    this.handshaking.clear();
  }
}

/**
 * One authenticated connection: frames out and in, keepalive and dead detection. `secure` is the
 * tunnel's TLS socket, `carrier` the socket it runs over (destroyed with it). It reads from the
 * start: the dialer's side waits for the acceptor's ACCEPT (`accepted`), and DATA that follows
 * it before the keeper opens the link is held for the sink.
 */
class TcpLink implements Link {
  /** Dialer side: settles with the acceptor's ACCEPT frame, or fails if the link ends first. */
  readonly accepted: Promise<void>;
  private acceptedState: 'waiting' | 'yes' = 'waiting';
  private settleAccepted: ((error?: Error) => void) | undefined;
  private readonly slot = new SinkSlot();
  private readonly decoder: FrameDecoder;
  private lastReceivedAt = performance.now();
  /** When the peer was last heard, by the clock alone (silentMs): no stall is taken off it. */
  private lastHeardAt = performance.now();
  private lastPingAt = performance.now();
  private ticker: NodeJS.Timeout | undefined;
  private tickMs = 0;
  private lastTickAt = 0;
  private wantDrain = false;
  /** Bytes sent since the last tick: the rate the two queue bounds follow. */
  private sentSinceTick = 0;
  private unsentBound = 0;
  /** What may wait in the process before send() says stop: timing.highWaterMark at the most. */
  private queueBound: number;
  /** How late recent ticks ran: the longest the event loop may leave the queues unfilled. */
  private loopLagMs = 0;

  constructor(
    private readonly secure: tls.TLSSocket,
    private readonly carrier: Duplex,
    readonly peerKey: Buffer,
    private readonly timing: LinkTiming,
    role: 'dialer' | 'acceptor',
    private readonly boundUnsent?: (socket: Duplex, bytes: number) => void,
  ) {
    this.queueBound = timing.highWaterMark;
    this.accepted = new Promise<void>((resolve, reject) => {
      this.settleAccepted = (error) => (error ? reject(error) : resolve());
    });
    // Nobody waits on the acceptor's promise; a rejection there must not be reported as unhandled.
    this.accepted.catch(() => {});
    if (role === 'acceptor') {
      this.acceptedState = 'yes';
      this.settleAccepted?.();
      secure.write(ACCEPT_FRAME);
    }
    this.decoder = new FrameDecoder({ frame: (type, payload) => this.onFrame(type, payload) });
    const onError = (error: NodeJS.ErrnoException) =>
      // A record that fails to authenticate (tampering) is not a network accident.
      this.finish(error.code?.startsWith('ERR_SSL') ? 'corrupt' : undefined, error.message);
    secure.on('error', onError);
    // A server-side TLSSocket made outside a tls.Server never has its "control released", and
    // Node then reports TLS errors after the handshake (a record failing authentication) only as
    // '_tlsError', neither emitting 'error' nor closing the socket. Node's own tls.Server listens
    // to the same event. test/transports/tcp-security.test.ts (man in the middle) checks it.
    secure.on('_tlsError', onError);
    secure.on('close', () => this.finish(undefined, 'connection closed'));
    // The API server's sockets allow half-open connections, and a TLS socket over one inherits
    // that: the peer's FIN would otherwise leave it open, half-dead, until the dead timer.
    secure.on('end', () => this.finish(undefined, 'closed by the peer'));
    carrier.on('error', (error) => this.finish(undefined, error.message));
    secure.on('data', (chunk: Buffer) => {
      this.lastReceivedAt = performance.now();
      this.lastHeardAt = this.lastReceivedAt;
      const error = this.decoder.push(chunk);
      if (error && !this.finished) this.finish('protocol', error);
    });
    secure.on('drain', () => {
      if (!this.wantDrain || this.finished) return;
      this.wantDrain = false;
      this.slot.drain();
    });
  }

  private get finished(): boolean {
    return this.slot.ended;
  }

  /** The fault that ended it before it was opened, if any. */
  get endReason(): FaultReason | undefined {
    return this.slot.endReason;
  }

  open(sink: LinkSink): void {
    if (!this.slot.open(sink)) return;
    const { keepaliveIntervalMs, deadAfterMs } = this.timing;
    // Fine enough that death is noticed within a quarter of the shorter period of its deadline.
    this.tickMs = Math.max(5, Math.min(keepaliveIntervalMs, deadAfterMs) / 4);
    this.lastTickAt = performance.now();
    this.followSendRate(0, 0);
    this.ticker = setInterval(() => this.tick(), this.tickMs);
    this.ticker.unref();
  }

  silentMs(): number {
    return Math.max(0, performance.now() - this.lastHeardAt);
  }

  send(messages: readonly TunnelMessage[]): boolean {
    if (this.finished) return true;
    for (const m of messages) this.sentSinceTick += m.length;
    writePieces(this.secure, dataFrameChunks(messages));
    if (this.secure.writableLength <= this.queueBound) return true;
    this.wantDrain = true;
    return false;
  }

  close(): void {
    if (this.finished) return;
    this.slot.detach();
    this.teardown(new Error('closed'));
  }

  private onFrame(type: number, message: TunnelMessage): void {
    if (this.finished) return;
    if (type === FRAME_ACCEPT) {
      if (this.acceptedState === 'yes') this.finish('protocol', 'ACCEPT out of place');
      else {
        this.acceptedState = 'yes';
        this.settleAccepted?.();
      }
      return;
    }
    if (this.acceptedState !== 'yes') {
      this.finish('protocol', 'a frame before ACCEPT');
      return;
    }
    if (type === FRAME_DATA) {
      this.slot.message(message);
      return;
    }
    // Control frames are never in pieces (FrameDecoder).
    const payload = wholeOf(message);
    if (type === FRAME_PING) this.secure.write(encodeControlFrame(FRAME_PONG, payload));
    else if (type === FRAME_PONG) {
      const rtt = performance.now() - payload.readDoubleBE(0);
      // A peer can only hurt its own figure, but keep nonsense out of it.
      if (rtt >= 0 && rtt < 3_600_000) this.slot.rtt(rtt);
    }
  }

  private tick(): void {
    if (this.finished) return;
    const now = performance.now();
    // Time this process's event loop was stalled (a long synchronous task, a GC pause, no CPU)
    // is not the peer's silence: we could not listen, and timers run before the input that waited
    // in the socket meanwhile. Without this, one stall longer than deadAfterMs would declare every
    // tunnel dead at once. A loop that is merely slow still finds dead peers, only later.
    const gap = now - this.lastTickAt;
    this.lastTickAt = now;
    this.followSendRate(gap, gap - this.tickMs);
    if (gap > this.tickMs * 2) this.lastReceivedAt = Math.min(now, this.lastReceivedAt + gap - this.tickMs);
    const silentMs = now - this.lastReceivedAt;
    if (silentMs > this.timing.deadAfterMs) {
      this.finish('dead', `nothing received for ${Math.round(silentMs)} ms`);
      return;
    }
    if (now - this.lastPingAt >= this.timing.keepaliveIntervalMs) {
      this.lastPingAt = now;
      const stamp = Buffer.allocUnsafe(PING_PAYLOAD_BYTES);
      stamp.writeDoubleBE(now, 0);
      this.secure.write(encodeControlFrame(FRAME_PING, stamp));
    }
  }

  /**
   * Sets both queue bounds to what was sent over the last `elapsedMs`, times FOLLOW_MS or twice
   * the event loop's recent lag (`lateMs`: how late this tick's timer ran), whichever is more.
   * The queues must last until the loop comes back to refill them: a tunnel whose bounds held
   * less would send less, measure less and bound tighter still, down to the least bound.
   */
  private followSendRate(elapsedMs: number, lateMs: number): void {
    const rate = elapsedMs > 0 ? this.sentSinceTick / elapsedMs : 0;
    this.sentSinceTick = 0;
    // The worst recent lag, forgotten by a fifth a tick.
    this.loopLagMs = Math.max(lateMs, this.loopLagMs * 0.8);
    const coverMs = Math.max(FOLLOW_MS, 2 * this.loopLagMs);
    const follow = Math.max(FOLLOW_MIN, Math.round(rate * coverMs));
    this.queueBound = Math.min(this.timing.highWaterMark, follow);
    if (!this.boundUnsent) return;
    const bound = Math.min(UNSENT_MAX, follow);
    // A change within a quarter is noise, not worth a system call; the ends are always reached.
    const atEnd = bound === FOLLOW_MIN || bound === UNSENT_MAX;
    if (bound === this.unsentBound) return;
    if (!atEnd && this.unsentBound > 0 && Math.abs(bound - this.unsentBound) < this.unsentBound / 4) return;
    this.unsentBound = bound;
    this.boundUnsent(this.carrier, bound);
  }

  private finish(reason: FaultReason | undefined, detail: string): void {
    if (this.finished) return;
    this.slot.end(reason, detail);
    this.teardown(new Error(detail));
  }

  private teardown(error: Error): void {
    if (this.ticker) clearInterval(this.ticker);
    this.ticker = undefined;
    this.decoder.stop('closed');
    this.settleAccepted?.(error);
    this.settleAccepted = undefined;
    this.secure.destroy();
    this.carrier.destroy();
  }
}

function ignore(): void {}

function positive(value: number, name: string): number {
  if (!(value > 0) || !Number.isFinite(value)) throw new RangeError(`${name} must be a positive number`);
  return value;
}
