#!/usr/bin/env node
// `npm test`'s first step (pretest): makes a fresh Debian machine able to run every test. As
// root it installs the Debian packages the tests drive that are missing (apt-get update first,
// and only when something is missing), then the npm packages when node_modules is missing or
// older than package-lock.json (npm ci). Not as root it installs nothing: the whole suite needs
// root (network namespaces, TUN devices, nftables), so it says in one paragraph which packages
// are missing and which tests need root, and fails. `npm run test:unit` is the tier for a
// user without root.
import { spawnSync } from 'node:child_process';
import { existsSync, statSync } from 'node:fs';
import { findFiles } from './find-files.mjs';

/** Each package the tests need, and what for; a fresh machine has the first five already. */
const DEBIAN_PACKAGES = {
  'g++': 'building the native addons and better-sqlite3 (npm ci)',
  make: 'building the native addons and better-sqlite3 (npm ci)',
  python3: 'node-gyp, which builds them',
  iproute2: 'ip: network namespaces, links, rules and routes',
  openssl: 'reading the tunnel certificate in a unit test',
  nftables: 'the data plane’s own table',
  tcpdump: 'underlay captures',
  curl: 'a client through the mesh',
  iperf3: 'two iperf3 runs back to back through a limited service',
  'iputils-ping': 'ICMP through the mesh',
  procps: 'sysctl -a in the transparent-mode tests',
  'util-linux': 'unshare in the transparent-mode tests',
  systemd: 'systemd-analyze verify of deploy/mesh-agent.service',
  chromium: 'the /docs rendering test (driven by playwright-core)',
  'python3-prometheus-client': 'the official parser of /metrics',
  prometheus: 'promtool, the official linter of /metrics',
  libfaketime: 'moving an agent’s clock in the license, credential, tombstone and webhook tests',
};

function installed(pkg) {
  // dpkg-query's own format field, not a JavaScript template.
  // biome-ignore lint/suspicious/noTemplateCurlyInString: see above
  const r = spawnSync('dpkg-query', ['-W', '-f', '${db:Status-Abbrev}', pkg], { encoding: 'utf8' });
  return r.status === 0 && r.stdout.startsWith('ii');
}

function run(command, args, env = process.env) {
  console.error(`test-setup: ${command} ${args.join(' ')}`);
  const r = spawnSync(command, args, { stdio: 'inherit', env });
  if (r.status !== 0) {
    console.error(
      `test-setup: ${command} ${args.join(' ')} failed (${r.error?.message ?? `exit ${r.status}`})`,
    );
    process.exit(1);
  }
}

const missing = Object.keys(DEBIAN_PACKAGES).filter((p) => !installed(p));
if (process.getuid?.() !== 0) {
  const packages =
    missing.length === 0
      ? 'every Debian package the tests use is installed'
      : `these Debian packages are missing: ${missing.map((p) => `${p} (${DEBIAN_PACKAGES[p]})`).join(', ')}`;
  console.error(
    `npm test runs every test and must run as root: ${packages}; and these tests need root for ` +
      `network namespaces, TUN devices and nftables: ${[...findFiles('src', '.root.test.ts'), ...findFiles('test', '.root.test.ts')].join(', ')}. ` +
      'Run it as root, which installs what is missing, or run npm run test:unit, ' +
      'the tier that needs neither root nor those packages.',
  );
  process.exit(1);
}
if (missing.length > 0) {
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  run('apt-get', ['update', '-qq'], env);
  run('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...missing], env);
}
// npm writes node_modules/.package-lock.json after every install: older than the lock means the
// lock changed since (a pull, a checkout), and what is installed may not be what it says.
const installedLock = 'node_modules/.package-lock.json';
if (!existsSync(installedLock) || statSync(installedLock).mtimeMs < statSync('package-lock.json').mtimeMs) {
  run('npm', ['ci', '--no-audit', '--no-fund']);
}
