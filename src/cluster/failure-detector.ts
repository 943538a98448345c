/**
 * Which members answer right now. The replicated state decides who is in the cluster; this module
 * only says which of those members are reachable. A peer that stops answering becomes dead
 * (unreachable) but stays a member. It becomes alive again as soon as it is heard from, so a
 * network partition never changes the membership.
 *
 * The algorithm is SWIM with the Lifeguard extensions, and it behaves like HashiCorp memberlist
 * because that behaviour has worked in large clusters for years:
 * - Each member is probed once per pass, in an order reshuffled every pass. Every member gets
 *   checked within a bounded time, and nobody can predict the order.
 * - When a direct probe fails, a few other members probe the peer for us. One lossy link between
 *   us and the peer should not make it look failed.
 * - A peer that fails the probe is first only suspect, and it can refute with a higher
 *   incarnation. A slow peer gets a chance before everyone treats it as gone.
 * - A suspicion times out sooner when other members independently confirm it. Without
 *   confirmations it lasts longer, so a peer that only we cannot reach is not declared dead fast.
 * - Local health awareness stretches our probe timeouts while our own probes fail or we are being
 *   suspected. A slow or overloaded node then blames itself instead of accusing healthy peers.
 * - The buddy system: a probe of a peer we suspect carries a hint, so the peer can refute at once
 *   instead of waiting for gossip to bring it the accusation.
 * I/O goes through ProbeTransport and time through Clock. Nothing here starts a timer: the gossip
 * engine calls probeOnce/expireSuspicions, and tests move a ManualClock instead of sleeping.
 */
import type { Clock } from '../domain/clock.js';

export type Liveness = 'alive' | 'suspect' | 'dead';

/** What the engine disseminates for us (piggybacked on gossip to a few peers, relayed). */
export interface LivenessRumor {
  kind: Liveness;
  /** Whose liveness. */
  peer: string;
  incarnation: number;
  /** Who says so. */
  from: string;
}

export interface ProbeTransport {
  /**
   * Direct probe; resolves true when the peer acked within timeoutMs, false otherwise (never
   * rejects). `suspected` is the buddy-system hint: true when we currently suspect that peer (or
   * consider it dead), so it can refute at once.
   */
  ping(peerId: string, timeoutMs: number, suspected: boolean): Promise<boolean>;
  /** Ask `via` to probe `target` for us; true when `via` reports an ack within timeoutMs. */
  pingReq(via: string, target: string, timeoutMs: number): Promise<boolean>;
  /** Hand a rumor to the dissemination layer. */
  disseminate(rumor: LivenessRumor): void;
}

export interface FailureDetectorConfig {
  /** The gossip/heartbeat interval; default 1000. */
  probeIntervalMs: number;
  /** Default: probeIntervalMs / 2. */
  probeTimeoutMs: number;
  /** Default 3. */
  indirectChecks: number;
  /** Default 4 (memberlist: SuspicionMult). */
  suspicionMult: number;
  /** Default 6 (memberlist: SuspicionMaxTimeoutMult). */
  suspicionMaxTimeoutMult: number;
  /** Upper bound of the awareness score; default 8. */
  awarenessMax: number;
}

export interface PeerLiveness {
  state: Liveness;
  incarnation: number;
  /** When the peer itself was last heard from (a message or a direct ack); null if never. */
  lastSeenAt: number | null;
}

type ChangeListener = (peerId: string, from: Liveness, to: Liveness) => void;

interface Suspicion {
  startedAt: number;
  minTimeoutMs: number;
  maxTimeoutMs: number;
  /** How many confirmations would bring the timeout down to its minimum. */
  expectedConfirmations: number;
  confirmations: number;
  /** Who has already accused the peer. One member repeating itself is no new evidence. */
  accusers: Set<string>;
}

export class FailureDetector {
  private readonly config: FailureDetectorConfig;
  private readonly peers = new Map<string, PeerLiveness>();
  private readonly suspicions = new Map<string, Suspicion>();
  private readonly listeners: ChangeListener[] = [];
  private probeOrder: string[] = [];
  private probeIndex = 0;
  private ownIncarnation = 0;
  private awarenessScore = 0;

  constructor(
    private readonly selfId: string,
    private readonly transport: ProbeTransport,
    private readonly clock: Clock,
    config: Partial<FailureDetectorConfig> = {},
    private readonly random: () => number = Math.random,
  ) {
    this.config = resolveConfig(config);
  }

  /**
   * The current members other than self. Members that stay keep their state, new ones start alive
   * and never seen, and removed ones are forgotten.
   */
  setMembers(peerIds: readonly string[]): void {
    const members = new Set(peerIds.filter((id) => id !== this.selfId));
    for (const id of [...this.peers.keys()]) {
      if (members.has(id)) continue;
      this.peers.delete(id);
      this.suspicions.delete(id);
    }
    const probed = this.probeOrder.slice(0, this.probeIndex).filter((id) => members.has(id));
    const pending = this.probeOrder.slice(this.probeIndex).filter((id) => members.has(id));
    for (const id of members) {
      if (this.peers.has(id)) continue;
      this.peers.set(id, { state: 'alive', incarnation: 0, lastSeenAt: null });
      // Put newcomers in the part of the pass not yet probed. They get checked in this pass and no
      // other member is probed twice in it.
      pending.splice(randomIndex(pending.length + 1, this.random), 0, id);
    }
    this.probeOrder = [...probed, ...pending];
    this.probeIndex = probed.length;
  }

  /**
   * One protocol period: expire suspicions, then probe the next member, directly first and then
   * through up to indirectChecks others. Resolves when the probe is done and never rejects.
   */
  async probeOnce(): Promise<void> {
    this.expireSuspicions();
    const target = this.nextProbeTarget();
    if (target === undefined) return;
    // Take the verdict at the incarnation we probed. If the peer refutes while the probe is in
    // flight, this failed probe cannot accuse its newer incarnation.
    const { state, incarnation } = this.peers.get(target)!;
    const scale = this.awarenessScore + 1;
    const { probeIntervalMs, probeTimeoutMs } = this.config;

    if (await settle(() => this.transport.ping(target, probeTimeoutMs * scale, state !== 'alive'))) {
      this.adjustAwareness(-1);
      this.heardFrom(target);
      return;
    }
    // A dead peer still gets a direct probe in every pass, so a direct ack can bring it back. Its
    // silence is expected, though: it says nothing about our own health and is not worth
    // indirectChecks more messages in every pass.
    if (state === 'dead') return;

    // As in memberlist, the relays get the rest of the period: they need time for a probe of their
    // own. Never less than one probe timeout, even if the config leaves no rest.
    const indirectTimeoutMs = Math.max(probeIntervalMs - probeTimeoutMs, probeTimeoutMs) * scale;
    const relays = this.pickRelays(target);
    const relayed = await Promise.all(
      relays.map((via) => settle(() => this.transport.pingReq(via, target, indirectTimeoutMs))),
    );
    if (relayed.includes(true)) {
      // Lifeguard counts a probe answered through a relay as a success, and it is not evidence of
      // life strong enough to clear a suspicion. A suspect peer still has to refute.
      this.adjustAwareness(-1);
      return;
    }
    // Without nacks we cannot tell whether the relays or the target failed, so, like memberlist
    // when no relay can nack, a failed probe costs one point of health.
    this.adjustAwareness(1);
    if (this.suspect(target, incarnation, this.selfId)) {
      this.transport.disseminate({ kind: 'suspect', peer: target, incarnation, from: this.selfId });
    }
  }

  /** Moves suspects whose timeout has passed to dead. */
  expireSuspicions(): void {
    const now = this.clock.now();
    for (const [peerId, suspicion] of [...this.suspicions]) {
      // A listener called from an earlier iteration may have changed this peer already.
      const peer = this.peers.get(peerId);
      if (!peer || this.suspicions.get(peerId) !== suspicion) continue;
      if (now - suspicion.startedAt < suspicionTimeoutMs(suspicion)) continue;
      this.transport.disseminate({
        kind: 'dead',
        peer: peerId,
        incarnation: peer.incarnation,
        from: this.selfId,
      });
      this.transition(peerId, peer, 'dead');
    }
  }

  /**
   * A rumor received from gossip. Returns true when it changed our view of another peer; the
   * engine relays the rumor only then. Rumors about us return false even when we refute them: the
   * refutation we disseminate is what should spread, and relaying the accusation would only race
   * it.
   */
  onRumor(rumor: LivenessRumor): boolean {
    if (!isIncarnation(rumor.incarnation)) return false;
    if (rumor.peer === this.selfId) {
      this.onRumorAboutSelf(rumor);
      return false;
    }
    const peer = this.peers.get(rumor.peer);
    if (!peer) return false;
    switch (rumor.kind) {
      case 'alive':
        if (rumor.incarnation <= peer.incarnation) return false;
        peer.incarnation = rumor.incarnation;
        this.transition(rumor.peer, peer, 'alive');
        return true;
      case 'suspect':
        return this.suspect(rumor.peer, rumor.incarnation, rumor.from);
      case 'dead':
        if (rumor.incarnation < peer.incarnation || peer.state === 'dead') return false;
        peer.incarnation = rumor.incarnation;
        this.transition(rumor.peer, peer, 'dead');
        return true;
      default:
        return false;
    }
  }

  /**
   * Any authenticated message from the peer, or an ack: evidence that it is alive. A suspect or dead
   * peer comes back unless the message carries an incarnation older than the one it was accused
   * at. A message that carries an older incarnation is stale and cannot outrank the accusation.
   */
  heardFrom(peerId: string, incarnation?: number): void {
    const peer = this.peers.get(peerId);
    if (!peer || (incarnation !== undefined && !isIncarnation(incarnation))) return;
    peer.lastSeenAt = this.clock.now();
    if (incarnation !== undefined && incarnation < peer.incarnation) return;
    const newer = incarnation !== undefined && incarnation > peer.incarnation;
    if (newer) peer.incarnation = incarnation;
    if (peer.state === 'alive') return;
    // Only a newer incarnation overrides the accusation elsewhere. At the same incarnation our
    // 'alive' would lose to the suspect/dead rumor everywhere, so it is not worth sending.
    if (newer) {
      this.transport.disseminate({
        kind: 'alive',
        peer: peerId,
        incarnation: peer.incarnation,
        from: this.selfId,
      });
    }
    this.transition(peerId, peer, 'alive');
  }

  /** A ping carried the buddy-system hint: the prober suspects us. */
  refuteSuspicion(): void {
    this.refute(this.ownIncarnation);
  }

  get incarnation(): number {
    return this.ownIncarnation;
  }

  /** Restores our incarnation after a restart, so that our refutations outrank the old ones. */
  setIncarnation(n: number): void {
    if (!isIncarnation(n)) throw new RangeError(`incarnation must be a non-negative integer, got ${n}`);
    this.ownIncarnation = n;
  }

  /** Lifeguard's local health score: 0 means healthy. Probe timeouts are multiplied by awareness + 1. */
  get awareness(): number {
    return this.awarenessScore;
  }

  liveness(peerId: string): PeerLiveness | undefined {
    const peer = this.peers.get(peerId);
    return peer && { ...peer };
  }

  /** A snapshot. Later changes do not show through it. */
  all(): ReadonlyMap<string, PeerLiveness> {
    return new Map([...this.peers].map(([id, peer]) => [id, { ...peer }]));
  }

  /** Called after every state change of a peer (alive, suspect, dead), never for a forgotten one. */
  onChange(listener: ChangeListener): void {
    this.listeners.push(listener);
  }

  private onRumorAboutSelf(rumor: LivenessRumor): void {
    if (rumor.kind === 'alive') {
      // A newer incarnation of us is circulating, probably because we restarted without restoring
      // ours. Adopt it so that our messages and refutations are not older than what peers hold.
      if (rumor.incarnation > this.ownIncarnation) this.ownIncarnation = rumor.incarnation;
      return;
    }
    if (rumor.incarnation < this.ownIncarnation) return;
    this.refute(rumor.incarnation);
  }

  private refute(accusedIncarnation: number): void {
    this.ownIncarnation = Math.max(this.ownIncarnation, accusedIncarnation) + 1;
    // Lifeguard: if others do not hear from us in time, the likeliest cause is that we are slow.
    this.adjustAwareness(1);
    this.transport.disseminate({
      kind: 'alive',
      peer: this.selfId,
      incarnation: this.ownIncarnation,
      from: this.selfId,
    });
  }

  /** Starts or confirms a suspicion. Returns true when that changed anything. */
  private suspect(peerId: string, incarnation: number, accuser: string): boolean {
    const peer = this.peers.get(peerId);
    // Dead outranks suspect: once declared dead, only evidence of life changes the state.
    if (!peer || incarnation < peer.incarnation || peer.state === 'dead') return false;
    if (peer.state === 'suspect') {
      const newer = incarnation > peer.incarnation;
      if (newer) peer.incarnation = incarnation;
      return this.confirm(peerId, accuser) || newer;
    }
    peer.incarnation = incarnation;
    this.suspicions.set(peerId, this.newSuspicion(accuser));
    this.transition(peerId, peer, 'suspect');
    return true;
  }

  private confirm(peerId: string, accuser: string): boolean {
    const suspicion = this.suspicions.get(peerId);
    if (!suspicion || suspicion.accusers.has(accuser)) return false;
    // Past the expected count the timeout is already at its minimum, and another confirmation
    // would only start another round of relays.
    if (suspicion.confirmations >= suspicion.expectedConfirmations) return false;
    suspicion.accusers.add(accuser);
    suspicion.confirmations++;
    return true;
  }

  private newSuspicion(accuser: string): Suspicion {
    const clusterSize = this.peers.size + 1;
    const { suspicionMult, suspicionMaxTimeoutMult, probeIntervalMs, indirectChecks } = this.config;
    // Rumors take about log(n) rounds to reach everyone. The suspect needs that long to hear the
    // accusation and for its refutation to come back.
    const sizeScale = Math.max(1, Math.log10(Math.max(1, clusterSize)));
    const minTimeoutMs = Math.floor(suspicionMult * sizeScale * probeIntervalMs);
    return {
      startedAt: this.clock.now(),
      minTimeoutMs,
      maxTimeoutMs: suspicionMaxTimeoutMult * minTimeoutMs,
      // Only members other than the suspect and the first accuser can confirm. Expecting more
      // confirmations than that would keep a small cluster at the maximum timeout forever.
      expectedConfirmations: Math.min(indirectChecks, Math.max(0, clusterSize - 2)),
      confirmations: 0,
      accusers: new Set([accuser]),
    };
  }

  private transition(peerId: string, peer: PeerLiveness, to: Liveness): void {
    const from = peer.state;
    if (from === to) return;
    peer.state = to;
    if (to !== 'suspect') this.suspicions.delete(peerId);
    for (const listener of [...this.listeners]) {
      try {
        listener(peerId, from, to);
      } catch (err) {
        // A faulty listener must not stop the other listeners or make probeOnce reject. Throw the
        // error again outside this call, so it is reported rather than swallowed.
        queueMicrotask(() => {
          throw err;
        });
      }
    }
  }

  private nextProbeTarget(): string | undefined {
    if (this.peers.size === 0) return undefined;
    if (this.probeIndex >= this.probeOrder.length) {
      this.probeOrder = shuffle([...this.peers.keys()], this.random);
      this.probeIndex = 0;
    }
    return this.probeOrder[this.probeIndex++];
  }

  /** Only alive members relay. A peer we suspect would probably fail the relayed probe too. */
  private pickRelays(target: string): string[] {
    const candidates = [...this.peers].filter(([id, peer]) => id !== target && peer.state === 'alive');
    return shuffle(
      candidates.map(([id]) => id),
      this.random,
    ).slice(0, this.config.indirectChecks);
  }

  private adjustAwareness(delta: number): void {
    this.awarenessScore = Math.min(this.config.awarenessMax, Math.max(0, this.awarenessScore + delta));
  }
}

/**
 * memberlist's formula: the timeout starts at the maximum and shrinks on a log scale as
 * independent confirmations arrive. It reaches the minimum once the expected number is in.
 */
function suspicionTimeoutMs(suspicion: Suspicion): number {
  const { minTimeoutMs, maxTimeoutMs, expectedConfirmations, confirmations } = suspicion;
  if (expectedConfirmations < 1) return minTimeoutMs;
  const progress = Math.log(confirmations + 1) / Math.log(expectedConfirmations + 1);
  return Math.max(minTimeoutMs, Math.floor(maxTimeoutMs - (maxTimeoutMs - minTimeoutMs) * progress));
}

/**
 * The transport promises never to reject. If a broken one does anyway, the probe counts as failed:
 * that must neither stall the protocol period nor make probeOnce reject.
 */
async function settle(call: () => Promise<boolean>): Promise<boolean> {
  try {
    return (await call()) === true;
  } catch {
    return false;
  }
}

function isIncarnation(n: number): boolean {
  return Number.isSafeInteger(n) && n >= 0;
}

function randomIndex(length: number, random: () => number): number {
  return Math.min(length - 1, Math.floor(random() * length));
}

function shuffle<T>(items: T[], random: () => number): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = randomIndex(i + 1, random);
    [items[i], items[j]] = [items[j]!, items[i]!];
  }
  return items;
}

function resolveConfig(overrides: Partial<FailureDetectorConfig>): FailureDetectorConfig {
  const probeIntervalMs = overrides.probeIntervalMs ?? 1000;
  const config: FailureDetectorConfig = {
    probeIntervalMs,
    probeTimeoutMs: overrides.probeTimeoutMs ?? probeIntervalMs / 2,
    indirectChecks: overrides.indirectChecks ?? 3,
    suspicionMult: overrides.suspicionMult ?? 4,
    suspicionMaxTimeoutMult: overrides.suspicionMaxTimeoutMult ?? 6,
    awarenessMax: overrides.awarenessMax ?? 8,
  };
  // A zero or NaN here would not fail loudly. Suspicions would expire at once and the whole
  // cluster would look dead, or probes would never time out.
  for (const key of ['probeIntervalMs', 'probeTimeoutMs', 'suspicionMult'] as const) {
    if (!(Number.isFinite(config[key]) && config[key] > 0)) {
      throw new RangeError(`${key} must be a positive number, got ${config[key]}`);
    }
  }
  if (!(Number.isFinite(config.suspicionMaxTimeoutMult) && config.suspicionMaxTimeoutMult >= 1)) {
    throw new RangeError(`suspicionMaxTimeoutMult must be at least 1, got ${config.suspicionMaxTimeoutMult}`);
  }
  for (const key of ['indirectChecks', 'awarenessMax'] as const) {
    if (!(Number.isSafeInteger(config[key]) && config[key] >= 0)) {
      throw new RangeError(`${key} must be a non-negative integer, got ${config[key]}`);
    }
  }
  return config;
}
