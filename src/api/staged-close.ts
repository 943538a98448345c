/**
 * Closing a connection in stages (RFC 9112 §9.6), for answers sent before the request body was
 * read, such as 413. Closing at once while the client is still sending leaves its bytes unread
 * in our receive buffer; the kernel then answers with a reset, and a reset makes the client's
 * kernel drop the answer it has not read yet: the client sees EPIPE or ECONNRESET, never the 413.
 * So after the answer the write side is closed (FIN) and the rest of the body is read and
 * discarded until it ends, the client closes, or the linger time runs out.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';

/** How long a client may go on sending a refused body after the answer; nginx's lingering_timeout. */
export const LINGER_MS = 5_000;

export function closeInStages(
  request: IncomingMessage,
  response: ServerResponse,
  lingerMs = LINGER_MS,
): void {
  const socket = request.socket;
  // Node's own 'finish' listener runs first: it ends the write side, dumps the unread body, and
  // schedules socket.destroy() for when the FIN is out. That destroy is what must wait.
  response.once('finish', () => {
    if (request.complete || socket.destroyed) return;
    socket.removeListener('finish', socket.destroy);
    const close = () => {
      clearTimeout(timer);
      socket.destroy();
    };
    const timer = setTimeout(close, lingerMs);
    timer.unref();
    request.once('end', close);
    socket.once('end', close);
    socket.once('close', () => clearTimeout(timer));
  });
}
