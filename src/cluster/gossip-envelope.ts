/**
 * Gossip messages on the wire: sealing and opening. Pure apart from the replay memory.
 *
 *   { payload, kid, mac, sig }
 *   payload = JSON text of { v, type, from, to, sent_at, nonce, re?, body }
 *   mac     = HMAC-SHA256(macKey(kid), CONTEXT || kid || "\n" || payload)     base64url
 *   sig     = Ed25519_from(CONTEXT || kid || "\n" || mac || "\n" || payload)  base64url
 *
 * The payload travels as text and is signed as those exact bytes, so nothing has to be
 * canonicalized. The MAC proves the sender holds a live cluster key (the cluster credential,
 * named by kid); the signature proves which member sent it. `to` binds a message to its receiver,
 * `sent_at` bounds its age and `nonce` makes it single-use: a captured message replayed to the
 * same agent, to another agent, or later than the window is refused.
 *
 * Only a `rejoin` request and its reply travel without a MAC (kid "none"): they are how an agent
 * that missed a rotation past its grace period gets the current credential back, by its identity
 * alone (the receiver still requires a signature from an active member).
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Identity } from './identity.js';
import { verifyPeerSignature } from './identity.js';

export const GOSSIP_VERSION = 1;
const CONTEXT = 'mesh-agent gossip v1\n';
export const NO_KEY = 'none';
/** Message types that may travel without a cluster key. */
const KEYLESS_TYPES: ReadonlySet<string> = new Set(['rejoin', 'rejoin-reply']);

export interface Envelope {
  payload: string;
  kid: string;
  mac: string;
  sig: string;
}

export interface Payload {
  v: number;
  type: string;
  from: string;
  to: string;
  sent_at: number;
  nonce: string;
  /** On a reply: the nonce of the request it answers. */
  re?: string;
  body: unknown;
}

export type RejectReason =
  | 'malformed'
  | 'wrong_recipient'
  | 'unknown_sender'
  | 'inactive_sender'
  | 'stale'
  | 'unknown_credential'
  | 'bad_mac'
  | 'bad_signature'
  | 'replay';

export interface SenderKey {
  publicKey: string;
  isActive: boolean;
}

export interface OpenContext {
  localPeerId: string;
  now: number;
  windowMs: number;
  sender(peerId: string): SenderKey | undefined;
  macKey(kid: string): Buffer | undefined;
  replay: ReplayGuard;
  /**
   * When the replay memory began (the agent's start): a message sent before then may have been
   * seen by this agent before a restart, so it is refused as a replay.
   */
  notBefore?: number;
}

export function seal(
  identity: Identity,
  fields: Omit<Payload, 'v' | 'from' | 'nonce'>,
  key: { kid: string; key: Buffer } | undefined,
): { envelope: Envelope; nonce: string } {
  const nonce = randomBytes(16).toString('base64url');
  const payload = JSON.stringify({ v: GOSSIP_VERSION, from: identity.peerId, nonce, ...fields });
  const kid = key?.kid ?? NO_KEY;
  const mac = key ? macOf(key.key, kid, payload) : '';
  const sig = identity.sign(signingInput(kid, mac, payload)).toString('base64url');
  return { envelope: { payload, kid, mac, sig }, nonce };
}

export type Opened = { ok: true; payload: Payload } | { ok: false; reason: RejectReason };

/**
 * Checks an envelope, cheapest refusals first (a flood of junk costs a JSON parse and an HMAC,
 * not a signature check). The nonce is remembered only once everything else has passed.
 */
export function open(raw: unknown, ctx: OpenContext): Opened {
  const env = raw as Partial<Envelope>;
  if (
    typeof env !== 'object' ||
    env === null ||
    typeof env.payload !== 'string' ||
    typeof env.kid !== 'string' ||
    typeof env.mac !== 'string' ||
    typeof env.sig !== 'string'
  ) {
    return { ok: false, reason: 'malformed' };
  }
  let p: Payload;
  try {
    p = JSON.parse(env.payload) as Payload;
  } catch {
    return { ok: false, reason: 'malformed' };
  }
  if (
    typeof p !== 'object' ||
    p === null ||
    p.v !== GOSSIP_VERSION ||
    typeof p.type !== 'string' ||
    typeof p.from !== 'string' ||
    typeof p.to !== 'string' ||
    typeof p.nonce !== 'string' ||
    p.nonce.length < 16 ||
    p.nonce.length > 64 ||
    !Number.isFinite(p.sent_at)
  ) {
    return { ok: false, reason: 'malformed' };
  }
  if (p.to !== ctx.localPeerId) return { ok: false, reason: 'wrong_recipient' };
  const sender = ctx.sender(p.from);
  if (!sender) return { ok: false, reason: 'unknown_sender' };
  if (!sender.isActive) return { ok: false, reason: 'inactive_sender' };
  if (Math.abs(ctx.now - p.sent_at) > ctx.windowMs) return { ok: false, reason: 'stale' };
  if (env.kid === NO_KEY) {
    if (!KEYLESS_TYPES.has(p.type)) return { ok: false, reason: 'unknown_credential' };
  } else {
    const key = ctx.macKey(env.kid);
    if (!key) return { ok: false, reason: 'unknown_credential' };
    if (!equalText(macOf(key, env.kid, env.payload), env.mac)) return { ok: false, reason: 'bad_mac' };
  }
  const signature = Buffer.from(env.sig, 'base64url');
  if (!verifyPeerSignature(sender.publicKey, signingInput(env.kid, env.mac, env.payload), signature)) {
    return { ok: false, reason: 'bad_signature' };
  }
  if (ctx.notBefore !== undefined && p.sent_at < ctx.notBefore) return { ok: false, reason: 'replay' };
  if (!ctx.replay.first(p.from, p.nonce, p.sent_at + ctx.windowMs, ctx.now)) {
    return { ok: false, reason: 'replay' };
  }
  return { ok: true, payload: p };
}

function macOf(key: Buffer, kid: string, payload: string): string {
  return createHmac('sha256', key).update(`${CONTEXT}${kid}\n${payload}`).digest('base64url');
}

function signingInput(kid: string, mac: string, payload: string): Buffer {
  return Buffer.from(`${CONTEXT}${kid}\n${mac}\n${payload}`, 'utf8');
}

function equalText(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/**
 * Nonces seen per sender, each kept until its message could no longer pass the time window. A
 * sender is allowed a bounded number of live nonces, so a member cannot grow our memory without
 * end (at 200 ms intervals a peer sends a few dozen messages a window).
 */
export class ReplayGuard {
  private readonly seen = new Map<string, Map<string, number>>();

  constructor(private readonly maxPerSender = 100_000) {}

  /** True the first time (from, nonce) is offered while it is live; false for a repeat. */
  first(from: string, nonce: string, expiresAt: number, now: number): boolean {
    let nonces = this.seen.get(from);
    if (!nonces) {
      nonces = new Map();
      this.seen.set(from, nonces);
    }
    if (nonces.has(nonce)) return false;
    if (nonces.size >= this.maxPerSender) {
      for (const [n, until] of nonces) if (until < now) nonces.delete(n);
      if (nonces.size >= this.maxPerSender) return false;
    }
    nonces.set(nonce, expiresAt);
    return true;
  }

  /**
   * Forgets nonces whose messages have left the window. A sender's nonces are kept in the order
   * they arrived, which is about the order of their senders' clocks, so this stops at the first
   * one still live: walking every live nonce of every sender at each of the engine's prunes was a
   * tenth of a 200-agent simulation's CPU. One kept behind an older but live
   * nonce (a sender's clock stepped back) goes at a later pass; keeping a nonce too long costs
   * memory, never safety.
   */
  prune(now: number): void {
    for (const [from, nonces] of this.seen) {
      for (const [n, until] of nonces) {
        if (until >= now) break;
        nonces.delete(n);
      }
      if (nonces.size === 0) this.seen.delete(from);
    }
  }
}
