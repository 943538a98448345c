/**
 * Fully transparent services (docs/transparent.md) through real agents in network
 * namespaces (test/helpers/netns-topology.ts): the destination's own server log says which
 * source address it saw. The destination routes the client networks back through the exit's
 * MACVLAN address, the return route docs/transparent.md tells operators to add.
 *
 * exit2 runs with /proc/sys read-only (it may not set rp_filter), for the not-ready report.
 * Services are unique per source/target pair: the modes are switched by deleting and creating.
 * The cases run in order and share the cluster.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import {
  APPS,
  serviceAt as get,
  HTTP,
  type MeshNetns,
  meshNetnsUp,
  removeService as remove,
  createService as service,
  UDP,
  until,
  waitUp,
} from '../helpers/mesh-netns.js';
import { streamSha256 } from '../helpers/netns-apps.js';
import { IP, type Topology } from '../helpers/netns-topology.js';
import type { Node } from '../helpers/nodes.js';

const MACVLAN = { v4: '10.91.2.50', v6: 'fd91:2::50' };
const MACVLAN2 = '10.91.4.50';

/**
 * Kernel counters that `sysctl -a` shows and that move by themselves (caches, pids, a random
 * uuid): not settings, so never part of "what the agent changed".
 */
const VOLATILE_SYSCTLS =
  /^(fs\.(dentry-state|inode-nr|inode-state|file-nr|aio-nr)|kernel\.(ns_last_pid|random\.|pty\.nr)|net\.netfilter\.nf_conntrack_count)/;

describe('data plane: fully transparent services', { timeout: 600_000 }, () => {
  let mesh: MeshNetns;
  let topo: Topology;
  let ingress: Node;
  let exit: Node;
  let exit2: Node;
  const destLog = () => mesh.destLog();

  const url = (host: string, path = '/') =>
    host.includes(':') ? `http://[${host}]:${HTTP}${path}` : `http://${host}:${HTTP}${path}`;
  const curl = (target: string, extra: string[] = []) =>
    topo.run(topo.ns.client, 'curl', ['-sS', '--max-time', '5', ...extra, target], 20_000);

  /**
   * The source addresses the destination's server logged (`remote ADDR PATH` lines, `udp-remote
   * ADDR`) since `from`, for requests of `path` if given.
   */
  const destSaw = (from: number, prefix = 'remote', path?: string) =>
    destLog()
      .slice(from)
      .split('\n')
      .filter((l) => l.startsWith(`${prefix} `))
      .map((l) => l.split(' '))
      .filter((f) => path === undefined || f[2] === path)
      .map((f) => f[1]!);

  let requests = 0;
  /** One request from the client; the address the destination's own log shows for it. */
  async function sourceSeen(host: string): Promise<string> {
    // A path of its own: a request of an earlier try that arrived late is not this one.
    const path = `/?request=${++requests}`;
    const from = destLog().length;
    await curl(url(host, path));
    let seen: string[] = [];
    await until(
      'the destination logged the request',
      async () => {
        seen = destSaw(from, 'remote', path);
        assert.equal(seen.length, 1);
      },
      5000,
    );
    return seen[0]!;
  }

  async function sysctlDump(ns: string): Promise<Map<string, string>> {
    const out = await topo.run(ns, 'sysctl', ['-a'], 20_000);
    const map = new Map<string, string>();
    for (const line of out.split('\n')) {
      const at = line.indexOf(' = ');
      if (at > 0) map.set(line.slice(0, at), line.slice(at + 3));
    }
    return map;
  }

  const writeProcSys = (ns: string, key: string, value: string) =>
    topo.run(ns, 'sh', ['-c', `echo ${value} > /proc/sys/${key.replaceAll('.', '/')}`]);

  before(async () => {
    mesh = await meshNetnsUp('mdtp', 42, {
      readOnlySysctls: ['exit2'],
      async prepare(t) {
        // An exit's own default route (here over the underlay). Loose reverse-path filtering,
        // which a transparent exit sets, drops tunnel packets from a client address the exit
        // has no route to at all (docs/transparent.md).
        await t.run(t.ns.exit, 'ip', ['route', 'add', 'default', 'via', IP.ingressUl]);
        await t.run(t.ns.exit2!, 'ip', ['route', 'add', 'default', 'via', IP.ingressUl2]);
        // The return routes docs/transparent.md asks for: client networks via the MACVLAN address.
        await t.run(t.ns.dest, 'ip', ['route', 'add', '10.91.1.0/24', 'via', MACVLAN.v4]);
        await t.run(t.ns.dest, 'ip', ['-6', 'route', 'add', 'fd91:1::/64', 'via', MACVLAN.v6]);
      },
    });
    ({ topo, ingress, exit, exit2 } = mesh);
  });

  after(async () => {
    await mesh?.down();
  });

  const body = (target: Node, transparent: boolean) => ({
    target_peer_id: target.peerId,
    requires_interface: true,
    desired_ipv4_cidr: `${MACVLAN.v4}/24`,
    desired_ipv6_cidr: `${MACVLAN.v6}/64`,
    fully_transparent: transparent,
  });
  const routes = [
    { priority: 100, source_cidr: '10.91.1.0/24', dest_cidr: '10.91.2.0/24' },
    { priority: 100, source_cidr: 'fd91:1::/64', dest_cidr: 'fd91:2::/64' },
  ];

  it('without transparency the destination logs the MACVLAN address (IPv4 and IPv6)', async () => {
    const id = await service(ingress, body(exit, false), routes);
    await waitUp(id, ingress, exit);
    assert.equal((await get(exit, id)).dataplane.exit_mode, 'macvlan');
    assert.equal(await sourceSeen(IP.dest), MACVLAN.v4);
    // The MACVLAN's IPv6 address may still be tentative (duplicate address detection).
    await until(
      'IPv6 through the MACVLAN',
      async () => assert.equal(await sourceSeen(IP.dest6), MACVLAN.v6),
      10_000,
    );
    assert.equal(
      (await get(exit, id)).transparent_ready,
      undefined,
      'no transparency fields on other services',
    );
    await remove(ingress, id);
    // Gone from the exit's kernel too (its MACVLAN with its sysctls) before the next test reads
    // the sysctls: on a loaded machine the removal can take more than a second to arrive.
    await until(
      'the MACVLAN removed from the exit',
      async () => {
        const links = JSON.parse(await topo.run(topo.ns.exit, 'ip', ['-j', 'link', 'show'])) as {
          ifname: string;
        }[];
        assert.deepEqual(
          links.map((l) => l.ifname).filter((n) => n.startsWith('mesh-')),
          [],
        );
      },
      20_000,
    );
  });

  let transparent: string;
  it('strict rp_filter beforehand: the agent sets 2 on exactly all, default and the MACVLAN, and nothing else', async () => {
    await writeProcSys(topo.ns.exit, 'net.ipv4.conf.all.rp_filter', '1');
    await writeProcSys(topo.ns.exit, 'net.ipv4.conf.default.rp_filter', '1');
    const before = await sysctlDump(topo.ns.exit);
    await new Promise((r) => setTimeout(r, 1000));
    const again = await sysctlDump(topo.ns.exit);
    transparent = await service(ingress, body(exit, true), routes);
    await waitUp(transparent, ingress, exit);
    await until(
      'the exit is ready for transparent mode',
      async () => assert.equal((await get(exit, transparent)).transparent_ready, true),
      10_000,
    );
    const after = await sysctlDump(topo.ns.exit);
    const tun = (await get(exit, transparent)).dataplane.interface as string;
    const macvlan = tun.replace('mesh-t', 'mesh-m');
    const changed: string[] = [];
    for (const [key, value] of before) {
      if (VOLATILE_SYSCTLS.test(key) || again.get(key) !== value) continue;
      if (after.get(key) !== value) changed.push(`${key}: ${value} -> ${after.get(key)}`);
    }
    assert.deepEqual(changed.sort(), [
      'net.ipv4.conf.all.rp_filter: 1 -> 2',
      'net.ipv4.conf.default.rp_filter: 1 -> 2',
    ]);
    // New keys only of the agent's own new links (its TUN and MACVLAN).
    const added = [...after.keys()].filter((k) => !before.has(k) && !VOLATILE_SYSCTLS.test(k));
    const foreign = added.filter((k) => !k.includes(`.${tun}.`) && !k.includes(`.${macvlan}.`));
    assert.deepEqual(foreign, []);
    assert.equal(after.get(`net.ipv4.conf.${macvlan}.rp_filter`), '2');
    // The one change each key got is in the log, with its old value.
    for (const key of ['all', 'default', macvlan]) {
      assert.match(
        exit.agent.logs,
        new RegExp(`"key":"net\\.ipv4\\.conf\\.${key}\\.rp_filter","from":"1","to":"2"`),
      );
    }
  });

  it("the destination logs the client's own address for TCP (IPv4 and IPv6); the exit shows mode transparent", async () => {
    assert.equal(await sourceSeen(IP.dest), IP.client);
    // Once in four clean-clone runs on 2026-11-28 the IPv6 path was not up within 10 s (two
    // curl attempts of 5 s); the cause is not known. The check is that it works, not how soon.
    await until(
      'IPv6 transparently',
      async () => assert.equal(await sourceSeen(IP.dest6), IP.client6),
      30_000,
    );
    const atExit = await get(exit, transparent);
    assert.equal(atExit.dataplane.exit_mode, 'transparent');
    assert.deepEqual(atExit.transparent_reasons, []);
    // The ingress cannot know: it says where to ask.
    const atIngress = await get(ingress, transparent);
    assert.equal(atIngress.transparent_ready, null);
    assert.match((atIngress.transparent_reasons as string[])[0]!, new RegExp(exit.peerId));
    assert.ok((atExit.dataplane.streams_opened as number) >= 2, JSON.stringify(atExit.dataplane));
  });

  it('moves 100 MB intact (SHA-256) and serves 50 concurrent connections, each seen from the client address', async () => {
    const n = 100 * 1024 * 1024;
    const out = await topo.run(
      topo.ns.client,
      'sh',
      ['-c', `curl -sS --max-time 120 ${url(IP.dest, `/bytes?n=${n}`)} | sha256sum`],
      130_000,
    );
    assert.equal(out.split(' ')[0], streamSha256(n));
    const from = destLog().length;
    const statuses = await topo.run(
      topo.ns.client,
      process.execPath,
      [APPS, 'burst', url(IP.dest), '50'],
      30_000,
    );
    assert.deepEqual(JSON.parse(statuses), Array(50).fill(200));
    await until('50 requests logged', async () => assert.equal(destSaw(from).length, 50), 5000);
    assert.deepEqual(new Set(destSaw(from)), new Set([IP.client]));
  });

  it('UDP and ICMP of a transparent service cross by the IP tunnel and arrive NATed (MACVLAN address)', async () => {
    const from = destLog().length;
    assert.equal(
      await topo.run(topo.ns.client, process.execPath, [APPS, 'udp', IP.dest, String(UDP), 'hello-udp']),
      'hello-udp',
    );
    assert.deepEqual(destSaw(from, 'udp-remote'), [MACVLAN.v4]);
    await topo.run(topo.ns.client, 'ping', ['-c', '2', '-i', '0.2', '-W', '2', IP.dest]);
  });

  it('an asymmetric return path: connections fail, and the exit reports the probable cause with the route to add', async () => {
    // The destination's route to the client network now points elsewhere (a host that is not there).
    await topo.run(topo.ns.dest, 'ip', ['route', 'replace', '10.91.1.0/24', 'via', '10.91.2.99']);
    const started = Date.now();
    // the exit's 10 s open timeout then a reset; curl's own 40 s limit tells a hang apart
    await assert.rejects(topo.run(topo.ns.client, 'curl', ['-sS', '--max-time', '40', url(IP.dest)], 50_000));
    const failedAfter = Date.now() - started;
    assert.ok(
      failedAfter < 35_000,
      `the client got an error (after ${failedAfter} ms), not curl's own timeout`,
    );
    let reasons: string[] = [];
    await until(
      'the probable asymmetric route reported',
      async () => {
        const s = await get(exit, transparent);
        reasons = s.transparent_reasons as string[];
        assert.equal(s.transparent_ready, false);
        assert.ok(
          reasons.some((r) => r.includes('asymmetric')),
          JSON.stringify(reasons),
        );
      },
      10_000,
    );
    const reason = reasons.find((r) => r.includes('asymmetric'))!;
    assert.match(reason, /10\.91\.1\.0\/24 via 10\.91\.2\.50/);
    const readyz = await exit.agent.client.get('/readyz');
    assert.equal(readyz.status, 503);
    assert.ok(
      (readyz.body.reasons as string[]).some((r) => r.includes('asymmetric')),
      readyz.text,
    );
    // The route the report names: traffic crosses again and the report clears.
    await topo.run(topo.ns.dest, 'ip', ['route', 'replace', '10.91.1.0/24', 'via', MACVLAN.v4]);
    assert.equal(await sourceSeen(IP.dest), IP.client);
    const s = await get(exit, transparent);
    assert.equal(s.transparent_ready, true, JSON.stringify(s.transparent_reasons));
    assert.equal((await exit.agent.client.get('/readyz')).status, 200);
  });

  it('an exit that may not set rp_filter: not ready, with reasons on the service, in /readyz, /metrics and once in the log', async () => {
    await writeProcSys(topo.ns.exit2!, 'net.ipv4.conf.all.rp_filter', '1');
    await writeProcSys(topo.ns.exit2!, 'net.ipv4.conf.default.rp_filter', '1');
    const id = await service(
      ingress,
      { ...body(exit2, true), desired_ipv4_cidr: `${MACVLAN2}/24`, desired_ipv6_cidr: null },
      [{ priority: 100, dest_cidr: '10.91.4.0/24' }],
    );
    let s: Awaited<ReturnType<typeof get>> | undefined;
    await until(
      'exit2 reports why it is not ready',
      async () => {
        s = await get(exit2, id);
        assert.equal(s.transparent_ready, false, JSON.stringify(s));
      },
      20_000,
    );
    const reasons = s!.transparent_reasons as string[];
    for (const key of ['all', 'default']) {
      assert.ok(
        reasons.some((r) => r.includes(`net.ipv4.conf.${key}.rp_filter is 1`) && r.includes('could not set')),
        JSON.stringify(reasons),
      );
    }
    // Nothing was changed behind the operator's back: the values are the ones set above.
    assert.equal(
      (await topo.run(topo.ns.exit2!, 'cat', ['/proc/sys/net/ipv4/conf/all/rp_filter'])).trim(),
      '1',
    );
    const readyz = await exit2.agent.client.get('/readyz');
    assert.equal(readyz.status, 503);
    assert.ok(
      (readyz.body.reasons as string[]).some(
        (r) => r.includes(`transparent service ${id}`) && r.includes('rp_filter'),
      ),
      readyz.text,
    );
    const metrics = await exit2.agent.client.get('/metrics', { token: exit2.token });
    assert.match(metrics.text, new RegExp(`mesh_dataplane_transparent_ready\\{service_id="${id}"\\} 0`));
    // Reconciles come and go (sync, the timer): the log says it once.
    for (let i = 0; i < 3; i++) {
      await exit2.agent.client.post('/v1/cluster/sync', { token: exit2.token });
      await new Promise((r) => setTimeout(r, 300));
    }
    const said = exit2.agent.logs.split('\n').filter((l) => l.includes('transparent service not ready'));
    assert.equal(said.length, 1, said.join('\n'));
    await remove(ingress, id);
  });
});
