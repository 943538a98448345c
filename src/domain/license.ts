/**
 * The License object of the API document and the bytes its signature covers (docs/decisions.md §2):
 * the RFC 8785 (JCS) canonical JSON of the object without its `signature` field. Pure.
 */
import canonicalize from 'canonicalize';

export interface License {
  customer_id: string;
  license_id: string;
  issued_at: string;
  expires_at: string;
  max_nodes: number;
  max_services: number;
  signature: string;
}

/**
 * The signed bytes. Every field present is covered, including ones this version does not know,
 * so adding a field to a signed license breaks its signature.
 */
export function licenseSigningInput(license: Readonly<Record<string, unknown>>): Buffer {
  const { signature: _omitted, ...rest } = license;
  const text = canonicalize(rest);
  if (text === undefined) throw new Error('license is not serializable');
  return Buffer.from(text, 'utf8');
}

/** ISO 8601 date-time with a zone, as RFC 3339 writes it. */
const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})$/i;

export function parseTimestamp(value: string): number | undefined {
  if (!RFC3339.test(value)) return undefined;
  const ms = Date.parse(value);
  return Number.isFinite(ms) ? ms : undefined;
}
