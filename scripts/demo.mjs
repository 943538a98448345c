#!/usr/bin/env node
/**
 * `npm run demo`: a three-site mesh in network namespaces on this machine, set up
 * the way an operator would, with the `mesh-agent` CLI only: a vendor key and one signed license,
 * three agents bootstrapped with it, joined with `peers add`, two services with their routes (one
 * NATed, one fully transparent with the return route it needs), a request from a client at site A
 * to a destination at sites B and C, the source address the destination's own log recorded, and
 * `mesh-agent status`. Everything it made (namespaces, links, processes, temp dirs) is removed on
 * exit, on an error, on Ctrl-C and on SIGTERM.
 *
 * Needs root (namespaces, TUN, nftables), iproute2, nftables, curl and a build (`npm run build`):
 * it reuses the test topology, dist/test/helpers/netns-topology.js, and the destination server of
 * the tests, dist/test/helpers/netns-apps.js. Namespaces are named `mdemo-*`. Test:
 * test/demo/demo.root.test.ts.
 */
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const MAIN_JS = join(ROOT, 'dist', 'src', 'cli', 'main.js');
const TOPOLOGY_JS = join(ROOT, 'dist', 'test', 'helpers', 'netns-topology.js');
const APPS_JS = join(ROOT, 'dist', 'test', 'helpers', 'netns-apps.js');
const PREFIX = 'mdemo';
/** The management subnet 10.254.97.0/24 (the tests use other indexes). */
const INDEX = 97;
const PORT = 7480;
const HTTP = 8080;
const MACVLAN = '10.91.2.50';

const bold = (s) => (process.stdout.isTTY ? `\x1b[1m${s}\x1b[0m` : s);
const step = (n, text) => console.log(`\n${bold(`== ${n}. ${text}`)}`);
const say = (text) => console.log(`   ${text}`);
const indent = (text) =>
  text
    .trimEnd()
    .split('\n')
    .map((l) => `     ${l}`)
    .join('\n');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** What the cleanup removes: filled as things are made. */
const made = { topo: null, procs: [], dirs: [] };
let cleaning = null;
/** Set by Ctrl-C / SIGTERM: the steps still running then fail, and that is no error to report. */
let interrupted = false;

function cleanup() {
  cleaning ??= (async () => {
    for (const p of made.procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGTERM');
    const deadline = Date.now() + 10_000;
    while (made.procs.some((p) => p.exitCode === null && p.signalCode === null) && Date.now() < deadline)
      await sleep(50);
    for (const p of made.procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
    // Kills whatever still runs in the namespaces, deletes them and the management links.
    if (made.topo) await made.topo.down();
    for (const d of made.dirs) rmSync(d, { recursive: true, force: true });
  })();
  return cleaning;
}

for (const [signal, code] of [
  ['SIGINT', 130],
  ['SIGTERM', 143],
]) {
  process.on(signal, () => {
    interrupted = true;
    console.log(`\n${signal}: tearing the demo down`);
    cleanup().finally(() => process.exit(code));
  });
}

/** Runs the CLI; prints the command and (unless quiet) its output; rejects on a non-zero exit. */
function cli(args, env, { quiet = false, show = args } = {}) {
  if (!quiet) console.log(`   $ mesh-agent ${show.join(' ')}`);
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [MAIN_JS, ...args], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c) => {
      stdout += c;
    });
    child.stderr.on('data', (c) => {
      stderr += c;
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      if (code !== 0) {
        reject(new Error(`mesh-agent ${args.join(' ')} exited ${code}: ${stderr || stdout}`));
        return;
      }
      resolve(stdout);
    });
  });
}

/** Retries fn (which throws until done) for at most ms; its last error otherwise. */
async function until(what, fn, ms) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    try {
      return await fn();
    } catch (err) {
      last = err;
      await sleep(250);
    }
  }
  throw new Error(`${what}: not done in ${ms} ms (${last?.message ?? 'no attempt'})`);
}

async function main() {
  if (process.getuid?.() !== 0) {
    throw new Error('the demo needs root (network namespaces, TUN devices, nftables): run it with sudo');
  }
  for (const f of [MAIN_JS, TOPOLOGY_JS, APPS_JS]) {
    if (!existsSync(f)) throw new Error(`${f} is missing: run \`npm run build\` first`);
  }
  const { IP, spawnIn, topologyUp } = await import(TOPOLOGY_JS);
  const work = mkdtempSync(join(tmpdir(), 'mesh-demo-'));
  made.dirs.push(work);

  step(1, 'Network: three sites in network namespaces (mdemo-*)');
  made.topo = await topologyUp(PREFIX, INDEX, { secondExit: true });
  const topo = made.topo;
  say(`site A: agent ${topo.ns.ingress} (underlay ${IP.ingressUl}), client ${topo.ns.client} ${IP.client}`);
  say(`site B: agent ${topo.ns.exit} (underlay ${IP.exitUl}), destination network 10.91.2.0/24`);
  say(`site C: agent ${topo.ns.exit2} (underlay ${IP.exit2Ul}), destination network 10.91.4.0/24`);
  say(`destination ${topo.ns.dest}: ${IP.dest} on site B's network and ${IP.dest2} on site C's`);
  say('the client has no route to either destination network except through the agents.');
  // A transparent exit loosens reverse-path filtering; a client address it has no route to
  // at all would still be dropped (docs/transparent.md): site B's default route is its underlay.
  await topo.run(topo.ns.exit, 'ip', ['route', 'add', 'default', 'via', IP.ingressUl]);
  const server = spawnIn(topo.ns.dest, process.execPath, [
    APPS_JS,
    'serve',
    String(HTTP),
    String(HTTP + 1010),
  ]);
  made.procs.push(server);
  let destLog = '';
  server.stdout.on('data', (c) => {
    destLog += c;
  });
  say(
    `the destination runs a web server on port ${HTTP} that logs each request's source address (pid ${server.pid}).`,
  );

  step(2, 'License: one vendor key, one license for the whole mesh');
  const vendorDir = join(work, 'vendor');
  await cli(['license', 'keygen', '--out', vendorDir]);
  const expires = new Date(Date.now() + 30 * 86_400_000).toISOString();
  const license = await cli([
    'license',
    'sign',
    '--key',
    join(vendorDir, 'license-signing.key'),
    '--customer-id',
    'demo',
    '--license-id',
    'demo-license',
    '--max-nodes',
    '5',
    '--max-services',
    '10',
    '--expires-at',
    expires,
  ]);
  const licenseFile = join(work, 'license.json');
  writeFileSync(licenseFile, license);
  say(`signed license ${licenseFile} (5 nodes, 10 services, expires ${expires.slice(0, 10)})`);

  step(3, 'Agents: `mesh-agent serve` in each site, trusting the vendor public key');
  const sites = [
    { name: 'site-a', ns: topo.ns.ingress, ul: IP.ingressUl, mgmt: topo.mgmt.ingress, parent: null },
    { name: 'site-b', ns: topo.ns.exit, ul: IP.exitUl, mgmt: topo.mgmt.exit, parent: 'e0' },
    { name: 'site-c', ns: topo.ns.exit2, ul: IP.exit2Ul, mgmt: topo.mgmt.exit2, parent: 'f0' },
  ];
  for (const s of sites) {
    s.url = `http://${s.mgmt}:${PORT}`;
    const args = [
      MAIN_JS,
      'serve',
      '--listen',
      `0.0.0.0:${PORT}`,
      '--advertise',
      `${s.ul}:${PORT}`,
      '--data-dir',
      join(work, s.name),
      '--license-public-key',
      join(vendorDir, 'license-signing.pub'),
      '--dataplane',
      'on',
      '--gossip-interval-ms',
      '200',
      '--log-level',
      'warn',
      ...(s.parent ? ['--macvlan-parent', s.parent] : []),
    ];
    say(`${s.name}: mesh-agent ${args.slice(1).join(' ')}`);
    const proc = spawnIn(s.ns, process.execPath, args);
    s.log = '';
    proc.stdout.on('data', (c) => {
      s.log += c;
    });
    proc.stderr.on('data', (c) => {
      s.log += c;
    });
    made.procs.push(proc);
    s.proc = proc;
  }
  for (const s of sites) {
    await until(
      `${s.name} ready`,
      async () => {
        if (s.proc.exitCode !== null) throw new Error(`exited ${s.proc.exitCode}: ${s.log}`);
        const res = await fetch(`${s.url}/readyz`, { signal: AbortSignal.timeout(1000) });
        if (res.status !== 200) throw new Error(`/readyz ${res.status}`);
      },
      30_000,
    );
    say(`${s.name} answers at ${s.url} (management API)`);
  }

  step(4, 'Bootstrap: each agent gets the license and its first admin credential (a CLI profile)');
  const env = { XDG_CONFIG_HOME: join(work, 'config'), MESH_PROFILE: '' };
  for (const s of sites) {
    const out = await cli(
      [
        'bootstrap',
        '--license',
        licenseFile,
        '--url',
        s.url,
        '--name',
        s.name,
        '--login',
        '--profile',
        s.name,
      ],
      env,
    );
    s.peerId = /^peer_id\s+(\S+)$/m.exec(out)?.[1];
    // The secret is saved in the profile (mode 0600); the demo does not print it.
    console.log(indent(out.replace(/^(client_secret\s+)\S+$/m, '$1(saved in the profile, not shown)')));
  }

  step(5, 'Join: site A adds sites B and C; they share membership by gossip from now on');
  const a = { ...env, MESH_PROFILE: 'site-a' };
  for (const s of sites.slice(1)) console.log(indent(await cli(['peers', 'add', `${s.ul}:${PORT}`], a)));
  await until(
    'every agent sees the other two',
    async () => {
      for (const s of sites) {
        const peers = JSON.parse(
          await cli(['peers', 'ls', '--json'], { ...env, MESH_PROFILE: s.name }, { quiet: true }),
        );
        const list = Array.isArray(peers) ? peers : (peers.items ?? peers.peers ?? []);
        if (list.length < 3) throw new Error(`${s.name} sees ${list.length} peers`);
      }
    },
    30_000,
  );
  say('peers are named after their sites, for the screens below:');
  for (const s of sites) await cli(['peers', 'rename', s.peerId, s.name], a);
  console.log(indent(await cli(['peers', 'ls'], a)));

  step(6, 'Services and routes (made at site A, they reach every agent by gossip)');
  const [siteA, siteB, siteC] = sites;
  say(
    `NAT service A -> C: the client's TCP to 10.91.4.0/24 crosses the mesh and leaves site C from its own address`,
  );
  const nat = JSON.parse(
    await cli(['services', 'create', '--target', siteC.peerId, '--transport', 'tcp', '--json'], a),
  );
  console.log(indent(`service ${nat.id}`));
  console.log(indent(await cli(['routes', 'add', nat.id, '--dest', '10.91.4.0/24'], a)));
  say(
    "Transparent service A -> B: the destination sees the client's own address; site B gets a MACVLAN " +
      `address ${MACVLAN} on the destination network`,
  );
  const tp = JSON.parse(
    await cli(
      [
        'services',
        'create',
        '--target',
        siteB.peerId,
        '--interface',
        '--ipv4',
        `${MACVLAN}/24`,
        '--transparent',
        '--json',
      ],
      a,
    ),
  );
  console.log(indent(`service ${tp.id}`));
  console.log(
    indent(await cli(['routes', 'add', tp.id, '--source', '10.91.1.0/24', '--dest', '10.91.2.0/24'], a)),
  );
  say(`the return route an operator adds on the destination's network (docs/transparent.md):`);
  say(`# ip route add 10.91.1.0/24 via ${MACVLAN}     (in ${topo.ns.dest})`);
  await topo.run(topo.ns.dest, 'ip', ['route', 'add', '10.91.1.0/24', 'via', MACVLAN]);
  for (const [svc, ends] of [
    [nat, [siteA, siteC]],
    [tp, [siteA, siteB]],
  ]) {
    await until(
      `service ${svc.id} up`,
      async () => {
        for (const s of ends) {
          const got = JSON.parse(
            await cli(
              ['services', 'get', svc.id, '--json'],
              { ...env, MESH_PROFILE: s.name },
              { quiet: true },
            ),
          );
          if (got.dataplane?.state !== 'up') throw new Error(`${s.name}: ${JSON.stringify(got.dataplane)}`);
        }
      },
      45_000,
    );
    say(`service ${svc.id} is up at both ends`);
  }

  step(7, 'Traffic: the client at site A requests each destination; the destination logs who it saw');
  const results = [];
  for (const [label, host, path, expect] of [
    ['NAT (via site C)', IP.dest2, '/demo-nat', 'site C (its own address, 10.91.4.1)'],
    ['transparent (via site B)', IP.dest, '/demo-transparent', `the client (${IP.client})`],
  ]) {
    say(`$ curl http://${host}:${HTTP}${path}      (in ${topo.ns.client})`);
    const from = destLog.length;
    const body = await until(
      `${label} request`,
      () =>
        topo.run(topo.ns.client, 'curl', ['-sS', '--max-time', '5', `http://${host}:${HTTP}${path}`], 15_000),
      30_000,
    );
    say(`  answer: ${body.trim()}`);
    const line = await until(
      'the destination log line',
      async () => {
        const m = new RegExp(`^remote (\\S+) ${path}$`, 'm').exec(destLog.slice(from));
        if (!m) throw new Error('not logged yet');
        return m;
      },
      5_000,
    );
    say(`  the destination's own log: "${line[0]}"  (expected: ${expect})`);
    results.push({ label, source: line[1] });
  }
  for (const r of results) console.log(`   RESULT ${r.label}: the destination saw source ${r.source}`);

  step(8, 'Status: the whole cluster from site A');
  console.log(indent(await cli(['status'], a)));
}

let code = 0;
try {
  await main();
  console.log(`\n${bold('== Done.')} Tearing down (namespaces, links, agents, temp files).`);
} catch (err) {
  if (!interrupted) {
    console.error(`\ndemo failed: ${err instanceof Error ? err.message : err}`);
    code = 1;
  }
} finally {
  await cleanup();
}
console.log('Torn down: no mdemo-* namespace, agent or temp directory is left.');
process.exit(code);
