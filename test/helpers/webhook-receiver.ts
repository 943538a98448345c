/**
 * A real HTTP webhook receiver for tests, on a loopback port: it records every request with its
 * headers and body and checks each signature with the `standardwebhooks` library (the
 * specification's reference code), as an operator's receiver would. It can answer, hang (never
 * answer), be closed (connection refused) and opened again on the same port.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';

export interface ReceivedDelivery {
  headers: http.IncomingHttpHeaders;
  body: string;
  /** The event the signature check returned; undefined when the check failed. */
  event: Record<string, unknown> | undefined;
  verifyError: string | undefined;
  at: number;
}

export type ReceiverMode = { status: number } | 'hang';

/** The Standard Webhooks timestamp tolerance, the library's. */
const TOLERANCE_S = 5 * 60;

export class WebhookReceiver {
  readonly received: ReceivedDelivery[] = [];
  /** Requests whose answer is still held back ('hang'). */
  readonly hanging = new Set<http.ServerResponse>();
  secret: string | undefined;
  mode: ReceiverMode = { status: 204 };
  /**
   * How far this receiver's clock is ahead of the test's. An operator's receiver keeps time with
   * the agent (both on NTP): a test that moves an agent's clock (faketime.ts) moves this one too,
   * or every timestamp would be refused as too new.
   */
  clockOffsetMs = 0;
  private server: http.Server | undefined;
  private boundPort = 0;

  static async open(): Promise<WebhookReceiver> {
    const r = new WebhookReceiver();
    await r.listen(0);
    return r;
  }

  get port(): number {
    return this.boundPort;
  }

  get url(): string {
    return `http://127.0.0.1:${this.boundPort}/hook`;
  }

  /** Events whose signature verified, in the order they arrived. */
  get events(): Record<string, unknown>[] {
    return this.received.filter((d) => d.event !== undefined).map((d) => d.event!);
  }

  /** The library's check; on a moved clock, the same check against this receiver's time. */
  private verify(secret: string, body: string, headers: http.IncomingHttpHeaders): Record<string, unknown> {
    const hook = new Webhook(secret);
    if (this.clockOffsetMs === 0)
      return hook.verify(body, headers as Record<string, string>) as Record<string, unknown>;
    const id = String(headers['webhook-id']);
    const seconds = Number(headers['webhook-timestamp']);
    const now = (Date.now() + this.clockOffsetMs) / 1000;
    if (!Number.isInteger(seconds) || Math.abs(now - seconds) > TOLERANCE_S) {
      throw new Error(`timestamp ${headers['webhook-timestamp']} not within ${TOLERANCE_S} s`);
    }
    const signatures = String(headers['webhook-signature']).split(' ');
    if (!signatures.includes(hook.sign(id, new Date(seconds * 1000), body)))
      throw new Error('no matching signature');
    return JSON.parse(body) as Record<string, unknown>;
  }

  private listen(port: number): Promise<void> {
    const server = http.createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks).toString();
        let event: Record<string, unknown> | undefined;
        let verifyError: string | undefined;
        try {
          if (!this.secret) throw new Error('the test gave the receiver no secret');
          event = this.verify(this.secret, body, req.headers);
        } catch (err) {
          verifyError = (err as Error).message;
        }
        this.received.push({ headers: req.headers, body, event, verifyError, at: Date.now() });
        if (this.mode === 'hang') {
          this.hanging.add(res);
          res.on('close', () => this.hanging.delete(res));
          return;
        }
        res.writeHead(this.mode.status).end();
      });
    });
    this.server = server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => {
        this.boundPort = (server.address() as AddressInfo).port;
        resolve();
      });
    });
  }

  /** Stops listening and drops every connection: the agent's next attempt is refused. */
  async close(): Promise<void> {
    const server = this.server;
    if (!server) return;
    this.server = undefined;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** Listens again on the same port. */
  reopen(): Promise<void> {
    return this.listen(this.boundPort);
  }
}
