/**
 * The tcp transport's entry through the agent's management API port (src/transports/tcp.ts
 * only): the dialer asks `GET /internal/v1/tunnel` with `Upgrade: mesh-tunnel/1`, the API server
 * answers 101 and both run TLS 1.3 over the socket. Nothing here authenticates anyone: the TLS
 * inside does. The dialer reads the answer's head bounded in size and time, as the peer (or
 * whatever answers on its address) is not trusted yet.
 */
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';

export const TUNNEL_PATH = '/internal/v1/tunnel';
export const TUNNEL_PROTOCOL = 'mesh-tunnel/1';
export const MAX_RESPONSE_HEAD_BYTES = 4096;

export const UPGRADE_RESPONSE = `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${TUNNEL_PROTOCOL}\r\n\r\n`;

/** Whether a request is for the tunnel at all (its path), valid or not. */
export function isTunnelPath(req: IncomingMessage): boolean {
  return (req.url ?? '').split('?')[0] === TUNNEL_PATH;
}

/** Whether a request is exactly the tunnel's upgrade: GET, the path, Connection: upgrade, our protocol. */
export function isTunnelUpgrade(req: IncomingMessage): boolean {
  if (req.method !== 'GET' || req.url !== TUNNEL_PATH) return false;
  const upgrade = req.headers.upgrade;
  if (typeof upgrade !== 'string' || upgrade.trim().toLowerCase() !== TUNNEL_PROTOCOL) return false;
  const connection = req.headers.connection;
  if (typeof connection !== 'string') return false;
  return connection
    .split(',')
    .map((t) => t.trim().toLowerCase())
    .includes('upgrade');
}

export function upgradeRequest(hostHeader: string): string {
  return (
    `GET ${TUNNEL_PATH} HTTP/1.1\r\nHost: ${hostHeader}\r\n` +
    `Connection: Upgrade\r\nUpgrade: ${TUNNEL_PROTOCOL}\r\n\r\n`
  );
}

/**
 * Writes the upgrade request and reads the answer's head: resolves once it is a 101 switching
 * to our protocol, leaving any bytes after the head unread on the (paused) socket; rejects on
 * anything else, on more than 4 KiB of head, on timeout or when the socket ends.
 */
export function requestUpgrade(socket: Duplex, hostHeader: string, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    let head: Buffer = Buffer.alloc(0);
    const done = (error?: Error) => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('end', onEnd);
      socket.off('close', onEnd);
      socket.off('error', onError);
      if (error) reject(error);
      else resolve();
    };
    const onData = (chunk: Buffer) => {
      head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) {
        if (head.length > MAX_RESPONSE_HEAD_BYTES) done(new UpgradeRefused('answer head over 4 KiB'));
        return;
      }
      if (end + 4 > MAX_RESPONSE_HEAD_BYTES) return done(new UpgradeRefused('answer head over 4 KiB'));
      // Stop the flow before handing the socket on, and give back what follows the head.
      socket.pause();
      const rest = head.subarray(end + 4);
      if (rest.length > 0) socket.unshift(rest);
      const problem = checkResponseHead(head.subarray(0, end).toString('latin1'));
      done(problem ? new UpgradeRefused(problem) : undefined);
    };
    const onEnd = () => done(new Error('connection closed before the upgrade answer'));
    const onError = (error: Error) => done(error);
    const timer = setTimeout(() => done(new UpgradeRefused('no upgrade answer in time')), timeoutMs);
    socket.on('data', onData);
    socket.on('end', onEnd);
    socket.on('close', onEnd);
    socket.on('error', onError);
    socket.write(upgradeRequest(hostHeader));
  });
}

/** The peer answered, but not with our upgrade. */
export class UpgradeRefused extends Error {}

function checkResponseHead(head: string): string | undefined {
  const [status, ...lines] = head.split('\r\n');
  if (!/^HTTP\/1\.1 101(?: |$)/.test(status ?? ''))
    return `answered ${JSON.stringify((status ?? '').slice(0, 80))}`;
  let upgrade: string | undefined;
  for (const line of lines) {
    const colon = line.indexOf(':');
    if (colon > 0 && line.slice(0, colon).trim().toLowerCase() === 'upgrade')
      upgrade = line
        .slice(colon + 1)
        .trim()
        .toLowerCase();
  }
  return upgrade === TUNNEL_PROTOCOL ? undefined : `upgraded to ${JSON.stringify(upgrade ?? '')}`;
}
