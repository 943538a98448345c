/**
 * A UDP impairment proxy for tests and benches (this kernel has no netem): it sits between UDP
 * clients and one UDP server and loses, delays (with jitter), duplicates and reorders what it
 * forwards, per direction, from a seeded PRNG so a run's decisions can be replayed exactly, and can
 * cut the link for an outage window. For the tests and benches of the transports (the `kcp`
 * transport first); nothing under src/ may use it.
 *
 * In-process: `const p = await UdpImpairProxy.start({ listen: '127.0.0.1:0', to: '127.0.0.1:9000',
 * impairment: { lossPct: 5 } })`, then `p.address`, `p.counters`, `p.setOutage(true)`, `p.close()`.
 *
 * CLI (in a network namespace):
 *   ip netns exec NS node dist/test/helpers/udp-impair.js --listen ADDR:PORT --to ADDR:PORT
 *     [--loss P] [--delay-ms D] [--jitter-ms J] [--dup P] [--reorder P] [--reorder-ms R]
 *     [--seed N] [--outage-at-ms T --outage-ms D] [--client-idle-ms I]
 *   Every impairment flag also comes as --FLAG-up / --FLAG-down (client->server / server->client),
 *   which overrides the common value for that direction. IPv6 as [addr]:port.
 *   stdout: one JSON line {"listening":"ADDR:PORT",...} once bound; on SIGTERM/SIGINT one JSON line
 *   of counters (the shape of UdpImpairProxy.counters) and exit 0; SIGUSR2 prints that line without
 *   exiting; SIGUSR1 toggles the outage (a {"outage":bool} line on stderr).
 *
 * Model, per direction:
 * - outage: a datagram that arrives, or would leave, while the link is cut is dropped;
 * - loss: dropped with probability lossPct (the loss stream draws once per datagram that arrives
 *   outside an outage);
 * - dup: a survivor is sent twice with probability dupPct (both copies leave together);
 * - delay/jitter: a survivor leaves delayMs + U(-jitterMs, +jitterMs) (at least 0) after it
 *   arrived, but never before the one ahead of it: jitter alone does not reorder, as on a FIFO link
 *   (so at packet rates above 1 / (2 jitterMs) the delays crowd towards delayMs + jitterMs);
 * - reorder: a survivor is held back reorderMs beyond its delay with probability reorderPct, so the
 *   datagrams behind it overtake it (if any come within reorderMs). `reordered` counts the held ones.
 * Every random decision has its own stream per direction (impairSeed(seed, direction, kind)), each
 * drawn once per survivor whatever the percentages, so a test can replay the decisions with prng().
 * Queued datagrams wait in FIFOs (the normal one and the held-back one are each sorted by
 * construction) under one timer; an unimpaired direction sends at once without queueing.
 *
 * Each client (source address:port) gets an upstream socket of its own, connected to `to`, so the
 * server sees one peer per client and its replies go back to the client that caused them. A client
 * silent for clientIdleMs (to 2x that) is forgotten and its socket closed.
 */
import { createSocket, type RemoteInfo, type Socket } from 'node:dgram';
import { realpathSync } from 'node:fs';
import { isIP } from 'node:net';
import { fileURLToPath } from 'node:url';
import { prng } from './seeded-random.js';

export type Direction = 'up' | 'down';
export type RandomKind = 'loss' | 'dup' | 'reorder' | 'jitter';

export interface Impairment {
  /** Percent (0..100) of datagrams dropped. */
  lossPct: number;
  /** Base one-way delay added, ms. */
  delayMs: number;
  /** The delay varies uniformly within +-jitterMs (never below 0). */
  jitterMs: number;
  /** Percent of forwarded datagrams sent twice. */
  dupPct: number;
  /** Percent of forwarded datagrams held back by reorderMs more, so later ones overtake them. */
  reorderPct: number;
  /** The extra hold of a reordered datagram, ms. */
  reorderMs: number;
}

export const NO_IMPAIRMENT: Readonly<Impairment> = Object.freeze({
  lossPct: 0,
  delayMs: 0,
  jitterMs: 0,
  dupPct: 0,
  reorderPct: 0,
  reorderMs: 10,
});

export interface Endpoint {
  host: string;
  port: number;
}

export interface UdpImpairOptions {
  /** Where clients send to ('127.0.0.1:0' picks a port; see `address`). */
  listen: Endpoint | string;
  /** The server everything is forwarded to. */
  to: Endpoint | string;
  /** Both directions, unless overridden by `up` / `down`. */
  impairment?: Partial<Impairment>;
  /** Client -> server. */
  up?: Partial<Impairment>;
  /** Server -> client. */
  down?: Partial<Impairment>;
  /** PRNG seed (default 1). */
  seed?: number;
  /** A scheduled outage: the link is cut from atMs after start() for durationMs. */
  outage?: { atMs: number; durationMs: number };
  /** Forget a client silent this long (default 300 000 ms; 0 = never). */
  clientIdleMs?: number;
  /** SO_RCVBUF / SO_SNDBUF of every socket (default 4 MiB; the kernel caps it at rmem_max). */
  socketBufferBytes?: number;
}

export interface DirectionCounters {
  /** Datagrams that arrived for this direction. */
  received: number;
  /** Datagrams sent on, duplicate copies included. */
  forwarded: number;
  bytesForwarded: number;
  /** droppedLoss + droppedOutage. */
  dropped: number;
  droppedLoss: number;
  /** Arrived, or were due to leave, during an outage (a duplicated one counts twice). */
  droppedOutage: number;
  /** Datagrams sent twice (each adds one to forwarded). */
  duplicated: number;
  /** Datagrams held back by reorderMs. */
  reordered: number;
  /**
   * up: errors of the upstream sockets (ECONNREFUSED when the server's port is closed, a failed
   * connect) and datagrams due for a client already forgotten; down: the listening socket's errors.
   */
  errors: number;
}

/**
 * Per direction, received - dropped + duplicated = forwarded + queued + errors-from-forgotten-clients
 * (queued is both directions' sum; datagrams waiting for a new upstream socket's connect are briefly
 * in none of them).
 */
export interface ImpairCounters {
  up: DirectionCounters;
  down: DirectionCounters;
  /** Clients currently remembered. */
  clients: number;
  /** Datagrams (copies included) waiting in the delay queues. */
  queued: number;
  outage: boolean;
}

const KIND_SALT: Record<RandomKind, number> = {
  loss: 0x9e3779b9,
  dup: 0x85ebca6b,
  reorder: 0xc2b2ae35,
  jitter: 0x27d4eb2f,
};

/** The seed of one random stream: feed it to prng() to replay that stream's draws. */
export function impairSeed(seed: number, direction: Direction, kind: RandomKind): number {
  // murmur3's finaliser over seed ^ salt: neighbouring seeds give unrelated streams
  let h = (seed ^ KIND_SALT[kind] ^ (direction === 'up' ? 0 : 0x5bd1e995)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** 'ADDR:PORT' or '[V6ADDR]:PORT' (an unbracketed v6 address takes the part after its last colon). */
export function parseEndpoint(text: string): Endpoint {
  let host: string;
  let port: string;
  const bracket = /^\[([^\]]+)\]:(\d+)$/.exec(text);
  if (bracket) {
    host = bracket[1]!;
    port = bracket[2]!;
  } else {
    const colon = text.lastIndexOf(':');
    host = text.slice(0, colon);
    port = text.slice(colon + 1);
  }
  const n = Number(port);
  if (isIP(host) === 0 || !/^\d+$/.test(port) || n > 65535)
    throw new Error(`not an ADDR:PORT with an IP address: ${JSON.stringify(text)}`);
  return { host, port: n };
}

export function formatEndpoint(e: Endpoint): string {
  return isIP(e.host) === 6 ? `[${e.host}]:${e.port}` : `${e.host}:${e.port}`;
}

function toEndpoint(e: Endpoint | string): Endpoint {
  if (typeof e !== 'string') {
    if (isIP(e.host) === 0) throw new Error(`not an IP address: ${e.host}`);
    return e;
  }
  return parseEndpoint(e);
}

function checkImpairment(i: Impairment): Impairment {
  for (const [key, value] of Object.entries(i)) {
    if (typeof value !== 'number' || !Number.isFinite(value) || value < 0)
      throw new Error(`impairment ${key} must be a finite number >= 0, not ${value}`);
    if (key.endsWith('Pct') && value > 100) throw new Error(`impairment ${key} is a percent: ${value} > 100`);
  }
  return i;
}

function emptyCounters(): DirectionCounters {
  return {
    received: 0,
    forwarded: 0,
    bytesForwarded: 0,
    dropped: 0,
    droppedLoss: 0,
    droppedOutage: 0,
    duplicated: 0,
    reordered: 0,
    errors: 0,
  };
}

/** An array queue with a moving head: O(1) push and shift, compacted now and then. */
class Fifo<T> {
  private items: (T | undefined)[] = [];
  private head = 0;

  get size(): number {
    return this.items.length - this.head;
  }

  push(item: T): void {
    this.items.push(item);
  }

  peek(): T | undefined {
    return this.items[this.head];
  }

  shift(): T | undefined {
    const item = this.items[this.head];
    this.items[this.head++] = undefined;
    if (this.head === this.items.length) {
      this.items = [];
      this.head = 0;
    } else if (this.head >= 4096 && this.head * 2 >= this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return item;
  }

  clear(): void {
    this.items = [];
    this.head = 0;
  }
}

interface Client {
  address: string;
  port: number;
  upstream: Socket;
  connected: boolean;
  closed: boolean;
  /** Datagrams released before the upstream socket was connected. */
  pending: Buffer[];
  /** Sent something since the last idle sweep. */
  seen: boolean;
}

interface Queued {
  due: number;
  data: Buffer;
  client: Client;
  copies: number;
}

interface Lane {
  direction: Direction;
  cfg: Impairment;
  counters: DirectionCounters;
  loss: () => number;
  dup: () => number;
  reorder: () => number;
  jitter: () => number;
  /** Datagrams on their way, due times non-decreasing (jitter is clamped to keep the order). */
  normal: Fifo<Queued>;
  /** Reordered datagrams, due times non-decreasing too. */
  held: Fifo<Queued>;
  lastNormalDue: number;
  lastHeldDue: number;
  /** Datagrams in normal and held, copies included. */
  queued: number;
}

export class UdpImpairProxy {
  private readonly lanes: Record<Direction, Lane>;
  private readonly clients = new Map<string, Client>();
  private lastClient: Client | undefined;
  private outage = false;
  private timer: NodeJS.Timeout | undefined;
  private timerDue = Number.POSITIVE_INFINITY;
  private readonly schedule: NodeJS.Timeout[] = [];
  private sweeper: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly bufferBytes: number;
  private readonly toFamily: 'udp4' | 'udp6';

  private constructor(
    private readonly socket: Socket,
    readonly target: Endpoint,
    cfg: Record<Direction, Impairment>,
    opts: UdpImpairOptions,
  ) {
    const seed = opts.seed ?? 1;
    const lane = (direction: Direction): Lane => ({
      direction,
      cfg: cfg[direction],
      counters: emptyCounters(),
      loss: prng(impairSeed(seed, direction, 'loss')),
      dup: prng(impairSeed(seed, direction, 'dup')),
      reorder: prng(impairSeed(seed, direction, 'reorder')),
      jitter: prng(impairSeed(seed, direction, 'jitter')),
      normal: new Fifo(),
      held: new Fifo(),
      lastNormalDue: 0,
      lastHeldDue: 0,
      queued: 0,
    });
    this.lanes = { up: lane('up'), down: lane('down') };
    this.bufferBytes = opts.socketBufferBytes ?? 4 << 20;
    this.toFamily = isIP(target.host) === 6 ? 'udp6' : 'udp4';
  }

  static async start(opts: UdpImpairOptions): Promise<UdpImpairProxy> {
    const listen = toEndpoint(opts.listen);
    const to = toEndpoint(opts.to);
    const cfg = (d: Direction) => checkImpairment({ ...NO_IMPAIRMENT, ...opts.impairment, ...opts[d] });
    const impairment = { up: cfg('up'), down: cfg('down') };
    const bytes = opts.socketBufferBytes ?? 4 << 20;
    const socket = createSocket({
      type: isIP(listen.host) === 6 ? 'udp6' : 'udp4',
      recvBufferSize: bytes,
      sendBufferSize: bytes,
    });
    const proxy = new UdpImpairProxy(socket, to, impairment, opts);
    await new Promise<void>((resolve, reject) => {
      socket.once('error', reject);
      socket.bind(listen.port, listen.host, () => {
        socket.off('error', reject);
        resolve();
      });
    });
    socket.on('message', proxy.onClientMessage);
    // the listening socket sends the down direction; a failed send to a client is that direction's
    socket.on('error', () => proxy.lanes.down.counters.errors++);
    if (opts.outage) {
      const { atMs, durationMs } = opts.outage;
      proxy.schedule.push(
        setTimeout(() => proxy.setOutage(true), atMs),
        setTimeout(() => proxy.setOutage(false), atMs + durationMs),
      );
    }
    const idle = opts.clientIdleMs ?? 300_000;
    if (idle > 0) {
      proxy.sweeper = setInterval(() => proxy.sweepIdle(), idle);
      proxy.sweeper.unref();
    }
    return proxy;
  }

  /** Where the proxy listens (the bound port when started on port 0). */
  get address(): Endpoint {
    const a = this.socket.address();
    return { host: a.address, port: a.port };
  }

  /** A snapshot of the counters. */
  get counters(): ImpairCounters {
    return {
      up: { ...this.lanes.up.counters },
      down: { ...this.lanes.down.counters },
      clients: this.clients.size,
      queued: this.lanes.up.queued + this.lanes.down.queued,
      outage: this.outage,
    };
  }

  get inOutage(): boolean {
    return this.outage;
  }

  /** Cuts (true) or restores (false) the link in both directions. */
  setOutage(on: boolean): void {
    this.outage = on;
  }

  toggleOutage(): boolean {
    this.outage = !this.outage;
    return this.outage;
  }

  /** The impairment of one direction now. */
  impairment(direction: Direction): Impairment {
    return { ...this.lanes[direction].cfg };
  }

  /**
   * Changes the impairment from now on (datagrams already queued keep their times). The random
   * streams go on where they were.
   */
  setImpairment(direction: Direction | 'both', change: Partial<Impairment>): void {
    for (const d of direction === 'both' ? (['up', 'down'] as const) : [direction]) {
      const lane = this.lanes[d];
      lane.cfg = checkImpairment({ ...lane.cfg, ...change });
    }
  }

  /** Closes every socket; queued datagrams are discarded. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.timer);
    clearInterval(this.sweeper);
    for (const t of this.schedule) clearTimeout(t);
    for (const lane of Object.values(this.lanes)) {
      lane.normal.clear();
      lane.held.clear();
      lane.queued = 0;
    }
    const closing = [...this.clients.values()].map((c) => this.closeClient(c));
    this.clients.clear();
    closing.push(new Promise<void>((resolve) => this.socket.close(() => resolve())));
    await Promise.all(closing);
  }

  private readonly onClientMessage = (data: Buffer, rinfo: RemoteInfo): void => {
    let client = this.lastClient;
    if (client === undefined || client.port !== rinfo.port || client.address !== rinfo.address) {
      client = this.clients.get(`${rinfo.address} ${rinfo.port}`) ?? this.addClient(rinfo);
      this.lastClient = client;
    }
    client.seen = true;
    this.impair(this.lanes.up, data, client);
  };

  private addClient(rinfo: RemoteInfo): Client {
    const upstream = createSocket({
      type: this.toFamily,
      recvBufferSize: this.bufferBytes,
      sendBufferSize: this.bufferBytes,
    });
    const client: Client = {
      address: rinfo.address,
      port: rinfo.port,
      upstream,
      connected: false,
      closed: false,
      pending: [],
      seen: true,
    };
    this.clients.set(`${rinfo.address} ${rinfo.port}`, client);
    upstream.on('message', (data: Buffer) => this.impair(this.lanes.down, data, client));
    upstream.on('error', () => {
      this.lanes.up.counters.errors++;
      if (!client.connected) {
        // the connect itself failed (no route): forget the client so its next datagram retries
        client.pending = [];
        this.forget(client);
      }
    });
    // connected: the kernel fills in the destination and drops anything not from the server
    upstream.connect(this.target.port, this.target.host, () => {
      client.connected = true;
      for (const data of client.pending.splice(0)) this.sendUp(client, data, 1);
    });
    return client;
  }

  private forget(client: Client): void {
    const key = `${client.address} ${client.port}`;
    if (this.clients.get(key) === client) this.clients.delete(key);
    if (this.lastClient === client) this.lastClient = undefined;
    void this.closeClient(client);
  }

  private closeClient(client: Client): Promise<void> {
    if (client.closed) return Promise.resolve();
    client.closed = true;
    return new Promise<void>((resolve) => {
      try {
        client.upstream.close(() => resolve());
      } catch {
        resolve(); // already closed by a failed connect
      }
    });
  }

  private sweepIdle(): void {
    for (const client of [...this.clients.values()]) {
      if (client.seen) client.seen = false;
      else this.forget(client);
    }
  }

  private impair(lane: Lane, data: Buffer, client: Client): void {
    const c = lane.counters;
    c.received++;
    if (this.outage) {
      c.dropped++;
      c.droppedOutage++;
      return;
    }
    const cfg = lane.cfg;
    if (lane.loss() * 100 < cfg.lossPct) {
      c.dropped++;
      c.droppedLoss++;
      return;
    }
    // every stream draws once per survivor, so each one's decisions replay whatever the others do
    const copies = lane.dup() * 100 < cfg.dupPct ? 2 : 1;
    const reorder = lane.reorder() * 100 < cfg.reorderPct;
    const jitter = (lane.jitter() * 2 - 1) * cfg.jitterMs;
    if (copies === 2) c.duplicated++;
    if (!reorder && cfg.delayMs === 0 && cfg.jitterMs === 0 && lane.normal.size === 0) {
      this.send(lane, client, data, copies);
      return;
    }
    let due = performance.now() + Math.max(0, cfg.delayMs + jitter);
    if (reorder) {
      c.reordered++;
      due = Math.max(due + cfg.reorderMs, lane.lastHeldDue);
      lane.lastHeldDue = due;
      lane.held.push({ due, data, client, copies });
    } else {
      due = Math.max(due, lane.lastNormalDue);
      lane.lastNormalDue = due;
      lane.normal.push({ due, data, client, copies });
    }
    lane.queued += copies;
    this.arm(due);
  }

  /** One timer for all queues, set for the earliest due time. */
  private arm(due: number): void {
    if (this.timer !== undefined) {
      if (this.timerDue <= due) return;
      clearTimeout(this.timer);
    }
    this.timerDue = due;
    this.timer = setTimeout(this.onTimer, Math.max(1, Math.ceil(due - performance.now())));
  }

  private readonly onTimer = (): void => {
    this.timer = undefined;
    this.timerDue = Number.POSITIVE_INFINITY;
    // the timer may fire a little early (libuv's cached loop time): what is not due yet waits
    const now = performance.now();
    let next = Number.POSITIVE_INFINITY;
    for (const lane of [this.lanes.up, this.lanes.down]) {
      for (const q of [lane.normal, lane.held]) {
        for (let e = q.peek(); e !== undefined; e = q.peek()) {
          if (e.due > now) {
            next = Math.min(next, e.due);
            break;
          }
          q.shift();
          lane.queued -= e.copies;
          this.send(lane, e.client, e.data, e.copies);
        }
      }
    }
    if (next !== Number.POSITIVE_INFINITY) this.arm(next);
  };

  private send(lane: Lane, client: Client, data: Buffer, copies: number): void {
    if (this.outage) {
      lane.counters.dropped += copies;
      lane.counters.droppedOutage += copies;
      return;
    }
    if (lane.direction === 'up') this.sendUp(client, data, copies);
    else {
      for (let i = 0; i < copies; i++) this.socket.send(data, client.port, client.address);
      lane.counters.forwarded += copies;
      lane.counters.bytesForwarded += data.length * copies;
    }
  }

  private sendUp(client: Client, data: Buffer, copies: number): void {
    const c = this.lanes.up.counters;
    if (client.closed) {
      c.errors += copies;
      return;
    }
    if (!client.connected) {
      for (let i = 0; i < copies; i++) client.pending.push(data);
      return;
    }
    for (let i = 0; i < copies; i++) client.upstream.send(data);
    c.forwarded += copies;
    c.bytesForwarded += data.length * copies;
  }
}

const FLAG_KEYS: Record<string, keyof Impairment> = {
  loss: 'lossPct',
  'delay-ms': 'delayMs',
  'jitter-ms': 'jitterMs',
  dup: 'dupPct',
  reorder: 'reorderPct',
  'reorder-ms': 'reorderMs',
};

const USAGE = `usage: node udp-impair.js --listen ADDR:PORT --to ADDR:PORT [--loss P] [--delay-ms D]
  [--jitter-ms J] [--dup P] [--reorder P] [--reorder-ms R] [--seed N] [--outage-at-ms T --outage-ms D]
  [--client-idle-ms I]   (impairment flags also as --FLAG-up / --FLAG-down; IPv6 as [addr]:port)
signals: SIGUSR1 toggles the outage, SIGUSR2 prints the counters, SIGTERM/SIGINT print them and exit`;

/** Parses the CLI's arguments into start() options (throws with the reason on a bad one). */
export function parseArgs(argv: string[]): UdpImpairOptions {
  const common: Partial<Impairment> = {};
  const up: Partial<Impairment> = {};
  const down: Partial<Impairment> = {};
  let listen: string | undefined;
  let to: string | undefined;
  let seed: number | undefined;
  let outageAt: number | undefined;
  let outageMs: number | undefined;
  let idle: number | undefined;
  for (let i = 0; i < argv.length; i += 2) {
    const flag = argv[i]!;
    const value = argv[i + 1];
    if (!flag.startsWith('--') || value === undefined) throw new Error(`expected --flag value at ${flag}`);
    const name = flag.slice(2);
    const num = () => {
      const n = Number(value);
      if (value.trim() === '' || !Number.isFinite(n) || n < 0) throw new Error(`${flag} needs a number >= 0`);
      return n;
    };
    const m = /^(.*?)(?:-(up|down))?$/.exec(name)!;
    const key = FLAG_KEYS[m[1]!];
    if (key !== undefined) {
      const into = m[2] === 'up' ? up : m[2] === 'down' ? down : common;
      into[key] = num();
    } else if (name === 'listen') listen = value;
    else if (name === 'to') to = value;
    else if (name === 'seed') seed = num();
    else if (name === 'outage-at-ms') outageAt = num();
    else if (name === 'outage-ms') outageMs = num();
    else if (name === 'client-idle-ms') idle = num();
    else throw new Error(`unknown flag ${flag}`);
  }
  if (listen === undefined || to === undefined) throw new Error('--listen and --to are required');
  if ((outageAt === undefined) !== (outageMs === undefined))
    throw new Error('--outage-at-ms and --outage-ms go together');
  const opts: UdpImpairOptions = {
    listen: parseEndpoint(listen),
    to: parseEndpoint(to),
    impairment: common,
    up,
    down,
  };
  if (seed !== undefined) opts.seed = seed;
  if (outageAt !== undefined && outageMs !== undefined)
    opts.outage = { atMs: outageAt, durationMs: outageMs };
  if (idle !== undefined) opts.clientIdleMs = idle;
  return opts;
}

async function main(argv: string[]): Promise<void> {
  let opts: UdpImpairOptions;
  try {
    opts = parseArgs(argv);
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n${USAGE}\n`);
    process.exit(2);
  }
  const proxy = await UdpImpairProxy.start(opts);
  const line = (o: unknown) => `${JSON.stringify(o)}\n`;
  // handlers before the listening line: a parent may signal the moment it reads that line, and a
  // signal that comes before its handler is lost (seen with Node 20)
  process.on('SIGUSR1', () => process.stderr.write(line({ outage: proxy.toggleOutage() })));
  process.on('SIGUSR2', () => process.stdout.write(line(proxy.counters)));
  const stop = () => {
    const counters = proxy.counters;
    void proxy.close().then(() => process.stdout.write(line(counters), () => process.exit(0)));
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
  process.stdout.write(
    line({
      listening: formatEndpoint(proxy.address),
      to: formatEndpoint(proxy.target),
      up: proxy.impairment('up'),
      down: proxy.impairment('down'),
      seed: opts.seed ?? 1,
      outage: opts.outage ?? null,
    }),
  );
}

function isEntry(): boolean {
  try {
    const entry = process.argv[1];
    return entry !== undefined && realpathSync(entry) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false; // argv[1] is not a file (node -e, a REPL)
  }
}

if (isEntry()) {
  main(process.argv.slice(2)).catch((err: unknown) => {
    process.stderr.write(`udp-impair: ${(err as Error).stack ?? String(err)}\n`);
    process.exit(1);
  });
}
