/**
 * A Server-Sent Events reader over real HTTP for tests of GET /v1/events/stream: parses the
 * stream as a browser's EventSource would (fields `id`, `event`, `data`, comments), keeps every
 * message, and says when the server ended the stream.
 */
import http from 'node:http';
import type { ApiResponse } from './api-client.js';
import { waitUntil } from './wait-until.js';

/** An event as the stream sends it (arbitrary JSON). */
type Ev = ApiResponse['body'];

export interface SseMessage {
  id: string | undefined;
  event: string;
  data: string;
  /** performance.now() when its last line arrived. */
  receivedAt: number;
}

export class SseClient {
  readonly messages: SseMessage[] = [];
  comments = 0;
  status = 0;
  headers: http.IncomingHttpHeaders = {};
  /** Resolves when the server ends the stream or the connection closes. */
  readonly ended: Promise<void>;
  private request!: http.ClientRequest;
  private pending = '';

  private constructor(url: string, headers: Record<string, string>, ready: (err?: Error) => void) {
    let end!: () => void;
    this.ended = new Promise((r) => {
      end = r;
    });
    this.request = http.get(url, { headers }, (res) => {
      this.status = res.statusCode ?? 0;
      this.headers = res.headers;
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => this.feed(chunk));
      res.on('close', end);
      ready();
    });
    this.request.on('error', (err) => {
      end();
      ready(err);
    });
  }

  /** Opens a stream; resolves once the answer's headers arrived. */
  static open(
    baseUrl: string,
    opts: { token: string; lastEventId?: string; query?: string },
  ): Promise<SseClient> {
    const headers: Record<string, string> = { authorization: `Bearer ${opts.token}` };
    if (opts.lastEventId !== undefined) headers['last-event-id'] = opts.lastEventId;
    const url = `${baseUrl}/v1/events/stream${opts.query ? `?${opts.query}` : ''}`;
    return new Promise((resolve, reject) => {
      const c: SseClient = new SseClient(url, headers, (err) => (err ? reject(err) : resolve(c)));
    });
  }

  /** The events (not resync) received, parsed. */
  get events(): Ev[] {
    return this.messages.filter((m) => m.event !== 'resync').map((m) => JSON.parse(m.data));
  }

  async waitFor(count: number, ms = 10_000): Promise<void> {
    await waitUntil(
      `${count} SSE messages`,
      () => this.messages.length >= count,
      ms,
      () => this.messages,
    );
  }

  close(): void {
    this.request.destroy();
  }

  private feed(chunk: string): void {
    this.pending += chunk;
    for (let cut = this.pending.indexOf('\n\n'); cut >= 0; cut = this.pending.indexOf('\n\n')) {
      const block = this.pending.slice(0, cut);
      this.pending = this.pending.slice(cut + 2);
      const msg: SseMessage = { id: undefined, event: 'message', data: '', receivedAt: performance.now() };
      let hasData = false;
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) {
          this.comments++;
          continue;
        }
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'id') msg.id = value;
        else if (field === 'event') msg.event = value;
        else if (field === 'data') {
          msg.data += hasData ? `\n${value}` : value;
          hasData = true;
        }
      }
      if (hasData) this.messages.push(msg);
    }
  }
}
