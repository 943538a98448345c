/**
 * What this agent observes (runtime events, docs/events.md "Runtime events"), as the parts that
 * observe it report it. The cluster, the data plane, auth and the API take a `RecordObserved`
 * function, never the event log or the store: the agent (agent.ts) wires it to the event log,
 * which adds seq, id, time and the actor (this agent). Imports nothing.
 */

export interface ObservedEvent {
  /** `<resource>.<what happened>`, e.g. `peer.unreachable`. */
  type: string;
  resource: { kind: string; id: string };
  /** Never a secret. */
  data: Record<string, unknown>;
}

export type RecordObserved = (event: ObservedEvent) => void;
