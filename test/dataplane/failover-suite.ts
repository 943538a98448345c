/**
 * Failover between two exits (docs/dataplane.md): two services from the ingress to two exits
 * with the same route, the first preferred. For each fault of the first exit, new connections
 * go through the second within seconds, and so does a UDP flow (its source port unchanged);
 * when the fault is gone, traffic returns to the first only after the hold-down; the ingress's
 * event log holds one `service.failover` each way and the health change pair of each switch
 * (docs/events.md "Runtime events"), and nothing of the kind under loss; the ingress's nftables
 * table deleted behind its back comes back with one `dataplane.drift_repaired`. That streams
 * through a failed exit end with an error is checked in traffic-suite ("never a hang") and
 * timed by bench/failover.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { ADMIN } from '../../src/domain/scopes.js';
import { show, signIn } from '../helpers/console-page.js';
import { eventsOf } from '../helpers/event-reads.js';
import { launchIsolatedChromium } from '../helpers/isolated-chromium.js';
import {
  APPS,
  createService,
  HTTP,
  type MeshNetns,
  meshNetnsUp,
  PORT,
  serviceAt,
  setBandwidthLimit,
  UDP,
  until,
  waitUp,
} from '../helpers/mesh-netns.js';
import { IP, requireNetnsSupport, spawnIn } from '../helpers/netns-topology.js';
import {
  cutUp,
  type LossCounters,
  lossCounters,
  lossUp,
  portBlockUp,
  tableDown,
} from '../helpers/underlay-rules.js';

const HOLD_DOWN_MS = 4000;
/** Generous bounds that still tell a switch from a hang; bench/failover measures the real times. */
const MOVE_WITHIN_MS = 15_000;

/** The failover suite for services of one transport (failover-tcp/-kcp.root.test.ts run it). */
export function failoverSuite(transport: 'tcp' | 'kcp'): void {
  describe(`data plane: failover between two exits (${transport})`, { timeout: 600_000 }, () => {
    let mesh: MeshNetns;
    let first: string;
    let second: string;

    before(async () => {
      await requireNetnsSupport();
      mesh = await meshNetnsUp(transport === 'tcp' ? 'mdfo' : 'mdfk', transport === 'tcp' ? 47 : 48, {
        agentArgs: ['--failover-hold-down-ms', String(HOLD_DOWN_MS)],
      });
      const { ingress, exit, exit2 } = mesh;
      const route = { source_cidr: '10.91.1.0/24', dest_cidr: '10.91.2.0/24' };
      first = await createService(ingress, { target_peer_id: exit.peerId, transport_type: transport }, [
        { priority: 10, ...route },
      ]);
      second = await createService(ingress, { target_peer_id: exit2.peerId, transport_type: transport }, [
        { priority: 20, ...route },
      ]);
      await waitUp(first, ingress, exit);
      await waitUp(second, ingress, exit2);
    });
    after(async () => {
      await mesh?.down();
    });

    /** The address the destination saw the request from: the exit it left by. */
    const seenFrom = async (): Promise<string> => {
      const out = await mesh.topo.run(mesh.topo.ns.client, 'curl', [
        '-sS',
        '--max-time',
        '2',
        `http://${IP.dest}:${HTTP}/`,
      ]);
      return (JSON.parse(out) as { remote: string }).remote;
    };

    /** One UDP flow (one source port) from the client, an echo every 100 ms; its answers so far. */
    const udpFlow = () => {
      const flow = spawnIn(mesh.topo.ns.client, process.execPath, [
        APPS,
        'udp-flow',
        IP.dest,
        String(UDP),
        '100',
      ]);
      let echoes = 0;
      flow.stdout.on('data', (d: Buffer) => {
        echoes += d
          .toString()
          .split('\n')
          .filter((l) => l.startsWith('echo ')).length;
      });
      return { echoes: () => echoes, stop: () => flow.kill() };
    };

    /** The ingress's newest event seq: what a trial's events come after. */
    const lastSeq = async () => (await eventsOf(mesh.ingress)).at(-1)?.seq ?? 0;

    /** The ingress's failover and health events after `since`, as [type, service, details]. */
    const switches = async (since: number) =>
      (await eventsOf(mesh.ingress, { type: 'service.', since }))
        .filter((e) => e.type === 'service.failover' || e.type === 'service.health_changed')
        .map((e) =>
          e.type === 'service.failover'
            ? [e.type, e.resource.id, e.data.from_service, e.data.to_service, e.data.reason]
            : [e.type, e.resource.id, e.data.state, e.data.reason],
        );

    /**
     * One fault of the first exit: traffic through it, a UDP flow through it, the fault; then new
     * connections and the flow through the second exit, the service unhealthy for `reason`; then
     * the fault undone and the traffic back through the first after the hold-down.
     */
    async function trial(
      name: string,
      reason: string,
      inject: () => Promise<void>,
      undo: () => Promise<void>,
    ): Promise<void> {
      await until('through the first exit', async () => assert.equal(await seenFrom(), IP.exitOut), 30_000);
      const flow = udpFlow();
      await until(
        'the UDP flow answered through the first exit',
        async () => {
          assert.ok(flow.echoes() > 0);
          assert.match(mesh.destLog(), new RegExp(`^udp-remote ${IP.exitOut}$`, 'm'));
        },
        10_000,
      );
      const since = await lastSeq();
      await inject();
      const faultAt = performance.now();
      const logAtFault = mesh.destLog().length;
      try {
        await until(
          'through the second exit',
          async () => assert.equal(await seenFrom(), IP.exit2Out),
          MOVE_WITHIN_MS,
        );
        const movedMs = performance.now() - faultAt;
        console.log(`# ${name}: new connections through the second exit after ${movedMs.toFixed(0)} ms`);
        // The same UDP flow (its source port unchanged) moves too, and is answered.
        const echoesAtMove = flow.echoes();
        await until(
          'the UDP flow through the second exit',
          async () => {
            assert.match(mesh.destLog().slice(logAtFault), new RegExp(`^udp-remote ${IP.exit2Out}$`, 'm'));
            assert.ok(flow.echoes() > echoesAtMove);
          },
          10_000,
        );
        const seen = (await serviceAt(mesh.ingress, first)) as unknown as {
          health: { state: string; reason: string | null; carrying: boolean };
          routes: { active: boolean; standby_reason: string | null }[];
        };
        assert.equal(seen.health.state, 'unhealthy', `${name}: ${JSON.stringify(seen.health)}`);
        assert.equal(seen.health.reason, reason);
        assert.deepEqual(
          seen.routes.map((r) => [r.active, r.standby_reason]),
          [[false, reason]],
        );
      } finally {
        flow.stop();
        await undo();
      }
      const undoneAt = performance.now();
      await until(
        'back through the first exit',
        async () => assert.equal(await seenFrom(), IP.exitOut),
        60_000,
      );
      const backMs = performance.now() - undoneAt;
      console.log(`# ${name} undone: traffic back through the first exit after ${backMs.toFixed(0)} ms`);
      assert.ok(
        backMs >= HOLD_DOWN_MS * 0.5,
        `${name}: back after ${backMs.toFixed(0)} ms, before the hold-down`,
      );
      // Once per switch each way: unhealthy and away to the second, healthy and back.
      await until(
        `${name}: the ingress's events of the switch`,
        async () =>
          assert.deepEqual(await switches(since), [
            ['service.health_changed', first, 'unhealthy', reason],
            ['service.failover', first, first, second, reason],
            ['service.health_changed', first, 'healthy', null],
            ['service.failover', first, second, first, 'healthy'],
          ]),
        10_000,
      );
    }

    it('the first exit killed (kill -9): moves, and returns after the hold-down once it is back', async () => {
      const { ingress, exit } = mesh;
      const since = await lastSeq();
      await trial(
        'kill -9',
        'tunnel_silent',
        () => exit.agent.kill9(),
        async () => {
          await exit.agent.restart();
          await waitUp(first, exit);
        },
      );
      const metrics = (await ingress.agent.client.get('/metrics', { token: ingress.token })).text;
      assert.match(
        metrics,
        new RegExp(`^mesh_dataplane_service_carrying\\{service_id="${first}"\\} 1$`, 'm'),
      );
      assert.match(
        metrics,
        new RegExp(`^mesh_dataplane_service_carrying\\{service_id="${second}"\\} 1$`, 'm'),
      );
      assert.match(metrics, /^mesh_dataplane_service_health_changes_total\{to="tunnel_silent"\} [1-9]/m);
      // The tunnel to the killed exit went down and came back up: a down, then an up, in pairs.
      const tunnel = (await eventsOf(ingress, { type: 'tunnel.', resource: exit.peerId, since })).map(
        (e) => `${e.type} ${e.data.transport}`,
      );
      assert.ok(tunnel.length >= 2, tunnel.join());
      assert.deepEqual(
        tunnel,
        tunnel.map((_, i) => (i % 2 === 0 ? `tunnel.down ${transport}` : `tunnel.up ${transport}`)),
      );
    });

    it('the first exit hung (SIGSTOP: its tunnel silent, not closed)', async () => {
      const { pid } = mesh.exit.agent;
      await trial(
        'SIGSTOP',
        'tunnel_silent',
        async () => {
          process.kill(pid, 'SIGSTOP');
        },
        async () => {
          process.kill(pid, 'SIGCONT');
        },
      );
    });

    it('the underlay between the ingress and the first exit cut (an nftables drop at the exit)', async () => {
      const { topo } = mesh;
      await trial(
        'underlay cut',
        'tunnel_silent',
        () => cutUp(topo, topo.ns.exit, 'e1', 'mdfo_cut'),
        () => tableDown(topo, topo.ns.exit, 'mdfo_cut'),
      );
    });

    it("the first exit's LAN interface down: its own route check, even with a default route to fall to", async () => {
      const { topo, ingress } = mesh;
      const ip = (...args: string[]) => topo.run(topo.ns.exit, 'ip', args);
      // Like most hosts, the exit has a default route (here toward the ingress): with its LAN
      // down, the lookup for the destination falls through to it rather than failing.
      await ip('route', 'add', 'default', 'via', IP.ingressUl);
      try {
        await trial(
          'LAN down',
          'exit_no_route',
          () => ip('link', 'set', 'e0', 'down').then(() => undefined),
          async () => {
            await ip('link', 'set', 'e0', 'up');
            // Linux drops a link's IPv6 addresses when it goes down (IPv4 ones stay).
            if (!(await ip('-6', 'addr', 'show', 'dev', 'e0')).includes(IP.exitOut6))
              await ip('addr', 'add', `${IP.exitOut6}/64`, 'dev', 'e0', 'nodad');
          },
        );
      } finally {
        await ip('route', 'del', 'default', 'via', IP.ingressUl).catch(() => undefined);
      }
      const metrics = (await ingress.agent.client.get('/metrics', { token: ingress.token })).text;
      assert.match(metrics, /^mesh_dataplane_service_health_changes_total\{to="exit_no_route"\} [1-9]/m);
    });

    it('5 % random loss on both underlays for 60 s: no switch at all', async () => {
      const { topo, ingress } = mesh;
      const lossy: [string, string][] = [
        [topo.ns.exit, 'e1'],
        [topo.ns.exit2!, 'f1'],
      ];
      const metrics = async () => (await ingress.agent.client.get('/metrics', { token: ingress.token })).text;
      const changes = (text: string) =>
        [...text.matchAll(/^mesh_dataplane_service_health_changes_total\{to="[a-z_]+"\} (\d+)$/gm)].reduce(
          (sum, m) => sum + Number(m[1]),
          0,
        );
      await until('through the first exit', async () => assert.equal(await seenFrom(), IP.exitOut), 30_000);
      const before = changes(await metrics());
      const since = await lastSeq();
      for (const [ns, dev] of lossy) await lossUp(topo, ns, dev, 'mdfo_loss', 5);
      let dropped: LossCounters | undefined;
      try {
        const until60 = performance.now() + 60_000;
        while (performance.now() < until60) {
          const text = await metrics();
          assert.equal(changes(text), before, 'a service changed health under 5 % loss');
          assert.match(
            text,
            new RegExp(`^mesh_dataplane_service_carrying\\{service_id="${first}"\\} 1$`, 'm'),
          );
          await new Promise((resolve) => setTimeout(resolve, 500));
        }
        dropped = await lossCounters(topo, topo.ns.exit, 'mdfo_loss');
      } finally {
        for (const [ns] of lossy) await tableDown(topo, ns, 'mdfo_loss');
      }
      assert.deepEqual(await switches(since), [], 'no failover or health event under 5 % loss');
      // The loss was real: the exit dropped packets both ways.
      assert.ok(
        dropped && dropped.in.dropped > 0 && dropped.out.dropped > 0,
        `nothing dropped: ${JSON.stringify(dropped)}`,
      );
      console.log(
        `# 5 % loss for 60 s: no switch; the first exit dropped ${dropped.in.dropped} in, ${dropped.out.dropped} out`,
      );
    });

    it("the ingress's nftables table deleted behind its back: put back, one dataplane.drift_repaired", async () => {
      const { topo, ingress } = mesh;
      await until('through the first exit', async () => assert.equal(await seenFrom(), IP.exitOut), 30_000);
      const since = await lastSeq();
      await topo.run(topo.ns.ingress, 'nft', ['delete', 'table', 'inet', 'mesh_agent']);
      const repairs = async () => eventsOf(ingress, { type: 'dataplane.', since });
      // Found by the reconcile timer (every 10 s).
      await until(
        'the drift repaired',
        async () => {
          const [repair, ...more] = await repairs();
          assert.deepEqual(more, []);
          assert.equal(repair?.type, 'dataplane.drift_repaired');
          assert.deepEqual(repair.data.repaired, ['nft: table replaced']);
        },
        30_000,
      );
      await topo.run(topo.ns.ingress, 'nft', ['list', 'table', 'inet', 'mesh_agent']);
      // The reconciles after it find nothing to repair.
      await new Promise((resolve) => setTimeout(resolve, 12_000));
      assert.equal((await repairs()).length, 1);
      await until('through the first exit', async () => assert.equal(await seenFrom(), IP.exitOut), 30_000);
    });

    it("the first exit healthy but its probe's target blocked (health_check)", async () => {
      const { topo, ingress } = mesh;
      const setCheck = async (check: Record<string, unknown> | null) => {
        const res = await ingress.agent.client.put(`/v1/services/${first}`, {
          token: ingress.token,
          json: { health_check: check },
        });
        assert.equal(res.status, 200, res.text);
      };
      // The probe asks the destination's second TCP server; the HTTP one stays reachable through
      // the first exit, so only the probe says it is unwell.
      await setCheck({ tcp: `${IP.dest}:${HTTP + 1}`, interval_ms: 200, failures: 3 });
      try {
        await until(
          'the probe passes at the first exit',
          async () => {
            const dp = (await serviceAt(mesh.exit, first)).dataplane;
            assert.equal(dp.probe_passing, true, JSON.stringify(dp));
          },
          30_000,
        );
        await trial(
          'probe target blocked',
          'probe_failed',
          () => portBlockUp(topo, topo.ns.dest, HTTP + 1, 'mdfo_probe'),
          () => tableDown(topo, topo.ns.dest, 'mdfo_probe'),
        );
      } finally {
        await tableDown(topo, topo.ns.dest, 'mdfo_probe');
        await setCheck(null);
      }
      const metrics = (await ingress.agent.client.get('/metrics', { token: ingress.token })).text;
      assert.match(metrics, /^mesh_dataplane_service_health_changes_total\{to="probe_failed"\} [1-9]/m);
    });

    it('a /25 via the first exit falls back to the /24 via the second; with neither up, nothing gets through', async () => {
      const { ingress, exit, exit2 } = mesh;
      const routesOf = async (id: string) =>
        (await ingress.agent.client.get(`/v1/services/${id}/routes`, { token: ingress.token })).body as {
          id: number;
        }[];
      const [firstRoute] = await routesOf(first);
      const put = async (body: Record<string, unknown>) => {
        const res = await ingress.agent.client.put(`/v1/services/${first}/routes/${firstRoute!.id}`, {
          token: ingress.token,
          json: body,
        });
        assert.equal(res.status, 200, res.text);
      };
      // The same priority as the second's /24: the first wins by its longer destination.
      await put({ priority: 20, dest_cidr: '10.91.2.0/25' });
      try {
        await until(
          'through the first exit (/25)',
          async () => assert.equal(await seenFrom(), IP.exitOut),
          30_000,
        );
        await exit.agent.kill9();
        await until(
          'through the second exit (/24)',
          async () => assert.equal(await seenFrom(), IP.exit2Out),
          MOVE_WITHIN_MS,
        );
        process.kill(exit2.agent.pid, 'SIGSTOP');
        try {
          await until(
            'the second stands aside too',
            async () => {
              const health = (
                (await serviceAt(ingress, second)) as unknown as { health: { carrying: boolean } }
              ).health;
              assert.equal(health.carrying, false);
            },
            MOVE_WITHIN_MS,
          );
          // No route left: the request fails, as it does without failover.
          await assert.rejects(seenFrom(), 'a request got through with both exits down');
        } finally {
          process.kill(exit2.agent.pid, 'SIGCONT');
        }
      } finally {
        await exit.agent.restart().catch(() => undefined);
        await put({ priority: 10, dest_cidr: '10.91.2.0/24' });
      }
      await waitUp(first, exit);
      await until(
        'through the first exit again',
        async () => assert.equal(await seenFrom(), IP.exitOut),
        60_000,
        // What the ingress and the exits say of both services, for a failure to be read.
        async () => ({
          ingress: [await serviceAt(ingress, first), await serviceAt(ingress, second)],
          exit: await serviceAt(exit, first).catch((e: Error) => e.message),
          exit2: await serviceAt(exit2, second).catch((e: Error) => e.message),
        }),
      );
    });

    // The console (docs/console.md) against this live data plane, in Chromium: both tunnels with
    // their round-trip times, the first service drawn standby while its exit is down, and its
    // throughput against its limit. tcp only: the drawing differs by transport in a label only,
    // which src/console/topology.test.ts checks.
    if (transport === 'tcp')
      it('the console draws the live tunnels, a switched-away service as standby, and throughput', async () => {
        const { ingress, exit, exit2, topo } = mesh;
        const credential = await ingress.agent.client.post('/v1/credentials', {
          token: ingress.token,
          json: { scopes: [ADMIN] },
        });
        assert.equal(credential.status, 201, credential.text);
        const chromium = await launchIsolatedChromium([PORT], topo.mgmt.ingress);
        try {
          const context = await chromium.browser.newContext({ viewport: { width: 1280, height: 860 } });
          context.setDefaultTimeout(15_000);
          const page = await context.newPage();
          await signIn(
            page,
            `http://127.0.0.1:${PORT}`,
            credential.body.client_id,
            credential.body.client_secret,
          );
          await show(page, 'topology');
          const tunnelRow = (peer: string) =>
            page.locator(`[aria-label="tunnels"] tbody tr[data-peer-id="${peer}"][data-transport="tcp"]`);
          const arrowTo = (peer: string) => page.locator(`svg.topology path.svc[data-to="${peer}"]`);
          // Inside `until`'s retries: a short wait each, not the context's 15 s.
          const attr = (at: ReturnType<typeof page.locator>, name: string) =>
            at.getAttribute(name, { timeout: 1000 });
          const text = async (at: ReturnType<typeof page.locator>) =>
            (await at.textContent({ timeout: 1000 })) ?? '';
          const summary = page.getByTestId('topology-summary');
          for (const peer of [exit.peerId, exit2.peerId]) {
            await until(
              `the tunnel to ${peer} drawn up, with its round-trip time`,
              async () => {
                assert.equal(await attr(tunnelRow(peer), 'data-state'), 'up');
                assert.match(await text(tunnelRow(peer).locator('td').nth(3)), /^[\d.]+ ms$/);
                assert.equal(await attr(arrowTo(peer), 'data-state'), 'active');
              },
              10_000,
            );
          }
          assert.equal(await page.locator('svg.topology g.tunnel.up').count(), 2);
          assert.match(
            (await summary.textContent()) ?? '',
            /3 peers · 2\/2 tunnels up · 2 services as 2 arrows$/,
          );

          await exit.agent.kill9();
          try {
            await until(
              'the tunnel to the killed exit drawn down, its service standby',
              async () => {
                assert.equal(await attr(tunnelRow(exit.peerId), 'data-state'), 'down');
                assert.equal(await attr(arrowTo(exit.peerId), 'data-state'), 'standby');
                assert.equal(await attr(arrowTo(exit2.peerId), 'data-state'), 'active');
                assert.match(await text(summary), /1\/2 tunnels up .* · 1 standby/);
              },
              MOVE_WITHIN_MS,
            );
            // The services list says so too (it reads /metrics every 5 s).
            await show(page, 'services');
            const stateIn = (id: string) => page.locator(`tr[data-service-id="${id}"] span.state`);
            await until(
              'the services list showing the first service standby',
              async () => {
                assert.equal(await text(stateIn(first)), 'standby');
                assert.equal(await text(stateIn(second)), 'active');
              },
              10_000,
            );
            await show(page, 'topology');
          } finally {
            await exit.agent.restart();
          }
          await waitUp(first, exit);
          await until(
            'the first service drawn active again after the hold-down',
            async () => {
              assert.equal(await attr(tunnelRow(exit.peerId), 'data-state'), 'up');
              assert.equal(await attr(arrowTo(exit.peerId), 'data-state'), 'active');
            },
            30_000,
          );

          // Throughput: the first service limited to 20 Mbit/s, a download through it, its chart.
          // The exit shapes the download: it holds the limit before any byte.
          const limit = (mbps: number) => setBandwidthLimit(ingress, exit, first, mbps);
          await limit(20);
          try {
            await show(page, 'services');
            await page
              .locator(`tr[data-service-id="${first}"]`)
              .getByRole('button', { name: 'Open' })
              .click();
            const chart = page.locator(`.detail[data-service-id="${first}"]`).getByTestId('throughput');
            await until(
              'the limit in the chart',
              async () => assert.match(await text(chart), /limit 20 Mbit\/s/),
              10_000,
            );
            const pointsIn = async () =>
              ((await chart.locator('polyline.in').getAttribute('points')) ?? '').split(' ').filter(Boolean)
                .length;
            const pointsBefore = await pointsIn();
            // 10 MB at 20 Mbit/s: about 4 s, two of the chart's 2 s readings. Its caption read
            // every half second meanwhile.
            let done = false;
            const download = topo
              .run(
                topo.ns.client,
                'curl',
                ['-sS', '-o', '/dev/null', '--max-time', '30', `http://${IP.dest}:${HTTP}/bytes?n=10000000`],
                35_000,
              )
              .finally(() => {
                done = true;
              });
            const readings: number[] = [];
            try {
              while (!done) {
                const caption = await text(chart.locator('figcaption'));
                readings.push(Number(/in ([\d.]+) Mbit\/s/.exec(caption)?.[1] ?? Number.NaN));
                await sleep(500);
              }
            } finally {
              await download;
            }
            const peakIn = Math.max(...readings.filter((r) => !Number.isNaN(r)));
            console.log(
              `# console: the chart showed up to ${peakIn.toFixed(1)} Mbit/s in against a 20 Mbit/s limit`,
            );
            assert.ok(peakIn > 5 && peakIn < 20 * 1.25, `${readings.join(', ')} Mbit/s drawn, limit 20`);
            assert.equal(await chart.locator('line.limit').count(), 1);
            assert.ok((await pointsIn()) >= pointsBefore + 2, 'two readings more in the chart');
          } finally {
            await limit(0);
          }
          assert.equal(await page.getByRole('alert').count(), 0);
        } finally {
          await chromium.close();
          const revoked = await ingress.agent.client.delete(`/v1/credentials/${credential.body.client_id}`, {
            token: ingress.token,
          });
          assert.equal(revoked.status, 200, revoked.text);
        }
      });
  });
}
