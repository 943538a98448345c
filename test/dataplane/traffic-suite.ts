/**
 * Real traffic through real agents in network namespaces (test/helpers/netns-topology.ts): an
 * ingress agent, an exit agent and a second exit, each in its own namespace with its data plane
 * on, joined into one cluster over the underlay. The destination's own server tells which source
 * address it saw. Kernel state is read with `ip -j` and `nft -j` inside the namespaces.
 *
 * The cases share the cluster and run in order: services are created, changed and deleted along
 * the way, and the agents are restarted and killed near the end. The whole suite runs once per
 * transport_type (traffic-tcp.root.test.ts, traffic-kcp.root.test.ts): every service it creates has it.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { bulkTransfer, p50, p99, pingTimes, requestTimes } from '../helpers/latency-probes.js';
import {
  AGENT_UNDERLAY,
  APPS,
  createService,
  dataplaneOf,
  HTTP,
  type MeshNetns,
  meshNetnsUp,
  removeService as remove,
  setBandwidthLimit,
  UDP,
  underlayCapture,
  until,
  waitUp,
} from '../helpers/mesh-netns.js';
import { MARKER, streamSha256 } from '../helpers/netns-apps.js';
import { IP, spawnIn, type Topology } from '../helpers/netns-topology.js';
import type { Node } from '../helpers/nodes.js';

/** iperf3's port on the destination (its control and data connections both cross the service). */
const IPERF = 5201;

/** The suite for services of one transport_type, in namespaces `prefix`-*, management subnet `index`. */
export function trafficSuite(transport: 'tcp' | 'kcp', prefix: string, index: number): void {
  describe(`data plane: traffic through a ${transport} service`, { timeout: 600_000 }, () => {
    /** Every service of the suite is of the suite's transport. */
    const service = (node: Node, body: Record<string, unknown>, routes: Record<string, unknown>[]) =>
      createService(node, { ...body, transport_type: transport }, routes);
    let mesh: MeshNetns;
    let topo: Topology;
    let ingress: Node;
    let exit: Node;
    let exit2: Node;
    const baseline: Record<string, string> = {};

    /** Kernel state of a namespace that the agent may touch, without counters, handles and link flags. */
    async function kernelDump(ns: string): Promise<string> {
      const parts = await Promise.all([
        topo.run(ns, 'ip', ['-j', 'addr', 'show']),
        topo.run(ns, 'ip', ['-j', '-4', 'rule', 'show']),
        topo.run(ns, 'ip', ['-j', '-6', 'rule', 'show']),
        topo.run(ns, 'ip', ['-j', '-4', 'route', 'show', 'table', 'all']),
        topo.run(ns, 'ip', ['-j', '-6', 'route', 'show', 'table', 'all']),
        topo.run(ns, 'nft', ['-j', 'list', 'ruleset']),
      ]);
      const ignored = new Set([
        'handle',
        'packets',
        'bytes',
        'stats64',
        'stats',
        'flags',
        'operstate',
        'linkmode',
        'valid_life_time',
        'preferred_life_time',
        // IPv6 duplicate address detection may still run on a fresh link-local address.
        'tentative',
      ]);
      const strip = (v: unknown): unknown =>
        Array.isArray(v)
          ? v.map(strip)
          : v && typeof v === 'object'
            ? Object.fromEntries(
                Object.entries(v)
                  .filter(([k]) => !ignored.has(k))
                  .map(([k, x]) => [k, strip(x)]),
              )
            : v;
      return parts.map((p) => JSON.stringify(strip(JSON.parse(p || '[]')), null, 1)).join('\n');
    }

    const curl = (url: string, extra: string[] = []) =>
      topo.run(topo.ns.client, 'curl', ['-sS', '--max-time', '5', ...extra, url], 15_000);

    async function remoteSeen(host: string): Promise<string> {
      const url = host.includes(':') ? `http://[${host}]:${HTTP}/` : `http://${host}:${HTTP}/`;
      try {
        return (JSON.parse(await curl(url)) as { remote: string }).remote;
      } catch (err) {
        // What the agents hold at that moment, so that a failure in CI can be understood.
        const state = async (ns: string) =>
          [
            await topo.run(ns, 'ip', ['rule']),
            await topo.run(ns, 'ip', ['route', 'show', 'table', 'all']).then((r) =>
              r
                .split('\n')
                .filter((l) => l.includes('mesh-'))
                .join('\n'),
            ),
            await topo.run(ns, 'ip', ['-s', 'link']).then((r) => r.split('mesh-').slice(1).join('\n')),
            await topo.run(ns, 'nft', ['list', 'table', 'inet', 'mesh_agent']).catch((e: Error) => e.message),
          ].join('\n');
        const logs = (n: Node) =>
          n.agent.logs
            .split('\n')
            .filter((l) => l.includes('dataplane') || l.includes('tunnel') || l.includes('error'))
            .slice(-40)
            .join('\n');
        const again = await curl(url).then(
          (r) => `a second try at once worked: ${r}`,
          (e: Error) => `a second try at once failed too: ${e.message}`,
        );
        throw new Error(
          `${(err as Error).message}\n${again}\n--- ingress\n${await state(topo.ns.ingress)}\n${logs(ingress)}\n--- exit\n${await state(topo.ns.exit)}\n${logs(exit)}`,
        );
      }
    }

    before(async () => {
      mesh = await meshNetnsUp(prefix, index);
      ({ topo, ingress, exit, exit2 } = mesh);
    });

    after(async () => {
      await mesh?.down();
    });

    it('carries nothing before a service exists: the client cannot reach the destination', async () => {
      // The baseline the kernel must return to: taken with the agents running and links settled
      // (IPv6 duplicate address detection done: a tentative address has no local routes yet).
      for (const ns of [topo.ns.ingress, topo.ns.exit, topo.ns.exit2!]) {
        await until(
          `IPv6 addresses of ${ns} settled`,
          async () => assert.equal(await topo.run(ns, 'ip', ['-6', 'addr', 'show', 'tentative']), ''),
          10_000,
        );
        baseline[ns] = await kernelDump(ns);
      }
      await assert.rejects(curl(`http://${IP.dest}:${HTTP}/`, ['--max-time', '2']));
      await assert.rejects(topo.run(topo.ns.client, 'ping', ['-c', '1', '-W', '1', IP.dest]));
    });

    let nat: string;
    it('carries HTTP, ping and UDP over IPv4 and IPv6; the destination sees the exit (NAT)', async () => {
      nat = await service(ingress, { target_peer_id: exit.peerId }, [
        { priority: 100, dest_cidr: '10.91.2.0/24' },
        { priority: 100, dest_cidr: 'fd91:2::/64' },
      ]);
      await waitUp(nat, ingress, exit);
      assert.equal(await remoteSeen(IP.dest), IP.exitOut);
      assert.equal(await remoteSeen(IP.dest6), IP.exitOut6);
      await topo.run(topo.ns.client, 'ping', ['-c', '3', '-i', '0.2', '-W', '2', IP.dest]);
      await topo.run(topo.ns.client, 'ping', ['-6', '-c', '3', '-i', '0.2', '-W', '2', IP.dest6]);
      assert.equal(
        await topo.run(topo.ns.client, process.execPath, [APPS, 'udp', IP.dest, String(UDP), 'hello-udp']),
        'hello-udp',
      );
      assert.equal(
        await topo.run(topo.ns.client, process.execPath, [APPS, 'udp', IP.dest6, String(UDP), 'hello-udp6']),
        'hello-udp6',
      );
      const status = await dataplaneOf(exit, nat);
      assert.equal(status.role, 'exit');
      assert.equal(status.exit_mode, 'nat');
    });

    it('moves 100 MB intact (SHA-256) as a stream, not as TUN packets; the underlay shows only the two agents and no payload', async () => {
      const n = 100 * 1024 * 1024;
      const before = await dataplaneOf(ingress, nat);
      let out = '';
      const { packets, text: captured } = await underlayCapture(topo, 'i1', async () => {
        out = await topo.run(
          topo.ns.client,
          'sh',
          ['-c', `curl -sS --max-time 120 http://${IP.dest}:${HTTP}/bytes?n=${n} | sha256sum`],
          130_000,
        );
      });
      assert.equal(out.split(' ')[0], streamSha256(n));
      assert.ok(packets.length > 100, `the capture saw the transfer (${packets.length} packets)`);
      for (const p of packets) {
        for (const addr of [p.src, p.dst]) {
          assert.ok(
            [...AGENT_UNDERLAY, 'fd91::1', 'fd91::2'].includes(addr),
            `only the agents' underlay addresses on the underlay, saw ${addr} in: ${p.line}`,
          );
        }
      }
      assert.ok(!captured.includes(MARKER), 'no payload marker in clear on the underlay');
      const afterStatus = await dataplaneOf(ingress, nat);
      const grew = (k: string) => (afterStatus[k] as number) - (before[k] as number);
      assert.ok(
        grew('stream_bytes_down') >= n,
        `the payload crossed as a stream: ${JSON.stringify(afterStatus)}`,
      );
      assert.ok(grew('streams_opened') >= 1);
      // TCP no longer travels as packets: the TUN saw (almost) nothing of the transfer.
      assert.ok(
        grew('packets_received') < 100 && grew('packets_sent') < 100,
        `TUN packet counters stayed flat: ${JSON.stringify({ before, afterStatus })}`,
      );
    });

    it('carries TCP that the ingress host itself originates', async () => {
      const before = await dataplaneOf(ingress, nat);
      const out = await topo.run(topo.ns.ingress, 'curl', [
        '-sS',
        '--max-time',
        '5',
        `http://${IP.dest}:${HTTP}/`,
      ]);
      assert.equal((JSON.parse(out) as { remote: string }).remote, IP.exitOut);
      const after = await dataplaneOf(ingress, nat);
      assert.ok((after.streams_opened as number) > (before.streams_opened as number), JSON.stringify(after));
    });

    it("shows the service's streams, packets and tunnel in /metrics", async () => {
      const res = await ingress.agent.client.get('/metrics', { token: ingress.token });
      assert.equal(res.status, 200);
      const value = (name: string, labels: string) => {
        const line = res.text.split('\n').find((l) => l.startsWith(`${name}{${labels}}`));
        assert.ok(line, `${name}{${labels}} in /metrics`);
        return Number(line.slice(line.lastIndexOf(' ') + 1));
      };
      assert.ok(
        value('mesh_dataplane_stream_bytes_total', `service_id="${nat}",direction="down"`) >= 100 * 1024 ** 2,
      );
      assert.ok(value('mesh_dataplane_connections_total', `service_id="${nat}",event="opened"`) >= 2);
      // Present (the value may still count a connection that is closing).
      value('mesh_dataplane_connections_open', `service_id="${nat}"`);
      assert.ok(value('mesh_dataplane_packets_total', `service_id="${nat}",direction="sent"`) > 0); // ping, UDP
      assert.equal(value('mesh_tunnel_up', `peer_id="${exit.peerId}",transport="${transport}"`), 1);
    });

    it('serves 50 concurrent connections', async () => {
      const out = await topo.run(
        topo.ns.client,
        process.execPath,
        [APPS, 'burst', `http://${IP.dest}:${HTTP}/`, '50'],
        30_000,
      );
      assert.deepEqual(JSON.parse(out), Array(50).fill(200));
    });

    it('keeps nothing per connection once 2000 connections have ended (mesh_dataplane_entries)', async () => {
      for (let round = 0; round < 10; round++) {
        const out = await topo.run(
          topo.ns.client,
          process.execPath,
          [APPS, 'burst', `http://${IP.dest}:${HTTP}/`, '200'],
          30_000,
        );
        assert.deepEqual(JSON.parse(out), Array(200).fill(200));
      }
      const entries = async (node: Node) => {
        const res = await node.agent.client.get('/metrics', { token: node.token });
        assert.equal(res.status, 200);
        const out: Record<string, number> = {};
        for (const m of res.text.matchAll(/^mesh_dataplane_entries\{structure="(\w+)"\} (\S+)$/gm))
          out[m[1]!] = Number(m[2]);
        return out;
      };
      const listed = await ingress.agent.client.get('/v1/services', { token: ingress.token });
      const services = (listed.body as unknown as unknown[]).length;
      for (const node of [ingress, exit])
        await until(
          'no stream left',
          async () => {
            const e = await entries(node);
            assert.equal(e['streams'], 0, JSON.stringify(e));
            // Per tunnel peer and per service, never per connection: one peer, this suite's services.
            assert.ok(e['stream_peers']! <= 1, JSON.stringify(e));
            assert.ok(e['stream_services']! <= services, `${JSON.stringify(e)}, ${services} services`);
            assert.ok(e['tcp_flows']! < 50, JSON.stringify(e));
          },
          10_000,
        );
    });

    /** The raw TCP client of netns-apps, from the client namespace. */
    const tcpClient = async (host: string, port: number, mode: 'halfclose' | 'reset' | 'connect') =>
      JSON.parse(
        await topo.run(topo.ns.client, process.execPath, [APPS, 'tcp', host, String(port), mode], 20_000),
      ) as { connected: boolean; data: string; error: string | null };

    it('carries half-close and resets like a direct connection; a refusing destination gives the client an error at once', async () => {
      // The server reads to the client's FIN, then answers: the other direction stayed open.
      assert.deepEqual(await tcpClient(IP.dest, HTTP + 1, 'halfclose'), {
        connected: true,
        data: 'got 5\n',
        error: null,
      });
      assert.deepEqual(await tcpClient(IP.dest6, HTTP + 1, 'halfclose'), {
        connected: true,
        data: 'got 5\n',
        error: null,
      });
      // The server resets: so does the client's connection.
      assert.equal((await tcpClient(IP.dest, HTTP + 2, 'reset')).error, 'ECONNRESET');
      // Nothing listens: without the mesh the client's connect fails with ECONNREFUSED. Through
      // the stream path the ingress has already accepted the connection when the exit learns the
      // destination refused, so the client sees a reset instead (docs/dataplane.md); at once, never
      // a hang.
      const started = Date.now();
      const refused = await tcpClient(IP.dest, HTTP + 3, 'connect');
      assert.ok(refused.error === 'ECONNRESET' || refused.error === 'ECONNREFUSED', JSON.stringify(refused));
      // (the time includes starting the client, a Node process, in its namespace on a loaded machine)
      assert.ok(Date.now() - started < 5000, 'the error came at once');
      const s = await dataplaneOf(ingress, nat);
      assert.ok((s.streams_refused as number) >= 1, JSON.stringify(s));
    });

    /** Sets the NAT service's bandwidth limit, held by both agents when it returns. */
    const limit = (mbps: number) => setBandwidthLimit(ingress, exit, nat, mbps);

    it('holds bandwidth_limit_mbps in each direction, fair between flows; 0 is unlimited', async (t) => {
      const measured: string[] = [];
      /** Mbit/s of payload: downloads from /bytes, uploads to /sink, for `seconds`. */
      /**
       * Mbit/s of payload, as the receiving end saw it. Down: bytes curl received from /bytes in
       * `seconds` (more is asked than fits). Up: a fixed amount to /sink, over the time until the
       * server's answer (it answers once it has read everything; curl's own upload count would
       * include what merely sits in socket buffers).
       */
      const rate = async (direction: 'down' | 'up', mbps: number, seconds: number, flows = 1) => {
        // An upload is a fixed amount: each flow sends its share of `seconds` at the limit.
        const bytes = Math.round((mbps * 1e6 * seconds) / 8 / (direction === 'up' ? flows : 1));
        const cmd =
          direction === 'down'
            ? `curl -sS -o /dev/null --max-time ${seconds} -w '%{size_download}' http://${IP.dest}:${HTTP}/bytes?n=${bytes * 2}`
            : `head -c ${bytes} /dev/zero | curl -sS --max-time ${seconds * 3} -w ' %{time_total}' -T - http://${IP.dest}:${HTTP}/sink`;
        // curl exits 28 when --max-time cuts a download, as meant; the size it printed counts.
        const file = (i: number | string) => `/tmp/mesh-rate-${process.pid}-${i}`;
        const script = Array.from({ length: flows }, (_, i) => `(${cmd} > ${file(i)}; true) &`).join(' ');
        const out = await topo.run(
          topo.ns.client,
          'sh',
          ['-c', `${script} wait; for i in $(seq 0 ${flows - 1}); do cat ${file('$i')}; echo; done`],
          (seconds * 3 + 10) * 1000,
        );
        return out
          .trim()
          .split('\n')
          .map((line) => {
            if (direction === 'down') return (Number(line) * 8) / 1e6 / seconds;
            const [body, time] = [
              line.slice(0, line.lastIndexOf(' ')),
              Number(line.slice(line.lastIndexOf(' ') + 1)),
            ];
            assert.equal(
              (JSON.parse(body) as { bytes: number }).bytes,
              bytes,
              'the server read the whole upload',
            );
            return (bytes * 8) / 1e6 / time;
          });
      };
      const within = (got: number, want: number, tolerance: number, what: string) => {
        measured.push(`${what}: ${got.toFixed(2)}`);
        assert.ok(
          Math.abs(got - want) <= want * tolerance,
          `${what}: ${got.toFixed(2)} Mbit/s, want ${want} ±${tolerance * 100} %`,
        );
      };

      /**
       * Measures until a run is undisturbed, at most three times. All flows together going over
       * the limit `mbps` + 15 % fails at once (the shaper let too much through: no load explains
       * that). A flow off its share by more than `tolerance`, short or skewed, can be three
       * encrypting agents starved of the two loaded cores by other tests, so that run is measured
       * again, and three such runs fail.
       */
      const measure = async (
        direction: 'down' | 'up',
        mbps: number,
        flows: number,
        seconds: number,
        tolerance: number,
      ) => {
        const what = `${mbps} Mbit/s ${direction}${flows > 1 ? ` in ${flows} flows` : ''}`;
        const share = mbps / flows;
        for (let attempt = 1; ; attempt++) {
          const got = await rate(direction, mbps, seconds, flows);
          // Uploads are equal amounts that end at different times, so the sum of their rates
          // overstates what crossed at once: together they took as long as the slowest.
          const total = direction === 'up' ? flows * Math.min(...got) : got.reduce((s, r) => s + r, 0);
          assert.ok(
            total <= mbps * 1.15,
            `${what}: together ${total.toFixed(2)} Mbit/s, over the limit + 15 %`,
          );
          const off = got.some((r) => Math.abs(r - share) > share * tolerance);
          if (off && attempt < 3) {
            measured.push(`${what} (disturbed, measured again): ${got.map((r) => r.toFixed(2)).join(', ')}`);
            continue;
          }
          for (const [i, r] of got.entries()) {
            within(r, share, tolerance, flows === 1 ? what : `${what}, flow ${i} of ${flows}`);
          }
          return;
        }
      };

      await limit(10);
      // The end of a flow (docs/dataplane.md "Pacing a limited service's clients"): a client that
      // writes for 2 s and shuts its side. Its close reaches the destination once what waits has
      // drained at the limit: the issue's bound is 300 ms plus one target's worth of queue (50 ms).
      // Before the pacer the client's own kernel grew its send buffer to about 1 MB (0.8-1.2 s);
      // behind the pacer it sees the limit as it would a bottleneck (90-120 ms here).
      let pacer = '';
      await until(
        'the ingress of a limited service has a pacer',
        async () => {
          pacer =
            (await topo.run(topo.ns.ingress, 'tc', ['qdisc', 'show'])).match(/htb 1: dev (mesh-p\d+)/)?.[1] ??
            '';
          assert.ok(pacer);
        },
        10_000,
      );
      /** Bytes the pacer's queue has sent (`tc -s`), SYNs and ACKs included. */
      const pacedBytes = async () =>
        Number(
          /Sent (\d+) bytes/.exec(
            await topo.run(topo.ns.ingress, 'tc', ['-s', 'qdisc', 'show', 'dev', pacer, 'root']),
          )?.[1],
        );
      const pacedBefore = await pacedBytes();
      const flood = JSON.parse(
        await topo.run(
          topo.ns.client,
          process.execPath,
          [APPS, 'flood', IP.dest, String(HTTP + 1), '2'],
          30_000,
        ),
      ) as { written: number; answeredMs: number };
      const queued = (flood.answeredMs / 1000) * (10e6 / 8);
      measured.push(
        `the close reached the destination ${flood.answeredMs.toFixed(0)} ms after the client's (${(queued / 1e6).toFixed(2)} MB at 10 Mbit/s of ${(flood.written / 1e6).toFixed(2)} written)`,
      );
      assert.ok(
        (await pacedBytes()) - pacedBefore >= flood.written,
        "the client's bytes went through the pacer",
      );
      assert.ok(
        flood.answeredMs <= 350,
        `the close reached the destination ${flood.answeredMs.toFixed(0)} ms after the client's; at most 300 ms plus 50 ms of queue`,
      );
      // Two iperf3 runs one right after the other against one server: the second is refused
      // ("the server is busy running a test") while the first's data still drains toward it.
      const iperf = spawnIn(topo.ns.dest, 'iperf3', ['-s', '-p', String(IPERF)]);
      try {
        await until(
          'iperf3 listening',
          async () =>
            assert.match(await topo.run(topo.ns.dest, 'ss', ['-Htln', `sport = :${IPERF}`]), /LISTEN/),
          10_000,
        );
        for (const run of [1, 2]) {
          const out = await topo
            .run(topo.ns.client, 'iperf3', ['-c', IP.dest, '-p', String(IPERF), '-t', '2', '-J'], 30_000)
            .catch((err: Error) => err.message);
          // -J: its verdict is JSON on stdout, a refusal too (then it exits 1).
          if (!out.includes('{')) throw new Error(`iperf3 run ${run} gave no report: ${out}`);
          const report = JSON.parse(out.slice(out.indexOf('{'))) as {
            error?: string;
            end?: { sum_received?: { bits_per_second: number } };
          };
          assert.equal(report.error, undefined, `iperf3 run ${run} of 2 back to back: ${report.error}`);
          measured.push(
            `iperf3 run ${run}: ${((report.end?.sum_received?.bits_per_second ?? 0) / 1e6).toFixed(2)} Mbit/s`,
          );
        }
      } finally {
        iperf.kill();
      }
      await measure('down', 10, 1, 4, 0.15);
      await measure('up', 10, 1, 4, 0.15);
      await measure('down', 10, 4, 5, 0.3);
      await measure('up', 10, 4, 5, 0.3);
      // The high limit is one the path carries with room to spare right now: the kcp path on two
      // cores shared with other tests carries 110-190 Mbit/s unlimited (tcp over 300), and a limit
      // near that measures the CPU left over, not the shaper (81 Mbit/s at a limit of 100 once;
      // at half its capacity kcp still fell 10-15 % short, at a third it holds the limit).
      await limit(0);
      const [capacity] = (await rate('down', 1000, 2)) as [number];
      const high = Math.min(100, Math.max(20, Math.floor(capacity / 3 / 10) * 10));
      measured.push(`unlimited before the high limit: ${capacity.toFixed(0)}`);
      await limit(high);
      await measure('down', high, 1, 4, 0.15);
      await measure('up', high, 1, 4, 0.15);
      await limit(0);
      let free = 0;
      // Well over the last limit (a third of what the path carried before it).
      for (let attempt = 1; attempt <= 3 && free <= high * 1.5; attempt++) {
        if (attempt > 1) measured.push(`unlimited (disturbed, measured again): ${free.toFixed(0)}`);
        [free] = (await rate('down', 1000, 2)) as [number];
      }
      assert.ok(free > high * 1.5, `unlimited again: ${free.toFixed(0)} Mbit/s, limit was ${high}`);
      t.diagnostic(`Mbit/s measured: ${measured.join('; ')}; unlimited ${free.toFixed(0)}`);
    });

    // Through a kcp service too, since the minimum RTO went to 100 ms (docs/kcp.md,
    // "Retransmission"): before, the 30 ms RTO's spurious retransmissions made tails of 100 to
    // 300 ms. The unlimited control there still waits 40 to 110 ms behind the KCP send window for
    // the first seconds of a bulk flow (docs/dataplane.md); it is measured, not asserted.
    it('keeps latency low beside a bulk transfer under a 10 Mbit/s limit: HTTP and ping, up and down', async (t) => {
      const pings = (count: number) => pingTimes(topo.run, topo.ns.client, IP.dest, count);
      const requests = (count: number) => requestTimes(topo.run, topo.ns.client, IP.dest, HTTP, count);
      /** A bulk transfer of `seconds` at well over the limit, in the background. */
      const bulk = (direction: 'up' | 'down', seconds: number) =>
        bulkTransfer(
          topo.run,
          topo.ns.client,
          IP.dest,
          HTTP,
          direction,
          Math.round((100e6 / 8) * seconds),
          seconds,
        );
      const measured: string[] = [];
      /**
       * What a bulk flow adds to the latency of pings and small requests beside it: the same
       * number of samples idle and loaded, p50 against p50 (a standing queue moves the median) and
       * p99 against p99 (on two cores shared with other tests a stall of 100 ms or more now and
       * then hits idle and loaded samples alike; compared so, it does not count as the queue's).
       */
      const added = async (direction: 'up' | 'down') => {
        const [idlePings, idleRequests] = await Promise.all([pings(30), requests(20)]);
        const running = bulk(direction, 10);
        await new Promise((resolve) => setTimeout(resolve, 1500));
        const [loadedPings, loadedRequests] = await Promise.all([pings(30), requests(20)]);
        await running;
        const result = {
          pingMedian: p50(loadedPings) - p50(idlePings),
          ping: p99(loadedPings) - p99(idlePings),
          httpMedian: p50(loadedRequests) - p50(idleRequests),
          http: p99(loadedRequests) - p99(idleRequests),
          lost: 30 - loadedPings.length,
        };
        const show = (xs: number[]) => `${p50(xs).toFixed(1)}/${p99(xs).toFixed(1)}`;
        measured.push(
          `${direction}: ping p50/p99 idle ${show(idlePings)}, loaded ${show(loadedPings)} ms (${result.lost} lost); ` +
            `HTTP idle ${show(idleRequests)}, loaded ${show(loadedRequests)} ms`,
        );
        return result;
      };
      try {
        // Without a limit first, as the control: the same flows, nothing shaped.
        await limit(0);
        await added('up');
        await added('down');
        await limit(10);
        for (const direction of ['up', 'down'] as const) {
          // A run whose numbers a stall of the shared cores explains is measured again, at most
          // three times in all.
          for (let attempt = 1; ; attempt++) {
            const a = await added(direction);
            const ok =
              a.lost === 0 && Math.max(a.pingMedian, a.httpMedian) <= 10 && Math.max(a.ping, a.http) <= 30;
            if (!ok && attempt < 3) continue;
            assert.equal(a.lost, 0, `${direction}: pings lost beside the bulk flow`);
            assert.ok(a.pingMedian <= 10, `${direction}: ping p50 ${a.pingMedian.toFixed(1)} ms over idle`);
            assert.ok(a.httpMedian <= 10, `${direction}: HTTP p50 ${a.httpMedian.toFixed(1)} ms over idle`);
            assert.ok(a.ping <= 30, `${direction}: ping p99 ${a.ping.toFixed(1)} ms over idle; at most 30`);
            assert.ok(a.http <= 30, `${direction}: HTTP p99 ${a.http.toFixed(1)} ms over idle; at most 30`);
            break;
          }
        }
      } finally {
        await limit(0);
        t.diagnostic(`latency beside a bulk flow (first two lines unlimited): ${measured.join(' | ')}`);
      }
    });

    it('says in /readyz why a limited service is not paced (strict rp_filter, read-only /proc/sys), stays ready, and paces again once it can', async () => {
      const strict = 'net.ipv4.conf.all.rp_filter';
      const was = (await topo.run(topo.ns.ingress, 'sysctl', ['-n', strict])).trim();
      const paced = async () =>
        /htb 1: dev mesh-p\d+/.test(await topo.run(topo.ns.ingress, 'tc', ['qdisc', 'show']));
      /** /readyz of the ingress: its status and the warnings that name pacing. */
      const readiness = async () => {
        const res = await ingress.agent.client.get('/readyz');
        const warnings = ((res.body as { warnings?: string[] }).warnings ?? []).filter((w) =>
          w.includes('not paced'),
        );
        return { status: res.status, warnings, body: res.text };
      };
      const earlyDemux = async () =>
        (await topo.run(topo.ns.ingress, 'sysctl', ['-n', 'net.ipv4.tcp_early_demux'])).trim();
      const pacedWithoutWarning = (what: string) =>
        until(
          what,
          async () => {
            assert.ok(await paced());
            assert.deepEqual((await readiness()).warnings, []);
            assert.equal(await earlyDemux(), '0', 'early demux off while pacing');
          },
          20_000,
        );
      /** Not paced, still ready with `warning`, early demux on, and the service still carries traffic. */
      const unpacedSaying = async (what: string, warning: RegExp) => {
        await until(
          what,
          async () => {
            const r = await readiness();
            assert.equal(r.status, 200, `still ready: ${r.body}`);
            assert.equal(r.warnings.length, 1, r.body);
            assert.match(r.warnings[0]!, warning);
            assert.equal(await paced(), false);
            assert.equal(await earlyDemux(), '1', 'early demux on: nothing is paced');
          },
          20_000,
        );
        assert.equal(await remoteSeen(IP.dest), IP.exitOut);
      };
      try {
        await limit(10);
        await pacedWithoutWarning('paced, without a warning');
        // Strict reverse-path filtering on `all` would drop the pacer's packets where they come
        // back in: the agent stops pacing and says why, with the command that fixes it.
        await topo.run(topo.ns.ingress, 'sysctl', ['-qw', `${strict}=1`]);
        await limit(12);
        await unpacedSaying(
          'the pacer gone and the reason in /readyz',
          /^data plane: net\.ipv4\.conf\.all\.rp_filter is 1 \(strict\).*sysctl -w net\.ipv4\.conf\.all\.rp_filter=2/,
        );
        await topo.run(topo.ns.ingress, 'sysctl', ['-qw', `${strict}=${was}`]);
        await limit(10);
        await pacedWithoutWarning('paced again, the warning gone');

        // A read-only /proc/sys, as deploy/mesh-agent.service's ProtectKernelTunables makes it:
        // a read-only bind mount in the running agent's own mount namespace (agent-process.ts
        // readOnlySysctls does it before start; here the agent has already paced and let go).
        // Early demux cannot be turned off, so nothing is paced, and the warning says where to
        // set it instead; set there (the test's namespace, writable), the agent paces at its next
        // reconcile without being asked.
        await limit(0);
        await until('early demux back on', async () => assert.equal(await earlyDemux(), '1'), 20_000);
        const inAgentMounts = (script: string) =>
          topo.run(topo.ns.ingress, 'nsenter', ['-t', String(ingress.agent.pid), '-m', 'sh', '-c', script]);
        let mounted = false;
        try {
          await inAgentMounts('mount --bind /proc/sys /proc/sys');
          mounted = true;
          await inAgentMounts('mount -o remount,bind,ro /proc/sys');
          await limit(10);
          await unpacedSaying(
            'the read-only /proc/sys in /readyz',
            /^data plane: net\.ipv4\.tcp_early_demux could not be set to 0 \(.*read-only file system.*\): limited services are not paced \(set net\.ipv4\.tcp_early_demux = 0 in \/etc\/sysctl\.d/i,
          );
          await topo.run(topo.ns.ingress, 'sysctl', ['-qw', 'net.ipv4.tcp_early_demux=0']);
          await pacedWithoutWarning('paced once early demux is 0, /proc/sys still read-only');
        } finally {
          // Lazy: an agent reading a sysctl at that moment cannot make it fail.
          if (mounted) await inAgentMounts('umount -l /proc/sys');
          await limit(0);
          await topo.run(topo.ns.ingress, 'sysctl', ['-qw', 'net.ipv4.tcp_early_demux=1']);
        }
      } finally {
        await topo.run(topo.ns.ingress, 'sysctl', ['-qw', `${strict}=${was}`]);
        await limit(0);
      }
    });

    it('honours priority and tie-breaks between two services; unmatched traffic stays out', async () => {
      // A second service to exit2 with a route that wins for one destination host only.
      const second = await service(ingress, { target_peer_id: exit2.peerId }, [
        { priority: 100, dest_cidr: '10.91.2.2/32' },
      ]);
      try {
        await waitUp(second, ingress, exit2);
        // Same priority, longer destination prefix: exit2 (its NAT address on the dest side).
        assert.equal(await remoteSeen(IP.dest), IP.exit2Out);
        // A source CIDR that does not match the client: the route is not taken.
        const r = await ingress.agent.client.post(`/v1/services/${nat}/routes`, {
          token: ingress.token,
          json: { routes: [{ priority: 1, source_cidr: '10.91.1.99/32', dest_cidr: '10.91.2.0/24' }] },
        });
        assert.equal(r.status, 201, r.text);
        await ingress.agent.client.post('/v1/cluster/sync', { token: ingress.token });
        assert.equal(await remoteSeen(IP.dest), IP.exit2Out);
        // Lower priority number wins over the longer prefix: the client's own /32 source via exit.
        const r2 = await ingress.agent.client.post(`/v1/services/${nat}/routes`, {
          token: ingress.token,
          json: { routes: [{ priority: 1, source_cidr: `${IP.client}/32`, dest_cidr: '10.91.2.0/24' }] },
        });
        assert.equal(r2.status, 201, r2.text);
        await ingress.agent.client.post('/v1/cluster/sync', { token: ingress.token });
        assert.equal(await remoteSeen(IP.dest), IP.exitOut);
        // Unmatched traffic does not enter any tunnel.
        const sent = (await dataplaneOf(ingress, nat)).packets_sent as number;
        await assert.rejects(curl('http://10.91.5.5:8080/', ['--max-time', '1']));
        assert.equal((await dataplaneOf(ingress, nat)).packets_sent, sent);
      } finally {
        await remove(ingress, second);
      }
    });

    it('with requires_interface the destination sees the MACVLAN address, IPv4 and IPv6, and its MAC survives a restart', async () => {
      const mv = await service(
        ingress,
        {
          target_peer_id: exit2.peerId,
          requires_interface: true,
          desired_ipv4_cidr: '10.91.4.50/24',
          desired_ipv6_cidr: 'fd91:4::50/64',
        },
        [
          { priority: 0, dest_cidr: '10.91.4.0/24' },
          { priority: 0, dest_cidr: 'fd91:4::/64' },
        ],
      );
      try {
        await waitUp(mv, ingress, exit2);
        assert.equal((await dataplaneOf(exit2, mv)).exit_mode, 'macvlan');
        assert.equal(await remoteSeen(IP.dest2), '10.91.4.50');
        assert.equal(await remoteSeen(IP.dest26), 'fd91:4::50');
        // Made again after a restart, the MACVLAN has the same MAC, so the destination's
        // neighbour entry for its address (learnt just now) stays right and replies need no new
        // resolution: with a random MAC they went to the old one for up to 10 s.
        const macvlanMac = async () => {
          const links = JSON.parse(await topo.run(topo.ns.exit2!, 'ip', ['-j', 'link', 'show'])) as {
            ifname: string;
            address: string;
          }[];
          return links.find((l) => l.ifname.startsWith('mesh-m'))?.address;
        };
        const neighbour = async (address: string) =>
          (
            JSON.parse(await topo.run(topo.ns.dest, 'ip', ['-j', 'neigh', 'show', address])) as {
              lladdr?: string;
            }[]
          )[0]?.lladdr;
        const mac = await macvlanMac();
        assert.match(mac ?? '', /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/);
        assert.equal(await neighbour('fd91:4::50'), mac);
        assert.equal(await exit2.agent.stop(), 0);
        assert.equal(await macvlanMac(), undefined, 'a stopped agent removes its MACVLAN');
        await exit2.agent.restart();
        await waitUp(mv, ingress, exit2);
        assert.equal(await macvlanMac(), mac);
        assert.equal(await remoteSeen(IP.dest26), 'fd91:4::50');
        assert.equal(await remoteSeen(IP.dest2), '10.91.4.50');
      } finally {
        await remove(ingress, mv);
      }
    });

    it('a catch-all route keeps gossip, the tunnel and the API working', async () => {
      const r = await ingress.agent.client.post(`/v1/services/${nat}/routes`, {
        token: ingress.token,
        json: {
          routes: [
            { priority: 65535, dest_cidr: '0.0.0.0/0' },
            { priority: 65535, dest_cidr: '::/0' },
          ],
        },
      });
      assert.equal(r.status, 201, r.text);
      await ingress.agent.client.post('/v1/cluster/sync', { token: ingress.token });
      await new Promise((res) => setTimeout(res, 3000));
      const peers = await ingress.agent.client.get('/v1/peers', { token: ingress.token });
      assert.equal(peers.status, 200);
      for (const p of peers.body as { id: string; reachable: boolean }[])
        assert.equal(p.reachable, true, p.id);
      assert.equal((await dataplaneOf(ingress, nat)).state, 'up');
      assert.equal(await remoteSeen(IP.dest), IP.exitOut);
    });

    it('deleting the service stops its traffic and leaves kernel state as it was', async () => {
      await remove(ingress, nat);
      await ingress.agent.client.post('/v1/cluster/sync', { token: ingress.token });
      try {
        await until(
          'kernel state back to the baseline',
          async () => {
            for (const ns of [topo.ns.ingress, topo.ns.exit, topo.ns.exit2!]) {
              assert.equal(await kernelDump(ns), baseline[ns], `kernel state of ${ns}`);
            }
          },
          15_000,
        );
      } catch (err) {
        const tail = (n: Node) =>
          n.agent.logs
            .split('\n')
            .filter((l) => l.includes('dataplane') || l.includes('error'))
            .slice(-12)
            .join('\n');
        throw new Error(
          `${(err as Error).message.slice(0, 300)}\nexit:\n${tail(exit)}\ningress:\n${tail(ingress)}`,
        );
      }
      await assert.rejects(curl(`http://${IP.dest}:${HTTP}/`, ['--max-time', '2']));
    });

    it('SIGTERM leaves nothing; a restart restores traffic; kill -9 then start cleans up and restores it', async () => {
      const id = await service(ingress, { target_peer_id: exit.peerId }, [
        { priority: 10, dest_cidr: '10.91.2.0/24' },
      ]);
      await waitUp(id, ingress, exit);
      assert.equal(await remoteSeen(IP.dest), IP.exitOut);
      assert.equal(await ingress.agent.stop(), 0);
      assert.equal(await kernelDump(topo.ns.ingress), baseline[topo.ns.ingress]);
      await ingress.agent.restart();
      await waitUp(id, ingress, exit);
      assert.equal(await remoteSeen(IP.dest), IP.exitOut);
      await ingress.agent.kill9();
      assert.notEqual(
        await kernelDump(topo.ns.ingress),
        baseline[topo.ns.ingress],
        'a killed agent leaves rules behind',
      );
      await ingress.agent.restart();
      await waitUp(id, ingress, exit);
      assert.equal(await remoteSeen(IP.dest), IP.exitOut);
      await remove(ingress, id);
    });
    // The clients only receive or wait, so they send nothing the ingress could refuse: the ingress
    // has to make them answer (src/dataplane/tcp-flows.ts). curl's own limit (60 s) is far above
    // the bound. The waiting ones (`/stall`) send nothing at all once their request is answered.
    it('the clients see an error (never a hang) when the exit dies mid-transfer; traffic resumes after it returns', async () => {
      const id = await service(ingress, { target_peer_id: exit.peerId }, [
        { priority: 10, dest_cidr: '10.91.2.0/24' },
        { priority: 10, dest_cidr: 'fd91:2::/64' },
      ]);
      await waitUp(id, ingress, exit);
      const failedAt: Record<string, number> = {};
      const client = (name: string, url: string, extra: string[]) =>
        topo
          .run(topo.ns.client, 'curl', ['-sS', '-o', '/dev/null', '--max-time', '60', ...extra, url], 70_000)
          .then(
            () => 'completed',
            (err: Error) => {
              failedAt[name] = Date.now();
              return err.message;
            },
          );
      const transfers = {
        download: client('download', `http://${IP.dest}:${HTTP}/bytes?n=${4 * 1024 ** 3}`, []),
        waiting: client('waiting', `http://${IP.dest}:${HTTP}/stall`, []),
        waiting6: client('waiting6', `http://[${IP.dest6}]:${HTTP}/stall`, []),
      };
      // All three connected through the ingress before the kill (a late connect would be refused,
      // not reset).
      await until(
        'the three transfers under way',
        async () => {
          const lines = (await topo.run(topo.ns.client, 'ss', ['-Htn', 'state', 'established']))
            .split('\n')
            .filter((l) => l.includes(`:${HTTP} `) || l.trimEnd().endsWith(`:${HTTP}`));
          assert.ok(lines.length >= 3, lines.join('\n'));
        },
        15_000,
      );
      await new Promise((r) => setTimeout(r, 500));
      const killedAt = Date.now();
      await exit.agent.kill9();
      const outcomes = Object.fromEntries(
        await Promise.all(Object.entries(transfers).map(async ([k, v]) => [k, await v] as const)),
      );
      // Back before anything is asserted, so that the later cases have their exit whatever happens here.
      await exit.agent.restart();
      const back = Date.now();
      const diagnostics = async () =>
        `${JSON.stringify(outcomes)}\n${await topo.run(topo.ns.ingress, 'nft', ['list', 'table', 'inet', 'mesh_agent']).catch((e: Error) => e.message)}\n` +
        ingress.agent.logs.split('\n').slice(-15).join('\n');
      for (const [name, outcome] of Object.entries(outcomes)) {
        assert.notEqual(outcome, 'completed', name);
        assert.ok(
          // nominally 10.5-11 s for kcp (deadAfterMs 10 s); curl's own 60 s tells a hang apart
          failedAt[name]! - killedAt < 25_000,
          `${name} failed within 25 s of the kill: ${await diagnostics()}`,
        );
        // A reset, not curl giving up on its own (--max-time would say "Operation timed out").
        assert.match(outcome, /reset/i, `${name}: ${await diagnostics()}`);
      }
      await until(
        'traffic through the returned exit',
        async () => assert.equal(await remoteSeen(IP.dest), IP.exitOut),
        25_000,
      );
      // redial backoff reaches 3.6 s, then the handshake and curl; room for a loaded machine
      assert.ok(Date.now() - back < 20_000, 'traffic resumed within 20 s of the exit returning');
    });
  });
}
