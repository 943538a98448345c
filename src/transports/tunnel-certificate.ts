/**
 * The tcp transport's TLS certificates (src/transports/tcp.ts only). Each agent presents a
 * self-signed X.509 certificate over its Ed25519 identity key; peers do not trust it for its
 * issuer or dates but PIN its key to the one the cluster's directory holds for the peer (TLS 1.3
 * CertificateVerify proves the presenter holds the private key). So the certificate only has to
 * be well-formed: v3, no extensions, validity from 2000 to 9999-12-31 (RFC 5280's "no expiry").
 *
 * Built here with a few lines of DER rather than with @peculiar/x509: that library's 2.x needs a
 * global Reflect polyfill (tsyringe) that the project does not carry, and a certificate with
 * fixed fields is simple enough to encode directly and check with node:crypto's parser.
 */
import { createPublicKey, type KeyObject, randomBytes, sign, type X509Certificate } from 'node:crypto';

const ED25519_ALGORITHM = der(0x30, Buffer.from([0x06, 0x03, 0x2b, 0x65, 0x70])); // OID 1.3.101.112
const COMMON_NAME_OID = Buffer.from([0x06, 0x03, 0x55, 0x04, 0x03]); // OID 2.5.4.3

/** A PEM certificate over the identity key's public half, signed by the identity key. */
export function selfSignedCertificate(identityKey: KeyObject, commonName: string): string {
  if (identityKey.type !== 'private' || identityKey.asymmetricKeyType !== 'ed25519')
    throw new Error('the tunnel certificate needs an Ed25519 private key');
  const serial = randomBytes(16);
  // Positive and minimally encoded: top bit clear, first byte non-zero.
  serial[0] = (serial[0]! & 0x7f) | 0x01;
  const name = der(0x30, der(0x31, der(0x30, COMMON_NAME_OID, der(0x0c, Buffer.from(commonName, 'utf8')))));
  const validity = der(
    0x30,
    der(0x17, Buffer.from('000101000000Z', 'latin1')), // UTCTime 2000-01-01
    der(0x18, Buffer.from('99991231235959Z', 'latin1')), // GeneralizedTime 9999-12-31
  );
  const spki = createPublicKey(identityKey).export({ type: 'spki', format: 'der' });
  const tbs = der(
    0x30,
    der(0xa0, der(0x02, Buffer.from([0x02]))), // [0] version v3
    der(0x02, serial),
    ED25519_ALGORITHM,
    name,
    validity,
    name,
    spki,
  );
  const signature = sign(null, tbs, identityKey);
  const certificate = der(0x30, tbs, ED25519_ALGORITHM, der(0x03, Buffer.from([0x00]), signature));
  const base64 = certificate.toString('base64').replace(/.{64}/g, '$&\n');
  return `-----BEGIN CERTIFICATE-----\n${base64.replace(/\n$/, '')}\n-----END CERTIFICATE-----\n`;
}

/**
 * The raw 32-byte Ed25519 key a peer certificate binds, or undefined unless it is an Ed25519
 * certificate validly signed by its own key (what selfSignedCertificate makes).
 */
export function certifiedKey(certificate: X509Certificate | undefined): Buffer | undefined {
  if (!certificate) return undefined;
  try {
    const key = certificate.publicKey;
    if (key.asymmetricKeyType !== 'ed25519') return undefined;
    if (!certificate.verify(key)) return undefined;
    const x = key.export({ format: 'jwk' }).x;
    if (typeof x !== 'string') return undefined;
    const raw = Buffer.from(x, 'base64url');
    return raw.length === 32 ? raw : undefined;
  } catch {
    return undefined;
  }
}

/** One DER element: tag, definite length, contents. */
function der(tag: number, ...contents: Buffer[]): Buffer {
  const body = Buffer.concat(contents);
  const n = body.length;
  let length: Buffer;
  if (n < 0x80) length = Buffer.from([n]);
  else {
    const bytes: number[] = [];
    for (let rest = n; rest > 0; rest >>>= 8) bytes.unshift(rest & 0xff);
    length = Buffer.from([0x80 | bytes.length, ...bytes]);
  }
  return Buffer.concat([Buffer.from([tag]), length, body]);
}
