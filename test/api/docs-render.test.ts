/**
 * /docs in a real browser: Debian's headless Chromium driven by playwright-core opens the agent's
 * Swagger UI, which must render with no request leaving the agent's origin, no console or page
 * error, and one operation block for every (method, path) of the OpenAPI document the agent serves
 * and of the endpoint tables of docs/api.md (read from the repository). The API document is the
 * second oracle so that an endpoint missing from both the OpenAPI document and the page is still
 * caught.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import type { Browser, Page } from 'playwright-core';
import { CHROMIUM, type IsolatedChromium, launchIsolatedChromium } from '../helpers/isolated-chromium.js';
import { makeVendor } from '../helpers/licenses.js';
import { type Node, startNode } from '../helpers/nodes.js';

/** The API document in the repository; compiled, this file runs from dist/test/api/. */
const SPEC = new URL('../../../docs/api.md', import.meta.url);
const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'head', 'options', 'trace'];

/** `METHOD /path` keys, sorted, so a failing deepEqual shows the odd ones out. */
function keys(pairs: Iterable<string>): string[] {
  return [...new Set(pairs)].sort();
}

/**
 * The (method, path) of every row of the tables under "## Endpoints" of the API spec. A row that
 * does not parse fails the test, so a change of the spec's form cannot silently shrink the list.
 */
function specEndpoints(): string[] {
  const text = readFileSync(SPEC, 'utf8');
  const start = text.indexOf('\n## Endpoints\n');
  assert.ok(start >= 0, 'the spec has an "## Endpoints" part');
  const end = text.indexOf('\n## ', start + 1);
  const section = text.slice(start, end < 0 ? undefined : end).split('\n');
  const found: string[] = [];
  let inEndpointTable = false;
  for (const line of section) {
    if (!line.startsWith('|')) {
      inEndpointTable = false;
      continue;
    }
    const cells = line.split('|').map((c) => c.trim());
    if (cells[1] === 'Method' && cells[2] === 'Path') {
      inEndpointTable = true;
      continue;
    }
    if (!inEndpointTable || /^-+$/.test(cells[1] ?? '')) continue;
    const [method, path] = [cells[1] ?? '', cells[2] ?? ''];
    assert.match(method, /^(GET|POST|PUT|DELETE|PATCH)$/, `spec row: ${line}`);
    assert.match(path, /^\/[\w./{}-]*$/, `spec row: ${line}`);
    found.push(`${method} ${path}`);
  }
  return keys(found);
}

/** Every operation block Swagger UI rendered, as `METHOD /path`, after expanding closed tags. */
async function renderedOperations(page: Page): Promise<string[]> {
  // Tags start open with Swagger UI's default docExpansion ('list'); open any that are not, so the
  // test reads the page as a reader would see it after a click rather than relying on that default.
  for (const tag of await page.locator('.opblock-tag-section:not(.is-open) .opblock-tag').all()) {
    await tag.click();
  }
  return keys(
    await page.locator('.opblock').evaluateAll((blocks) =>
      blocks.map((b) => {
        const method = b.querySelector('.opblock-summary-method')?.textContent?.trim() ?? '?';
        const path = b.querySelector('.opblock-summary-path')?.getAttribute('data-path') ?? '?';
        return `${method.toUpperCase()} ${path}`;
      }),
    ),
  );
}

describe('/docs rendered in headless Chromium', { timeout: 60_000 }, () => {
  let node: Node | undefined;
  let browser: Browser | undefined;
  /** In a network namespace of its own: test/helpers/isolated-chromium.ts says why. */
  let isolated: IsolatedChromium | undefined;
  let origin: string;
  let page: Page;
  /** Requests to anything but the agent: aborted, and recorded to fail the test. */
  const foreign: string[] = [];
  const consoleErrors: string[] = [];
  const pageErrors: string[] = [];
  let documented: string[];
  let version: string;

  before(async () => {
    assert.ok(
      existsSync(CHROMIUM),
      `${CHROMIUM} is missing: install Debian's chromium (apt-get install -y --no-install-recommends chromium)`,
    );
    node = await startNode(makeVendor());
    origin = `http://127.0.0.1:${node.agent.port}`;
    const doc = (await node.agent.client.get('/openapi.json')).body as {
      info: { version: string };
      paths: Record<string, Record<string, unknown>>;
    };
    version = doc.info.version;
    documented = keys(
      Object.entries(doc.paths).flatMap(([path, ops]) =>
        Object.keys(ops)
          .filter((m) => METHODS.includes(m))
          .map((m) => `${m.toUpperCase()} ${path}`),
      ),
    );
    isolated = await launchIsolatedChromium([node.agent.port]);
    browser = isolated.browser;
    const context = await browser.newContext();
    context.setDefaultTimeout(15_000);
    // On the context, not the page: also covers workers and any popup the page might open.
    await context.route('**/*', async (route) => {
      const url = route.request().url();
      if (new URL(url).origin === origin) return route.continue();
      foreign.push(url);
      return route.abort('blockedbyclient');
    });
    page = await context.newPage();
    page.on('console', (msg) => {
      if (msg.type() === 'error') consoleErrors.push(`${msg.text()} at ${msg.location().url}`);
    });
    page.on('pageerror', (err) => pageErrors.push(String(err)));
    const res = await page.goto(`${origin}/docs/`, { waitUntil: 'load' });
    assert.equal(res?.status(), 200);
    // Swagger UI fetches the document (./json) after load and then renders the operations.
    await page.locator('.opblock').first().waitFor({ state: 'visible' });
    await page.waitForLoadState('networkidle');
  });

  after(async () => {
    await isolated?.close();
    if (node) assert.equal(await node.agent.stop(), 0);
  });

  it('renders the agent document: its title and version, no error banner', async () => {
    const title = (await page.locator('.information-container .title').textContent()) ?? '';
    assert.match(title, /mesh-agent management API/);
    assert.ok(title.includes(version), `version ${version} in the title: ${title}`);
    assert.equal(await page.locator('.swagger-ui .errors-wrapper').count(), 0, 'Swagger UI error box');
    assert.equal(await page.locator('.loading-container').count(), 0, 'still loading');
  });

  it('lists every operation of the served OpenAPI document, and nothing else', async () => {
    assert.ok(documented.length > 0);
    const rendered = await renderedOperations(page);
    assert.deepEqual(
      {
        missing: documented.filter((e) => !rendered.includes(e)),
        extra: rendered.filter((e) => !documented.includes(e)),
      },
      { missing: [], extra: [] },
      `operation blocks on the page against ${documented.length} operations of /openapi.json`,
    );
  });

  it('lists every endpoint of docs/api.md', async () => {
    const spec = specEndpoints();
    assert.ok(spec.length >= 20, `endpoints parsed from the spec: ${spec.join(', ')}`);
    const rendered = new Set(await renderedOperations(page));
    assert.deepEqual(
      spec.filter((e) => !rendered.has(e)),
      [],
      'endpoints of the spec not on the page',
    );
    assert.deepEqual(
      spec.filter((e) => !documented.includes(e)),
      [],
      'endpoints of the spec not in the OpenAPI document',
    );
  });

  it('asked no host but the agent (no CDN) and logged no error', () => {
    assert.deepEqual(foreign, [], 'requests to other origins');
    assert.deepEqual(pageErrors, [], 'uncaught page errors');
    assert.deepEqual(consoleErrors, [], 'console errors');
  });
});
