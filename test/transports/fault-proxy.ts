/**
 * A TCP proxy on 127.0.0.1 that a test can turn against the connections it carries: blackhole
 * (stop forwarding without closing anything, as a dead host or a partition looks to TCP), tamper
 * (flip one byte of the next chunk in one direction) and record (every byte each client sent, to
 * replay it later). Used by the transport compliance world and the tcp security tests.
 */
import net from 'node:net';

interface Carried {
  client: net.Socket;
  upstream: net.Socket | undefined;
  /** Bytes the client sent, in order. */
  sent: Buffer[];
  /** Blackholed: nothing passes and no close is passed on; dropped when the proxy is restored. */
  frozen: boolean;
}

export type Direction = 'to-server' | 'to-client';

export class FaultProxy {
  private readonly server: net.Server;
  private readonly carried = new Set<Carried>();
  private readonly finished: Buffer[] = [];
  private blackholed = false;
  private tamper: { direction: Direction; done: (flipped: Buffer) => void } | undefined;

  private constructor(
    public targetPort: number,
    private readonly targetHost: string,
  ) {
    this.server = net.createServer((client) => this.carry(client));
  }

  static async start(targetPort: number, targetHost = '127.0.0.1'): Promise<FaultProxy> {
    const proxy = new FaultProxy(targetPort, targetHost);
    await new Promise<void>((resolve, reject) => {
      proxy.server.once('error', reject);
      proxy.server.listen(0, '127.0.0.1', () => resolve());
    });
    return proxy;
  }

  get port(): number {
    return (this.server.address() as net.AddressInfo).port;
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** Stops forwarding: connections stay open but silent both ways; new ones are held silent too. */
  blackhole(): void {
    this.blackholed = true;
    for (const c of this.carried) c.frozen = true;
  }

  /**
   * Forwards new connections again. Of the silenced ones, the client side is dropped (a pending
   * dial fails fast and is retried) while the server side stays silent until its owner gives up
   * on it: a host that restarted does not close its old connections at the peer.
   */
  restore(): void {
    this.blackholed = false;
    for (const c of this.carried) if (c.frozen) c.client.destroy();
  }

  get isBlackholed(): boolean {
    return this.blackholed;
  }

  /** Flips one byte (the last) of the next chunk going that way; resolves with the chunk as sent. */
  tamperNext(direction: Direction): Promise<Buffer> {
    return new Promise((done) => {
      this.tamper = { direction, done };
    });
  }

  /** Everything each client sent, one buffer per connection (open and closed ones), oldest first. */
  recorded(): Buffer[] {
    return [...this.finished, ...[...this.carried].map((c) => Buffer.concat(c.sent))];
  }

  /** Connections currently carried (not counting silenced ones). */
  get open(): number {
    let n = 0;
    for (const c of this.carried) if (!c.frozen) n++;
    return n;
  }

  async close(): Promise<void> {
    for (const c of this.carried) {
      c.client.destroy();
      c.upstream?.destroy();
    }
    this.carried.clear();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private carry(client: net.Socket): void {
    const c: Carried = { client, upstream: undefined, sent: [], frozen: this.blackholed };
    this.carried.add(c);
    client.setNoDelay(true);
    client.on('error', () => {});
    if (c.frozen) {
      client.on('data', () => {});
      return;
    }
    const upstream = net.connect({ host: this.targetHost, port: this.targetPort });
    c.upstream = upstream;
    upstream.setNoDelay(true);
    upstream.on('error', () => {});
    client.pause();
    upstream.once('connect', () => client.resume());
    this.pipe(c, client, upstream, 'to-server');
    this.pipe(c, upstream, client, 'to-client');
  }

  private pipe(c: Carried, from: net.Socket, to: net.Socket, direction: Direction): void {
    from.on('data', (chunk: Buffer) => {
      if (c.frozen) return;
      let out = chunk;
      if (this.tamper?.direction === direction) {
        const { done } = this.tamper;
        this.tamper = undefined;
        out = Buffer.from(chunk);
        out[out.length - 1]! ^= 0x01;
        done(out);
      }
      if (direction === 'to-server') c.sent.push(Buffer.from(chunk));
      if (!to.write(out)) {
        from.pause();
        to.once('drain', () => from.resume());
      }
    });
    // A close is passed on, unless the connection is silenced (a dead host sends no FIN).
    from.on('close', () => {
      if (c.frozen) return;
      to.destroy();
      if (this.carried.delete(c)) this.finished.push(Buffer.concat(c.sent));
    });
  }
}
