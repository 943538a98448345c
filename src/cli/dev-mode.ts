/**
 * `serve --dev`: a local license signing key in the data dir, trusted by this agent only, and a
 * ready trial license plus bootstrap body, so a newcomer can bootstrap at once. Never implied:
 * without --dev no key is trusted that the operator did not name.
 */
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { newLicenseId } from '../domain/ids.js';
import { generateLicenseKeyPair, loadLicenseSigningKey, signLicense } from '../license/sign.js';
import { loadOrCreateSecretFile, writeFileAtomic } from '../store/key-files.js';

export const DEV_SIGNING_KEY = 'dev-license-signing.key';
export const DEV_PUBLIC_KEY = 'dev-license-signing.pub';
export const DEV_LICENSE = 'dev-license.json';
export const DEV_BOOTSTRAP_BODY = 'dev-bootstrap.json';
const TRIAL_DAYS = 30;

/** Returns the PEM of the dev public key to trust, writing key, license and body as needed. */
export function prepareDevMode(
  dataDir: string,
  nowMs: number,
): { publicPem: string; bootstrapBodyFile: string } {
  const dir = resolve(dataDir);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  let publicPem: string | undefined;
  const privatePem = loadOrCreateSecretFile(join(dir, DEV_SIGNING_KEY), () => {
    const pair = generateLicenseKeyPair();
    publicPem = pair.publicPem;
    return pair.privatePem;
  });
  if (publicPem) writeFileAtomic(join(dir, DEV_PUBLIC_KEY), publicPem, 0o644);
  else publicPem = readFileSync(join(dir, DEV_PUBLIC_KEY), 'utf8');

  const licenseFile = join(dir, DEV_LICENSE);
  const bodyFile = join(dir, DEV_BOOTSTRAP_BODY);
  const current = existsSync(licenseFile)
    ? (JSON.parse(readFileSync(licenseFile, 'utf8')) as { expires_at: string })
    : undefined;
  if (!current || Date.parse(current.expires_at) <= nowMs || !existsSync(bodyFile)) {
    const license = signLicense(
      {
        customer_id: 'dev',
        license_id: newLicenseId(),
        issued_at: new Date(nowMs).toISOString(),
        expires_at: new Date(nowMs + TRIAL_DAYS * 86_400_000).toISOString(),
        max_nodes: 10,
        max_services: 100,
      },
      loadLicenseSigningKey(privatePem),
    );
    writeFileAtomic(licenseFile, `${JSON.stringify(license, null, 2)}\n`, 0o644);
    writeFileAtomic(bodyFile, `${JSON.stringify({ license, name: 'dev' })}\n`, 0o644);
  }
  return { publicPem, bootstrapBodyFile: bodyFile };
}

export function devBanner(publicUrl: string, bootstrapBodyFile: string): string {
  return [
    '',
    'mesh-agent is running in --dev mode: it trusts a local license key and wrote a trial license.',
    '1. Bootstrap (once). The answer holds client_id and client_secret, shown only this once:',
    `   curl -sS ${publicUrl}/v1/bootstrap -H 'content-type: application/json' --data @${bootstrapBodyFile}`,
    '2. Get an access token with them:',
    `   curl -sS -u 'CLIENT_ID:CLIENT_SECRET' -d grant_type=client_credentials ${publicUrl}/v1/oauth/token`,
    '3. List peers with the access_token:',
    `   curl -sS -H 'Authorization: Bearer ACCESS_TOKEN' ${publicUrl}/v1/peers`,
    '4. Or open the web console and sign in with the client_id and client_secret of step 1:',
    `   ${publicUrl}/ui/`,
    '',
  ].join('\n');
}
