/**
 * The tunnel compliance suite against the kcp transport over loopback UDP: each peer a
 * KcpTransport on its own UDP port, each dialer reaching its acceptor through a UdpRelay (so a cut
 * or a killed peer is silence), short keepalive and dead timers, as tunnel-tcp.test.ts.
 */
import { KcpTransport } from '../../src/transports/kcp-transport.js';
import { UdpRelay } from '../transports/udp-relay.js';
import { relayedWorld, RELAYED_TIMING as timing } from './relayed-world.js';
import { tunnelCompliance } from './tunnel-suite.js';

tunnelCompliance('kcp', (peers) =>
  relayedWorld(peers, timing, {
    async start(identity, directory) {
      const transport = await KcpTransport.start({
        localPeerId: identity.id,
        identityKey: identity.key,
        directory,
        bind: { address: '127.0.0.1', port: 0 },
        keepaliveIntervalMs: timing.keepaliveIntervalMs,
        deadAfterMs: timing.deadAfterMs,
        backoff: { minMs: 50, maxMs: timing.backoffMaxMs },
        highWaterMark: timing.highWaterMark,
        handshakeTimeoutMs: 2000,
        handshakeRetryMs: 250,
      });
      return { transport, port: transport.address().port };
    },
    async stop({ transport }) {
      await transport.close();
      // Its last datagrams (the CLOSEs) may still wait in the relays' sockets: let the relays read
      // and drop them while still silent, or a restart right after would let them through.
      await new Promise((resolve) => setTimeout(resolve, 50));
    },
    relay: () => UdpRelay.start(1),
    silence(relay, silent) {
      relay.blackholed = silent;
    },
  }),
);
