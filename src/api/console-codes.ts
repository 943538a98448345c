/**
 * One-time sign-in codes for the web console (`mesh-agent ui`, docs/console.md): a signed-in
 * client asks for a code, and the browser that opens the link trades it once, within 60 s, for a
 * token of the same client with the same scopes. Codes live in memory only: one the agent
 * forgets at a restart is simply asked for again. Random 256-bit values, so they cannot be
 * guessed within their minute.
 */
import { randomBytes } from 'node:crypto';
import type { Clock } from '../domain/clock.js';
import type { Scope } from '../domain/scopes.js';

export const CODE_TTL_MS = 60_000;
/** Outstanding codes kept at most: a caller asking in a loop cannot grow the agent's memory. */
export const MAX_OUTSTANDING_CODES = 1000;

export interface CodeGrant {
  clientId: string;
  scopes: readonly Scope[];
}

export class ConsoleCodes {
  private readonly codes = new Map<string, CodeGrant & { expiresAtMs: number }>();

  constructor(private readonly clock: Clock) {}

  issue(grant: CodeGrant): { code: string; expiresInSeconds: number } {
    const now = this.clock.now();
    for (const [code, held] of this.codes) if (held.expiresAtMs <= now) this.codes.delete(code);
    // The oldest goes first when full: a Map iterates in insertion order.
    while (this.codes.size >= MAX_OUTSTANDING_CODES) this.codes.delete(this.codes.keys().next().value!);
    const code = randomBytes(32).toString('base64url');
    this.codes.set(code, {
      clientId: grant.clientId,
      scopes: [...grant.scopes],
      expiresAtMs: now + CODE_TTL_MS,
    });
    return { code, expiresInSeconds: CODE_TTL_MS / 1000 };
  }

  /** The grant of a code, once: a second use, or a use after its 60 s, gets nothing. */
  redeem(code: string): CodeGrant | undefined {
    const held = this.codes.get(code);
    if (!held) return undefined;
    this.codes.delete(code);
    if (held.expiresAtMs <= this.clock.now()) return undefined;
    return { clientId: held.clientId, scopes: held.scopes };
  }
}
