/**
 * API credentials (`/v1/credentials`): create with scopes no wider than the caller's own,
 * list without secrets, revoke (never the caller's own). Local to the agent (docs/decisions.md §5).
 */
import { type Clock, isoTime } from '../domain/clock.js';
import { ApiError, forbidden, notFound } from '../domain/errors.js';
import { newClientId, newClientSecret } from '../domain/ids.js';
import { grantsAll, normalizeScopes, type Scope } from '../domain/scopes.js';
import type { EventLog } from '../events/event-log.js';
import type { Store } from '../store/store.js';
import type { SecretHasher } from './secret-hash.js';

export interface Caller {
  clientId: string;
  scopes: readonly Scope[];
}

export class Credentials {
  constructor(
    private readonly store: Store,
    private readonly hasher: SecretHasher,
    private readonly clock: Clock,
    /** Credentials are local (docs/decisions.md §5): their events are this agent's alone. */
    private readonly events: EventLog,
  ) {}

  list() {
    return this.store.credentials().map((c) => ({
      client_id: c.clientId,
      scopes: c.scopes,
      license_id: c.licenseId,
      created_at: c.createdAt,
      last_used_at: c.lastUsedAt,
    }));
  }

  create(caller: Caller, requested: readonly Scope[] | undefined, licenseId: string) {
    const scopes = normalizeScopes(requested);
    if (!grantsAll(caller.scopes, scopes)) {
      throw forbidden('a credential cannot be given scopes that the caller does not hold');
    }
    const clientId = newClientId();
    const clientSecret = newClientSecret();
    const createdAt = isoTime(this.clock.now());
    this.store.transaction(() => {
      this.store.insertCredential({
        clientId,
        secretHash: this.hasher.hash(clientSecret),
        scopes,
        licenseId,
        createdAt,
        lastUsedAt: null,
      });
      // Never the secret nor its hash: what it is for and since when.
      this.events.record({
        type: 'credential.created',
        actor: this.events.actorFor(caller.clientId),
        resource: { kind: 'credential', id: clientId },
        data: {
          before: null,
          after: { client_id: clientId, scopes, license_id: licenseId, created_at: createdAt },
        },
      });
    });
    return { client_id: clientId, client_secret: clientSecret, scopes, created_at: createdAt };
  }

  revoke(caller: Caller, clientId: string): void {
    const revoked = this.store.credential(clientId);
    if (!revoked) throw notFound(`no credential with client_id ${clientId}`);
    if (clientId === caller.clientId) {
      throw new ApiError(
        'CANNOT_REVOKE_CURRENT',
        'this is the credential of the calling token; revoke it with another',
      );
    }
    this.store.transaction(() => {
      this.store.deleteCredential(clientId);
      this.events.record({
        type: 'credential.revoked',
        actor: this.events.actorFor(caller.clientId),
        resource: { kind: 'credential', id: clientId },
        data: {
          before: {
            client_id: clientId,
            scopes: revoked.scopes,
            license_id: revoked.licenseId,
            created_at: revoked.createdAt,
          },
          after: null,
        },
      });
    });
  }
}
