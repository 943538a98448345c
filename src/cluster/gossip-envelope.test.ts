import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { describe, it } from 'node:test';
import { hashClusterSecret, keyId, macKeyOf } from './cluster-credential.js';
import {
  type Envelope,
  NO_KEY,
  type OpenContext,
  open,
  type Payload,
  ReplayGuard,
  type SenderKey,
  seal,
} from './gossip-envelope.js';
import { Identity } from './identity.js';

const alice = new Identity(Identity.generatePem());
const bob = new Identity(Identity.generatePem());
const mallory = new Identity(Identity.generatePem());

const NOW = Date.UTC(2026, 0, 1);
const WINDOW = 60_000;

const clusterHash = hashClusterSecret('cluster secret');
const KEY = { kid: keyId(clusterHash), key: macKeyOf(clusterHash) };
const otherHash = hashClusterSecret('another secret');
const OTHER_KEY = { kid: keyId(otherHash), key: macKeyOf(otherHash) };

/** Bob receives; alice (and mallory, as far as `senders` says) send. */
function context(over: Partial<OpenContext> & { senders?: Record<string, SenderKey> } = {}): OpenContext {
  const senders = over.senders ?? {
    [alice.peerId]: { publicKey: alice.publicKeyBase64, isActive: true },
  };
  return {
    localPeerId: bob.peerId,
    now: NOW,
    windowMs: WINDOW,
    sender: (id) => senders[id],
    macKey: (kid) => (kid === KEY.kid ? KEY.key : undefined),
    replay: new ReplayGuard(),
    ...over,
  };
}

const fields = (over: Partial<Payload> = {}) => ({
  type: 'ping',
  to: bob.peerId,
  sent_at: NOW,
  body: { root: 'abc', n: [1, 2] },
  ...over,
});

/** `key` null seals without a key (a default parameter would turn undefined into KEY). */
function sealed(over: Partial<Payload> = {}, key: typeof KEY | null = KEY, from = alice): Envelope {
  return seal(from, fields(over), key ?? undefined).envelope;
}

const reason = (raw: unknown, ctx: OpenContext = context()) => {
  const r = open(raw, ctx);
  return r.ok ? 'ok' : r.reason;
};

/** Re-MACs and re-signs a changed payload as `who` would, so only the change itself is judged. */
function reseal(env: Envelope, payload: string, who = alice, key = KEY): Envelope {
  const mac = createHmac('sha256', key.key)
    .update('mesh-agent gossip v1\n')
    .update(key.kid)
    .update('\n')
    .update(payload)
    .digest('base64url');
  const sig = who
    .sign(Buffer.from(`mesh-agent gossip v1\n${key.kid}\n${mac}\n${payload}`, 'utf8'))
    .toString('base64url');
  return { ...env, payload, kid: key.kid, mac, sig };
}

describe('gossip envelope: seal and open', { timeout: 30_000 }, () => {
  it('round-trips a message', () => {
    const { envelope, nonce } = seal(alice, fields({ re: 'earlier-nonce-value' }), KEY);
    assert.equal(envelope.kid, KEY.kid);
    const r = open(JSON.parse(JSON.stringify(envelope)), context());
    assert.ok(r.ok, JSON.stringify(r));
    assert.deepEqual(r.payload, {
      v: 1,
      from: alice.peerId,
      nonce,
      type: 'ping',
      to: bob.peerId,
      sent_at: NOW,
      re: 'earlier-nonce-value',
      body: { root: 'abc', n: [1, 2] },
    });
  });

  it('gives every message its own nonce', () => {
    const nonces = new Set(Array.from({ length: 20 }, () => seal(alice, fields(), KEY).nonce));
    assert.equal(nonces.size, 20);
  });

  it('reseal (the helper of these tests) makes what seal makes', () => {
    const env = sealed();
    assert.deepEqual(reseal(env, env.payload), env);
  });

  it('refuses what is not an envelope: malformed', () => {
    const env = sealed();
    for (const bad of [
      null,
      'text',
      42,
      [],
      {},
      { ...env, payload: undefined },
      { ...env, payload: {} },
      { ...env, kid: 1 },
      { ...env, mac: null },
      { ...env, sig: undefined },
    ]) {
      assert.equal(reason(bad), 'malformed', JSON.stringify(bad));
    }
  });

  it('refuses a payload that is not a message: malformed', () => {
    const env = sealed();
    const p = JSON.parse(env.payload) as Record<string, unknown>;
    const variants: unknown[] = [
      'not json {',
      'null',
      '[]',
      '"text"',
      { ...p, v: 2 },
      { ...p, v: undefined },
      { ...p, type: 5 },
      { ...p, from: undefined },
      { ...p, to: null },
      { ...p, nonce: 'short' },
      { ...p, nonce: 'x'.repeat(65) },
      { ...p, nonce: 1234567890123456 },
      { ...p, sent_at: 'now' },
      { ...p, sent_at: null },
      { ...p, sent_at: undefined },
    ];
    for (const v of variants) {
      const payload = typeof v === 'string' ? v : JSON.stringify(v);
      // Correctly MACed and signed: the content alone is what is refused.
      assert.equal(reason(reseal(env, payload)), 'malformed', payload);
    }
  });

  it('refuses a message for another agent: wrong_recipient', () => {
    assert.equal(reason(sealed({ to: mallory.peerId })), 'wrong_recipient');
    // The same message is fine for the agent it was sent to.
    assert.equal(reason(sealed({ to: mallory.peerId }), context({ localPeerId: mallory.peerId })), 'ok');
  });

  it('refuses a sender that is not a member: unknown_sender', () => {
    assert.equal(reason(sealed({}, KEY, mallory)), 'unknown_sender');
  });

  it('refuses a member that is no longer active: inactive_sender', () => {
    const ctx = context({
      senders: { [alice.peerId]: { publicKey: alice.publicKeyBase64, isActive: false } },
    });
    assert.equal(reason(sealed(), ctx), 'inactive_sender');
  });

  it('refuses a message sent too long ago or too far ahead: stale', () => {
    assert.equal(reason(sealed({ sent_at: NOW - WINDOW - 1 })), 'stale');
    assert.equal(reason(sealed({ sent_at: NOW + WINDOW + 1 })), 'stale');
    assert.equal(reason(sealed({ sent_at: NOW - 365 * 86_400_000 })), 'stale');
    // The window's edges are inside it.
    assert.equal(reason(sealed({ sent_at: NOW - WINDOW })), 'ok');
    assert.equal(reason(sealed({ sent_at: NOW + WINDOW })), 'ok');
  });

  it('refuses a key the receiver does not hold: unknown_credential', () => {
    assert.equal(reason(sealed({}, OTHER_KEY)), 'unknown_credential');
    const env = sealed();
    assert.equal(reason({ ...env, kid: 'ffffffffffffffff' }), 'unknown_credential');
  });

  it('refuses a wrong MAC: bad_mac', () => {
    const env = sealed();
    // A MAC under another key, presented with the receiver's kid.
    const forged = reseal(env, env.payload, alice, { kid: KEY.kid, key: OTHER_KEY.key });
    assert.equal(reason(forged), 'bad_mac');
    assert.equal(reason({ ...env, mac: '' }), 'bad_mac');
    assert.equal(reason({ ...env, mac: `${env.mac}A` }), 'bad_mac');
    // A changed payload under the old MAC.
    const changed = env.payload.replace('"ping"', '"push"');
    assert.notEqual(changed, env.payload);
    assert.equal(reason({ ...env, payload: changed }), 'bad_mac');
  });

  it('refuses a signature that is not the sender’s: bad_signature', () => {
    const env = sealed();
    // Mallory holds the cluster key but signs as herself while claiming to be alice.
    const p = JSON.parse(env.payload) as Payload;
    const impostor = reseal(env, JSON.stringify({ ...p, from: alice.peerId }), mallory);
    assert.equal(reason(impostor), 'bad_signature');
    assert.equal(reason({ ...env, sig: '' }), 'bad_signature');
    assert.equal(reason({ ...env, sig: 'not base64url!' }), 'bad_signature');
    assert.equal(reason({ ...env, sig: sealed().sig }), 'bad_signature', 'the signature of another message');
    // A member whose stored key is garbage cannot be verified at all.
    const ctx = context({ senders: { [alice.peerId]: { publicKey: 'garbage', isActive: true } } });
    assert.equal(reason(env, ctx), 'bad_signature');
  });

  it('refuses the same message twice: replay', () => {
    const ctx = context();
    const env = sealed();
    assert.equal(reason(env, ctx), 'ok');
    assert.equal(reason(env, ctx), 'replay');
    assert.equal(reason(env, ctx), 'replay');
    // Another message of the same sender still passes.
    assert.equal(reason(sealed(), ctx), 'ok');
  });

  it('refuses a message sent before the replay memory began (a restart): replay', () => {
    const ctx = context({ notBefore: NOW - 1000 });
    assert.equal(reason(sealed({ sent_at: NOW - 1001 }), ctx), 'replay');
    assert.equal(reason(sealed({ sent_at: NOW - 1000 }), ctx), 'ok');
    // Still a forgery first: the time alone does not make a message a replay.
    const forged = { ...sealed({ sent_at: NOW - 1001 }), sig: sealed().sig };
    assert.equal(reason(forged, ctx), 'bad_signature');
  });

  it('remembers a nonce only once the message passed every other check', () => {
    const ctx = context();
    const env = sealed();
    assert.equal(reason({ ...env, mac: 'x' }, ctx), 'bad_mac');
    assert.equal(reason({ ...env, sig: 'x' }, ctx), 'bad_signature');
    assert.equal(reason(env, { ...ctx, now: NOW + WINDOW + 1 }), 'stale');
    assert.equal(reason(env, ctx), 'ok');
  });

  it('a message replayed to another agent is refused there (to binds it)', () => {
    const env = sealed();
    assert.equal(reason(env, context()), 'ok');
    assert.equal(reason(env, context({ localPeerId: mallory.peerId })), 'wrong_recipient');
  });

  it('travels without a key only as rejoin or rejoin-reply', () => {
    for (const type of ['rejoin', 'rejoin-reply']) {
      const env = sealed({ type }, null);
      assert.equal(env.kid, NO_KEY);
      assert.equal(env.mac, '');
      assert.equal(reason(env), 'ok', type);
    }
    for (const type of ['ping', 'push', 'sync', 'admit', 'Rejoin']) {
      assert.equal(reason(sealed({ type }, null)), 'unknown_credential', type);
    }
  });

  it('a keyless message still needs the sender’s signature, and keeps every other check', () => {
    const env = sealed({ type: 'rejoin' }, null);
    const p = JSON.parse(env.payload) as Payload;
    const forgedPayload = JSON.stringify({ ...p, from: alice.peerId });
    const forgedSig = mallory
      .sign(Buffer.from(`mesh-agent gossip v1\n${NO_KEY}\n\n${forgedPayload}`, 'utf8'))
      .toString('base64url');
    assert.equal(reason({ ...env, payload: forgedPayload, sig: forgedSig }), 'bad_signature');
    assert.equal(reason(sealed({ type: 'rejoin' }, null, mallory)), 'unknown_sender');
    assert.equal(reason(sealed({ type: 'rejoin', sent_at: NOW - 2 * WINDOW }, null)), 'stale');
    const ctx = context();
    assert.equal(reason(env, ctx), 'ok');
    assert.equal(reason(env, ctx), 'replay');
  });

  it('a keyed message cannot be downgraded to keyless', () => {
    // Stripping the key from a keyed rejoin breaks the signature, which covers the kid.
    const env = sealed({ type: 'rejoin' });
    assert.equal(reason(env), 'ok');
    assert.equal(reason({ ...env, kid: NO_KEY, mac: '' }), 'bad_signature');
    const ping = sealed();
    assert.equal(reason({ ...ping, kid: NO_KEY, mac: '' }), 'unknown_credential');
  });
});

describe('ReplayGuard', { timeout: 30_000 }, () => {
  it('accepts a nonce once per sender', () => {
    const g = new ReplayGuard();
    assert.equal(g.first('a', 'n1', NOW + WINDOW, NOW), true);
    assert.equal(g.first('a', 'n1', NOW + WINDOW, NOW), false);
    assert.equal(g.first('b', 'n1', NOW + WINDOW, NOW), true, 'another sender, the same nonce');
  });

  it('bounds the live nonces kept per sender', () => {
    const g = new ReplayGuard(3);
    for (const n of ['n1', 'n2', 'n3']) assert.equal(g.first('a', n, NOW + WINDOW, NOW), true);
    assert.equal(g.first('a', 'n4', NOW + WINDOW, NOW), false, 'a fourth live nonce is refused');
    assert.equal(g.first('b', 'n4', NOW + WINDOW, NOW), true, 'other senders have their own bound');
    // Once the first three have expired they make room.
    const later = NOW + WINDOW + 1;
    assert.equal(g.first('a', 'n4', later + WINDOW, later), true);
    assert.equal(g.first('a', 'n4', later + WINDOW, later), false);
  });

  it('makes room only from expired nonces', () => {
    const g = new ReplayGuard(2);
    assert.equal(g.first('a', 'old', NOW + 10, NOW), true);
    assert.equal(g.first('a', 'young', NOW + 1000, NOW), true);
    const t = NOW + 11;
    assert.equal(g.first('a', 'n3', t + 1000, t), true, 'room made by the expired one');
    assert.equal(g.first('a', 'young', t + 1000, t), false, 'the live one is still remembered');
    assert.equal(g.first('a', 'n4', t + 1000, t), false, 'the bound holds');
  });

  it('prune forgets expired nonces and keeps live ones', () => {
    const g = new ReplayGuard();
    g.first('a', 'old', NOW + 10, NOW);
    g.first('a', 'live', NOW + 1000, NOW);
    g.first('b', 'old', NOW + 10, NOW);
    g.prune(NOW + 11);
    assert.equal(g.first('a', 'old', NOW + 2000, NOW + 11), true, 'forgotten');
    assert.equal(g.first('b', 'old', NOW + 2000, NOW + 11), true, 'forgotten, sender entry too');
    assert.equal(g.first('a', 'live', NOW + 2000, NOW + 11), false, 'still remembered');
  });

  it('prune keeps a nonce up to its expiry instant', () => {
    const g = new ReplayGuard();
    g.first('a', 'n', NOW + 10, NOW);
    g.prune(NOW + 10);
    assert.equal(g.first('a', 'n', NOW + 20, NOW + 10), false);
    g.prune(NOW + 11);
    assert.equal(g.first('a', 'n', NOW + 20, NOW + 11), true);
  });

  it('prune never forgets a live nonce that arrived before an expired one', () => {
    // The sender's clock stepped back: the later nonce expires first. Prune stops at the live
    // one; the expired one behind it stays (memory, not safety) until the live one has gone.
    const g = new ReplayGuard();
    g.first('a', 'live', NOW + 1000, NOW);
    g.first('a', 'stepped-back', NOW + 10, NOW);
    g.prune(NOW + 11);
    assert.equal(g.first('a', 'live', NOW + 2000, NOW + 11), false, 'live: still remembered');
    assert.equal(g.first('a', 'stepped-back', NOW + 2000, NOW + 11), false, 'kept behind the live one');
    g.prune(NOW + 3000);
    assert.equal(g.first('a', 'stepped-back', NOW + 4000, NOW + 3000), true, 'gone once the live one went');
  });

  it('bounds memory under a flood: a sender cannot exceed its bound', () => {
    const g = new ReplayGuard(50);
    let accepted = 0;
    for (let i = 0; i < 1000; i++) if (g.first('a', `n${i}`, NOW + WINDOW, NOW)) accepted++;
    assert.equal(accepted, 50);
  });
});
