/**
 * Scope values of the API document and the rules between them (docs/decisions.md §4).
 * Pure: no I/O.
 */

export const SCOPE_PREFIX = 'urn:vendor:service:';

export const SCOPE_NAMES = [
  'admin',
  'peers.read',
  'peers.write',
  'services.read',
  'services.write',
  'credentials.read',
  'credentials.write',
  // Extension (docs/events.md): reads the event log and its stream.
  'events.read',
] as const;

export type ScopeName = (typeof SCOPE_NAMES)[number];
export type Scope = `${typeof SCOPE_PREFIX}${ScopeName}`;

export const ALL_SCOPES: readonly Scope[] = SCOPE_NAMES.map((n) => `${SCOPE_PREFIX}${n}` as Scope);
export const ADMIN: Scope = `${SCOPE_PREFIX}admin`;

export const scope = (name: ScopeName): Scope => `${SCOPE_PREFIX}${name}`;

export function isScope(value: unknown): value is Scope {
  return typeof value === 'string' && (ALL_SCOPES as readonly string[]).includes(value);
}

/** True when a holder of `held` may do what `required` guards. Only admin implies another scope. */
export function grants(held: readonly Scope[], required: Scope): boolean {
  return held.includes(ADMIN) || held.includes(required);
}

/** True when every scope of `wanted` is granted by `held`. */
export function grantsAll(held: readonly Scope[], wanted: readonly Scope[]): boolean {
  return wanted.every((s) => grants(held, s));
}

/** Empty or absent scopes mean admin (API document, Authentication 4). Duplicates are folded. */
export function normalizeScopes(requested: readonly Scope[] | undefined): Scope[] {
  if (!requested || requested.length === 0) return [ADMIN];
  return [...new Set(requested)];
}

/** Parses an OAuth `scope` parameter (space-separated URNs); undefined when any value is unknown. */
export function parseScopeParam(param: string): Scope[] | undefined {
  const values = param.split(' ').filter((s) => s.length > 0);
  if (values.length === 0 || !values.every(isScope)) return undefined;
  return [...new Set(values as Scope[])];
}
