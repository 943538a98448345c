/**
 * bench/dataplane/shaping-latency: what a bulk flow adds to the latency of pings and small HTTP
 * requests beside it, through a mesh service limited to R Mbit/s, against the same load through a
 * plain R Mbit/s bottleneck (the kernel's `tbf`, the reference a user compares a shaped link with;
 * this kernel has no fq_codel or cake). Root: network namespaces.
 *
 * Mesh: the data-plane tests' namespaces (test/helpers/mesh-netns.ts), one service ingress -> exit
 * with its route to the destination's subnet and `bandwidth_limit_mbps` R. Reference: two more
 * namespaces joined by a veth pair, `tbf rate R burst max(4 ms of R, 3 KB) latency 50ms` on both
 * egresses, the same server app on the far side. For each path, rate, direction and number of bulk
 * flows (`--flows`, 1 and 4): 150 pings 50 ms apart and 50 requests idle, then the same beside
 * that many bulk transfers (curl, up or down, three times the rate asked between them) that
 * saturate the limit; p50 and p99 of each, and what the load added (loaded minus idle, p50
 * against p50 and p99 against p99). The ratio mesh over tbf of the loaded p99 is the figure.
 *
 * A third path is the mesh's floor: the same service with no limit, and bulk senders that keep
 * themselves to the rate between them (curl's --limit-rate up, the server's pacing down), so no
 * shaper keeps a queue (on average: curl's limiter overshoots in its first second). What it
 * adds is what carrying that rate through two agents costs on this machine, shaper or not; the
 * limited mesh can only be judged above that.
 *
 * Then the end of a flow, per path and rate: a client writes as fast as its socket takes bytes
 * for 2 s and shuts its side (the `flood` app), three times; how long after its shutdown the
 * destination has read everything, median and range, and mesh over tbf. For the mesh, the
 * client's own socket (`ss -tmi`) 1.5 s in: its congestion window, send buffer and unsent bytes,
 * which is where that time is spent (docs/dataplane.md, "Where a limited service's bytes wait").
 *
 * With `--bottleneck underlay` the mesh service has no limit; the same tbf sits instead on both
 * agents' underlay links (the ingress's i1, the exit's e1): a tunnel across a slow WAN, where what
 * the agent queues in front of the tunnel is all a ping or a request waits behind.
 *
 *   node dist/bench/dataplane/shaping-latency.js [--rates 10,100,1000] [--flows 1,4]
 *     [--transport tcp|kcp] [--bottleneck limit|underlay]
 */
import { execFile } from 'node:child_process';
import { parseArgs, promisify } from 'node:util';
import { bulkTransfer, p50, p99, pingTimes, requestTimes } from '../../test/helpers/latency-probes.js';
import { APPS, createService, HTTP, meshNetnsUp, UDP, until, waitUp } from '../../test/helpers/mesh-netns.js';
import { IP, spawnIn, type Topology } from '../../test/helpers/netns-topology.js';

const { values } = parseArgs({
  options: {
    rates: { type: 'string', default: '10,100,1000' },
    flows: { type: 'string', default: '1,4' },
    transport: { type: 'string', default: 'tcp' },
    bottleneck: { type: 'string', default: 'limit' },
  },
});
const RATES = values.rates.split(',').map(Number);
const TRANSPORT = values.transport;
if (RATES.some((r) => !Number.isFinite(r) || r <= 0))
  throw new Error('--rates: positive Mbit/s, comma separated');
const FLOWS = values.flows.split(',').map(Number);
if (FLOWS.some((f) => !Number.isInteger(f) || f < 1 || f > 16))
  throw new Error('--flows: numbers of bulk flows (1 to 16), comma separated');
if (TRANSPORT !== 'tcp' && TRANSPORT !== 'kcp') throw new Error('--transport: tcp or kcp');
const UNDERLAY = values.bottleneck === 'underlay';
if (!UNDERLAY && values.bottleneck !== 'limit') throw new Error('--bottleneck: limit or underlay');
if (process.getuid?.() !== 0) throw new Error('shaping-latency needs root (network namespaces)');

const exec = promisify(execFile);
/** Runs a command in a namespace (the topology's runner, set once the mesh is up). */
let run: Topology['run'];

const PINGS = 150;
const REF = { a: 'mbsl-ra', b: 'mbsl-rb', ipA: '10.92.0.1', ipB: '10.92.0.2' };
interface Sample {
  pings: number[];
  requests: number[];
}

/** Pings and small requests (each its own connection) from `ns` to `host`, at once. */
async function sample(ns: string, host: string): Promise<Sample> {
  const [pings, requests] = await Promise.all([
    pingTimes(run, ns, host, PINGS, 0.05),
    requestTimes(run, ns, host, HTTP, 50, 0.05),
  ]);
  return { pings, requests };
}

/**
 * `flows` bulk transfers, three times `mbps` between them, for `seconds`, up or down, at once;
 * with `selfPaced` each sender keeps to its share of `mbps`.
 */
const bulk = (
  ns: string,
  host: string,
  mbps: number,
  direction: 'up' | 'down',
  seconds: number,
  flows: number,
  selfPaced: boolean,
) =>
  Promise.all(
    Array.from({ length: flows }, () =>
      bulkTransfer(
        run,
        ns,
        host,
        HTTP,
        direction,
        Math.round(((3 * mbps * 1e6) / 8 / flows) * seconds),
        seconds,
        selfPaced ? mbps / flows : undefined,
      ),
    ),
  );

/** The end of a flow: ms from the client's shutdown to the destination's read of the last byte. */
interface CloseRow {
  path: string;
  mbps: number;
  closes: number[];
  /** The client's socket 1.5 s into the last flood (congestion window, buffers), from `ss -tmi`. */
  client: string;
}

async function endOfFlow(
  path: string,
  ns: string,
  host: string,
  mbps: number,
  rows: CloseRow[],
): Promise<void> {
  const closes: number[] = [];
  let client = '';
  for (let i = 0; i < 3; i++) {
    const flooding = run(ns, process.execPath, [APPS, 'flood', host, String(HTTP + 1), '2'], 30_000);
    await new Promise((r) => setTimeout(r, 1500));
    const ss = (await run(ns, 'ss', ['-tmi', 'dst', host], 5_000)).replace(/\s+/g, ' ');
    client = (ss.match(/cwnd:\d+|skmem:\([^)]*\)|notsent:\d+|bbr:\([^)]*\)/g) ?? []).join(' ');
    closes.push((JSON.parse(await flooding) as { answeredMs: number }).answeredMs);
  }
  rows.push({ path, mbps, closes, client });
  console.log(
    `  ${path} ${mbps} Mbit/s end of flow: ${closes.map((c) => c.toFixed(0)).join(', ')} ms; client ${client}`,
  );
}

interface Row {
  path: string;
  mbps: number;
  flows: number;
  direction: 'up' | 'down';
  idle: Sample;
  loaded: Sample;
}

async function measure(
  path: string,
  ns: string,
  host: string,
  mbps: number,
  rows: Row[],
  selfPaced = false,
): Promise<void> {
  for (const flows of FLOWS) {
    for (const direction of ['up', 'down'] as const) {
      await measureOne(path, ns, host, mbps, flows, direction, rows, selfPaced);
    }
  }
}

async function measureOne(
  path: string,
  ns: string,
  host: string,
  mbps: number,
  flows: number,
  direction: 'up' | 'down',
  rows: Row[],
  selfPaced: boolean,
): Promise<void> {
  const idle = await sample(ns, host);
  const running = bulk(ns, host, mbps, direction, 12, flows, selfPaced);
  await new Promise((r) => setTimeout(r, 1500));
  const loaded = await sample(ns, host);
  await running;
  rows.push({ path, mbps, flows, direction, idle, loaded });
  const show = (xs: number[]) => `${p50(xs).toFixed(1)}/${p99(xs).toFixed(1)}`;
  console.log(
    `  ${path} ${mbps} Mbit/s ${direction} x${flows}: ping p50/p99 idle ${show(idle.pings)} loaded ${show(loaded.pings)} ms (${PINGS - loaded.pings.length} lost); HTTP idle ${show(idle.requests)} loaded ${show(loaded.requests)} ms`,
  );
}

async function referenceUp(): Promise<() => Promise<void>> {
  const sh = (args: string[]) => exec('ip', args, { timeout: 10_000 });
  for (const ns of [REF.a, REF.b]) await sh(['netns', 'add', ns]).catch(() => undefined);
  await sh(['link', 'add', 'mbsl-va', 'netns', REF.a, 'type', 'veth', 'peer', 'mbsl-vb', 'netns', REF.b]);
  for (const [ns, dev, ip] of [
    [REF.a, 'mbsl-va', REF.ipA],
    [REF.b, 'mbsl-vb', REF.ipB],
  ] as const) {
    await run(ns, 'ip', ['addr', 'add', `${ip}/24`, 'dev', dev], 10_000);
    await run(ns, 'ip', ['link', 'set', dev, 'up'], 10_000);
    await run(ns, 'ip', ['link', 'set', 'lo', 'up'], 10_000);
  }
  const server = spawnIn(REF.b, process.execPath, [APPS, 'serve', String(HTTP), String(UDP)]);
  await until(
    'the reference server',
    async () => {
      await run(REF.a, 'curl', ['-sS', '--max-time', '1', `http://${REF.ipB}:${HTTP}/`], 5_000);
    },
    10_000,
  );
  return async () => {
    server.kill();
    for (const ns of [REF.a, REF.b]) await sh(['netns', 'del', ns]).catch(() => undefined);
  };
}

/** `tbf` at `mbps` on each of these links' egress. */
async function tbf(mbps: number, links: readonly (readonly [string, string])[]): Promise<void> {
  const burst = Math.max(3000, Math.round((mbps * 1e6) / 8 / 250));
  for (const [ns, dev] of links) {
    await run(
      ns,
      'tc',
      [
        'qdisc',
        'replace',
        'dev',
        dev,
        'root',
        'tbf',
        'rate',
        `${mbps}mbit`,
        'burst',
        String(burst),
        'latency',
        '50ms',
      ],
      10_000,
    );
  }
}

async function main(): Promise<void> {
  const rows: Row[] = [];
  const closeRows: CloseRow[] = [];
  const mesh = await meshNetnsUp('mbsl', 75);
  let referenceDown: (() => Promise<void>) | undefined;
  try {
    const { ingress, exit, topo } = mesh;
    run = topo.run;
    const id = await createService(ingress, { target_peer_id: exit.peerId, transport_type: TRANSPORT }, [
      { priority: 100, dest_cidr: '10.91.2.0/24' },
    ]);
    await waitUp(id, ingress, exit);
    referenceDown = await referenceUp();
    const path = `mesh-${TRANSPORT}${UNDERLAY ? ' over tbf' : ''}`;
    const limit = async (mbps: number) => {
      const res = await ingress.agent.client.put(`/v1/services/${id}`, {
        token: ingress.token,
        json: { bandwidth_limit_mbps: mbps },
      });
      if (res.status !== 200) throw new Error(`limit: ${res.status} ${res.text}`);
      await ingress.agent.client.post('/v1/cluster/sync', { token: ingress.token });
      await exit.agent.client.post('/v1/cluster/sync', { token: exit.token });
      // The idle sample starts once the pacer is in place (or gone), not while it changes.
      await until(
        mbps > 0 ? 'the pacer in place' : 'the pacer gone',
        async () => {
          const paced = /htb 1: dev mesh-p\d+/.test(
            await run(topo.ns.ingress, 'tc', ['qdisc', 'show'], 5_000),
          );
          if (paced !== mbps > 0) throw new Error(paced ? 'still paced' : 'not paced yet');
        },
        20_000,
      );
    };
    for (const mbps of RATES) {
      if (UNDERLAY) {
        await tbf(mbps, [
          [topo.ns.ingress, 'i1'],
          [topo.ns.exit, 'e1'],
        ]);
      } else {
        await limit(mbps);
      }
      await measure(path, topo.ns.client, IP.dest, mbps, rows);
      await endOfFlow(path, topo.ns.client, IP.dest, mbps, closeRows);
      if (!UNDERLAY) {
        await limit(0);
        await measure(`mesh-${TRANSPORT} floor`, topo.ns.client, IP.dest, mbps, rows, true);
      }
      await tbf(mbps, [
        [REF.a, 'mbsl-va'],
        [REF.b, 'mbsl-vb'],
      ]);
      await measure('tbf', REF.a, REF.ipB, mbps, rows);
      await endOfFlow('tbf', REF.a, REF.ipB, mbps, closeRows);
    }
  } finally {
    await referenceDown?.();
    await mesh.down();
  }
  console.log(
    `\nAdded by the load, ms (loaded minus idle: p50 | p99), and mesh over tbf of the loaded p99, ${TRANSPORT}:`,
  );
  console.log(
    '| Mbit/s | direction | bulk flows | path | ping added p50 / p99 | HTTP added p50 / p99 | loaded p99 ping / HTTP, mesh ÷ tbf |',
  );
  console.log('|---|---|---|---|---|---|---|');
  for (const r of rows) {
    const ref = rows.find(
      (x) => x.path === 'tbf' && x.mbps === r.mbps && x.direction === r.direction && x.flows === r.flows,
    )!;
    const added = (k: keyof Sample) =>
      `${(p50(r.loaded[k]) - p50(r.idle[k])).toFixed(1)} / ${(p99(r.loaded[k]) - p99(r.idle[k])).toFixed(1)}`;
    const ratio =
      r.path === 'tbf'
        ? ''
        : `${(p99(r.loaded.pings) / p99(ref.loaded.pings)).toFixed(2)} / ${(p99(r.loaded.requests) / p99(ref.loaded.requests)).toFixed(2)}`;
    console.log(
      `| ${r.mbps} | ${r.direction} | ${r.flows} | ${r.path} | ${added('pings')} | ${added('requests')} | ${ratio} |`,
    );
  }
  console.log(
    "\nEnd of a flow, ms from the client's shutdown until the destination read the last byte (3 runs):",
  );
  console.log('| Mbit/s | path | median [min-max] | mesh ÷ tbf (medians) |');
  console.log('|---|---|---|---|');
  for (const r of closeRows) {
    const ref = closeRows.find((x) => x.path === 'tbf' && x.mbps === r.mbps)!;
    const ratio = r.path === 'tbf' ? '' : (p50(r.closes) / p50(ref.closes)).toFixed(2);
    const range = `${Math.min(...r.closes).toFixed(0)}-${Math.max(...r.closes).toFixed(0)}`;
    console.log(`| ${r.mbps} | ${r.path} | ${p50(r.closes).toFixed(0)} [${range}] | ${ratio} |`);
  }
}

await main();
