/**
 * An in-memory twin of LinuxKernel for unit tests of the data plane (reconciler, glue): it keeps
 * the owned kernel state, writes the command lines the real kernel would get to `transcript`
 * (rendered by render.ts, so they are the real text), hands out fake TUN devices whose written
 * packets can be read and which can inject packets, and refuses what the real kernel refuses
 * when that matters to a caller: adding an existing link/address/rule/route, deleting a missing
 * one, an address on a missing link, a route through a missing or down device. The same
 * scenario runs against both in test/dataplane/kernel-port.root.test.ts so the twin cannot drift.
 *
 * Kernel behaviours it copies (checked against Linux 6.x by that test, except where noted):
 * - a batch stops at the first failing line; the lines before it stay applied;
 * - `rule del` deletes the FIRST rule (by pref, then age) that matches every selector given, so a
 *   rule without `from` can delete one that has a `from`; `rule add` refuses a rule equal to an
 *   existing one, where a missing from/to in the new rule matches any (a kernel quirk);
 * - deleting a link removes its addresses and the routes through it (and the MACVLANs on it:
 *   not checked there, the test's parent is a veth the twin does not pair);
 *   closing a TUN removes its link the same way; rules naming it stay;
 * - deleting a primary IPv4 address removes the secondaries of its subnet (promote_secondaries
 *   is 0 in a new namespace); an IPv6 address exists once per link whatever its prefix;
 * - an IPv6 route destination loses its host bits, an IPv4 one with host bits is refused.
 * What it does not check: the nft ruleset's syntax (only balanced braces, like render.ts), routes
 * to gateways, link up/down after the fact, packet forwarding.
 */
import {
  canonicalAddress,
  canonicalCidr,
  canonicalDst,
  canonicalNft,
  canonicalRoute,
  canonicalRule,
  hasHostBits,
  masked,
  type ParsedCidr,
  parseCidrLoose,
} from './canonical.js';
import { isOwnedPref, isOwnedTable, isPacerPeerName, LINK_PREFIX, pacerOfPeer } from './ownership.js';
import {
  type AddressSpec,
  type Family,
  type KernelChange,
  KernelError,
  type KernelPort,
  type KernelState,
  type LinkSpec,
  type RouteAnswer,
  type RouteQuery,
  type RouteSpec,
  type RuleSpec,
  type Tun,
  type Uplink,
} from './port.js';
import { checkLinkName, commandsOf, type Rendered, renderChange, renderNft } from './render.js';

export interface RecordingKernelOptions {
  /**
   * Links that exist and are not the agent's, with their MTU (MACVLAN parents, route devices).
   * Default: only `lo`. They are up and never reported by observe().
   */
  foreignLinks?: Record<string, number>;
  sysctls?: Record<string, string>;
  /** writeSysctl fails as on a read-only /proc/sys. */
  readOnlySysctls?: boolean;
  uplink?: Uplink | null;
}

/** How many packets a paused fake TUN queues before dropping (a TUN's default txqueuelen). */
export const TUN_QUEUE = 500;

/** A fake TUN device: what the agent writes is kept in `written`; `inject` plays the kernel. */
export class RecordingTun implements Tun {
  /** Copies of every packet the kernel took from write(), in order. */
  readonly written: Buffer[] = [];
  /** How many packets one write() takes at most (a full queue takes fewer). */
  writeLimit = Number.POSITIVE_INFINITY;
  /** Packets inject() dropped while paused with a full queue. */
  dropped = 0;
  private readonly listeners: ((packets: Buffer[]) => void)[] = [];
  private errorListener: ((error: Error) => void) | null = null;
  private queue: Buffer[] = [];
  private paused = false;
  private state: 'open' | 'detached' | 'closed' = 'open';

  constructor(
    readonly name: string,
    private readonly onClose: (tun: RecordingTun) => void,
  ) {}

  get closed(): boolean {
    return this.state === 'closed';
  }
  /** The link was deleted under the open device (flush, `link del`): writes take nothing. */
  get detached(): boolean {
    return this.state === 'detached';
  }
  get isPaused(): boolean {
    return this.paused;
  }

  onPackets(listener: (packets: Buffer[]) => void): void {
    this.listeners.push(listener);
  }

  onError(listener: (error: Error) => void): void {
    this.errorListener = listener;
  }

  write(packets: readonly Buffer[]): number {
    if (this.state === 'closed') throw new Error(`TUN ${this.name} is closed`);
    if (this.state === 'detached') return 0;
    const taken = packets.slice(0, Math.min(packets.length, this.writeLimit));
    for (const p of taken) this.written.push(Buffer.from(p));
    return taken.length;
  }

  /**
   * The kernel routes packets into the device: listeners get them now (synchronously), or, while
   * paused, they wait in a queue of TUN_QUEUE packets and the rest are dropped.
   */
  inject(packets: readonly Buffer[]): void {
    if (this.state !== 'open') throw new Error(`TUN ${this.name} is ${this.state}`);
    if (!this.paused) {
      this.deliver([...packets]);
      return;
    }
    const room = Math.max(0, TUN_QUEUE - this.queue.length);
    this.queue.push(...packets.slice(0, room));
    this.dropped += Math.max(0, packets.length - room);
  }

  pause(): void {
    this.paused = true;
  }

  resume(): void {
    this.paused = false;
    const queued = this.queue;
    this.queue = [];
    if (queued.length && this.state === 'open') this.deliver(queued);
  }

  close(): void {
    if (this.state === 'closed') return;
    this.state = 'closed';
    this.queue = [];
    this.onClose(this);
  }

  /**
   * Called by the kernel twin when the link goes away while the device is open. As the real
   * device's poll does (src/native/tun.ts), the error listener hears of it on a later turn.
   */
  detach(): void {
    if (this.state !== 'open') return;
    this.state = 'detached';
    this.queue = [];
    setImmediate(() => {
      if (this.state !== 'detached') return;
      const error = Object.assign(new Error(`TUN device '${this.name}' failed while polling (deleted?)`), {
        code: 'EBADF',
      });
      this.errorListener?.(error);
    });
  }

  private deliver(packets: Buffer[]): void {
    for (const l of this.listeners) l(packets);
  }
}

interface FakeLink {
  name: string;
  /** A pacer stands for its veth pair: its peer has no entry of its own. */
  kind: 'tun' | 'macvlan' | 'pacer' | 'foreign';
  parent?: string;
  mac?: string;
  rateBps?: number;
  peerAddress?: string;
  mtu: number;
  up: boolean;
  tun?: RecordingTun;
}

interface FakeAddress {
  dev: string;
  cidr: string;
  parsed: ParsedCidr;
}

/** A line failed: the kernel's message (the twin's words are the real tools' where it matters). */
class LineFailure {
  constructor(readonly output: string) {}
}
const fail = (output: string): never => {
  throw new LineFailure(output);
};
const noDevice = (name: string): never => fail(`Cannot find device "${name}"`);

const sameSubnet = (a: ParsedCidr, b: ParsedCidr): boolean =>
  a.prefix === b.prefix && Buffer.compare(masked(a).bytes, masked(b).bytes) === 0;

export class RecordingKernel implements KernelPort {
  /** Every routeGet query, in order. */
  readonly routeQueries: RouteQuery[] = [];
  private readonly routeAnswers = new Map<string, RouteAnswer | null>();
  /** Every command line applied (or attempted: a failing line is its last entry), in order. */
  readonly transcript: string[] = [];
  readonly sysctls: Map<string, string>;
  /** Every writeSysctl that took effect, as `key=value`, in order. */
  readonly sysctlWrites: string[] = [];
  readOnlySysctls: boolean;
  uplinkValue: Uplink | null;
  private readonly links = new Map<string, FakeLink>();
  private addresses: FakeAddress[] = [];
  private readonly rules: Record<Family, RuleSpec[]> = { 4: [], 6: [] };
  private routes: RouteSpec[] = [];
  private nft: string | null = null;
  private readonly failures: { match: string | RegExp; output: string }[] = [];

  constructor(options: RecordingKernelOptions = {}) {
    for (const [name, mtu] of Object.entries(options.foreignLinks ?? { lo: 65_536 })) {
      this.links.set(name, { name, kind: 'foreign', mtu, up: true });
    }
    this.sysctls = new Map(Object.entries(options.sysctls ?? {}));
    this.readOnlySysctls = options.readOnlySysctls ?? false;
    this.uplinkValue = options.uplink ?? null;
  }

  /** The TUN devices opened and not closed, by name. */
  get tuns(): ReadonlyMap<string, RecordingTun> {
    const out = new Map<string, RecordingTun>();
    for (const l of this.links.values()) if (l.tun && !l.tun.closed) out.set(l.name, l.tun);
    return out;
  }

  /**
   * Makes the next command whose text contains `match` (or matches it) fail with `output`, as if
   * the kernel refused it. Once per call.
   */
  failOn(match: string | RegExp, output = 'RTNETLINK answers: Operation not permitted'): void {
    this.failures.push({ match, output });
  }

  openTun(name: string): Tun {
    checkLinkName(name);
    if (this.links.has(name)) throw new Error(`TUNSETIFF ${name}: Device or resource busy`);
    const tun = new RecordingTun(name, (t) => {
      const link = this.links.get(name);
      if (link?.tun === t) this.removeLink(name);
    });
    this.links.set(name, { name, kind: 'tun', mtu: 1500, up: false, tun });
    return tun;
  }

  async observe(): Promise<KernelState> {
    const owned = [...this.links.values()].filter(
      (l) => l.kind !== 'foreign' && l.name.startsWith(LINK_PREFIX),
    );
    const names = new Set(owned.map((l) => l.name));
    return {
      links: owned.map((l) => {
        const spec: LinkSpec = { name: l.name, kind: l.kind as LinkSpec['kind'], mtu: l.mtu };
        if (l.parent !== undefined) spec.parent = l.parent;
        if (l.mac !== undefined) spec.mac = l.mac;
        if (l.rateBps !== undefined) spec.rateBps = l.rateBps;
        if (l.peerAddress !== undefined) spec.peerAddress = l.peerAddress;
        return spec;
      }),
      addresses: this.addresses.filter((a) => names.has(a.dev)).map((a) => ({ dev: a.dev, cidr: a.cidr })),
      rules: [...this.rules[4], ...this.rules[6]]
        .filter((r) => isOwnedPref(r.pref))
        .map((r) => structuredClone(r)),
      routes: this.routes.filter((r) => isOwnedTable(r.table)).map((r) => ({ ...r })),
      nft: this.nft,
    };
  }

  async apply(changes: readonly KernelChange[]): Promise<void> {
    const rendered = changes.map(renderChange);
    changes.forEach((change, i) => {
      // One step per line across the change's tools, in order.
      const steps = this.steps(change);
      let next = 0;
      for (const r of rendered[i]!) {
        this.run(r, steps.slice(next, next + r.lines.length));
        next += r.lines.length;
      }
    });
  }

  async flush(): Promise<void> {
    // The same commands, in the same order, as LinuxKernel.flush().
    for (const family of [4, 6] as const) {
      for (const r of this.rules[family].filter((x) => isOwnedPref(x.pref))) {
        this.run({ tool: family === 4 ? 'ip -4' : 'ip -6', lines: [`rule del pref ${r.pref}`] }, [
          () => this.removeRule(family, r),
        ]);
      }
      const tables = [
        ...new Set(
          this.routes.filter((r) => r.family === family && isOwnedTable(r.table)).map((r) => r.table),
        ),
      ];
      for (const t of tables.sort((a, b) => a - b)) {
        this.run({ tool: family === 4 ? 'ip -4' : 'ip -6', lines: [`route flush table ${t}`] }, [
          () => {
            this.routes = this.routes.filter((r) => r.family !== family || r.table !== t);
          },
        ]);
      }
    }
    if (this.nft !== null)
      this.run(renderNft(null), [
        () => {},
        () => {
          this.nft = null;
        },
      ]);
    for (const l of [...this.links.values()]) {
      if (l.kind === 'foreign' || !l.name.startsWith(LINK_PREFIX) || !this.links.has(l.name)) continue;
      this.run({ tool: 'ip', lines: [`link del ${l.name}`] }, [() => this.removeLink(l.name)]);
    }
  }

  async readSysctl(key: string): Promise<string | null> {
    return this.sysctls.get(key) ?? null;
  }

  async writeSysctl(key: string, value: string): Promise<void> {
    const path = `/proc/sys/${key.replaceAll('.', '/')}`;
    if (this.readOnlySysctls) throw new KernelError(`write ${path}`, 'EROFS: read-only file system');
    // An interface's keys exist while the interface does; global ones only if the test set them.
    const iface = /^net\.ipv[46]\.conf\.([^.]+)\./.exec(key)?.[1];
    // A pacer's peer has no entry of its own: it exists with its pacer.
    const link = iface && isPacerPeerName(iface) ? pacerOfPeer(iface) : iface;
    const exists = link && !['all', 'default'].includes(link) ? this.links.has(link) : this.sysctls.has(key);
    if (!exists) throw new KernelError(`write ${path}`, 'ENOENT: no such file or directory');
    this.sysctls.set(key, value);
    this.sysctlWrites.push(`${key}=${value}`);
  }

  async uplink(): Promise<Uplink | null> {
    return this.uplinkValue;
  }

  /** The answer routeGet gives for `dst` from now on (null: no route), whatever the query's other fields. */
  answerRouteGet(dst: string, answer: RouteAnswer | null): void {
    this.routeAnswers.set(dst, answer);
  }

  /** The answer set for the destination, else the uplink, up (a twin with no routing of its own). */
  async routeGet(queries: readonly RouteQuery[]): Promise<(RouteAnswer | null)[]> {
    return queries.map((q) => {
      this.routeQueries.push(q);
      if (this.routeAnswers.has(q.dst)) return this.routeAnswers.get(q.dst)!;
      const u = this.uplinkValue;
      const six = q.dst.includes(':');
      return u
        ? {
            dev: u.dev,
            gateway: six ? u.gateway6 : u.gateway4,
            prefix: six ? '::/0' : '0.0.0.0/0',
            usable: true,
            operstate: 'UP',
          }
        : null;
    });
  }

  /** Runs one rendered change line by line: one step per line, each may fail with the kernel's words. */
  private run(r: Rendered, steps: (() => void)[]): void {
    if (r.onlyIfLinkExists !== undefined && !this.links.has(r.onlyIfLinkExists)) return;
    const commands = commandsOf(r);
    if (r.tool === 'nft') {
      // One transaction: all of it or nothing.
      this.transcript.push(...commands);
      for (const c of commands) this.injectedFailure(c);
      for (const step of steps) step();
      return;
    }
    commands.forEach((command, i) => {
      this.transcript.push(command);
      this.injectedFailure(command);
      try {
        steps[i]!();
      } catch (err) {
        if (err instanceof LineFailure) throw new KernelError(command, err.output);
        throw err;
      }
    });
  }

  private injectedFailure(command: string): void {
    const i = this.failures.findIndex((f) =>
      typeof f.match === 'string' ? command.includes(f.match) : f.match.test(command),
    );
    if (i < 0) return;
    const [f] = this.failures.splice(i, 1);
    throw new KernelError(command, f!.output);
  }

  /** One step per rendered line of the change. */
  private steps(change: KernelChange): (() => void)[] {
    if ('link' in change) {
      const l = change.link;
      if (change.op === 'del') return [() => this.removeLink(l.name, true)];
      const up = () => this.setLink(l.name, l.mtu);
      if (l.kind === 'tun') return [up];
      if (l.kind === 'pacer') {
        // The pair with its peer's address and queue: made by its first line, the rest set it up.
        const lines = renderChange(change).reduce((n, r) => n + r.lines.length, 0);
        return [() => this.addPacer(l), ...Array.from({ length: lines - 1 }, () => () => {})];
      }
      return [() => this.addMacvlan(l.name, l.parent!, l.mac), up];
    }
    if ('address' in change) {
      const a = canonicalAddress(change.address);
      return [change.op === 'add' ? () => this.addAddress(a) : () => this.delAddress(a)];
    }
    if ('rule' in change) {
      const r = canonicalRule(change.rule);
      return [change.op === 'add' ? () => this.addRule(r) : () => this.delRule(r)];
    }
    if ('route' in change) {
      const r = change.route;
      return [change.op === 'add' ? () => this.addRoute(r) : () => this.delRoute(r)];
    }
    const ruleset = change.ruleset;
    return ruleset === null
      ? [
          () => {},
          () => {
            this.nft = null;
          },
        ]
      : [
          () => {},
          () => {},
          () => {
            this.nft = canonicalNft(ruleset);
          },
        ];
  }

  private existing(name: string): FakeLink {
    return this.links.get(name) ?? noDevice(name);
  }

  private setLink(name: string, mtu: number): void {
    const link = this.existing(name);
    if (mtu < 68) fail('Error: mtu less than device minimum.');
    const max = link.kind === 'macvlan' ? this.existing(link.parent!).mtu : 65_535;
    if (mtu > max)
      fail(
        link.kind === 'macvlan'
          ? 'RTNETLINK answers: Invalid argument'
          : 'Error: mtu greater than device maximum.',
      );
    link.mtu = mtu;
    link.up = true;
  }

  private addPacer(l: LinkSpec): void {
    if (this.links.has(l.name)) fail('RTNETLINK answers: File exists');
    const link: FakeLink = { name: l.name, kind: 'pacer', mtu: l.mtu, up: true };
    if (l.rateBps !== undefined) link.rateBps = l.rateBps;
    if (l.peerAddress !== undefined) link.peerAddress = canonicalCidr(l.peerAddress);
    this.links.set(l.name, link);
  }

  private addMacvlan(name: string, parent: string, mac: string | undefined): void {
    if (this.links.has(name)) fail('RTNETLINK answers: File exists');
    const lower = this.existing(parent);
    const link: FakeLink = { name, kind: 'macvlan', parent, mtu: lower.mtu, up: false };
    if (mac !== undefined) link.mac = mac;
    this.links.set(name, link);
  }

  /** Removes a link with its addresses, the routes through it and the MACVLANs on it. */
  private removeLink(name: string, mustExist = false): void {
    const link = this.links.get(name);
    if (!link) {
      if (mustExist) noDevice(name);
      return;
    }
    this.links.delete(name);
    link.tun?.detach();
    this.addresses = this.addresses.filter((a) => a.dev !== name);
    this.routes = this.routes.filter((r) => r.dev !== name);
    for (const l of [...this.links.values()]) if (l.parent === name) this.removeLink(l.name);
  }

  private addAddress(a: AddressSpec): void {
    this.existing(a.dev);
    const parsed = parseCidrLoose(a.cidr)!;
    const mine = this.addresses.filter((x) => x.dev === a.dev && x.parsed.family === parsed.family);
    if (parsed.family === 4 && mine.some((x) => x.cidr === a.cidr)) fail('RTNETLINK answers: File exists');
    const host = (c: ParsedCidr) => Buffer.from(c.bytes).toString('hex');
    if (parsed.family === 6 && mine.some((x) => host(x.parsed) === host(parsed)))
      fail('Error: ipv6: address already assigned.');
    this.addresses.push({ dev: a.dev, cidr: a.cidr, parsed });
  }

  private delAddress(a: AddressSpec): void {
    this.existing(a.dev);
    const i = this.addresses.findIndex((x) => x.dev === a.dev && x.cidr === a.cidr);
    const parsed = parseCidrLoose(a.cidr)!;
    if (i < 0)
      fail(
        parsed.family === 6
          ? 'Error: ipv6: address not found.'
          : 'RTNETLINK answers: Cannot assign requested address',
      );
    const target = this.addresses[i]!;
    const subnet = (x: FakeAddress) =>
      x.dev === a.dev && x.parsed.family === 4 && sameSubnet(x.parsed, parsed);
    // A primary IPv4 address (the first of its subnet on the link) takes its secondaries along.
    const primary = parsed.family === 4 && this.addresses.findIndex(subnet) === i;
    this.addresses = this.addresses.filter((x) => x !== target && !(primary && subnet(x)));
  }

  private addRule(r: RuleSpec): void {
    const list = this.rules[r.family];
    // The kernel's duplicate test: every field equal, except that a from/to the new rule lacks matches any.
    const duplicate = list.some(
      (x) =>
        x.pref === r.pref &&
        x.table === r.table &&
        (r.from === undefined || x.from === r.from) &&
        (r.to === undefined || x.to === r.to) &&
        x.iif === r.iif &&
        x.fwmark?.value === r.fwmark?.value &&
        x.fwmark?.mask === r.fwmark?.mask &&
        x.ipproto === r.ipproto &&
        x.sport === r.sport,
    );
    if (duplicate) fail('RTNETLINK answers: File exists');
    // After the last rule whose pref is not larger.
    let at = list.length;
    while (at > 0 && list[at - 1]!.pref > r.pref) at--;
    list.splice(at, 0, r);
  }

  private delRule(r: RuleSpec): void {
    const list = this.rules[r.family];
    // The first rule matching every selector given (a missing one matches any).
    const found = list.find(
      (x) =>
        x.pref === r.pref &&
        x.table === r.table &&
        (r.from === undefined || x.from === r.from) &&
        (r.to === undefined || x.to === r.to) &&
        (r.iif === undefined || x.iif === r.iif) &&
        (r.fwmark === undefined ||
          (x.fwmark?.value === r.fwmark.value && x.fwmark?.mask === r.fwmark.mask)) &&
        (r.ipproto === undefined || x.ipproto === r.ipproto) &&
        (r.sport === undefined || x.sport === r.sport),
    );
    if (!found) fail('RTNETLINK answers: No such file or directory');
    this.removeRule(r.family, found!);
  }

  private removeRule(family: Family, r: RuleSpec): void {
    const list = this.rules[family];
    const i = list.indexOf(r);
    if (i >= 0) list.splice(i, 1);
  }

  private routeDst(r: RouteSpec): string {
    const c = r.dst === 'default' ? undefined : parseCidrLoose(r.dst);
    if (c && c.family === 4 && hasHostBits(c)) fail('Error: Invalid prefix for given prefix length.');
    return canonicalDst(r.dst);
  }

  private addRoute(spec: RouteSpec): void {
    const dst = this.routeDst(spec);
    const dev = this.existing(spec.dev);
    if (!dev.up)
      fail(spec.family === 4 ? 'Error: Device for nexthop is not up.' : 'Error: Nexthop device is not up.');
    // One route per destination and table (the agent never sets metrics or TOS).
    if (this.routes.some((x) => x.family === spec.family && x.table === spec.table && x.dst === dst))
      fail('RTNETLINK answers: File exists');
    this.routes.push(canonicalRoute(spec));
  }

  private delRoute(spec: RouteSpec): void {
    const dst = this.routeDst(spec);
    this.existing(spec.dev);
    const r = canonicalRoute(spec);
    const i = this.routes.findIndex(
      (x) =>
        x.family === r.family &&
        x.table === r.table &&
        x.dst === dst &&
        x.dev === r.dev &&
        x.type === r.type &&
        (r.via === undefined || x.via === r.via),
    );
    if (i < 0) fail('RTNETLINK answers: No such process');
    this.routes.splice(i, 1);
  }
}
