/**
 * Runs code with node:crypto's random sources (randomBytes, randomUUID) drawn from a seeded
 * source: ids, nonces and secrets made by the real code are then the same on every run of a
 * seed. Only the simulator does this, for the span of one run; the product never.
 *
 * For the same span, Ed25519 signing and verifying (two thirds of a run's CPU when real) are a
 * keyed hash: a signature is SHA-512(signer's raw public key || message). It binds the message
 * to the signer's key as Ed25519 does (another key or a changed byte fails verification), but
 * anyone holding the public key could forge one: the simulator checks the cluster's logic, not
 * the strength of Ed25519, which the envelope and license tests check with the real thing.
 * Public keys made from the same JWK are one KeyObject, so a key's raw bytes are read once.
 */
import crypto, { type KeyObject } from 'node:crypto';
import { syncBuiltinESMExports } from 'node:module';
import type { Prng } from './prng.js';

type Sign = typeof crypto.sign;
type Verify = typeof crypto.verify;
type CreatePublicKey = typeof crypto.createPublicKey;

const rawKeys = new WeakMap<KeyObject, Buffer>();

/** The 32 raw public key bytes of an Ed25519 key (private or public), or undefined. */
function rawEd25519(key: unknown): Buffer | undefined {
  if (!(key instanceof crypto.KeyObject) || key.asymmetricKeyType !== 'ed25519') return undefined;
  let raw = rawKeys.get(key);
  if (!raw) {
    raw = Buffer.from(key.export({ format: 'jwk' }).x as string, 'base64url');
    rawKeys.set(key, raw);
  }
  return raw;
}

const standIn = (raw: Buffer, data: NodeJS.ArrayBufferView): Buffer =>
  crypto.createHash('sha512').update(raw).update(data).digest();

export async function withSeededCrypto<T>(random: Prng, run: () => Promise<T>): Promise<T> {
  const saved = {
    randomBytes: crypto.randomBytes,
    randomUUID: crypto.randomUUID,
    sign: crypto.sign,
    verify: crypto.verify,
    createPublicKey: crypto.createPublicKey,
  };
  const patched = crypto as unknown as Record<string, unknown>;
  patched.randomBytes = (n: number) => random.bytes(n);
  patched.randomUUID = () => {
    const b = random.bytes(16);
    b[6] = (b[6]! & 0x0f) | 0x40;
    b[8] = (b[8]! & 0x3f) | 0x80;
    const h = b.toString('hex');
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  };
  patched.sign = ((algorithm, data, key, callback?: unknown) => {
    const raw = algorithm === null && !callback ? rawEd25519(key) : undefined;
    if (!raw) return (saved.sign as (...args: unknown[]) => unknown)(algorithm, data, key, callback);
    return standIn(raw, data);
  }) as Sign;
  patched.verify = ((algorithm, data, key, signature, callback?: unknown) => {
    const raw = algorithm === null && !callback ? rawEd25519(key) : undefined;
    if (!raw)
      return (saved.verify as (...args: unknown[]) => unknown)(algorithm, data, key, signature, callback);
    const expected = standIn(raw, data);
    return signature.byteLength === expected.length && expected.equals(signature as Uint8Array);
  }) as Verify;
  const publicKeys = new Map<string, KeyObject>();
  patched.createPublicKey = ((key) => {
    const jwk = (key as { key?: { kty?: string; crv?: string; x?: string }; format?: string }).key;
    if ((key as { format?: string }).format !== 'jwk' || jwk?.kty !== 'OKP' || jwk.crv !== 'Ed25519') {
      return saved.createPublicKey(key);
    }
    const id = String(jwk.x);
    let made = publicKeys.get(id);
    if (!made) {
      made = saved.createPublicKey(key);
      publicKeys.set(id, made);
    }
    return made;
  }) as CreatePublicKey;
  syncBuiltinESMExports();
  try {
    return await run();
  } finally {
    Object.assign(patched, saved);
    syncBuiltinESMExports();
  }
}

/** An Ed25519 private key (PKCS#8 PEM) from 32 seeded bytes. */
export function seededEd25519Pem(random: Prng): string {
  const der = Buffer.concat([Buffer.from('302e020100300506032b657004220420', 'hex'), random.bytes(32)]);
  return crypto
    .createPrivateKey({ key: der, format: 'der', type: 'pkcs8' })
    .export({ type: 'pkcs8', format: 'pem' })
    .toString();
}
