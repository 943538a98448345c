/**
 * Outbound calls to another agent's API during a handshake. Dials only the address it is given;
 * every call has a 2 s deadline, follows no redirect and reads at most 64 KiB (docs/decisions.md §5), so
 * a slow, redirecting or flooding remote cannot hold or bloat this agent.
 */
import http from 'node:http';
import https from 'node:https';

export const PEER_CALL_TIMEOUT_MS = 2000;
export const PEER_RESPONSE_LIMIT_BYTES = 64 * 1024;

export interface PeerResponse {
  status: number;
  body: unknown;
}

export class PeerCallError extends Error {}

export interface PeerCaller {
  call(address: string, method: 'GET' | 'POST', path: string, body?: unknown): Promise<PeerResponse>;
}

export class HttpPeerCaller implements PeerCaller {
  constructor(private readonly scheme: 'http' | 'https') {}

  call(address: string, method: 'GET' | 'POST', path: string, body?: unknown): Promise<PeerResponse> {
    const url = new URL(`${this.scheme}://${address}${path}`);
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const transport = this.scheme === 'https' ? https : http;
    return new Promise((resolve, reject) => {
      const req = transport.request(
        {
          method,
          hostname: url.hostname.replace(/^\[|\]$/g, ''),
          port: url.port,
          path: url.pathname,
          agent: false,
          headers: {
            accept: 'application/json',
            ...(payload
              ? { 'content-type': 'application/json', 'content-length': String(payload.length) }
              : {}),
          },
          // The peer's identity is proven by its Ed25519 signature over our nonce, not by a
          // certificate; TLS here only keeps the exchange private, so self-signed certs are fine.
          rejectUnauthorized: false,
        },
        (res) => {
          const chunks: Buffer[] = [];
          let size = 0;
          res.on('data', (c: Buffer) => {
            size += c.length;
            if (size > PEER_RESPONSE_LIMIT_BYTES) {
              req.destroy(new PeerCallError(`answer larger than ${PEER_RESPONSE_LIMIT_BYTES} bytes`));
              return;
            }
            chunks.push(c);
          });
          res.on('end', () => {
            clearTimeout(deadline);
            let parsed: unknown;
            try {
              parsed = JSON.parse(Buffer.concat(chunks).toString('utf8'));
            } catch {
              reject(new PeerCallError(`answer to ${method} ${path} is not JSON (status ${res.statusCode})`));
              return;
            }
            resolve({ status: res.statusCode ?? 0, body: parsed });
          });
          res.on('error', (err) => reject(new PeerCallError(err.message)));
        },
      );
      const deadline = setTimeout(
        () => req.destroy(new PeerCallError(`no answer within ${PEER_CALL_TIMEOUT_MS} ms`)),
        PEER_CALL_TIMEOUT_MS,
      );
      req.on('error', (err) => {
        clearTimeout(deadline);
        reject(err instanceof PeerCallError ? err : new PeerCallError(err.message));
      });
      req.end(payload);
    });
  }
}
