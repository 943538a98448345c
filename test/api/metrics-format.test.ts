/**
 * /metrics against the Prometheus text exposition format 0.0.4: every scrape is
 * read by the official Python client's parser and linted by `promtool check metrics`
 * (test/helpers/prometheus-text.ts); on the families they return, the checks neither tool makes
 * (one family per name so contiguous, typed, no series twice, counters non-negative, histograms
 * cumulative with a +Inf bucket equal to _count) and the naming conventions; then the counters
 * move when traffic moves: HTTP requests by route and status, gossip messages and bytes, gossip
 * convergence and the license usage gauges.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { eventually, expectStatus, post, startCluster, stopAll } from '../helpers/cluster.js';
import { makeVendor } from '../helpers/licenses.js';
import type { Node } from '../helpers/nodes.js';
import {
  type Family,
  parseExposition,
  promtoolCheckMetrics,
  type Sample,
} from '../helpers/prometheus-text.js';

// prom-client's default Node.js metrics name three gauges *_total (active handles, requests,
// resources): kept as prom-client names them, the agent's own metrics may not.
const DEFAULT_GAUGES_TOTAL = new Set([
  'mesh_nodejs_active_handles_total',
  'mesh_nodejs_active_requests_total',
  'mesh_nodejs_active_resources_total',
]);
// promtool's finding on exactly those three names, and no other, is let through: they are
// prom-client's default metrics, which the agent cannot rename.
const ALLOWED_PROMTOOL_FINDINGS = new Set(
  [...DEFAULT_GAUGES_TOTAL].map((name) => `${name} non-counter metrics should not have "_total" suffix`),
);

/** promtool parses the exposition and finds nothing to say but the allowed findings. */
function assertPromtoolClean(text: string): void {
  const { status, problems } = promtoolCheckMetrics(text);
  const left = problems.filter((p) => !ALLOWED_PROMTOOL_FINDINGS.has(p));
  assert.deepEqual(left, [], `promtool check metrics (exit ${status}):\n${problems.join('\n')}`);
  // 3 is promtool's exit status for lint findings only; a text it cannot parse exits 1.
  assert.equal(status, problems.length === 0 ? 0 : 3, `promtool's exit status with ${problems.join('; ')}`);
}

const seriesKey = (s: Sample) =>
  `${s.name}{${Object.entries(s.labels)
    .sort(([x], [y]) => (x < y ? -1 : 1))
    .map(([k, v]) => `${k}=${JSON.stringify(v)}`)
    .join(',')}}`;

/**
 * What the Python parser lets through and promtool does not check either (both accept a series
 * twice, a family split in two and a broken histogram): the parser yields a split family twice,
 * so one family per name means every family is contiguous. Throws (assert) on the first violation.
 */
function checkFamilies(list: readonly Family[]): Map<string, Family> {
  const families = new Map<string, Family>();
  const seen = new Set<string>();
  for (const f of list) {
    assert.ok(!families.has(f.name), `family ${f.name} twice: not contiguous`);
    families.set(f.name, f);
    assert.notEqual(f.type, 'unknown', `${f.name}: a sample without a # TYPE (or HELP without TYPE)`);
    for (const s of f.samples) {
      const key = seriesKey(s);
      assert.ok(!seen.has(key), `series twice: ${key}`);
      seen.add(key);
      if (f.type === 'counter' || s.name.endsWith('_count') || s.name.endsWith('_bucket')) {
        assert.ok(s.value >= 0, `negative counter ${key} ${s.value}`);
      }
    }
    if (f.type === 'histogram') checkHistogram(f);
  }
  return families;
}

/** Buckets per label set: cumulative, ending in le="+Inf" equal to _count, with a _sum. */
function checkHistogram(f: Family): void {
  const groups = new Map<string, { buckets: [number, number][]; sum?: number; count?: number }>();
  for (const s of f.samples) {
    const { le, ...rest } = s.labels;
    const key = JSON.stringify(Object.entries(rest).sort());
    const g = groups.get(key) ?? { buckets: [] };
    groups.set(key, g);
    if (s.name === `${f.name}_bucket`) {
      assert.ok(le !== undefined, `${f.name}_bucket without le`);
      // The parser leaves label values as text; le is a float as Go's ParseFloat reads it.
      const bound = le === '+Inf' ? Number.POSITIVE_INFINITY : Number(le);
      assert.ok(!Number.isNaN(bound), `${f.name}_bucket le=${JSON.stringify(le)}`);
      g.buckets.push([bound, s.value]);
    } else {
      assert.equal(le, undefined, `le on ${s.name}`);
      if (s.name === `${f.name}_sum`) g.sum = s.value;
      else g.count = s.value;
    }
  }
  for (const [key, g] of groups) {
    const what = `${f.name} ${key}`;
    assert.ok(g.sum !== undefined && g.count !== undefined, `${what}: _sum and _count`);
    g.buckets.sort((x, y) => x[0] - y[0]);
    const last = g.buckets.at(-1);
    assert.ok(last && last[0] === Number.POSITIVE_INFINITY, `${what}: an le="+Inf" bucket`);
    assert.equal(last[1], g.count, `${what}: +Inf bucket equals _count`);
    for (let i = 1; i < g.buckets.length; i++) {
      assert.ok(g.buckets[i]![1] >= g.buckets[i - 1]![1], `${what}: buckets are cumulative`);
    }
  }
}

/** Both tools and the checks above on one exposition: the families by name. */
function readExposition(text: string): Map<string, Family> {
  const families = checkFamilies(parseExposition(text));
  assertPromtoolClean(text);
  return families;
}

const samplesOf = (families: Map<string, Family>, name: string) =>
  [...families.values()].flatMap((f) => f.samples).filter((s) => s.name === name);

/** The value of the one sample with exactly these labels, or undefined. */
function value(
  families: Map<string, Family>,
  name: string,
  labels: Record<string, string> = {},
): number | undefined {
  const want = JSON.stringify(Object.entries(labels).sort());
  return samplesOf(families, name).find((s) => JSON.stringify(Object.entries(s.labels).sort()) === want)
    ?.value;
}

/** Sum of a metric's samples whose labels include these. */
function total(families: Map<string, Family>, name: string, labels: Record<string, string> = {}): number {
  return samplesOf(families, name)
    .filter((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((sum, s) => sum + s.value, 0);
}

describe('reading an exposition with the Prometheus tools', () => {
  const good =
    '# HELP x_total X.\n# TYPE x_total counter\nx_total{a="q\\"\\\\\\n"} 3\n' +
    '# HELP g G.\n# TYPE g gauge\ng{s="nan"} NaN\ng{s="inf"} +Inf\ng{s="-inf"} -Inf\n' +
    '# HELP h_seconds H.\n# TYPE h_seconds histogram\nh_seconds_bucket{le="1"} 1\n' +
    'h_seconds_bucket{le="+Inf"} 2\nh_seconds_sum 3.5\nh_seconds_count 2\n';

  it('reads a well-formed exposition: escapes, NaN and infinities, declared counter names', () => {
    const parsed = readExposition(good);
    assert.deepEqual([...parsed.keys()], ['x_total', 'g', 'h_seconds']);
    assert.deepEqual(
      [...parsed.values()].map((f) => [f.type, f.help]),
      [
        ['counter', 'X.'],
        ['gauge', 'G.'],
        ['histogram', 'H.'],
      ],
    );
    assert.equal(value(parsed, 'x_total', { a: 'q"\\\n' }), 3);
    assert.ok(Number.isNaN(value(parsed, 'g', { s: 'nan' })));
    assert.equal(value(parsed, 'g', { s: 'inf' }), Number.POSITIVE_INFINITY);
    assert.equal(value(parsed, 'g', { s: '-inf' }), Number.NEGATIVE_INFINITY);
    assert.equal(value(parsed, 'h_seconds_count'), 2);
    // A counter declared without _total keeps its name (the Python parser would add _total to
    // its samples and so hide it from the naming check); promtool names the mistake.
    const [counter] = parseExposition('# HELP c C.\n# TYPE c counter\nc 1\n');
    assert.deepEqual(counter, {
      name: 'c',
      type: 'counter',
      help: 'C.',
      samples: [{ name: 'c', labels: {}, value: 1 }],
    });
    assert.deepEqual(promtoolCheckMetrics('# HELP c C.\n# TYPE c counter\nc 1\n'), {
      status: 3,
      problems: ['c counter metrics should have "_total" suffix'],
    });
  });

  it("throws with the tool's message on a malformed exposition", () => {
    for (const [text, message] of [
      ['# TYPE x gauge\nx{a=b} 1\n', /prometheus_client refused the exposition: ValueError: .*x\{a=b\}/],
      ['# TYPE x gauge\nx one\n', /prometheus_client refused the exposition: ValueError: .*'one'/],
      ['# TYPE x bogus\nx 1\n', /prometheus_client refused the exposition: ValueError/],
    ] as const) {
      assert.throws(() => parseExposition(text), message, JSON.stringify(text));
    }
    for (const text of [
      '# HELP x X.\n# TYPE x gauge\nx 1', // no final newline
      '# HELP x X.\n# HELP x X.\n# TYPE x gauge\nx 1\n', // HELP twice
      '# HELP x X.\n# TYPE x gauge\nx{a="1",a="2"} 1\n', // label twice
      '# HELP x X.\n# TYPE x gauge\nx 1 abc\n', // bad timestamp
    ]) {
      const { status, problems } = promtoolCheckMetrics(text);
      assert.equal(status, 1, `${JSON.stringify(text)}: ${problems.join('; ')}`);
      assert.match(problems.join('\n'), /text format parsing error/);
      assert.throws(() => assertPromtoolClean(text), assert.AssertionError);
    }
  });

  it('refuses, on the parsed families, what both tools let through', () => {
    const bad = [
      '# HELP x X.\n# TYPE x gauge\nx 1\nx 2\n', // series twice
      '# HELP x X.\n# TYPE x gauge\n# HELP y Y.\n# TYPE y gauge\ny 1\nx 1\n', // not contiguous
      '# HELP x X.\nx 1\n', // no TYPE
      '# HELP h H.\n# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n', // not cumulative
      '# HELP h H.\n# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n', // no +Inf
      '# HELP h H.\n# TYPE h histogram\nh_bucket{le="+Inf"} 1\nh_sum 1\n', // no _count
      '# HELP x_total X.\n# TYPE x_total counter\nx_total -1\n', // negative counter
    ];
    for (const text of bad) {
      assert.throws(() => checkFamilies(parseExposition(text)), assert.AssertionError, JSON.stringify(text));
    }
  });
});

describe('/metrics in the Prometheus text format, moving with traffic', { timeout: 60_000 }, () => {
  const vendor = makeVendor();
  let a: Node;
  let b: Node;
  const scrape = async (n: Node) => {
    const res = await n.agent.client.get('/metrics', { token: n.token });
    assert.equal(res.status, 200, res.text);
    assert.match(String(res.headers['content-type']), /^text\/plain; version=0\.0\.4/);
    return readExposition(res.text);
  };
  before(async () => {
    [a, b] = (await startCluster(vendor, 2, {})) as [Node, Node];
  });
  after(async () => {
    await stopAll([a, b].filter(Boolean).map((n) => n.agent));
  });

  it('parses with the Prometheus tools and follows the naming conventions', async () => {
    const families = await scrape(a);
    assert.ok(families.size > 20, `${families.size} families`);
    for (const f of families.values()) {
      assert.match(f.name, /^mesh_/, `${f.name}: the agent's prefix`);
      assert.ok(f.help && f.help.length > 0, `${f.name}: a HELP text`);
      if (f.type === 'counter') assert.match(f.name, /_total$/, `${f.name}: counters end in _total`);
      else if (!DEFAULT_GAUGES_TOTAL.has(f.name)) {
        assert.doesNotMatch(f.name, /_total$/, `${f.name}: only counters end in _total`);
      }
      if (f.type === 'histogram') assert.match(f.name, /_(seconds|bytes)$/, `${f.name}: a unit`);
    }
    for (const name of [
      'mesh_http_requests_total',
      'mesh_http_request_duration_seconds',
      'mesh_oauth_tokens_issued_total',
      'mesh_gossip_messages_total',
      'mesh_gossip_bytes_total',
      'mesh_gossip_peers',
      'mesh_gossip_convergence_seconds',
      'mesh_license_expiry_seconds',
      'mesh_license_nodes_used',
      'mesh_license_services_limit',
    ]) {
      assert.ok(families.has(name), `${name} is exposed`);
    }
    assert.equal(value(families, 'mesh_license_nodes_used'), 2);
    // The failure detector's first probe of the new peer may still be on its way (a CI run saw 0).
    await eventually(
      'the other agent alive in mesh_gossip_peers',
      async () => (value(await scrape(a), 'mesh_gossip_peers', { state: 'alive' }) === 1 ? true : undefined),
      10_000,
    );
  });

  it('HTTP requests: the counter and the histogram move by exactly the requests made', async () => {
    const series = { method: 'GET', route: '/v1/peers', status: '200' };
    const before = await scrape(a);
    for (let i = 0; i < 5; i++)
      expectStatus(await a.agent.client.get('/v1/peers', { token: a.token }), 200, 'peers');
    expectStatus(
      await a.agent.client.get('/v1/services/no-such-service', { token: a.token }),
      404,
      'missing',
    );
    const after = await scrape(a);
    assert.equal(
      value(after, 'mesh_http_requests_total', series),
      (value(before, 'mesh_http_requests_total', series) ?? 0) + 5,
    );
    const time = { method: 'GET', route: '/v1/peers' };
    assert.equal(
      value(after, 'mesh_http_request_duration_seconds_count', time),
      (value(before, 'mesh_http_request_duration_seconds_count', time) ?? 0) + 5,
    );
    const missing = { method: 'GET', route: '/v1/services/:id', status: '404' };
    assert.equal(
      value(after, 'mesh_http_requests_total', missing),
      (value(before, 'mesh_http_requests_total', missing) ?? 0) + 1,
    );
    // The scrape itself is counted once it is answered: the next scrape sees the earlier one.
    const scrapes = { method: 'GET', route: '/metrics', status: '200' };
    assert.ok((value(after, 'mesh_http_requests_total', scrapes) ?? 0) >= 1);
  });

  it('gossip: messages and bytes grow; a write made on A is applied on B with its convergence time', async () => {
    const before = await scrape(b);
    const created = await post(a, '/v1/services', { source_peer_id: a.peerId, target_peer_id: b.peerId });
    expectStatus(created, 201, 'create A→B on A');
    const after = await eventually('the service counted on B', async () => {
      const now = await scrape(b);
      return value(now, 'mesh_license_services_used') === 1 ? now : undefined;
    });
    assert.equal(value(await scrape(a), 'mesh_license_services_used'), 1);
    const count0 = value(before, 'mesh_gossip_convergence_seconds_count') ?? 0;
    const count1 = value(after, 'mesh_gossip_convergence_seconds_count') ?? 0;
    assert.ok(count1 > count0, `convergence observations ${count0} -> ${count1}`);
    const sum =
      (value(after, 'mesh_gossip_convergence_seconds_sum') ?? 0) -
      (value(before, 'mesh_gossip_convergence_seconds_sum') ?? 0);
    // Both agents run on this host's clock: the service reached B in well under 10 s per record.
    assert.ok(sum >= 0 && sum / (count1 - count0) < 10, `mean convergence ${sum / (count1 - count0)} s`);
    for (const metric of ['mesh_gossip_messages_total', 'mesh_gossip_bytes_total']) {
      for (const direction of ['sent', 'received']) {
        const grew = total(after, metric, { direction }) - total(before, metric, { direction });
        assert.ok(grew > 0, `${metric} ${direction} grew by ${grew}`);
      }
    }
    assert.ok(
      total(after, 'mesh_gossip_records_applied_total') > total(before, 'mesh_gossip_records_applied_total'),
    );
  });
});
