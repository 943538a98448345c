/**
 * Reads an agent's event log over its API (GET /v1/events), following the cursor to the end,
 * for tests that assert which events an agent recorded.
 */
import assert from 'node:assert/strict';
import type { MeshEvent } from '../../src/events/event-log.js';
import type { AgentProcess } from './agent-process.js';

/** Every event after `since` (a type prefix and resource id narrow it), oldest first. */
export async function eventsOf(
  node: { agent: AgentProcess; token: string },
  query: { type?: string; resource?: string; since?: number } = {},
): Promise<MeshEvent[]> {
  const out: MeshEvent[] = [];
  let since = query.since ?? 0;
  for (;;) {
    const params = new URLSearchParams({ since: String(since), limit: '1000' });
    if (query.type) params.set('type', query.type);
    if (query.resource) params.set('resource', query.resource);
    const res = await node.agent.client.get(`/v1/events?${params}`, { token: node.token });
    assert.equal(res.status, 200, res.text);
    const page = (res.body as { events: MeshEvent[] }).events;
    out.push(...page);
    if (page.length < 1000) return out;
    since = page[page.length - 1]!.seq;
  }
}
