/**
 * Carries gossip envelopes to a peer's management port: POST /internal/v1/gossip over HTTP(S)
 * with kept-alive connections (a probe every interval to every peer would otherwise cost a TCP
 * handshake each). Bounded: a timeout per request and a cap on the answer's size.
 */
import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import type { Envelope } from './gossip-envelope.js';

export const GOSSIP_PATH = '/internal/v1/gossip';
/** Full state transfers are the largest answers: a license's worth of records. */
const MAX_ANSWER_BYTES = 32 * 1024 * 1024;

export interface GossipReply {
  status: number;
  body: unknown;
  /**
   * Bytes the exchange took on its connection, HTTP headers included (on HTTPS: before
   * encryption): the request as written, the answer as read.
   */
  wireBytes?: { sent: number; received: number };
}

export interface GossipTransport {
  post(address: string, envelope: Envelope, timeoutMs: number): Promise<GossipReply>;
  close(): void;
}

export class HttpGossipTransport implements GossipTransport {
  private readonly agent: http.Agent;

  /**
   * `localAddress`: the source address of every connection (gossipSourceAddress); none: the
   * kernel picks one by route.
   */
  constructor(
    private readonly scheme: 'http' | 'https',
    private readonly localAddress?: string,
  ) {
    this.agent =
      scheme === 'https'
        ? // Agents authenticate each other by signatures, not by certificates (docs/decisions.md §5).
          new https.Agent({ keepAlive: true, maxSockets: 4, rejectUnauthorized: false })
        : new http.Agent({ keepAlive: true, maxSockets: 4 });
  }

  post(address: string, envelope: Envelope, timeoutMs: number): Promise<GossipReply> {
    const body = Buffer.from(JSON.stringify(envelope));
    const lib = this.scheme === 'https' ? https : http;
    return new Promise((resolve, reject) => {
      const req = lib.request(
        `${this.scheme}://${address}${GOSSIP_PATH}`,
        {
          method: 'POST',
          agent: this.agent,
          ...(this.localAddress ? { localAddress: this.localAddress } : {}),
          headers: { 'content-type': 'application/json', 'content-length': body.length },
          timeout: timeoutMs,
        },
        (res) => {
          const wireBytes = () =>
            socket && {
              sent: socket.bytesWritten - writtenBefore,
              received: socket.bytesRead - readBefore,
            };
          const chunks: Buffer[] = [];
          let size = 0;
          res.on('data', (c: Buffer) => {
            size += c.length;
            if (size > MAX_ANSWER_BYTES) req.destroy(new Error('answer too large'));
            else chunks.push(c);
          });
          res.on('end', () => {
            try {
              resolve({
                status: res.statusCode ?? 0,
                body: JSON.parse(Buffer.concat(chunks).toString('utf8')),
                wireBytes: wireBytes(),
              });
            } catch {
              reject(new Error(`unreadable answer (status ${res.statusCode})`));
            }
          });
          res.on('error', reject);
        },
      );
      // A kept-alive connection carries one exchange at a time: the counters' growth between its
      // assignment and the answer's end is this exchange's.
      let socket: net.Socket | undefined;
      let writtenBefore = 0;
      let readBefore = 0;
      req.on('socket', (s) => {
        socket = s;
        writtenBefore = s.bytesWritten;
        readBefore = s.bytesRead;
      });
      const timer = setTimeout(() => req.destroy(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
      req.on('close', () => clearTimeout(timer));
      req.on('error', reject);
      req.end(body);
    });
  }

  close(): void {
    this.agent.destroy();
  }
}

/**
 * The address gossip leaves from: the listen address when the agent listens on one address and
 * tells peers that same address (as memberlist binds to its bind address), so peers see gossip
 * come from the address they know, and a firewall can allow or cut an agent's gossip by it. None
 * for a wildcard listen or another advertised address (behind a NAT or a proxy), where the
 * listen address may not be routable to peers.
 */
export function gossipSourceAddress(listenHost: string, advertise: string): string | undefined {
  if (listenHost === '0.0.0.0' || listenHost === '::') return undefined;
  const host = advertise.slice(0, advertise.lastIndexOf(':')).replace(/^\[|\]$/g, '');
  return host === listenHost ? listenHost : undefined;
}
