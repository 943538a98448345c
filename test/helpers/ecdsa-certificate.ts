/**
 * A self-signed ECDSA P-256 certificate and its key, made by the openssl CLI: a valid certificate
 * of a key type the tunnel must refuse (only Ed25519 identities are pinned), and the certificate
 * of bench/dataplane's bare Node TLS relay (the kind paths.sh makes for stunnel). Tests and benches.
 */
import { execFileSync } from 'node:child_process';

export function ecdsaCertificate(commonName: string): { cert: string; key: string } {
  const pem = execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-subj',
      `/CN=${commonName}`,
      '-days',
      '1',
      '-keyout',
      '-',
      '-out',
      '-',
    ],
    // No system openssl.cnf: its defaults differ between distributions.
    {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
      env: { ...process.env, OPENSSL_CONF: '/dev/null' },
    },
  );
  const keyEnd = '-----END PRIVATE KEY-----';
  return {
    key: pem.slice(pem.indexOf('-----BEGIN PRIVATE KEY-----'), pem.indexOf(keyEnd) + keyEnd.length),
    cert: pem.slice(pem.indexOf('-----BEGIN CERTIFICATE-----')),
  };
}
