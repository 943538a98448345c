/**
 * bench/soak/heap-snapshot: a small reader of V8 .heapsnapshot files (v8.writeHeapSnapshot) for
 * the soak bench: objects counted and their self sizes summed per constructor, grouped as the
 * Chrome DevTools "Summary" view groups them (objects and native objects by name, the rest by
 * kind: "(closure)", "(string)", "(array)", "(compiled code)", "(system)", ...), and the
 * difference of two such summaries. The file is read whole, its `nodes` array scanned as digits
 * (a full JSON.parse of a snapshot can pass V8's string limit), its `strings` array parsed as JSON;
 * edges are not read, so these are self sizes, not retained sizes.
 * `node dist/bench/soak/heap-snapshot.js A.heapsnapshot B.heapsnapshot` prints the top 20
 * constructors by count difference (either way) from A to B.
 */
import { readFileSync } from 'node:fs';

export interface ConstructorStats {
  count: number;
  selfSize: number;
}

export type HeapSummary = Map<string, ConstructorStats>;

interface SnapshotMeta {
  snapshot: {
    meta: { node_fields: string[]; node_types: [string[], ...unknown[]] };
    node_count: number;
  };
}

const KIND_GROUP: Record<string, string> = {
  hidden: '(system)',
  array: '(array)',
  string: '(string)',
  'concatenated string': '(string)',
  'sliced string': '(string)',
  code: '(compiled code)',
  closure: '(closure)',
  regexp: '(regexp)',
  number: '(number)',
  'heap number': '(number)',
  symbol: '(symbol)',
  bigint: '(bigint)',
  'object shape': '(object shape)',
};

/** Counts and self sizes per constructor of one snapshot file. */
export function summarizeHeapSnapshot(file: string): HeapSummary {
  const buf = readFileSync(file);
  const nodesKey = Buffer.from('"nodes":[');
  const nodesAt = buf.indexOf(nodesKey);
  if (nodesAt < 0) throw new Error(`${file}: no "nodes" array`);
  const head = buf.subarray(0, nodesAt).toString('utf8').trim().replace(/,$/, '');
  const meta = (JSON.parse(`${head}}`) as SnapshotMeta).snapshot;
  const fields = meta.meta.node_fields;
  const kinds = meta.meta.node_types[0];
  const width = fields.length;
  const [typeAt, nameAt, sizeAt] = ['type', 'name', 'self_size'].map((f) => fields.indexOf(f));
  if (typeAt! < 0 || nameAt! < 0 || sizeAt! < 0) throw new Error(`${file}: unexpected node fields ${fields}`);

  // The nodes array: non-negative integers separated by commas and newlines, up to its ']'.
  const nodes = new Float64Array(meta.node_count * width);
  let n = 0;
  let value = 0;
  let inNumber = false;
  let i = nodesAt + nodesKey.length;
  for (; i < buf.length; i++) {
    const c = buf[i]!;
    if (c >= 48 && c <= 57) {
      value = value * 10 + (c - 48);
      inNumber = true;
    } else {
      if (inNumber) {
        if (n < nodes.length) nodes[n] = value;
        n++;
        value = 0;
        inNumber = false;
      }
      if (c === 93) break; // ']'
    }
  }
  if (n !== nodes.length) throw new Error(`${file}: ${n} node values, expected ${nodes.length}`);

  const stringsKey = Buffer.from('"strings":[');
  const stringsAt = buf.lastIndexOf(stringsKey);
  const stringsEnd = buf.lastIndexOf(']');
  if (stringsAt < 0 || stringsEnd < stringsAt) throw new Error(`${file}: no "strings" array`);
  const strings = JSON.parse(
    buf.subarray(stringsAt + stringsKey.length - 1, stringsEnd + 1).toString('utf8'),
  ) as string[];

  const out: HeapSummary = new Map();
  for (let k = 0; k < nodes.length; k += width) {
    const kind = kinds[nodes[k + typeAt!]!] ?? 'unknown';
    if (kind === 'synthetic') continue;
    const key =
      kind === 'object' || kind === 'native'
        ? (strings[nodes[k + nameAt!]!] ?? '(unnamed)')
        : (KIND_GROUP[kind] ?? `(${kind})`);
    const s = out.get(key) ?? { count: 0, selfSize: 0 };
    s.count++;
    s.selfSize += nodes[k + sizeAt!]!;
    out.set(key, s);
  }
  return out;
}

export interface ConstructorDiff {
  name: string;
  countBefore: number;
  countAfter: number;
  countDiff: number;
  sizeDiff: number;
}

/** Every constructor whose count or size changed, largest count change (either way) first. */
export function diffHeapSummaries(before: HeapSummary, after: HeapSummary): ConstructorDiff[] {
  const names = new Set([...before.keys(), ...after.keys()]);
  const rows = [...names].map((name) => {
    const a = before.get(name) ?? { count: 0, selfSize: 0 };
    const b = after.get(name) ?? { count: 0, selfSize: 0 };
    return {
      name,
      countBefore: a.count,
      countAfter: b.count,
      countDiff: b.count - a.count,
      sizeDiff: b.selfSize - a.selfSize,
    };
  });
  return rows
    .filter((r) => r.countDiff !== 0 || r.sizeDiff !== 0)
    .sort(
      (x, y) =>
        Math.abs(y.countDiff) - Math.abs(x.countDiff) ||
        Math.abs(y.sizeDiff) - Math.abs(x.sizeDiff) ||
        y.countDiff - x.countDiff,
    );
}

/** The top rows of a diff as a Markdown table. */
export function diffTable(rows: ConstructorDiff[], top = 20): string {
  const cut = (s: string) => (s.length > 60 ? `${s.slice(0, 57)}...` : s).replace(/\|/g, '\\|');
  const lines = [
    '| constructor | count start | count end | Δ count | Δ self size KB |',
    '|---|---|---|---|---|',
    ...rows
      .slice(0, top)
      .map(
        (r) =>
          `| ${cut(r.name)} | ${r.countBefore} | ${r.countAfter} | ${r.countDiff >= 0 ? '+' : ''}${r.countDiff} | ${r.sizeDiff >= 0 ? '+' : ''}${(r.sizeDiff / 1024).toFixed(1)} |`,
      ),
  ];
  return lines.join('\n');
}

if (process.argv[1]?.endsWith('heap-snapshot.js') && process.argv.length === 4) {
  const rows = diffHeapSummaries(
    summarizeHeapSnapshot(process.argv[2]!),
    summarizeHeapSnapshot(process.argv[3]!),
  );
  process.stdout.write(`${diffTable(rows)}\n`);
}
