/**
 * AES-256-GCM for datagrams, with the key expanded once per context: the only module that loads
 * build/Release/mesh_aead.node (native/aead.cc, OpenSSL through the node binary). node:crypto
 * needs a new cipher object per nonce, which costs many times the encryption of a 1200-byte
 * datagram (docs/architecture.md, "What is written by hand, and why"). Used by the kcp transport's sessions; imports
 * nothing but Node built-ins.
 *
 * Both calls work in place on one datagram laid out as [aad][text][tag: 16 bytes], so a seal
 * writes the whole datagram into one buffer and an open yields the plaintext as a view of it.
 */
import { loadAddon } from './load-addon.js';

export const AEAD_KEY_BYTES = 32;
export const AEAD_NONCE_BYTES = 12;
export const AEAD_TAG_BYTES = 16;

interface NativeAesGcm {
  seal(nonce: Buffer, datagram: Buffer, aadLength: number): void;
  open(nonce: Buffer, datagram: Buffer, aadLength: number): boolean;
}

interface AeadAddon {
  AesGcm: new (key: Buffer, forSealing: boolean) => NativeAesGcm;
}

let addon: AeadAddon | undefined;
function nativeAddon(): AeadAddon {
  addon ??= loadAddon<AeadAddon>('mesh_aead.node');
  return addon;
}

function checkLayout(nonce: Buffer, datagram: Buffer, aadLength: number): void {
  if (nonce.length !== AEAD_NONCE_BYTES) throw new RangeError('the nonce is 12 bytes');
  if (!Number.isInteger(aadLength) || aadLength < 0 || aadLength + AEAD_TAG_BYTES > datagram.length)
    throw new RangeError('the datagram must hold aadLength bytes and a 16-byte tag');
}

/** A native context for one key and one direction. */
function contextFor(key: Buffer, forSealing: boolean): NativeAesGcm {
  if (key.length !== AEAD_KEY_BYTES) throw new RangeError('the key is 32 bytes');
  return new (nativeAddon().AesGcm)(key, forSealing);
}

/** Seals datagrams under one key (one direction of a session). */
export class AeadSealer {
  private readonly context: NativeAesGcm;

  constructor(key: Buffer) {
    this.context = contextFor(key, true);
  }

  /**
   * `datagram` holds the aad (its first aadLength bytes), the plaintext, then 16 bytes of room:
   * the plaintext is encrypted in place and the tag written into the room. Never reuse a nonce
   * under one key.
   */
  seal(nonce: Buffer, datagram: Buffer, aadLength: number): void {
    checkLayout(nonce, datagram, aadLength);
    this.context.seal(nonce, datagram, aadLength);
  }
}

/** Opens datagrams under one key (the other direction). */
export class AeadOpener {
  private readonly context: NativeAesGcm;

  constructor(key: Buffer) {
    this.context = contextFor(key, false);
  }

  /**
   * `datagram` holds the aad, the ciphertext and the tag (its last 16 bytes). Decrypts in place and
   * says whether the tag authenticated aad and ciphertext; when it did not, the bytes between them
   * are garbage and must not be used.
   */
  open(nonce: Buffer, datagram: Buffer, aadLength: number): boolean {
    checkLayout(nonce, datagram, aadLength);
    return this.context.open(nonce, datagram, aadLength);
  }
}
