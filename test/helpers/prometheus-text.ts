/**
 * The Prometheus text exposition format read by Prometheus's own tools, not by a parser written
 * here (tests only): parseExposition runs the official Python client's parser
 * (prometheus_client.parser.text_string_to_metric_families, Debian's python3-prometheus-client)
 * and promtoolCheckMetrics runs `promtool check metrics` (Debian's prometheus), the Go parser and
 * linter Prometheus ships. Both read the exposition on stdin. A missing tool throws with the
 * apt-get command that installs it: the tests that use this fail, they never skip.
 */
import { spawnSync } from 'node:child_process';

export const PYTHON_APT = 'apt-get install -y --no-install-recommends python3-prometheus-client';
export const PROMTOOL_APT = 'apt-get install -y --no-install-recommends prometheus';

/** Debian's interpreter, not whatever `python3` is first on PATH (a pyenv one lacks the package). */
const PYTHON = '/usr/bin/python3';

export interface Sample {
  name: string;
  labels: Record<string, string>;
  /** NaN and ±Infinity as the exposition wrote them (`NaN`, `+Inf`, `-Inf`). */
  value: number;
}

export interface Family {
  /** The name of the exposition's `# TYPE` line (a counter keeps its `_total`). */
  name: string;
  /** `unknown` for a sample no `# TYPE` line declared (the Python client's name for untyped). */
  type: string;
  /** '' when there was no `# HELP` line. */
  help: string;
  samples: Sample[];
}

// The parser is lax by its own account ("successful parsing does not imply that the parsed text
// meets the specification"): it does not refuse a series twice, a family split in two (it yields
// the family twice, which the caller can see) or a broken histogram; promtool's parser and the
// caller's checks cover those. It also renames counters the OpenMetrics way (family without
// `_total`, and `_total` added to the samples of a counter declared without it); the declared
// names are put back so that a counter named without `_total` stays visible. Values are sent as
// strings when JSON has no number for them.
const SCRIPT = `
import json, math, sys
from prometheus_client.parser import text_string_to_metric_families

def number(v):
    if math.isnan(v):
        return 'NaN'
    if math.isinf(v):
        return '+Inf' if v > 0 else '-Inf'
    return v

text = sys.stdin.read()
declared = {}
for line in text.split('\\n'):
    parts = line.split(None, 3)
    if parts[:2] == ['#', 'TYPE'] and len(parts) == 4:
        declared[parts[2]] = parts[3]
out = []
try:
    for f in text_string_to_metric_families(text):
        name = f.name
        samples = [[s.name, s.labels, number(s.value)] for s in f.samples]
        if f.type == 'counter':
            if declared.get(name + '_total') == 'counter':
                name += '_total'
            else:
                samples = [[s[0][:-len('_total')], s[1], s[2]] for s in samples]
        out.append({'name': name, 'type': f.type, 'help': f.documentation, 'samples': samples})
except Exception as e:
    after = out[-1]['name'] if out else 'the start'
    sys.stderr.write('%s: %s (after family %s)\\n' % (type(e).__name__, e, after))
    sys.exit(1)
json.dump(out, sys.stdout, allow_nan=False)
`;

type JsonValue = number | 'NaN' | '+Inf' | '-Inf';

function fromJson(v: JsonValue): number {
  if (v === 'NaN') return Number.NaN;
  if (v === '+Inf') return Number.POSITIVE_INFINITY;
  if (v === '-Inf') return Number.NEGATIVE_INFINITY;
  return v;
}

function run(command: string, args: string[], input: string, apt: string) {
  const r = spawnSync(command, args, { input, encoding: 'utf8', timeout: 20_000 });
  if ((r.error as NodeJS.ErrnoException | undefined)?.code === 'ENOENT') {
    throw new Error(`${command} is not installed: ${apt}`);
  }
  if (r.error) throw new Error(`${command} ${args.join(' ')}: ${r.error.message}`);
  return r;
}

/**
 * The families of a text exposition as the Python client's parser reads them, in the order the
 * exposition gives them (a family split in two comes twice). Throws with Python's message when it
 * cannot parse the text, and with the apt-get command when the parser is not installed.
 */
export function parseExposition(text: string): Family[] {
  const r = run(PYTHON, ['-c', SCRIPT], text, PYTHON_APT);
  if (r.status !== 0) {
    if (/No module named 'prometheus_client'/.test(r.stderr)) {
      throw new Error(`the Python client prometheus_client is not installed: ${PYTHON_APT}`);
    }
    throw new Error(`prometheus_client refused the exposition: ${r.stderr.trim()}`);
  }
  const raw = JSON.parse(r.stdout) as {
    name: string;
    type: string;
    help: string;
    samples: [string, Record<string, string>, JsonValue][];
  }[];
  return raw.map((f) => ({
    ...f,
    samples: f.samples.map(([name, labels, value]) => ({ name, labels, value: fromJson(value) })),
  }));
}

export interface PromtoolResult {
  /** promtool's exit status: 0 clean, 3 lint problems only, 1 a text it could not parse. */
  status: number;
  /** Every non-empty line promtool printed (it prints its findings on stderr). */
  problems: string[];
}

/** `promtool check metrics` on the exposition; throws with the apt-get command when missing. */
export function promtoolCheckMetrics(text: string): PromtoolResult {
  const r = run('promtool', ['check', 'metrics'], text, PROMTOOL_APT);
  if (r.status === null) throw new Error(`promtool check metrics died of ${r.signal}`);
  const problems = `${r.stdout}\n${r.stderr}`.split('\n').filter((l) => l.trim() !== '');
  return { status: r.status, problems };
}
