import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createPublicKey, generateKeyPairSync, X509Certificate } from 'node:crypto';
import { describe, it } from 'node:test';
import { ecdsaCertificate } from '../../test/helpers/ecdsa-certificate.js';
import { certifiedKey, selfSignedCertificate } from './tunnel-certificate.js';

const rawOf = (key: ReturnType<typeof generateKeyPairSync>['privateKey']) =>
  Buffer.from(createPublicKey(key).export({ format: 'jwk' }).x as string, 'base64url');

describe('tunnel certificate', () => {
  it('is a self-signed v3 Ed25519 certificate over the identity key, valid 2000..9999', () => {
    const { privateKey } = generateKeyPairSync('ed25519');
    const pem = selfSignedCertificate(privateKey, 'mesh-agent abc');
    const cert = new X509Certificate(pem);
    assert.equal(cert.subject, 'CN=mesh-agent abc');
    assert.equal(cert.issuer, 'CN=mesh-agent abc');
    assert.equal(cert.publicKey.asymmetricKeyType, 'ed25519');
    assert.ok(cert.verify(cert.publicKey));
    assert.equal(new Date(cert.validFrom).toISOString(), '2000-01-01T00:00:00.000Z');
    assert.equal(new Date(cert.validTo).toISOString(), '9999-12-31T23:59:59.000Z');
    assert.ok(certifiedKey(cert)!.equals(rawOf(privateKey)));
    // Each one has its own serial.
    assert.notEqual(
      new X509Certificate(selfSignedCertificate(privateKey, 'x')).serialNumber,
      cert.serialNumber,
    );
  });

  it('is what OpenSSL itself reads as a well-formed v3 certificate', () => {
    const { privateKey } = generateKeyPairSync('ed25519');
    const text = execFileSync('openssl', ['x509', '-noout', '-text'], {
      input: selfSignedCertificate(privateKey, 'mesh-agent abc'),
      encoding: 'utf8',
    });
    assert.match(text, /Version: 3 \(0x2\)/);
    assert.match(text, /Signature Algorithm: ED25519/);
    assert.match(text, /Not After : Dec 31 23:59:59 9999 GMT/);
  });

  it('certifiedKey refuses a broken self-signature, another key type, or nothing', () => {
    const { privateKey } = generateKeyPairSync('ed25519');
    const der = new X509Certificate(selfSignedCertificate(privateKey, 'x')).raw;
    der[der.length - 1]! ^= 0x01;
    assert.equal(certifiedKey(new X509Certificate(der)), undefined);
    const ec = new X509Certificate(ecdsaCertificate('ec').cert);
    assert.ok(ec.verify(ec.publicKey), 'a valid self-signed ECDSA certificate');
    assert.equal(certifiedKey(ec), undefined);
    assert.equal(certifiedKey(undefined), undefined);
  });

  it('refuses to make one from anything but an Ed25519 private key', () => {
    const { privateKey, publicKey } = generateKeyPairSync('ed25519');
    assert.throws(() => selfSignedCertificate(publicKey, 'x'), /Ed25519 private key/);
    assert.throws(() => selfSignedCertificate(generateKeyPairSync('x25519').privateKey, 'x'), /Ed25519/);
    assert.ok(selfSignedCertificate(privateKey, 'x'));
  });
});
