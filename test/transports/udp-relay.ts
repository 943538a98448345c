/**
 * A UDP relay on 127.0.0.1 for the kcp transport's tests and bench: each client (source
 * address:port) gets its own upstream socket towards the target, so the target sees one peer per
 * client and its replies go back to that client. A test can blackhole it (everything dropped both
 * ways, as a cut or a dead host), retarget it (a restarted peer on a new port), drop a seeded
 * random share of datagrams per direction, and hook every datagram (to tamper, record, replay or
 * count). Small on purpose; test/helpers/udp-impair.ts is the full impairment proxy.
 */
import { createSocket, type RemoteInfo, type Socket } from 'node:dgram';
import { prng } from '../helpers/seeded-random.js';

export type RelayDirection = 'up' | 'down';

/** What to forward instead: the datagram (maybe changed), several, or null to drop it. */
export type RelayHook = (direction: RelayDirection, datagram: Buffer) => Buffer | Buffer[] | null;

interface Client {
  address: string;
  port: number;
  upstream: Socket;
}

export class UdpRelay {
  /** Datagrams and bytes forwarded, and dropped (loss, blackhole, hook), per direction. */
  readonly counters = {
    up: { forwarded: 0, bytes: 0, dropped: 0 },
    down: { forwarded: 0, bytes: 0, dropped: 0 },
  };
  blackholed = false;
  /** Percent of datagrams dropped per direction (seeded). */
  lossPct = { up: 0, down: 0 };
  hook: RelayHook | undefined;
  private readonly clients = new Map<string, Client>();
  private readonly random: () => number;

  private constructor(
    private readonly socket: Socket,
    public targetPort: number,
    seed: number,
  ) {
    this.random = prng(seed);
    socket.on('message', (data, rinfo) => this.fromClient(data, rinfo));
    socket.on('error', () => {});
  }

  static async start(targetPort: number, seed = 1): Promise<UdpRelay> {
    const socket = createSocket('udp4');
    await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', () => resolve()));
    for (const set of [socket.setRecvBufferSize, socket.setSendBufferSize])
      try {
        set.call(socket, 4 * 1024 * 1024);
      } catch {}
    return new UdpRelay(socket, targetPort, seed);
  }

  get port(): number {
    return this.socket.address().port;
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  setLoss(pct: number): void {
    this.lossPct = { up: pct, down: pct };
  }

  /** Sends a datagram to the target as if from a client of ours that is not anyone real. */
  async close(): Promise<void> {
    for (const c of this.clients.values()) c.upstream.close();
    this.clients.clear();
    await new Promise<void>((resolve) => this.socket.close(() => resolve()));
  }

  private fromClient(data: Buffer, rinfo: RemoteInfo): void {
    const key = `${rinfo.address}:${rinfo.port}`;
    let client = this.clients.get(key);
    if (!client) {
      const upstream = createSocket('udp4');
      upstream.on('error', () => {});
      const c: Client = { address: rinfo.address, port: rinfo.port, upstream };
      upstream.on('message', (reply) =>
        this.forward('down', reply, (d) => this.socket.send(d, c.port, c.address)),
      );
      upstream.bind(0, '127.0.0.1');
      this.clients.set(key, c);
      client = c;
    }
    const upstream = client.upstream;
    this.forward('up', data, (d) => upstream.send(d, this.targetPort, '127.0.0.1'));
  }

  private forward(direction: RelayDirection, data: Buffer, send: (d: Buffer) => void): void {
    const count = this.counters[direction];
    if (this.blackholed || (this.lossPct[direction] > 0 && this.random() * 100 < this.lossPct[direction])) {
      count.dropped++;
      return;
    }
    const out = this.hook ? this.hook(direction, data) : data;
    if (out === null) {
      count.dropped++;
      return;
    }
    for (const d of Array.isArray(out) ? out : [out]) {
      count.forwarded++;
      count.bytes += d.length;
      try {
        send(d);
      } catch {
        // A socket closed under us (the relay is closing).
      }
    }
  }
}
