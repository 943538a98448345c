/**
 * Webhook endpoints as the API sees them (docs/events.md, "Webhooks"): create, list, read,
 * delete and a test delivery. Endpoints are local to this agent, like API credentials
 * (docs/decisions.md §5): they are not gossiped, and each agent delivers its own log. Making
 * and deleting one is a config event of this agent (`webhook.created`, `webhook.deleted`; never
 * the secret). Used by the API routes; the agent builds it with the dispatcher it feeds.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { type Clock, isoTime } from '../domain/clock.js';
import { ApiError, invalidRequest, notFound } from '../domain/errors.js';
import type { EventActor, EventLog, MeshEvent } from '../events/event-log.js';
import type { Store } from '../store/store.js';
import type { WebhookRecord } from '../store/webhook-table.js';
import { type AttemptOutcome, attemptDelivery } from './delivery.js';
import type { WebhookDispatcher } from './dispatcher.js';

export const MAX_URL_LENGTH = 2048;
export const MAX_TYPE_PREFIXES = 32;
/**
 * Endpoints per agent (docs/decisions.md, "Webhooks"): each has its own queue, read of the log
 * and delivery loop, so the number bounds the work and memory that webhooks take.
 */
export const MAX_WEBHOOKS = 50;
/** A type prefix: the start of `<resource>.<what>` (`peer.`, `service.created`, `service`). */
export const TYPE_PREFIX_FORMAT = /^[a-z][a-z0-9_.]{0,99}$/;

/** Webhook ids: `wh_` and 16 random bytes, base64url. */
const newWebhookId = (): string => `wh_${randomBytes(16).toString('base64url')}`;

/**
 * A signing secret as the Standard Webhooks specification writes it: `whsec_` and the base64 of
 * 32 random bytes (the specification asks for 24 to 64).
 */
export const newWebhookSecret = (): string => `whsec_${randomBytes(32).toString('base64')}`;

/** The webhook as listed: everything but the secret, and how its deliveries stand. */
export interface WebhookView {
  id: string;
  url: string;
  types: string[];
  created_at: string;
  delivery: {
    /** Events waiting for this endpoint. */
    pending: number;
    /** The log seq up to which this endpoint is done. */
    cursor: number;
    delivered: number;
    given_up: number;
    last_given_up_seq: number | null;
    last_delivered_at: string | null;
    /** When the failures now under way began; null while deliveries succeed. */
    failing_since: string | null;
    failures: number;
    last_error: string | null;
    last_error_at: string | null;
    /** When the next attempt is due while failing; null otherwise. */
    next_attempt_at: string | null;
  };
}

export interface WebhookTestResult {
  delivered: boolean;
  status: number | null;
  error: string | null;
  duration_ms: number;
}

/** Checks a receiver URL: http or https, absolute, without user info (it would be sent in clear). */
export function checkWebhookUrl(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw invalidRequest('url must be an absolute http or https URL');
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw invalidRequest(`url must use http or https, not ${parsed.protocol.replace(/:$/, '')}`);
  }
  if (parsed.username !== '' || parsed.password !== '') {
    throw invalidRequest('url must not hold a user name or password; the signature authenticates deliveries');
  }
  if (parsed.hash !== '') throw invalidRequest('url must not have a fragment');
  return url;
}

export class Webhooks {
  constructor(
    private readonly store: Store,
    private readonly events: EventLog,
    private readonly dispatcher: WebhookDispatcher,
    private readonly clock: Clock,
    private readonly userAgent: string,
  ) {}

  /** Makes an endpoint; the answer alone holds its secret. Only events recorded after it are delivered. */
  create(url: string, types: readonly string[], actor: EventActor): WebhookView & { secret: string } {
    checkWebhookUrl(url);
    const prefixes = [...new Set(types)];
    const id = newWebhookId();
    const secret = newWebhookSecret();
    const createdAt = isoTime(this.clock.now());
    this.store.transaction(() => {
      // Counted in the transaction: two creates at once cannot both take the last place.
      if (this.store.webhookTable.all().length >= MAX_WEBHOOKS) {
        throw new ApiError(
          'WEBHOOK_LIMIT_EXCEEDED',
          `this agent has ${MAX_WEBHOOKS} webhooks, the most it keeps; delete one to add another`,
        );
      }
      // Its queue starts after the last event so far: this event, and what comes after, are its.
      this.store.webhookTable.insert({
        id,
        url,
        types: prefixes,
        secret,
        createdAt,
        cursor: this.events.lastSeq(),
      });
      this.events.record({
        type: 'webhook.created',
        actor,
        resource: { kind: 'webhook', id },
        data: { before: null, after: { url, types: prefixes, created_at: createdAt } },
      });
    });
    this.dispatcher.added({ id, types: prefixes });
    return { ...this.get(id), secret };
  }

  list(): WebhookView[] {
    return this.store.webhookTable.all().map((w) => this.view(w));
  }

  get(id: string): WebhookView {
    return this.view(this.record(id));
  }

  delete(id: string, actor: EventActor): void {
    const w = this.record(id);
    this.store.transaction(() => {
      this.store.webhookTable.delete(id);
      this.events.record({
        type: 'webhook.deleted',
        actor,
        resource: { kind: 'webhook', id },
        data: { before: { url: w.url, types: w.types, created_at: w.createdAt }, after: null },
      });
    });
    this.dispatcher.removed(id);
  }

  /**
   * Sends one `webhook.test` event to the endpoint now, signed as deliveries are, outside its
   * queue: it is not in the log (its seq is 0), and it neither waits for nor delays the queue.
   */
  async test(id: string, actor: EventActor): Promise<WebhookTestResult> {
    const w = this.record(id);
    const event: MeshEvent = {
      seq: 0,
      id: randomUUID(),
      type: 'webhook.test',
      time: isoTime(this.clock.now()),
      actor,
      resource: { kind: 'webhook', id },
      data: {},
    };
    const o: AttemptOutcome = await attemptDelivery(w, event.id, JSON.stringify(event), {
      agents: this.dispatcher.agents,
      userAgent: this.userAgent,
    });
    return { delivered: o.delivered, status: o.status, error: o.error, duration_ms: o.ms };
  }

  /** Each endpoint's pending events, for the metrics. */
  pending(): { id: string; count: number }[] {
    return this.list().map((w) => ({ id: w.id, count: w.delivery.pending }));
  }

  private record(id: string): WebhookRecord {
    const w = this.store.webhookTable.get(id);
    if (!w) throw notFound(`no webhook with id ${id}`);
    return w;
  }

  private view(row: WebhookRecord): WebhookView {
    // The worker's state is newer than the row by up to a second of deliveries.
    const w = this.dispatcher.progress(row.id) ?? row;
    const failing = w.failingSince !== null;
    return {
      id: w.id,
      url: w.url,
      types: w.types,
      created_at: w.createdAt,
      delivery: {
        pending: this.store.webhookTable.queuedCount(w.cursor, w.types),
        cursor: w.cursor,
        delivered: w.delivered,
        given_up: w.givenUp,
        last_given_up_seq: w.lastGivenUpSeq,
        last_delivered_at: w.lastDeliveredAt,
        failing_since: w.failingSince,
        failures: w.failures,
        last_error: w.lastError,
        last_error_at: w.lastErrorAt,
        next_attempt_at: failing ? isoTime(w.nextAttemptAt) : null,
      },
    };
  }
}
