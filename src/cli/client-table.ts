/**
 * Plain-text tables for the `mesh-agent` client commands: aligned columns with a header row,
 * and key/value blocks for single objects. No dependency: padding by string length (the API's
 * values are ASCII identifiers, addresses and timestamps). Pure; used by client-commands.ts.
 */

/** How one value is shown in a cell: null and absent as '-', arrays comma-joined. */
export function cell(value: unknown): string {
  if (value === null || value === undefined || value === '') return '-';
  if (Array.isArray(value)) return value.length === 0 ? '-' : value.map(cell).join(',');
  if (typeof value === 'object') return JSON.stringify(value);
  return String(value).replace(/[\r\n\t]/g, ' ');
}

/** Columns separated by two spaces, the last one unpadded; trailing spaces trimmed. */
export function renderTable(headers: string[], rows: unknown[][]): string {
  const cells = rows.map((r) => r.map(cell));
  const widths = headers.map((h, i) => Math.max(h.length, ...cells.map((r) => (r[i] ?? '').length)));
  const line = (r: string[]) =>
    r
      .map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd();
  return [line(headers), ...cells.map(line)].join('\n');
}

/** One object as `key  value` lines, keys aligned; keys listed in `keys` order when given. */
export function renderObject(obj: Record<string, unknown>, keys: string[] = Object.keys(obj)): string {
  const present = keys.filter((k) => k in obj);
  const width = Math.max(0, ...present.map((k) => k.length));
  return present.map((k) => `${k.padEnd(width)}  ${cell(obj[k])}`).join('\n');
}

/** Bytes in a short human form (1024 steps): 0 B, 512 B, 1.5 KiB, 3.2 MiB. */
export function bytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${v} B` : `${v.toFixed(1)} ${units[u]}`;
}
