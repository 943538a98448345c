/**
 * TCP sockets Node's net module cannot make, for the data plane's stream path and fully transparent
 * services; the only module that loads the socket addon (build/Release/mesh_sockets.node, built by
 * `npm install` through node-gyp from binding.gyp and native/sockets.cc).
 * - openTransparentListener: a listening fd with IP_TRANSPARENT (IPV6_TRANSPARENT), for
 *   `net.createServer().listen({ fd })`. Connections nftables TPROXYs to it are accepted with their
 *   ORIGINAL destination as socket.localAddress/localPort.
 * - connectSocket: a connected fd, with SO_MARK and/or IP_TRANSPARENT set before bind/connect (a marked
 *   connection routed by policy; a source address that is not local, the original client's). The connect
 *   is driven by the event loop, never the thread pool. connectNetSocket wraps the fd in a net.Socket.
 * - setReceiveBuffer: SO_RCVBUF of a connected socket (net.Socket has no such option for TCP).
 * - setNotSentLowat: TCP_NOTSENT_LOWAT of a connected socket (the tcp tunnel's).
 * The first two need CAP_NET_ADMIN for the transparent and mark options. The fds are non-blocking and close-on-exec;
 * once handed over they are the caller's (net.Server / net.Socket close them).
 *
 * Used by src/transports and src/dataplane; imports nothing but Node built-ins.
 */
import { closeSync } from 'node:fs';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { loadAddon } from './load-addon.js';

export type IpFamily = 4 | 6;

export interface TransparentListenerOptions {
  family: IpFamily;
  /** Address to bind; the family's wildcard (0.0.0.0 / ::) when absent, which is what TPROXY needs. */
  address?: string;
  /** 0 lets the kernel pick one (read it back with server.address() once listening). */
  port: number;
  /** listen() backlog; 511 (Node's default) when absent. */
  backlog?: number;
  /** SO_MARK of the listener, which every accepted socket inherits (needs CAP_NET_ADMIN). */
  mark?: number;
}

export interface ConnectOptions {
  family: IpFamily;
  /** The destination, an address of `family` (no host names: the data plane connects to addresses). */
  address: string;
  port: number;
  /** Source address to bind; with `transparent` it may be an address that is not local. */
  localAddress?: string;
  /** Source port to bind; the kernel picks one when absent or 0. */
  localPort?: number;
  /** IP_TRANSPARENT (IPV6_TRANSPARENT) before bind, so localAddress may be non-local. CAP_NET_ADMIN. */
  transparent?: boolean;
  /** SO_MARK (0..2^32-1) before connect, so the SYN already carries it. CAP_NET_ADMIN. */
  mark?: number;
  /**
   * Gives up with ETIMEDOUT after this many ms; absent or 0: only the kernel's own limit
   * (net.ipv4.tcp_syn_retries, about two minutes).
   */
  timeoutMs?: number;
  /** Aborting closes the pending socket and rejects with an AbortError (code ABORT_ERR). */
  signal?: AbortSignal;
}

interface NativeConnect {
  cancel(): boolean;
}

interface NativeAddon {
  openTransparentListener?: (
    family: IpFamily,
    address: string | null,
    port: number,
    backlog: number,
    mark: number,
  ) => number;
  Connect?: new (
    family: IpFamily,
    address: string,
    port: number,
    localAddress: string | null,
    localPort: number,
    transparent: boolean,
    mark: number,
    timeoutMs: number,
    onDone: (error: NodeJS.ErrnoException | null, fd?: number) => void,
  ) => NativeConnect;
  setReceiveBuffer?: (fd: number, bytes: number) => number;
  setNotSentLowat?: (fd: number, bytes: number) => number;
}

let addon: NativeAddon | undefined;

/** Loaded on first use, so that importing this module (for its types) never needs the built addon. */
function nativeAddon(): Required<NativeAddon> {
  addon ??= loadAddon<NativeAddon>('mesh_sockets.node');
  if (
    !addon?.openTransparentListener ||
    !addon.Connect ||
    !addon.setReceiveBuffer ||
    !addon.setNotSentLowat
  ) {
    throw new Error(
      process.platform === 'linux'
        ? 'the mesh_sockets addon is older than this build: rebuild it (npm rebuild)'
        : `transparent and marked sockets are Linux-only (this is ${process.platform})`,
    );
  }
  return addon as Required<NativeAddon>;
}

function invalid(message: string): TypeError {
  return Object.assign(new TypeError(message), { code: 'ERR_INVALID_ARG_VALUE' });
}

function checkFamily(family: unknown): asserts family is IpFamily {
  if (family !== 4 && family !== 6) throw invalid(`family must be 4 or 6, not ${String(family)}`);
}

function checkAddress(family: IpFamily, address: unknown, what: string): asserts address is string {
  if (typeof address !== 'string' || net.isIP(address) !== family)
    throw invalid(`${what} must be an IPv${family} address, not ${JSON.stringify(address)}`);
}

function checkInteger(value: unknown, min: number, max: number, what: string): asserts value is number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max)
    throw invalid(`${what} must be an integer ${min}..${max}, not ${String(value)}`);
}

/**
 * A bound, listening, non-blocking fd with SO_REUSEADDR and IP_TRANSPARENT (IPv6: IPV6_TRANSPARENT and
 * IPV6_V6ONLY, so a v4 and a v6 listener can share a port). Use it with
 * `net.createServer(...).listen({ fd })`; the server then owns it (server.close() closes it).
 * Throws a system error (EPERM without CAP_NET_ADMIN, EADDRINUSE, ...) having closed the fd.
 */
export function openTransparentListener(opts: TransparentListenerOptions): number {
  checkFamily(opts.family);
  if (opts.address !== undefined) checkAddress(opts.family, opts.address, 'address');
  checkInteger(opts.port, 0, 65535, 'port');
  const backlog = opts.backlog ?? 511;
  checkInteger(backlog, 0, 65535, 'backlog');
  if (opts.mark !== undefined) checkInteger(opts.mark, 0, 0xffff_ffff, 'mark');
  return nativeAddon().openTransparentListener(
    opts.family,
    opts.address ?? null,
    opts.port,
    backlog,
    opts.mark ?? -1,
  );
}

function abortError(signal: AbortSignal): Error {
  return Object.assign(new Error('the connect was aborted', { cause: signal.reason }), {
    name: 'AbortError',
    code: 'ABORT_ERR',
  });
}

/**
 * Opens a TCP connection and resolves with its connected, non-blocking fd, which is then the caller's
 * to close (or to wrap: `new net.Socket({ fd, readable: true, writable: true })`, see connectNetSocket).
 * Rejects with a system error whose `code` is the errno name (ECONNREFUSED, ETIMEDOUT also for
 * timeoutMs, EHOSTUNREACH, ENETUNREACH, EADDRNOTAVAIL for a non-local localAddress without
 * `transparent`, EPERM for mark/transparent without CAP_NET_ADMIN, ...) plus `address` and `port`;
 * nothing is left open then. Invalid options reject with a TypeError (code ERR_INVALID_ARG_VALUE).
 */
export function connectSocket(opts: ConnectOptions): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const { signal } = opts;
    checkFamily(opts.family);
    checkAddress(opts.family, opts.address, 'address');
    checkInteger(opts.port, 1, 65535, 'port');
    if (opts.localAddress !== undefined) checkAddress(opts.family, opts.localAddress, 'localAddress');
    checkInteger(opts.localPort ?? 0, 0, 65535, 'localPort');
    checkInteger(opts.mark ?? 0, 0, 0xffffffff, 'mark');
    checkInteger(opts.timeoutMs ?? 0, 0, 0xffffffff, 'timeoutMs');
    if (signal?.aborted) {
      reject(abortError(signal));
      return;
    }
    const { Connect } = nativeAddon();
    const onAbort = (): void => {
      // cancel() closes the fd; false when the connect settled first (then onDone has run already).
      if (pending.cancel()) reject(abortError(signal!));
    };
    const withTarget = (error: NodeJS.ErrnoException) =>
      Object.assign(error, { address: opts.address, port: opts.port });
    let pending: NativeConnect;
    try {
      pending = new Connect(
        opts.family,
        opts.address,
        opts.port,
        opts.localAddress ?? null,
        opts.localPort ?? 0,
        opts.transparent ?? false,
        opts.mark ?? -1,
        opts.timeoutMs ?? 0,
        (error, fd) => {
          signal?.removeEventListener('abort', onAbort);
          if (error) reject(withTarget(error));
          else resolve(fd!);
        },
      );
    } catch (e) {
      // Refused before waiting (bind, an unreachable route, EPERM for a mark, ...): nothing is open.
      reject(withTarget(e as NodeJS.ErrnoException));
      return;
    }
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * connectSocket, then the fd wrapped in a net.Socket (reading started, allowHalfOpen so that a FIN from
 * the peer ends only the readable side: the stream path forwards half-closes). The fd is closed if the
 * wrapping fails.
 */
export async function connectNetSocket(opts: ConnectOptions): Promise<net.Socket> {
  const fd = await connectSocket(opts);
  return socketFromFd(fd);
}

/**
 * Wraps a connected TCP fd in a net.Socket that owns it (destroy() closes it), reading started and
 * allowHalfOpen set. Closes the fd when Node refuses it.
 */
export function socketFromFd(fd: number): net.Socket {
  try {
    return new net.Socket({ fd, readable: true, writable: true, allowHalfOpen: true });
  } catch (e) {
    closeSync(fd); // Node did not take it
    throw e;
  }
}

/**
 * Sets SO_RCVBUF of a connected TCP socket, which turns off the kernel's receive-buffer autotuning
 * for it: the window its peer sees stays near `bytes` instead of growing to megabytes. Returns the
 * size the kernel took (twice `bytes`, its bookkeeping included), or null when the socket has no
 * fd (closed already). Reads the fd from Node's handle (`_handle.fd`, set for TCP on Linux).
 */
export function setReceiveBuffer(socket: net.Socket, bytes: number): number | null {
  checkInteger(bytes, 1, 2 ** 30, 'bytes');
  const fd = fdOf(socket);
  return fd === undefined ? null : nativeAddon().setReceiveBuffer(fd, bytes);
}

/**
 * Sets TCP_NOTSENT_LOWAT of a connected TCP socket (a TLS socket's too: its handle reports the
 * TCP socket's fd): the kernel takes more bytes only while fewer than `bytes` wait unsent, so the
 * rest waits in the process. Returns the bound the kernel took, or null when the socket has no
 * fd (closed already).
 */
export function setNotSentLowat(socket: Duplex, bytes: number): number | null {
  checkInteger(bytes, 1, 2 ** 30, 'bytes');
  const fd = fdOf(socket);
  return fd === undefined ? null : nativeAddon().setNotSentLowat(fd, bytes);
}

/** The fd of a socket's TCP handle (`_handle.fd`, set for TCP and TLS on Linux), or undefined once closed. */
function fdOf(socket: Duplex): number | undefined {
  const fd = (socket as unknown as { _handle?: { fd?: unknown } })._handle?.fd;
  return typeof fd === 'number' && fd >= 0 ? fd : undefined;
}
