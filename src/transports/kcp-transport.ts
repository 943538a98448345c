/**
 * The `kcp` tunnel transport (docs/kcp.md): KCP ARQ (kcp/kcp.ts, message mode) inside authenticated,
 * encrypted datagrams (kcp/secure-datagram.ts) over ONE UDP socket per agent. The agent binds that
 * socket to the management API's port NUMBER, in UDP (the API is TCP on the same number, so there
 * is still one port to open per agent, once per protocol); a peer's UDP address is the host:port of
 * its directory address. The dataplane uses it through the TunnelTransport interface (tunnel.ts);
 * the keeper rules (who dials, replacement, drain, counters) are tunnel-keeper.ts's.
 *
 * Connection ("link") = the peer's SecureEndpoint session + one KcpSession whose conv the dialer
 * picks at random per connection. The dialer (lower peer id) sends INIT (again every
 * handshakeRetryMs, up to handshakeTimeoutMs); once the RESPONSE authenticates the peer it opens a
 * link and sends a PING at once. The responder creates its link on the first authenticated DATA
 * that carries a KCP conv it has not seen from that peer (a newer conv replaces the older link;
 * the retired convs' late datagrams are dropped, never reopened). A datagram of a conv we have no
 * link for whose sender already heard from that conv here (its una > 0: we restarted, or retired
 * the link) is answered with a CLOSE of that conv, so the sender redials at once. The dialer
 * re-handshakes every rekeyAfterMs (secure-datagram.ts) under the same link, KCP state surviving
 * rekeys, and whenever the peer has been silent for two keepalive intervals (a restarted peer
 * can authenticate nothing until then).
 *
 * Plaintext of a DATA datagram (after decryption):
 *   - empty: a keepalive (the endpoint's session confirmation after a rekey);
 *   - [conv u32 LE][0xFF] (5 B): CLOSE of the link `conv`. Outside KCP on purpose: KCP has no FIN,
 *     and a close queued in KCP can sit behind a full window; this one leaves at once (three
 *     copies, each sealed with its own counter, against loss), and it is authenticated, so only
 *     the peer can close.
 *   - else a KCP datagram (conv u32 LE first, ikcp format, see kcp.ts).
 * Each KCP message = [type u8][payload]: 1 DATA (one tunnel message; MessageParts are concatenated
 *   into one buffer with the type byte: one copy per message, which is also what makes send()
 *   copy the caller's buffers), 2 PING [f64 BE sender's clock], 3 PONG [the PING's 8 bytes]
 *   (rtt -> sink.rtt, every keepaliveIntervalMs).
 * A link with nothing authenticated received for deadAfterMs is closed ('dead'), so is one whose
 * KCP engine reports dead() (a segment sent deadLink times without an ack).
 *
 * Receiving: datagrams are demultiplexed by the receiver index (the endpoint finds the session),
 * then by conv. A datagram that fails authentication, is a replay, is malformed, names no session or
 * a retired conv is dropped and counted (datagramStats()); a failed authentication also counts as
 * the fault 'corrupt'. None of them changes any state: only an authenticated DATA moves the
 * link's remote address (roaming). After a batch of input datagrams, one flush per link (in a
 * setImmediate), not one per datagram.
 *
 * Sending and pacing (docs/kcp.md, "Pacing"): send() queues messages in the link; they enter the KCP
 * engine only while (a) the engine's queue + flight stays within its send window and (b) a token
 * bucket allows: the bucket fills at the pacing rate = clamp(gain x the measured delivery rate,
 * minRate, maxRate), where the delivery rate is the bytes the peer acknowledged per sampling
 * period (max(20 ms, 2 x srtt)), its maximum over the last 16 periods. So new data leaves at most at
 * gain x what the path delivered lately (or the fixed cap, or minRate when nothing is known), in
 * bursts of at most `burstBytes`. Retransmissions and acks are not paced (the engine decides them;
 * they are bounded by the loss and the windows). send() returns false while more than
 * highWaterMark bytes wait in the link's queue (not yet in the engine); 'drain' once at most half
 * of it waits.
 *
 * Timers: one per link, armed at the earliest of the engine's check() (only while it has data in
 * flight: an idle engine needs no 10 ms ticks), the pacing bucket's refill for the next message,
 * and the keepalive/dead tick.
 *
 * Used by the agent (which creates one with KcpTransport.start and hands it to the data plane);
 * imports domain and transports only.
 */

import { type KeyObject, randomInt } from 'node:crypto';
import { createSocket, type RemoteInfo, type Socket } from 'node:dgram';
import { lookup } from 'node:dns/promises';
import { isIP } from 'node:net';
import { peerIdFromPublicKey } from '../domain/ids.js';
import { parsePeerAddress } from '../domain/peer-address.js';
import type { BackoffOptions } from './backoff.js';
import {
  checkKcpParams,
  DEFAULT_KCP_PARAMS,
  KCP_OVERHEAD,
  type KcpParams,
  KcpSession,
  type KcpStats,
} from './kcp/kcp.js';
import {
  type HandshakeLimits,
  identityFromPrivateKey,
  SecureEndpoint,
  type SecureStats,
  type VerifySignature,
} from './kcp/secure-datagram.js';
import type { PeerDirectory, TransportLogger, TunnelMessage } from './tunnel.js';
import { type Link, type LinkSink, SinkSlot, TunnelKeeper } from './tunnel-keeper.js';

export const MSG_DATA = 1;
export const MSG_PING = 2;
export const MSG_PONG = 3;
/** The byte after the conv in a CLOSE plaintext. */
export const CLOSE_MARK = 0xff;
export const CLOSE_BYTES = 5;
/** CLOSE is sent this many times (each its own datagram). */
const CLOSE_COPIES = 3;
const PING_BYTES = 9;
/** Convs of closed links remembered per peer (their late datagrams are dropped, not reopened). */
const RETIRED_CONVS = 16;
/**
 * The lower bound of a link's retransmission timeout: 100 ms, not the 30 of ikcp's nodelay. An
 * agent's event loop delays acks now and then by more than 30 ms (a burst to seal, a relay's
 * turn), and each such delay retransmitted whole flights that were not lost: over a lossless
 * veth, a 10 s download through a kcp service made 12,129 timeout retransmissions and not one
 * fast one; at 100 ms, 1. Losses inside a flight are still repaired by fast retransmit after two
 * later acks; only a loss at a flight's tail waits the timeout (docs/kcp.md, "Retransmission").
 */
export const MIN_RTO_MS = 100;

const DELIVERY_SAMPLES = 16;
const MIN_SAMPLE_MS = 20;

export interface PacingOptions {
  /** Pacing rate = gain x the measured delivery rate. Default 2 (lets the rate double per sample). */
  gain?: number;
  /** The rate when nothing (or little) was measured, bytes/s. Default 2 MB/s. */
  minRateBytesPerSec?: number;
  /** A fixed cap, bytes/s. Default none. */
  maxRateBytesPerSec?: number;
  /** Bucket size, bytes: the largest burst. Default max(64 KiB, 2 ms at the rate). */
  burstBytes?: number;
  /** false: no pacing at all (for comparison). Default true. */
  enabled?: boolean;
}

export interface KcpTransportOptions {
  localPeerId: string;
  /** The agent's Ed25519 identity (private) key; localPeerId must be derived from it. */
  identityKey: KeyObject;
  directory: PeerDirectory;
  /**
   * The UDP socket: the agent passes the management API's address and port number. An IPv6
   * address (e.g. '::') makes a dual-stack udp6 socket, an IPv4 one a udp4 socket. Port 0 picks one.
   */
  bind: { address: string; port: number };
  /** A PING this often (it also measures lastRttMs). Default 5000. */
  keepaliveIntervalMs?: number;
  /** A link with nothing authenticated received for this long is closed. Default 15000. */
  deadAfterMs?: number;
  backoff?: BackoffOptions;
  /** send() returns false above this many bytes queued in the link (at least 64 KiB). Default 256 KiB. */
  highWaterMark?: number;
  /** A dial gives up when no RESPONSE came within this. Default 10000. */
  handshakeTimeoutMs?: number;
  /** INIT is sent again after this long without a RESPONSE. Default 1000. */
  handshakeRetryMs?: number;
  /** KCP engine parameters (message mode is forced). Default DEFAULT_KCP_PARAMS, minRtoMs MIN_RTO_MS. */
  kcp?: Partial<KcpParams>;
  pacing?: PacingOptions;
  /** INIT rate limits (secure-datagram.ts). */
  handshakeLimits?: Partial<HandshakeLimits>;
  /** Dialer: a new handshake under a live link after this long. Default 120000 (secure-datagram.ts). */
  rekeyAfterMs?: number;
  /** Allowed clock difference for INIT timestamps. Default 120000. */
  maxSkewMs?: number;
  /** For tests: the Ed25519 verifier (to count signature checks). */
  verify?: VerifySignature;
  logger?: TransportLogger;
  random?: () => number;
}

/** Datagram counters of the transport (all peers). */
export interface KcpDatagramStats {
  datagramsIn: number;
  datagramsOut: number;
  bytesIn: number;
  bytesOut: number;
  /** socket.send failures (and other socket errors). */
  sendErrors: number;
  /** Dropped before reaching a link, by reason. */
  dropped: {
    auth: number;
    replay: number;
    malformed: number;
    noSession: number;
    /** INIT/RESPONSE refused (rate limits included: see secure.handshakesRefused). */
    handshake: number;
    /** Authenticated, but naming a conv that is retired, or unknown to the dialer. */
    staleConv: number;
    /** Authenticated, right conv, but the KCP engine refused it. */
    kcpRejected: number;
    /** Authenticated DATA of a peer the directory no longer has / may not open a link. */
    refused: number;
  };
  secure: SecureStats;
}

/** A link's engine and pacing figures, for tests and metrics. */
export interface KcpLinkStats extends KcpStats {
  conv: number;
  role: 'dialer' | 'acceptor';
  /** Segments queued + in flight in the engine. */
  waitSnd: number;
  /** Bytes waiting in the link, not yet in the engine. */
  queuedBytes: number;
  pacingRateBytesPerSec: number;
  deliveryRateBytesPerSec: number;
  /** Times a message waited for pacing tokens. */
  pacingWaits: number;
  remote: string;
}

interface Remote {
  address: string;
  port: number;
}

interface Timing {
  keepaliveIntervalMs: number;
  deadAfterMs: number;
  highWaterMark: number;
  kcp: Partial<KcpParams>;
  pacing: Required<Omit<PacingOptions, 'burstBytes' | 'maxRateBytesPerSec'>> & {
    maxRateBytesPerSec: number;
    burstBytes: number | undefined;
  };
}

interface Dial {
  peerId: string;
  remote: Remote;
  resolve(link: Link): void;
  reject(error: Error): void;
  retry: NodeJS.Timeout | undefined;
  timeout: NodeJS.Timeout;
  onAbort(): void;
  signal: AbortSignal;
  publicKey: Buffer;
}

export class KcpTransport extends TunnelKeeper {
  readonly kind = 'kcp';
  private readonly socket: Socket;
  private readonly udp6: boolean;
  private readonly endpoint: SecureEndpoint;
  private readonly timing: Timing;
  private readonly handshakeTimeoutMs: number;
  private readonly handshakeRetryMs: number;
  /** The current link of each peer (the one its datagrams go to). */
  private readonly links = new Map<string, KcpLink>();
  private readonly retired = new Map<string, number[]>();
  private readonly dials = new Map<string, Dial>();
  /** Links with input, or sends, waiting for the next setImmediate. */
  private readonly dirty = new Set<KcpLink>();
  private immediate: NodeJS.Immediate | undefined;
  private pendingSends = 0;
  private sendsSettled: (() => void) | undefined;
  private readonly counts = {
    datagramsIn: 0,
    datagramsOut: 0,
    bytesIn: 0,
    bytesOut: 0,
    sendErrors: 0,
    auth: 0,
    replay: 0,
    malformed: 0,
    noSession: 0,
    handshake: 0,
    staleConv: 0,
    kcpRejected: 0,
    refused: 0,
  };
  private readonly onSent = (error: Error | null) => {
    if (error) this.counts.sendErrors++;
    if (--this.pendingSends === 0) this.sendsSettled?.();
  };

  private constructor(options: KcpTransportOptions, socket: Socket, udp6: boolean) {
    super(options);
    const identity = identityFromPrivateKey(options.identityKey);
    if (peerIdFromPublicKey(identity.publicKeyRaw) !== options.localPeerId)
      throw new Error('localPeerId is not the identity key’s peer id');
    this.socket = socket;
    this.udp6 = udp6;
    const pacing = options.pacing ?? {};
    this.timing = {
      keepaliveIntervalMs: positive(options.keepaliveIntervalMs ?? 5000, 'keepaliveIntervalMs'),
      deadAfterMs: positive(options.deadAfterMs ?? 15_000, 'deadAfterMs'),
      highWaterMark: options.highWaterMark ?? 256 * 1024,
      kcp: { ...DEFAULT_KCP_PARAMS, minRtoMs: MIN_RTO_MS, ...options.kcp, stream: false },
      pacing: {
        enabled: pacing.enabled ?? true,
        gain: positive(pacing.gain ?? 2, 'pacing.gain'),
        minRateBytesPerSec: positive(pacing.minRateBytesPerSec ?? 2_000_000, 'pacing.minRateBytesPerSec'),
        maxRateBytesPerSec: positive(
          pacing.maxRateBytesPerSec ?? Number.POSITIVE_INFINITY,
          'pacing.maxRateBytesPerSec',
          true,
        ),
        burstBytes:
          pacing.burstBytes === undefined ? undefined : positive(pacing.burstBytes, 'pacing.burstBytes'),
      },
    };
    if (!(this.timing.highWaterMark >= 65_536)) throw new RangeError('highWaterMark must be at least 64 KiB');
    // Fails now on bad engine parameters rather than at the first link.
    checkKcpParams(this.timing.kcp);
    this.handshakeTimeoutMs = positive(options.handshakeTimeoutMs ?? 10_000, 'handshakeTimeoutMs');
    this.handshakeRetryMs = positive(options.handshakeRetryMs ?? 1000, 'handshakeRetryMs');
    this.endpoint = new SecureEndpoint({
      self: identity,
      peerByKey: (raw) => this.directory.peerByKey(raw),
      ...(options.maxSkewMs !== undefined ? { maxSkewMs: options.maxSkewMs } : {}),
      ...(options.handshakeLimits ? { limits: options.handshakeLimits } : {}),
      ...(options.verify ? { verify: options.verify } : {}),
      ...(options.rekeyAfterMs !== undefined ? { rekeyAfterMs: options.rekeyAfterMs } : {}),
    });
    socket.on('message', (data, rinfo) => this.onDatagram(data, rinfo));
    socket.on('error', (error) => {
      this.counts.sendErrors++;
      this.logger?.warn({ transport: 'kcp', error: error.message }, 'udp socket error');
    });
  }

  /** Binds the UDP socket and returns the transport (rejects if the address cannot be bound). */
  static async start(options: KcpTransportOptions): Promise<KcpTransport> {
    const udp6 = isIP(options.bind.address) === 6;
    const socket = createSocket({ type: udp6 ? 'udp6' : 'udp4', ipv6Only: false });
    await new Promise<void>((resolve, reject) => {
      socket.once('error', reject);
      socket.bind(options.bind.port, options.bind.address, () => {
        socket.off('error', reject);
        resolve();
      });
    });
    try {
      // Room for a window of datagrams arriving while the event loop is busy.
      socket.setRecvBufferSize(4 * 1024 * 1024);
      socket.setSendBufferSize(4 * 1024 * 1024);
    } catch {
      // Capped by net.core.rmem_max / wmem_max; the defaults work, only slower under bursts.
    }
    try {
      return new KcpTransport(options, socket, udp6);
    } catch (error) {
      socket.close();
      throw error;
    }
  }

  /** The bound UDP address. */
  address(): { address: string; port: number } {
    const a = this.socket.address();
    return { address: a.address, port: a.port };
  }

  /**
   * The keeper closes the links of peers no longer active; their secure sessions go too, so
   * that their datagrams no longer even decrypt (they are dropped as `noSession`).
   */
  override revalidate(): void {
    super.revalidate();
    for (const peerId of this.endpoint.peerIds())
      if (!this.directory.peer(peerId)) this.endpoint.dropPeer(peerId);
  }

  /** Datagram counters (all peers), with the secure layer's. */
  datagramStats(): KcpDatagramStats {
    const c = this.counts;
    return {
      datagramsIn: c.datagramsIn,
      datagramsOut: c.datagramsOut,
      bytesIn: c.bytesIn,
      bytesOut: c.bytesOut,
      sendErrors: c.sendErrors,
      dropped: {
        auth: c.auth,
        replay: c.replay,
        malformed: c.malformed,
        noSession: c.noSession,
        handshake: c.handshake,
        staleConv: c.staleConv,
        kcpRejected: c.kcpRejected,
        refused: c.refused,
      },
      secure: this.endpoint.stats(),
    };
  }

  /** The current link's engine and pacing figures, if the peer has a link. */
  kcpStats(peerId: string): KcpLinkStats | undefined {
    return this.links.get(peerId)?.stats();
  }

  // ------------------------------------------------------------------------------ keeper hooks

  protected connect(peerId: string, signal: AbortSignal): Promise<Link> {
    const peer = this.directory.peer(peerId);
    if (!peer) return Promise.reject(new Error('not an active peer'));
    const address = parsePeerAddress(peer.address);
    if (!address) return Promise.reject(new Error(`unusable address ${JSON.stringify(peer.address)}`));
    return this.resolveHost(address.host).then(
      (host) =>
        new Promise<Link>((resolve, reject) => {
          if (signal.aborted || this.closed) return reject(new Error('dial aborted'));
          this.dials.get(peerId)?.reject(new Error('replaced by a newer dial'));
          const dial: Dial = {
            peerId,
            remote: { address: host, port: address.port },
            publicKey: Buffer.from(peer.publicKey),
            signal,
            retry: undefined,
            timeout: setTimeout(() => finish(new Error('handshake timed out')), this.handshakeTimeoutMs),
            onAbort: () => finish(new Error('dial aborted')),
            resolve: (link) => finish(undefined, link),
            reject: (error) => finish(error),
          };
          const finish = (error: Error | undefined, link?: Link) => {
            if (this.dials.get(peerId) !== dial) return;
            this.dials.delete(peerId);
            clearTimeout(dial.timeout);
            if (dial.retry) clearTimeout(dial.retry);
            signal.removeEventListener('abort', dial.onAbort);
            if (error) reject(error);
            else resolve(link!);
          };
          dial.timeout.unref();
          signal.addEventListener('abort', dial.onAbort, { once: true });
          this.dials.set(peerId, dial);
          const sendInit = () => {
            if (this.dials.get(peerId) !== dial) return;
            this.send(this.endpoint.initiate(peerId, dial.publicKey, Date.now()), dial.remote);
            dial.retry = setTimeout(sendInit, this.handshakeRetryMs);
            dial.retry.unref();
          };
          sendInit();
        }),
    );
  }

  protected async shutdown(): Promise<void> {
    for (const dial of [...this.dials.values()]) dial.reject(new Error('transport closed'));
    for (const link of [...this.links.values()]) link.close();
    if (this.immediate) clearImmediate(this.immediate);
    this.immediate = undefined;
    // Let the last datagrams (the CLOSEs) leave before the socket goes.
    if (this.pendingSends > 0) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 500);
        this.sendsSettled = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    await new Promise<void>((resolve) => this.socket.close(() => resolve()));
  }

  // ------------------------------------------------------------------------------ socket side

  /**
   * Sends a ready datagram (INIT, RESPONSE or DATA) to `to`. Only datagrams that shutdown must
   * wait for (CLOSE) take a completion callback: without one Node lets libuv send at once
   * (uv_udp_try_send) with no completion to run per datagram; errors then come as the socket's
   * 'error' event, counted there.
   */
  private send(datagram: Buffer, to: Remote, track = false): void {
    this.counts.datagramsOut++;
    this.counts.bytesOut += datagram.length;
    if (track) this.pendingSends++;
    try {
      if (track) this.socket.send(datagram, to.port, to.address, this.onSent);
      else this.socket.send(datagram, to.port, to.address);
    } catch {
      // The socket is closed (transport shutting down).
      if (track) this.onSent(new Error('socket closed'));
      else this.counts.sendErrors++;
    }
  }

  /** Seals the plaintext for the peer and sends it; false if the peer has no usable session. */
  sealAndSend(peerId: string, plaintext: Buffer, to: Remote, track = false): boolean {
    const datagram = this.endpoint.seal(peerId, plaintext);
    if (!datagram) return false;
    this.send(datagram, to, track);
    return true;
  }

  private onDatagram(data: Buffer, rinfo: RemoteInfo): void {
    this.counts.datagramsIn++;
    this.counts.bytesIn += data.length;
    if (this.closed) return;
    const from = unmapped(rinfo.address);
    // `data` is this datagram's own buffer (dgram allocates one per message): DATA is decrypted in
    // it and its payload kept as a view of it (SecureEndpoint.receive).
    const received = this.endpoint.receive(data, from, Date.now());
    switch (received.kind) {
      case 'dropped': {
        const reason = received.reason;
        if (reason === 'auth') {
          this.counts.auth++;
          this.fault('corrupt', { remote: from, detail: 'a datagram failed authentication' });
        } else if (reason === 'replay') this.counts.replay++;
        else if (reason === 'malformed') this.counts.malformed++;
        else if (reason === 'no-session') this.counts.noSession++;
        else {
          this.counts.handshake++;
          if (reason === 'handshake:unknown-peer') this.fault('unknown-peer', { remote: from });
          else if (reason === 'handshake:not-dialer') this.fault('not-dialer', { remote: from });
          else if (reason === 'handshake:bad-signature')
            this.fault('handshake', { remote: from, detail: 'bad signature' });
        }
        return;
      }
      case 'reply':
        this.send(received.datagram, { address: rinfo.address, port: rinfo.port });
        return;
      case 'established': {
        const dial = this.dials.get(received.peerId);
        const remote = { address: rinfo.address, port: rinfo.port };
        if (dial) {
          const link = new KcpLink(
            this,
            received.peerId,
            dial.publicKey,
            randomConv(),
            'dialer',
            remote,
            this.timing,
          );
          this.register(link);
          link.hello();
          dial.resolve(link);
        } else {
          // A rekey under a live link: confirm the new session to the responder at once.
          const link = this.links.get(received.peerId);
          if (link) this.sealAndSend(received.peerId, EMPTY, link.remote);
        }
        return;
      }
      case 'data':
        this.onPlaintext(received.peerId, received.payload, { address: rinfo.address, port: rinfo.port });
        return;
    }
  }

  private onPlaintext(peerId: string, plaintext: Buffer, from: Remote): void {
    const link = this.links.get(peerId);
    if (plaintext.length === 0) {
      link?.heard(from);
      return;
    }
    if (plaintext.length < 4) {
      this.counts.malformed++;
      return;
    }
    const conv = plaintext.readUInt32LE(0);
    if (plaintext.length === CLOSE_BYTES && plaintext[4] === CLOSE_MARK) {
      if (link && link.conv === conv) link.closedByPeer();
      else this.counts.staleConv++;
      return;
    }
    if (link && link.conv === conv) {
      if (!link.input(plaintext, from)) this.counts.kcpRejected++;
      else this.markDirty(link);
      return;
    }
    if (heardFromUs(plaintext)) {
      // The sender's link has received from a link of this conv here, and we have none: we
      // restarted, or retired it and its CLOSEs were lost. Opening a link on it would sit
      // forever waiting for segments the old one took (both sides acking, nothing delivered);
      // telling the sender lets it redial at once instead of after deadAfterMs of silence.
      this.counts.staleConv++;
      this.sealAndSend(peerId, closeOf(conv), from);
      return;
    }
    if (this.retired.get(peerId)?.includes(conv) || this.isDialerFor(peerId)) {
      this.counts.staleConv++;
      return;
    }
    // A new connection from the pair's dialer.
    const peer = this.directory.peer(peerId);
    const authorized = peer ? this.authorizeInbound(peer.publicKey) : { refused: 'unknown-peer' as const };
    if ('refused' in authorized || authorized.peerId !== peerId) {
      this.counts.refused++;
      if ('refused' in authorized)
        this.fault(authorized.refused, { peer: peerId, detail: 'new link refused' });
      // Its sessions must not open anything more; a new handshake is checked afresh.
      this.endpoint.dropPeer(peerId);
      return;
    }
    const fresh = new KcpLink(
      this,
      peerId,
      Buffer.from(peer!.publicKey),
      conv,
      'acceptor',
      from,
      this.timing,
    );
    if (!fresh.input(plaintext, from)) {
      this.counts.kcpRejected++;
      fresh.discard();
      return;
    }
    this.register(fresh);
    this.markDirty(fresh);
    this.adopt(peerId, fresh);
  }

  /** The peer's datagrams go to this link from now on; an older link's conv retires. */
  private register(link: KcpLink): void {
    const old = this.links.get(link.peerId);
    this.links.set(link.peerId, link);
    if (old && old !== link) this.retire(old);
  }

  // ------------------------------------------------------------------------------ for KcpLink

  /** The link is finished: its conv retires and its datagrams are dropped from now on. */
  retire(link: KcpLink): void {
    this.dirty.delete(link);
    if (link.discarded) {
      if (this.links.get(link.peerId) === link) this.links.delete(link.peerId);
      return;
    }
    if (this.links.get(link.peerId) === link) this.links.delete(link.peerId);
    let list = this.retired.get(link.peerId);
    if (!list) {
      list = [];
      this.retired.set(link.peerId, list);
    }
    if (!list.includes(link.conv)) list.push(link.conv);
    if (list.length > RETIRED_CONVS) list.shift();
  }

  markDirty(link: KcpLink): void {
    this.dirty.add(link);
    this.immediate ??= setImmediate(this.processDirty);
  }

  /**
   * A dialer's link: start a handshake when the endpoint says a rekey is due, or when the peer has
   * been silent for two keepalive intervals. A peer that restarted lost its sessions: it cannot
   * even authenticate what we send, and only a new handshake lets it answer (with a CLOSE of the
   * link it no longer has, so we redial at once rather than after deadAfterMs). To a live peer
   * behind an outage the handshake is a rekey like any other; the KCP connection carries on.
   */
  maybeRekey(link: KcpLink, lastInitAt: number, now: number, silentMs: number): boolean {
    if (link.role !== 'dialer') return false;
    const keepalive = this.timing.keepaliveIntervalMs;
    const silent = silentMs > 2 * keepalive;
    const every = silent ? Math.max(this.handshakeRetryMs, keepalive) : this.handshakeRetryMs;
    if (now - lastInitAt < every) return false;
    if (!silent && !this.endpoint.rekeyDue(link.peerId, Date.now())) return false;
    this.send(this.endpoint.initiate(link.peerId, link.peerKey, Date.now()), link.remote);
    return true;
  }

  private readonly processDirty = () => {
    this.immediate = undefined;
    const links = [...this.dirty];
    this.dirty.clear();
    const now = performance.now();
    for (const link of links) link.service(now);
  };

  private async resolveHost(host: string): Promise<string> {
    const family = isIP(host);
    if (family === 4) return this.udp6 ? `::ffff:${host}` : host;
    if (family === 6) return host;
    const found = await lookup(host, { family: this.udp6 ? 0 : 4 });
    return found.family === 4 && this.udp6 ? `::ffff:${found.address}` : found.address;
  }
}

/** One connection: a KCP session over the peer's secure session, with keepalive and pacing. */
class KcpLink implements Link {
  private readonly kcp: KcpSession;
  private readonly slot = new SinkSlot();
  /** Never registered nor handed out (its first datagram was refused). */
  discarded = false;
  /** Messages (type byte included) not yet in the engine. */
  private queue: Buffer[] = [];
  private queueHead = 0;
  private queuedBytes = 0;
  private wantDrain = false;
  // Delivery accounting: what went into the engine, in order, as [segments, bytes] pairs.
  private enqueuedSegments = 0;
  private ackedSegments = 0;
  private ackedBytes = 0;
  private readonly inEngine: number[] = [];
  private inEngineHead = 0;
  private sampleStartAt = performance.now();
  private sampleStartBytes = 0;
  private readonly samples = new Float64Array(DELIVERY_SAMPLES);
  private sampleIndex = 0;
  private deliveryRate = 0;
  private pacingRate: number;
  private tokens: number;
  private tokensAt = performance.now();
  private pacingWaits = 0;
  private blockedOnTokens = false;
  // Keepalive and dead detection.
  private lastReceivedAt = performance.now();
  /** When the peer was last heard, by the clock alone (silentMs): no stall is taken off it. */
  private lastHeardAt = performance.now();
  private lastPingAt = performance.now();
  private readonly tickMs: number;
  private nextTickAt: number;
  private lastTickAt = performance.now();
  private lastInitAt = Number.NEGATIVE_INFINITY;
  private timer: NodeJS.Timeout | undefined;
  private timerDue = Number.POSITIVE_INFINITY;

  constructor(
    private readonly transport: KcpTransport,
    readonly peerId: string,
    readonly peerKey: Buffer,
    readonly conv: number,
    readonly role: 'dialer' | 'acceptor',
    public remote: Remote,
    private readonly timing: Timing,
  ) {
    this.kcp = new KcpSession(conv, (datagram) => this.output(datagram), timing.kcp);
    this.pacingRate = this.clampRate(0);
    this.tokens = this.burst();
    this.tickMs = Math.max(5, Math.min(timing.keepaliveIntervalMs, timing.deadAfterMs) / 4);
    this.nextTickAt = performance.now() + this.tickMs;
    this.arm(performance.now());
  }

  // ----------------------------------------------------------------------------- Link

  open(sink: LinkSink): void {
    this.slot.open(sink);
  }

  private get finished(): boolean {
    return this.slot.ended;
  }

  silentMs(): number {
    return Math.max(0, performance.now() - this.lastHeardAt);
  }

  send(messages: readonly TunnelMessage[]): boolean {
    if (this.finished) return true;
    for (const m of messages) {
      const framed = Buffer.allocUnsafe(1 + m.length);
      framed[0] = MSG_DATA;
      if (Buffer.isBuffer(m)) m.copy(framed, 1);
      else {
        let at = 1;
        for (const part of m.parts) {
          part.copy(framed, at);
          at += part.length;
        }
      }
      this.queue.push(framed);
      this.queuedBytes += framed.length;
    }
    this.transport.markDirty(this);
    if (this.queuedBytes <= this.timing.highWaterMark) return true;
    this.wantDrain = true;
    return false;
  }

  close(): void {
    if (this.finished) return;
    this.sendClose();
    this.slot.detach();
    this.teardown();
  }

  // ----------------------------------------------------------------------------- transport side

  /** The dialer's first message: the responder opens its link on it (and the PONG measures rtt). */
  hello(): void {
    this.ping(performance.now());
    this.kcp.flush(performance.now());
  }

  /** An authenticated keepalive (or any authenticated datagram) from the peer. */
  heard(from: Remote): void {
    this.lastReceivedAt = performance.now();
    this.lastHeardAt = this.lastReceivedAt;
    this.remote = from;
  }

  /** An authenticated KCP datagram; false if the engine refused it. */
  input(datagram: Buffer, from: Remote): boolean {
    if (this.finished) return true;
    if (this.kcp.input(datagram, performance.now()) !== 'ok') return false;
    this.heard(from);
    return true;
  }

  closedByPeer(): void {
    this.finish(undefined, 'closed by the peer');
  }

  /** Dropped before it was ever handed out (its first datagram was refused). */
  discard(): void {
    this.discarded = true;
    this.slot.detach();
    this.teardown();
  }

  stats(): KcpLinkStats {
    return {
      ...this.kcp.stats,
      conv: this.conv,
      role: this.role,
      waitSnd: this.kcp.waitSnd(),
      queuedBytes: this.queuedBytes,
      pacingRateBytesPerSec: this.timing.pacing.enabled ? this.pacingRate : Number.POSITIVE_INFINITY,
      deliveryRateBytesPerSec: this.deliveryRate,
      pacingWaits: this.pacingWaits,
      remote: `${this.remote.address}:${this.remote.port}`,
    };
  }

  /** Everything a link does on its timer or after input/sends: receive, feed, flush, check. */
  service(now: number): void {
    if (this.finished) return;
    this.receive(now);
    if (this.finished) return;
    this.account(now);
    this.feed(now);
    // A flush, not update(): this runs at check()'s time or after input/sends, so there is work.
    this.kcp.flush(now);
    if (this.kcp.dead()) {
      this.finish('dead', 'a KCP segment was sent deadLink times without an ack');
      return;
    }
    if (now >= this.nextTickAt) this.tick(now);
    if (this.finished) return;
    if (this.wantDrain && this.queuedBytes <= this.timing.highWaterMark / 2) {
      this.wantDrain = false;
      this.slot.drain();
    }
    this.arm(now);
  }

  // ----------------------------------------------------------------------------- internals

  private output(datagram: Buffer): void {
    // The view is valid only during this call: seal() copies it into the DATA datagram.
    this.transport.sealAndSend(this.peerId, datagram, this.remote);
  }

  private receive(now: number): void {
    for (;;) {
      const message = this.kcp.recv();
      if (message === null) return;
      if (message.length === 0) continue;
      const type = message[0];
      if (type === MSG_DATA) {
        const payload = message.subarray(1);
        this.slot.message(payload);
        if (this.finished) return;
      } else if (type === MSG_PING && message.length === PING_BYTES) {
        const pong = Buffer.from(message);
        pong[0] = MSG_PONG;
        this.engineSend(pong);
      } else if (type === MSG_PONG && message.length === PING_BYTES) {
        const rtt = now - message.readDoubleBE(1);
        // A peer can only hurt its own figure, but keep nonsense out of it.
        if (rtt >= 0 && rtt < 3_600_000) this.slot.rtt(rtt);
      }
      // Unknown types: a newer peer's extension; ignored.
    }
  }

  private ping(now: number): void {
    this.lastPingAt = now;
    const stamp = Buffer.allocUnsafe(PING_BYTES);
    stamp[0] = MSG_PING;
    stamp.writeDoubleBE(now, 1);
    this.engineSend(stamp);
  }

  private engineSend(message: Buffer): void {
    this.kcp.send(message);
    const segments = Math.max(1, Math.ceil(message.length / this.kcp.mss));
    this.enqueuedSegments += segments;
    this.inEngine.push(segments, message.length);
  }

  /** Acked bytes so far (approximately: acks are credited to the oldest messages first). */
  private account(now: number): void {
    const acked = this.enqueuedSegments - this.kcp.waitSnd();
    const q = this.inEngine;
    let head = this.inEngineHead;
    while (head < q.length && this.ackedSegments + q[head]! <= acked) {
      this.ackedSegments += q[head]!;
      this.ackedBytes += q[head + 1]!;
      head += 2;
    }
    if (head > 4096 && head * 2 > q.length) {
      q.splice(0, head);
      head = 0;
    }
    this.inEngineHead = head;
    const period = Math.max(MIN_SAMPLE_MS, 2 * this.kcp.stats.rttMs);
    const elapsed = now - this.sampleStartAt;
    if (elapsed < period) return;
    this.samples[this.sampleIndex] = ((this.ackedBytes - this.sampleStartBytes) * 1000) / elapsed;
    this.sampleIndex = (this.sampleIndex + 1) % DELIVERY_SAMPLES;
    this.sampleStartAt = now;
    this.sampleStartBytes = this.ackedBytes;
    let max = 0;
    for (const s of this.samples) if (s > max) max = s;
    this.deliveryRate = max;
    this.pacingRate = this.clampRate(max);
  }

  private clampRate(delivery: number): number {
    const p = this.timing.pacing;
    return Math.min(p.maxRateBytesPerSec, Math.max(p.minRateBytesPerSec, p.gain * delivery));
  }

  private burst(): number {
    return this.timing.pacing.burstBytes ?? Math.max(65_536, this.pacingRate * 0.002);
  }

  /** Moves queued messages into the engine while its window and the pacing bucket allow. */
  private feed(now: number): void {
    this.blockedOnTokens = false;
    if (this.queueHead >= this.queue.length) return;
    const pacing = this.timing.pacing.enabled;
    if (pacing) {
      this.tokens = Math.min(this.burst(), this.tokens + ((now - this.tokensAt) * this.pacingRate) / 1000);
      this.tokensAt = now;
    }
    const window = this.timing.kcp.sndWnd ?? DEFAULT_KCP_PARAMS.sndWnd;
    const mss = this.kcp.mss;
    while (this.queueHead < this.queue.length) {
      const message = this.queue[this.queueHead]!;
      const segments = Math.max(1, Math.ceil(message.length / mss));
      if (this.kcp.waitSnd() + segments > window && this.kcp.waitSnd() > 0) break;
      if (pacing && this.tokens <= 0) {
        this.blockedOnTokens = true;
        this.pacingWaits++;
        break;
      }
      if (pacing) this.tokens -= message.length;
      this.queue[this.queueHead++] = EMPTY;
      this.queuedBytes -= message.length;
      this.engineSend(message);
    }
    if (this.queueHead >= this.queue.length) {
      this.queue = [];
      this.queueHead = 0;
    } else if (this.queueHead > 1024 && this.queueHead * 2 > this.queue.length) {
      this.queue = this.queue.slice(this.queueHead);
      this.queueHead = 0;
    }
  }

  private tick(now: number): void {
    // Time this process's event loop was stalled is not the peer's silence (as tcp.ts).
    const gap = now - this.lastTickAt;
    this.lastTickAt = now;
    this.nextTickAt = now + this.tickMs;
    if (gap > this.tickMs * 2) this.lastReceivedAt = Math.min(now, this.lastReceivedAt + gap - this.tickMs);
    const silentMs = now - this.lastReceivedAt;
    if (silentMs > this.timing.deadAfterMs) {
      this.finish('dead', `nothing received for ${Math.round(silentMs)} ms`);
      return;
    }
    if (now - this.lastPingAt >= this.timing.keepaliveIntervalMs) {
      this.ping(now);
      this.kcp.flush(now);
    }
    if (this.transport.maybeRekey(this, this.lastInitAt, now, silentMs)) this.lastInitAt = now;
  }

  /** One timer: the engine's next flush (while it has data out), the pacing refill, the tick. */
  private arm(now: number): void {
    let due = this.nextTickAt;
    if (this.kcp.waitSnd() > 0) due = Math.min(due, this.kcp.check(now));
    if (this.blockedOnTokens) {
      const need = Math.max(1, -this.tokens + 1);
      due = Math.min(due, now + (need * 1000) / this.pacingRate);
    }
    due = Math.max(due, now + 1);
    if (this.timer && due >= this.timerDue) return;
    if (this.timer) clearTimeout(this.timer);
    this.timerDue = due;
    this.timer = setTimeout(this.onTimer, due - now);
    this.timer.unref();
  }

  private readonly onTimer = () => {
    this.timer = undefined;
    this.timerDue = Number.POSITIVE_INFINITY;
    // Not now: timers run before the event loop polls the socket, so acks already waiting there
    // would be unseen and their segments retransmitted for nothing (measured: a quarter of all
    // segments on loopback). The setImmediate batch runs after the poll.
    this.transport.markDirty(this);
  };

  private sendClose(): void {
    const close = closeOf(this.conv);
    for (let i = 0; i < CLOSE_COPIES; i++) this.transport.sealAndSend(this.peerId, close, this.remote, true);
  }

  private finish(reason: 'dead' | undefined, detail: string): void {
    if (this.finished) return;
    if (reason === 'dead') this.sendClose();
    this.slot.end(reason, detail);
    this.teardown();
  }

  private teardown(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.queue = [];
    this.queueHead = 0;
    this.queuedBytes = 0;
    this.transport.retire(this);
  }
}

const EMPTY = Buffer.alloc(0);

/** The CLOSE plaintext of the link `conv`. */
function closeOf(conv: number): Buffer {
  const close = Buffer.allocUnsafe(CLOSE_BYTES);
  close.writeUInt32LE(conv, 0);
  close[4] = CLOSE_MARK;
  return close;
}

/**
 * Whether a KCP datagram's sender had received segments of its conv already: a segment's una is
 * the sender's next expected sequence number, 0 until our side of the conv first sent it data.
 */
function heardFromUs(datagram: Buffer): boolean {
  return datagram.length >= KCP_OVERHEAD && datagram.readUInt32LE(16) !== 0;
}

/** A random non-zero conv. */
function randomConv(): number {
  return randomInt(1, 2 ** 32 - 1);
}

/** The IPv4 address of an IPv4-mapped IPv6 one (dual-stack sockets), else the address itself. */
function unmapped(address: string): string {
  return address.startsWith('::ffff:') && isIP(address.slice(7)) === 4 ? address.slice(7) : address;
}

function positive(value: number, name: string, allowInfinity = false): number {
  if (!(value > 0) || (!allowInfinity && !Number.isFinite(value)))
    throw new RangeError(`${name} must be a positive number`);
  return value;
}
