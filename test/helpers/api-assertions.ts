/**
 * Assertions shared by the endpoint tests: the error body shape of docs/decisions.md §3, the timestamp
 * form, and tokens narrowed to chosen scopes.
 */
import assert from 'node:assert/strict';
import { type ScopeName, scope } from '../../src/domain/scopes.js';
import type { AgentProcess } from './agent-process.js';
import type { ApiResponse } from './api-client.js';

/** ISO 8601 in UTC with milliseconds and a Z suffix (docs/decisions.md §3). */
export const ISO_MS_Z = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

export function assertTimestamp(value: unknown, what: string, nearMs?: number): void {
  assert.equal(typeof value, 'string', `${what} is a string`);
  assert.match(value as string, ISO_MS_Z, `${what} is ISO 8601 UTC with ms and Z: ${String(value)}`);
  const ms = Date.parse(value as string);
  assert.ok(Number.isFinite(ms), `${what} parses`);
  if (nearMs !== undefined) {
    assert.ok(
      Math.abs(ms - nearMs) < 60_000,
      `${what} ${String(value)} is near ${new Date(nearMs).toISOString()}`,
    );
  }
}

/** The error answer: status, `{error, code}` with human text, JSON content type. */
export function assertError(res: ApiResponse, status: number, code: string, context = ''): void {
  const where = context ? `${context}: ` : '';
  assert.equal(res.status, status, `${where}expected ${status} ${code}, got ${res.status} ${res.text}`);
  assert.match(String(res.headers['content-type']), /^application\/json/, `${where}JSON error body`);
  assert.equal(typeof res.body?.error, 'string', `${where}error text in ${res.text}`);
  assert.ok(res.body.error.length > 0, `${where}non-empty error text`);
  assert.equal(res.body.code, code, `${where}code in ${res.text}`);
  assert.deepEqual(Object.keys(res.body).sort(), ['code', 'error'], `${where}exactly {error, code}`);
  assert.doesNotMatch(res.text, /\n\s+at /, `${where}no stack trace`);
}

/** A token of the credential narrowed to the given scopes (token endpoint `scope` parameter). */
export function tokenWith(
  agent: AgentProcess,
  creds: { clientId: string; clientSecret: string },
  ...names: ScopeName[]
): Promise<string> {
  return agent.client.token(creds.clientId, creds.clientSecret, names.map((n) => scope(n)).join(' '));
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A peer as the API shows it, without the liveness fields (`reachable`, `last_seen_at`): those
 * are this agent's observation of gossip, which moves on its own between two reads.
 */
export function withoutLiveness<T extends Record<string, unknown>>(
  peer: T,
): Omit<T, 'reachable' | 'last_seen_at'> {
  const { reachable: _r, last_seen_at: _l, ...rest } = peer;
  return rest;
}
