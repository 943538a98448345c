import assert from 'node:assert/strict';
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import { prng, SEED } from '../../test/helpers/seeded-random.js';
import { AeadOpener, AeadSealer } from './aead.js';

/** node:crypto's AES-256-GCM of [aad][plaintext] as one datagram [aad][ciphertext][tag]. */
function reference(key: Buffer, nonce: Buffer, aad: Buffer, plaintext: Buffer): Buffer {
  const cipher = createCipheriv('aes-256-gcm', key, nonce, { authTagLength: 16 });
  cipher.setAAD(aad);
  return Buffer.concat([aad, cipher.update(plaintext), cipher.final(), cipher.getAuthTag()]);
}

/** [aad][plaintext][16 bytes of room], as seal() takes it. */
function layout(aad: Buffer, plaintext: Buffer): Buffer {
  return Buffer.concat([aad, plaintext, Buffer.alloc(16, 0xee)]);
}

describe('native AES-256-GCM (src/native/aead.ts)', () => {
  it(`seals and opens byte for byte as node:crypto does (seed ${SEED})`, () => {
    const random = prng(SEED);
    const key = randomBytes(32);
    const sealer = new AeadSealer(key);
    const opener = new AeadOpener(key);
    // Lengths around the block size and the datagram sizes the kcp transport sends.
    for (const length of [0, 1, 15, 16, 17, 255, 1200, 1321, 65_000]) {
      for (const aadLength of [0, 13, 40]) {
        const nonce = randomBytes(12);
        const aad = Buffer.from(Array.from({ length: aadLength }, () => Math.floor(random() * 256)));
        const plaintext = randomBytes(length);
        const expected = reference(key, nonce, aad, plaintext);
        const datagram = layout(aad, plaintext);
        sealer.seal(nonce, datagram, aadLength);
        assert.deepEqual(datagram, expected, `seal of ${length} bytes after ${aadLength} of aad`);
        // node:crypto opens what was sealed natively (the other direction of the test above).
        const decipher = createDecipheriv('aes-256-gcm', key, nonce, { authTagLength: 16 });
        decipher.setAAD(aad);
        decipher.setAuthTag(datagram.subarray(datagram.length - 16));
        const clear = Buffer.concat([
          decipher.update(datagram.subarray(aadLength, datagram.length - 16)),
          decipher.final(),
        ]);
        assert.deepEqual(clear, plaintext);
        assert.equal(opener.open(nonce, datagram, aadLength), true);
        assert.deepEqual(datagram.subarray(aadLength, datagram.length - 16), plaintext, 'decrypted in place');
      }
    }
  });

  it('refuses a changed byte anywhere, another nonce and another key', () => {
    const key = randomBytes(32);
    const nonce = randomBytes(12);
    const sealed = reference(key, nonce, Buffer.from('header: thirteen'.slice(0, 13)), randomBytes(100));
    const opener = new AeadOpener(key);
    for (let at = 0; at < sealed.length; at++) {
      const tampered = Buffer.from(sealed);
      tampered[at]! ^= 0x01;
      assert.equal(opener.open(nonce, tampered, 13), false, `a flipped bit at ${at} went through`);
    }
    const otherNonce = Buffer.from(nonce);
    otherNonce[11]! ^= 0x80;
    assert.equal(opener.open(otherNonce, Buffer.from(sealed), 13), false);
    assert.equal(new AeadOpener(randomBytes(32)).open(nonce, Buffer.from(sealed), 13), false);
    // A refusal leaves the context usable: the genuine datagram still opens.
    assert.equal(opener.open(nonce, Buffer.from(sealed), 13), true);
  });

  it('keeps each context to its direction and its layout inside the buffer', () => {
    const key = randomBytes(32);
    const sealer = new AeadSealer(key);
    const opener = new AeadOpener(key);
    const nonce = randomBytes(12);
    assert.throws(() => new AeadSealer(randomBytes(16)), RangeError);
    assert.throws(() => sealer.seal(randomBytes(8), Buffer.alloc(40), 13), RangeError);
    assert.throws(() => sealer.seal(nonce, Buffer.alloc(28), 13), RangeError, 'no room for the tag');
    assert.throws(() => sealer.seal(nonce, Buffer.alloc(40), -1), RangeError);
    assert.throws(() => sealer.seal(nonce, Buffer.alloc(40), 1.5), RangeError);
    assert.throws(() => opener.open(nonce, Buffer.alloc(15), 0), RangeError, 'shorter than a tag');
    // The addon checks the same on its own: a caller past the wrapper cannot reach outside the buffer.
    const native = (sealer as unknown as { context: { seal(n: Buffer, d: Buffer, a: number): void } })
      .context;
    assert.throws(() => native.seal(nonce, Buffer.alloc(28), 13), RangeError);
    for (const aad of [2 ** 40, 2 ** 64, Number.POSITIVE_INFINITY, Number.NaN, -0.5])
      assert.throws(() => native.seal(nonce, Buffer.alloc(40), aad), RangeError, `aadLength ${aad}`);
    const nativeOpen = (opener as unknown as { context: { seal(n: Buffer, d: Buffer, a: number): void } })
      .context;
    assert.throws(() => nativeOpen.seal(nonce, Buffer.alloc(40), 13), /cannot seal/);
    // An empty plaintext seals to the tag alone, which authenticates the aad.
    const d = layout(Buffer.from('aad'), Buffer.alloc(0));
    sealer.seal(nonce, d, 3);
    assert.equal(opener.open(nonce, Buffer.from(d), 3), true);
    d[0] = 0x41;
    assert.equal(opener.open(nonce, d, 3), false);
  });
});
