/**
 * The tunnel compliance suite against the tcp transport over loopback: each peer an HTTP server
 * that hands upgrades to its TcpTransport, each dialer reaching its acceptor through a FaultProxy
 * (so a cut or a killed peer is silence, not a FIN), short keepalive and dead timers.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { TcpTransport } from '../../src/transports/tcp.js';
import { FaultProxy } from '../transports/fault-proxy.js';
import { relayedWorld, RELAYED_TIMING as timing } from './relayed-world.js';
import { tunnelCompliance } from './tunnel-suite.js';

tunnelCompliance('tcp', (peers) =>
  // Its queue follows its send rate: it may say stop from 64 KiB on (FOLLOW_MIN).
  relayedWorld(
    peers,
    { ...timing, leastQueueBound: 64 * 1024 },
    {
      async start(identity, directory) {
        const server = http.createServer((_req, res) => res.writeHead(404).end());
        await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
        const transport = new TcpTransport({
          localPeerId: identity.id,
          identityKey: identity.key,
          directory,
          scheme: 'http',
          keepaliveIntervalMs: timing.keepaliveIntervalMs,
          deadAfterMs: timing.deadAfterMs,
          backoff: { minMs: 50, maxMs: timing.backoffMaxMs },
          highWaterMark: timing.highWaterMark,
          dialTimeoutMs: 2000,
        });
        server.on('upgrade', (req, socket, head) => {
          if (!transport.acceptUpgrade(req, socket, head)) socket.destroy();
        });
        return { transport, server, port: (server.address() as AddressInfo).port };
      },
      async stop({ transport, server }) {
        await transport.close();
        server.closeAllConnections();
        await new Promise<void>((resolve) => server.close(() => resolve()));
      },
      relay: () => FaultProxy.start(1),
      silence(proxy, silent) {
        if (silent && !proxy.isBlackholed) proxy.blackhole();
        else if (!silent && proxy.isBlackholed) proxy.restore();
      },
    },
  ),
);
