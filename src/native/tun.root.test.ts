/**
 * The TUN addon against the real kernel (root). Devices are created with openTun's netnsPath inside one
 * namespace of this file's own: the device, its addresses and routes live there (no name or route can clash
 * with other tests or the host), while the fd and the listener stay in this process, so packets are checked
 * here directly. Traffic comes from ping and a UDP tool run inside that namespace. One case runs openTun
 * without netnsPath in a child process started inside the namespace.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { queryObjects } from 'node:v8';
import {
  checkSeqPayload,
  checksum,
  icmpEchoReplyV4,
  icmpEchoReplyV6,
  ipv6Bytes,
  parseIPv4,
  parseIPv6,
  seqPayload,
  udpV4,
} from '../../test/helpers/ip-packets.js';
import { collect, Netns, requireCommand } from '../../test/helpers/tun-netns.js';
import { loadAddon } from './load-addon.js';
import { openTun, type TunDevice, type TunOptions } from './tun.js';

const UDP_TOOL = fileURLToPath(new URL('../../test/helpers/udp-tool.js', import.meta.url));
const TUN_MODULE = fileURLToPath(new URL('./tun.js', import.meta.url));

interface Waiter {
  promise: Promise<void>;
  done(): void;
}

/** A promise the listener resolves, rejected after timeoutMs with what `state` says then. */
function waiter(timeoutMs: number, what: string, state: () => string): Waiter {
  let done!: () => void;
  const promise = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${what}: not after ${timeoutMs} ms (${state()})`)),
      timeoutMs,
    );
    // A test that failed before awaiting this must neither wait for the timer nor see it reject later.
    timer.unref();
    done = () => {
      clearTimeout(timer);
      resolve();
    };
  });
  promise.catch(() => {});
  return { promise, done };
}

/** The flags of this process's open file for `fd`, from /proc/self/fdinfo (octal). */
function openFlags(fd: string): number {
  const line = readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8')
    .split('\n')
    .find((l) => l.startsWith('flags:'));
  return Number.parseInt(line!.split(/\s+/)[1]!, 8);
}

function tunFds(): string[] {
  return readdirSync('/proc/self/fd').filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`) === '/dev/net/tun';
    } catch {
      return false;
    }
  });
}

describe('native TUN addon (real kernel, root)', { timeout: 120_000 }, () => {
  let ns: Netns;
  let counter = 0;
  const devices: TunDevice[] = [];

  const open = (opts: TunOptions = {}): TunDevice => {
    const dev = openTun(`mt${process.pid % 100000}x${++counter}`, { netnsPath: ns.path, ...opts });
    devices.push(dev);
    return dev;
  };
  /** Link up with an IPv4 address; IPv6 off unless asked, so no MLD/RS packets mix into the counts. */
  const up = (dev: TunDevice, v4: string, opts: { v6?: string; txqueuelen?: number } = {}) => {
    if (!opts.v6)
      ns.ip('netns', 'exec', ns.name, 'sysctl', '-qw', `net.ipv6.conf.${dev.name}.disable_ipv6=1`);
    if (opts.txqueuelen) ns.ip('link', 'set', 'dev', dev.name, 'txqueuelen', String(opts.txqueuelen));
    ns.ip('addr', 'add', v4, 'dev', dev.name);
    if (opts.v6) ns.ip('addr', 'add', opts.v6, 'dev', dev.name, 'nodad');
    ns.ip('link', 'set', 'dev', dev.name, 'up');
  };
  const udpSend = async (dst: string, port: number, count: number, minLen: number, maxLen: number) => {
    const r = await ns.run(
      process.execPath,
      [UDP_TOOL, 'send', dst, String(port), String(count), String(minLen), String(maxLen)],
      60_000,
    );
    assert.equal(r.code, 0, r.stderr);
    return JSON.parse(r.stdout) as { sent: number; errors: number };
  };

  before(() => {
    requireCommand('ping');
    requireCommand('setpriv', ['--version']);
    ns = Netns.create('mtun');
  });

  after(() => {
    for (const dev of devices) dev.close();
    ns?.delete();
  });

  it('opens a non-persistent, single-queue TUN without packet info, fd non-blocking and close-on-exec', () => {
    const fdsBefore = new Set(tunFds());
    const dev = open({ mtu: 1400 });
    const [info] = JSON.parse(ns.ip('-d', '-j', 'link', 'show', 'dev', dev.name)) as {
      mtu: number;
      linkinfo: { info_kind: string; info_data: Record<string, unknown> };
    }[];
    assert.equal(info!.mtu, 1400);
    assert.equal(info!.linkinfo.info_kind, 'tun');
    assert.equal(info!.linkinfo.info_data['type'], 'tun');
    assert.equal(info!.linkinfo.info_data['pi'], false);
    assert.equal(info!.linkinfo.info_data['vnet_hdr'], false);
    assert.equal(info!.linkinfo.info_data['multi_queue'], false);
    assert.equal(info!.linkinfo.info_data['persist'], false);
    const fds = tunFds().filter((fd) => !fdsBefore.has(fd));
    assert.equal(fds.length, 1);
    const flags = openFlags(fds[0]!);
    assert.ok(flags & 0o4000, 'O_NONBLOCK');
    assert.ok(flags & 0o2000000, 'O_CLOEXEC');
    // The device exists only in the namespace, not in this process's own.
    assert.throws(() => execFileSync('ip', ['link', 'show', 'dev', dev.name], { stdio: 'pipe' }));
    dev.close();
  });

  it('without netnsPath creates the device in the calling process namespace (child inside the namespace)', async () => {
    const code = `
      import { execFileSync } from 'node:child_process';
      import { openTun } from ${JSON.stringify(TUN_MODULE)};
      const show = () => {
        try { return JSON.parse(execFileSync('ip', ['-j', 'link', 'show', 'dev', 'mtchild'], { stdio: 'pipe' })); }
        catch { return null; }
      };
      const dev = openTun('mtchild', { mtu: 1280 });
      const before = show();
      dev.close();
      process.stdout.write(JSON.stringify({ name: dev.name, mtu: before?.[0]?.mtu ?? null, after: show() }));
    `;
    const r = await ns.run(process.execPath, ['--input-type=module', '-e', code], 20_000);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), { name: 'mtchild', mtu: 1280, after: null });
  });

  it('ping (IPv4): the listener sees the echo requests, written replies reach ping', async () => {
    const dev = open();
    up(dev, '10.77.1.1/24');
    const requests: { length: number; h: ReturnType<typeof parseIPv4> }[] = [];
    const writes: number[] = [];
    dev.onPackets((packets) => {
      for (const p of packets) {
        if (p[0]! >> 4 !== 4) continue;
        const h = parseIPv4(p);
        if (h.protocol !== 1 || h.payload[0] !== 8) continue;
        requests.push({ length: p.length, h });
        writes.push(dev.write([icmpEchoReplyV4(p)]));
      }
    });
    const r = await ns.run('ping', ['-n', '-c', '3', '-i', '0.2', '-W', '3', '10.77.1.2'], 30_000);
    assert.equal(r.code, 0, `ping failed: ${r.stdout}${r.stderr}`);
    assert.match(r.stdout, /3 packets transmitted, 3 received/);
    assert.equal(requests.length, 3);
    assert.deepEqual(writes, [1, 1, 1]);
    requests.forEach(({ length, h }, i) => {
      assert.equal(h.version, 4);
      assert.equal(h.ihl, 5);
      assert.equal(h.totalLength, length);
      assert.equal(length, 84); // 20 IP + 8 ICMP + 56 data
      assert.equal(h.ttl, 64);
      assert.equal(h.protocol, 1);
      assert.equal(h.src, '10.77.1.1');
      assert.equal(h.dst, '10.77.1.2');
      assert.ok(h.headerChecksumOk, 'IPv4 header checksum');
      assert.equal(checksum(h.payload), 0, 'ICMP checksum');
      assert.equal(h.payload.readUInt16BE(6), i + 1, 'ICMP sequence');
    });
    const s = dev.stats();
    assert.equal(s.packetsWritten, 3);
    assert.equal(s.bytesWritten, 3 * 84);
    assert.equal(s.writeDrops, 0);
    assert.ok(s.packetsRead >= 3);
    dev.close();
  });

  it('ping -6: the listener sees ICMPv6 echo requests, written replies reach ping', async () => {
    const dev = open();
    up(dev, '10.77.2.1/24', { v6: 'fd77:2::1/64' });
    const requests: { length: number; h: ReturnType<typeof parseIPv6> }[] = [];
    dev.onPackets((packets) => {
      for (const p of packets) {
        if (p[0]! >> 4 !== 6) continue;
        const h = parseIPv6(p);
        if (h.nextHeader !== 58 || h.payload[0] !== 128) continue; // not an echo request (MLD, RS)
        requests.push({ length: p.length, h });
        dev.write([icmpEchoReplyV6(p)]);
      }
    });
    const r = await ns.run('ping', ['-6', '-n', '-c', '3', '-i', '0.2', '-W', '3', 'fd77:2::2'], 30_000);
    assert.equal(r.code, 0, `ping -6 failed: ${r.stdout}${r.stderr}`);
    assert.match(r.stdout, /3 packets transmitted, 3 received/);
    assert.equal(requests.length, 3);
    const src = ipv6Bytes('fd77:2::1');
    const dst = ipv6Bytes('fd77:2::2');
    requests.forEach(({ length, h }, i) => {
      assert.equal(h.version, 6);
      assert.equal(h.payloadLength + 40, length);
      assert.equal(h.hopLimit, 64);
      assert.deepEqual(h.src, src);
      assert.deepEqual(h.dst, dst);
      const pseudo = Buffer.alloc(40);
      src.copy(pseudo, 0);
      dst.copy(pseudo, 16);
      pseudo.writeUInt32BE(h.payloadLength, 32);
      pseudo[39] = 58;
      assert.equal(checksum(pseudo, h.payload), 0, 'ICMPv6 checksum');
      assert.equal(h.payload.readUInt16BE(6), i + 1, 'ICMPv6 sequence');
    });
    assert.equal(dev.stats().packetsWritten, 3);
    dev.close();
  });

  it('batching: 20000 UDP datagrams blasted into the device all arrive whole, in fewer listener calls', async () => {
    const N = 20_000;
    const dev = open();
    // The kernel's queue to the device (its ring, sized by txqueuelen) holds what we have not read yet.
    up(dev, '10.77.3.1/24', { txqueuelen: N + 1000 });
    const seen = new Uint8Array(N);
    let distinct = 0;
    let bad = 0;
    let calls = 0;
    let largest = 0;
    const all = waiter(60_000, 'all datagrams read', () => `${distinct} of ${N}, ${calls} calls`);
    dev.onPackets((packets) => {
      calls++;
      largest = Math.max(largest, packets.length);
      for (const p of packets) {
        const h = parseIPv4(p);
        const udp = h.payload;
        const seq = checkSeqPayload(udp.subarray(8));
        const whole =
          h.version === 4 &&
          h.protocol === 17 &&
          h.totalLength === p.length &&
          udp.readUInt16BE(4) === udp.length &&
          udp.readUInt16BE(2) === 9 &&
          seq >= 0 &&
          seq < N &&
          udp.length - 8 === 16 + (seq % 1185);
        if (!whole || seen[seq] === 1) bad++;
        else {
          seen[seq] = 1;
          distinct++;
        }
      }
      if (distinct === N) all.done();
    });
    const sent = await udpSend('10.77.3.2', 9, N, 16, 1200);
    assert.deepEqual(sent, { sent: N, errors: 0 });
    await all.promise;
    const s = dev.stats();
    const k = ns.linkStats(dev.name);
    console.log(
      `batching: ${N} datagrams in ${calls} listener calls (mean ${(N / calls).toFixed(2)}, largest ${largest}); ` +
        `device tx dropped ${k.tx.dropped}`,
    );
    assert.equal(bad, 0, 'split, merged, corrupt or duplicated datagrams');
    assert.equal(distinct, N);
    assert.equal(s.packetsRead, N);
    assert.equal(s.readBatches, calls);
    assert.ok(calls < N, `batches formed: ${calls} calls for ${N} datagrams`);
    assert.ok(largest <= 64, 'a batch holds at most batchPackets');
    dev.close();
  });

  it('a backlog is read in batches of exactly batchPackets, or ending once batchBytes is passed', async () => {
    const byCount = open({ batchPackets: 64 });
    const byBytes = open({ batchPackets: 64, batchBytes: 3000 });
    up(byCount, '10.77.4.1/24', { txqueuelen: 5000 });
    up(byBytes, '10.77.5.1/24', { txqueuelen: 5000 });
    const sizes = new Map<TunDevice, number[]>([
      [byCount, []],
      [byBytes, []],
    ]);
    const total = (dev: TunDevice) => sizes.get(dev)!.reduce((a, b) => a + b, 0);
    const waiters = new Map<TunDevice, Waiter>();
    for (const [dev, expected] of [
      [byCount, 1000],
      [byBytes, 100],
    ] as const) {
      waiters.set(
        dev,
        waiter(30_000, `${dev.name} backlog`, () => `${total(dev)} of ${expected}`),
      );
      dev.pause();
      dev.onPackets((packets) => {
        sizes.get(dev)!.push(packets.length);
        if (total(dev) === expected) waiters.get(dev)!.done();
      });
    }
    // While paused nothing is read: the datagrams wait in the device's queue.
    await udpSend('10.77.4.2', 9, 1000, 72, 72); // 100-byte packets
    await udpSend('10.77.5.2', 9, 100, 1000, 1000); // 1028-byte packets
    assert.equal(byCount.stats().packetsRead, 0);
    assert.equal(byBytes.stats().packetsRead, 0);
    byCount.resume();
    byBytes.resume();
    await Promise.all([...waiters.values()].map((w) => w.promise));
    assert.deepEqual(sizes.get(byCount), [...new Array<number>(15).fill(64), 40]);
    // 3 x 1028 bytes pass 3000: each batch ends after its third packet.
    assert.deepEqual(sizes.get(byBytes), [...new Array<number>(33).fill(3), 1]);
    byCount.close();
    byBytes.close();
  });

  it('close() deletes the device; afterwards write returns 0, and everything else is a no-op', () => {
    const dev = open();
    up(dev, '10.77.6.1/24');
    assert.ok(ns.hasLink(dev.name));
    dev.onPackets(() => {});
    dev.close();
    assert.equal(dev.closed, true);
    assert.equal(ns.hasLink(dev.name), false, 'device gone from ip -n <ns> link');
    const packet = udpV4('10.77.6.2', '10.77.6.1', 1, 2, seqPayload(0, 8));
    assert.equal(dev.write([packet]), 0);
    assert.equal(dev.writeBatch(packet, Uint32Array.of(packet.length)), 0);
    dev.close();
    dev.pause();
    dev.resume();
    dev.onPackets(() => {});
    assert.equal(dev.stats().packetsWritten, 0);
    // The name is free again.
    const again = openTun(dev.name, { netnsPath: ns.path });
    again.close();
  });

  it('a closed device is released: 200 opened and closed leave at most the last few alive', async () => {
    const { Tun } = loadAddon<{ Tun: new (...args: never[]) => object }>('mesh_native.node');
    const live = () => queryObjects(Tun, { format: 'count' }) as number;
    const before = live();
    for (let i = 0; i < 200; i++) {
      const dev = openTun(`mtrel${i}`, { netnsPath: ns.path });
      dev.onPackets(() => {});
      dev.onError(() => {});
      dev.close();
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
    // Each one kept costs its 320 KiB read area, for good.
    assert.ok(live() <= before + 3, `${live() - before} of 200 closed TUN devices still alive`);
  });

  it('close() inside the listener: no further batch is delivered, the device is gone', async () => {
    const dev = open();
    up(dev, '10.77.7.1/24', { txqueuelen: 1000 });
    let calls = 0;
    let seenInFirst = 0;
    dev.pause();
    dev.onPackets((packets) => {
      calls++;
      seenInFirst = packets.length;
      dev.close();
    });
    await udpSend('10.77.7.2', 9, 200, 16, 16);
    const name = dev.name;
    const closed = waiter(10_000, 'listener called', () => `${calls} calls`);
    const check = setInterval(() => dev.closed && closed.done(), 5);
    dev.resume();
    try {
      await closed.promise;
    } finally {
      clearInterval(check);
    }
    // Give the event loop a few turns: a still-registered poll would call again.
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(calls, 1);
    assert.equal(seenInFirst, 64, 'the whole first batch is delivered');
    assert.equal(ns.hasLink(name), false);
  });

  it('refuses a name in use (EBUSY), bad names (EINVAL), a missing namespace (ENOENT), no CAP_NET_ADMIN (EPERM)', async () => {
    const dev = open();
    assert.throws(() => openTun(dev.name, { netnsPath: ns.path }), {
      code: 'EBUSY',
      syscall: 'ioctl(TUNSETIFF)',
      message: new RegExp(`TUN device name '${dev.name}' is already in use`),
    });
    // An existing device of another kind is just as taken.
    assert.throws(() => openTun('lo', { netnsPath: ns.path }), { code: 'EBUSY' });
    for (const bad of ['', 'x'.repeat(16), 'a/b', 'a b', 'mesh%d', 'tün0', '..']) {
      assert.throws(
        () => openTun(bad, { netnsPath: ns.path }),
        { code: 'EINVAL', message: /^invalid TUN device name/ },
        JSON.stringify(bad),
      );
    }
    assert.throws(() => openTun('mtnons', { netnsPath: `/run/netns/${ns.name}-missing` }), {
      code: 'ENOENT',
      syscall: 'open',
      message: /cannot open network namespace/,
    });
    assert.throws(() => openTun('mtbadmtu', { netnsPath: ns.path, mtu: 70_000 }), RangeError);
    assert.throws(() => openTun('mtbadbatch', { netnsPath: ns.path, batchPackets: 0 }), RangeError);
    // A failed open leaves no device and no fd behind.
    assert.equal(ns.hasLink('mtbadmtu'), false);
    const code = `
      import { openTun } from ${JSON.stringify(TUN_MODULE)};
      try { openTun('mtnocap'); process.stdout.write('opened'); }
      catch (e) { process.stdout.write(JSON.stringify({ code: e.code, errno: e.errno, syscall: e.syscall, message: e.message })); }
    `;
    const r = await ns.run(
      'setpriv',
      [
        '--bounding-set=-net_admin',
        '--inh-caps=-net_admin',
        process.execPath,
        '--input-type=module',
        '-e',
        code,
      ],
      20_000,
    );
    assert.equal(r.code, 0, r.stderr);
    const e = JSON.parse(r.stdout) as { code: string; errno: number; syscall: string; message: string };
    assert.equal(e.code, 'EPERM');
    assert.equal(e.errno, -1);
    assert.equal(e.syscall, 'ioctl(TUNSETIFF)');
    assert.match(e.message, /cannot create TUN device 'mtnocap': EPERM/);
    dev.close();
  });

  it('writes a batch of packets in one call (array and one buffer + lengths): all arrive in the namespace', async () => {
    const N = 4000;
    const dev = open();
    up(dev, '10.77.8.1/24');
    const packets = Array.from({ length: N }, (_, i) =>
      udpV4('10.77.8.2', '10.77.8.1', 40_000, 5008, seqPayload(i, 16 + (i % 300)), i),
    );
    const receive = async (port: number, write: () => number) => {
      const child = ns.spawn(process.execPath, [
        UDP_TOOL,
        'recv',
        '10.77.8.1',
        String(port),
        String(N),
        '20000',
      ]);
      const result = collect(child, 30_000, 'udp recv');
      await new Promise<void>((resolve, reject) => {
        child.stdout!.once('data', (d: Buffer) =>
          d.toString().startsWith('ready') ? resolve() : reject(new Error(d.toString())),
        );
        child.once('exit', () => reject(new Error('receiver exited before ready')));
      });
      const rxBefore = ns.linkStats(dev.name).rx.packets;
      assert.equal(write(), N);
      const r = await result;
      assert.equal(r.code, 0, r.stderr);
      assert.deepEqual(JSON.parse(r.stdout.split('\n').filter(Boolean).at(-1)!), {
        received: N,
        distinct: N,
        bad: 0,
      });
      assert.equal(ns.linkStats(dev.name).rx.packets - rxBefore, N);
    };
    await receive(5008, () => dev.write(packets));
    const again = Array.from({ length: N }, (_, i) =>
      udpV4('10.77.8.2', '10.77.8.1', 40_000, 5009, seqPayload(i, 16 + (i % 300)), i),
    );
    const one = Buffer.concat(again);
    const lengths = Uint32Array.from(again, (p) => p.length);
    await receive(5009, () => dev.writeBatch(one, lengths));
    const s = dev.stats();
    assert.equal(s.packetsWritten, 2 * N);
    assert.equal(s.writeDrops, 0);
    dev.close();
  });

  it('a packet the kernel refuses is a counted drop, not an exception; a non-buffer is a TypeError', () => {
    const dev = open();
    const early = udpV4('10.77.9.2', '10.77.9.1', 1, 9, seqPayload(0, 8));
    assert.equal(dev.write([early]), 0, 'link still down');
    assert.equal(dev.stats().lastWriteError, 'EIO');
    up(dev, '10.77.9.1/24');
    const good = udpV4('10.77.9.2', '10.77.9.1', 1, 9, seqPayload(1, 8));
    const notIp = Buffer.alloc(28); // version nibble 0: neither IPv4 nor IPv6
    assert.equal(dev.write([good, notIp, good]), 2);
    const s = dev.stats();
    assert.equal(s.packetsWritten, 2);
    assert.equal(s.writeDrops, 2);
    assert.equal(s.lastWriteError, 'EINVAL');
    assert.throws(() => dev.write([good, 'x' as unknown as Buffer]), TypeError);
    assert.throws(() => dev.writeBatch(good, Uint32Array.of(good.length + 1)), RangeError);
    dev.close();
  });

  it('a device deleted under the open fd: one EBADF error, reading stops, writes are drops, close() works', async () => {
    const dev = open();
    up(dev, '10.77.10.1/24');
    const errors: NodeJS.ErrnoException[] = [];
    const failed = waiter(10_000, 'error listener called', () => `${errors.length} errors`);
    dev.onPackets(() => {});
    dev.onError((e) => {
      errors.push(e);
      failed.done();
    });
    ns.ip('link', 'del', 'dev', dev.name);
    await failed.promise;
    await new Promise((r) => setTimeout(r, 100)); // a poll still registered would report again
    assert.equal(errors.length, 1);
    assert.equal(errors[0]!.code, 'EBADF');
    assert.equal(errors[0]!.syscall, 'uv_poll');
    assert.match(errors[0]!.message, new RegExp(`TUN device '${dev.name}' failed while polling`));
    assert.equal(dev.stats().readErrors, 1);
    assert.equal(dev.write([udpV4('10.77.10.2', '10.77.10.1', 1, 9, seqPayload(0, 8))]), 0);
    assert.equal(dev.stats().lastWriteError, 'EBADFD');
    dev.close();
    assert.equal(dev.closed, true);
  });

  it('a listener that throws is an uncaught exception of the process (child inside the namespace)', async () => {
    const code = `
      import { execFileSync } from 'node:child_process';
      import { createSocket } from 'node:dgram';
      import { openTun } from ${JSON.stringify(TUN_MODULE)};
      const dev = openTun('mtthrow');
      execFileSync('sysctl', ['-qw', 'net.ipv6.conf.mtthrow.disable_ipv6=1']);
      execFileSync('ip', ['addr', 'add', '10.79.0.1/24', 'dev', 'mtthrow']);
      execFileSync('ip', ['link', 'set', 'dev', 'mtthrow', 'up']);
      let calls = 0;
      dev.onPackets(() => { calls++; throw new Error('boom from listener'); });
      process.on('uncaughtException', (e) => {
        process.stdout.write(JSON.stringify({ message: e.message, calls }));
        dev.close();
      });
      const s = createSocket('udp4');
      s.send('x', 9, '10.79.0.2', () => s.close());
      setTimeout(() => { process.stdout.write('no exception'); process.exit(1); }, 5000).unref();
    `;
    const r = await ns.run(process.execPath, ['--input-type=module', '-e', code], 20_000);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), { message: 'boom from listener', calls: 1 });
  });
});
