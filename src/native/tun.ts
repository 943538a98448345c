/**
 * TUN devices for the data plane: the only module that loads the native addon (build/Release/mesh_native.node,
 * built by `npm install` through node-gyp from binding.gyp and native/tun.cc). It opens a Linux TUN device
 * (IFF_TUN | IFF_NO_PI, one queue, not persistent: the device disappears when it is closed or the process
 * dies), hands the packets the kernel routes into it to one listener in batches, and writes batches of
 * packets back. Reading is driven by the event loop (uv_poll), never by a thread.
 *
 * Link state, addresses, routes and (unless `mtu` is given) the MTU are set by the caller with `ip`
 * (the data plane's kernel port); this module only owns the file descriptor.
 *
 * Used by src/transports and src/dataplane; imports nothing but Node built-ins.
 */
import { loadAddon } from './load-addon.js';

export interface TunOptions {
  /** MTU to set on the new device (SIOCSIFMTU); left as the kernel's default (1500) when absent. */
  mtu?: number;
  /**
   * A network namespace file (e.g. /run/netns/<name>) to create the device in. The calling thread enters it
   * for the open and the ioctls only and comes back: the device lives there, the fd stays with this process.
   */
  netnsPath?: string;
  /** Most packets handed to the listener at once (default 64). */
  batchPackets?: number;
  /** A batch ends once it holds this many bytes (default 256 KiB; one packet may go past it). */
  batchBytes?: number;
}

export interface TunStats {
  packetsRead: number;
  bytesRead: number;
  /** Listener calls: packetsRead / readBatches is the mean batch size. */
  readBatches: number;
  readErrors: number;
  packetsWritten: number;
  bytesWritten: number;
  /** Packets the kernel refused on write (EIO while the link is down, EINVAL for a non-IP packet, EBADFD once
   * the device was deleted, ENOBUFS, ...). */
  writeDrops: number;
  /** errno code of the last refused write, null if none. */
  lastWriteError: string | null;
}

/** Receives each batch read from the device; the buffers are views into one buffer per batch. */
export type PacketListener = (packets: Buffer[]) => void;
/**
 * A read failure, after which the device no longer polls: a system error with code, errno and syscall,
 * e.g. EBADF from uv_poll when the device was deleted under the open fd (`ip link del`). Close it.
 */
export type TunErrorListener = (error: NodeJS.ErrnoException) => void;

interface NativeTun {
  ifname(): string;
  lengths(): Uint32Array;
  resume(): void;
  pause(): void;
  write(packets: readonly Uint8Array[]): number;
  writeBatch(buffer: Uint8Array, lengths: Uint32Array, count: number): number;
  close(): void;
  stats(): TunStats;
}

interface NativeAddon {
  Tun?: new (
    name: string,
    netnsPath: string | null,
    mtu: number,
    batchPackets: number,
    batchBytes: number,
    onBatch: (batch: Buffer, count: number) => void,
    onError: (error: NodeJS.ErrnoException) => void,
  ) => NativeTun;
}

let addon: NativeAddon | undefined;

/** Loaded on first use, so that importing this module (for its types) never needs the built addon. */
function nativeAddon(): NativeAddon {
  addon ??= loadAddon<NativeAddon>('mesh_native.node');
  return addon;
}

/** An open TUN device. Not reading until a packet listener is set; closed only by close(). */
export class TunDevice {
  /** The interface name, exactly as asked for. */
  readonly name: string;
  readonly #native: NativeTun;
  readonly #lengths: Uint32Array;
  #listener: PacketListener | null = null;
  #errorListener: TunErrorListener | null = null;
  #paused = false;
  #closed = false;

  /** @internal use openTun */
  constructor(name: string, opts: TunOptions) {
    const Native = nativeAddon().Tun;
    if (!Native) throw new Error(`TUN devices are Linux-only (this is ${process.platform})`);
    this.#native = new Native(
      name,
      opts.netnsPath ?? null,
      opts.mtu ?? 0,
      opts.batchPackets ?? 64,
      opts.batchBytes ?? 256 * 1024,
      (batch, count) => this.#dispatch(batch, count),
      (error) => this.#fail(error),
    );
    this.name = this.#native.ifname();
    this.#lengths = this.#native.lengths();
  }

  get closed(): boolean {
    return this.#closed;
  }

  /** Sets (or with null removes) the one packet listener; reading runs while one is set and not paused. */
  onPackets(listener: PacketListener | null): void {
    this.#listener = listener;
    this.#updatePolling();
  }

  /** Sets the read error listener; without one a read error is thrown as an uncaught exception. */
  onError(listener: TunErrorListener | null): void {
    this.#errorListener = listener;
  }

  /** Stops reading (back-pressure): packets wait in the kernel's queue (txqueuelen) and then drop there. */
  pause(): void {
    this.#paused = true;
    this.#updatePolling();
  }

  resume(): void {
    this.#paused = false;
    this.#updatePolling();
  }

  /**
   * Writes each packet with one write() (a TUN fd takes one packet per write) in a single call into native
   * code. Returns how many the kernel took; refused ones are counted in stats().writeDrops. 0 once closed.
   */
  write(packets: readonly Uint8Array[]): number {
    return this.#native.write(packets);
  }

  /** The same for `count` packets laid end to end in one buffer, lengths[i] bytes each. */
  writeBatch(buffer: Uint8Array, lengths: Uint32Array, count: number = lengths.length): number {
    return this.#native.writeBatch(buffer, lengths, count);
  }

  /** Stops reading and closes the fd, which deletes the device. Idempotent; safe inside the listener. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#listener = null;
    this.#native.close();
  }

  stats(): TunStats {
    return this.#native.stats();
  }

  #updatePolling(): void {
    if (this.#closed) return;
    if (this.#listener && !this.#paused) this.#native.resume();
    else this.#native.pause();
  }

  #dispatch(batch: Buffer, count: number): void {
    const listener = this.#listener;
    if (!listener) return;
    const lengths = this.#lengths;
    const packets = new Array<Buffer>(count);
    let offset = 0;
    for (let i = 0; i < count; i++) {
      const end = offset + lengths[i]!;
      packets[i] = batch.subarray(offset, end);
      offset = end;
    }
    listener(packets);
  }

  #fail(error: NodeJS.ErrnoException): void {
    if (!this.#errorListener) throw error;
    this.#errorListener(error);
  }
}

/**
 * Creates the TUN device `name` (1-15 of [A-Za-z0-9._-]) and opens it. Throws a system error (code EPERM
 * without CAP_NET_ADMIN, EBUSY if a device of that name exists, EINVAL for a bad name, ENOENT for a
 * missing namespace) with a message saying what failed.
 */
export function openTun(name: string, opts: TunOptions = {}): TunDevice {
  return new TunDevice(name, opts);
}
