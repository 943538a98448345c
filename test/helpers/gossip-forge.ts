/**
 * Shared code of the cluster security, rotation and limits tests: clusters of real agents
 * (on request on loopback addresses of their own, for gossip-cut.ts, and on movable clocks,
 * faketime.ts), gossip envelopes built by hand exactly as
 * an agent builds them (seal() of src/cluster/gossip-envelope.ts) so a test can send genuine,
 * replayed or forged messages to POST /internal/v1/gossip, and readers of what an agent shows
 * (its replicated state, its refusal counters).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join as joinPath } from 'node:path';
import { hashClusterSecret, keyId, macKeyOf } from '../../src/cluster/cluster-credential.js';
import { type Envelope, type Payload, seal } from '../../src/cluster/gossip-envelope.js';
import { encodeStamp } from '../../src/cluster/hlc.js';
import { Identity } from '../../src/cluster/identity.js';
import { makeVkey, PEER_RANK, type WireRecord } from '../../src/cluster/replicated-records.js';
import { AgentProcess, type StartOptions } from './agent-process.js';
import { assertError, withoutLiveness } from './api-assertions.js';
import type { ApiResponse } from './api-client.js';
import type { Vendor } from './licenses.js';

export const GOSSIP_ARGS = ['--gossip-interval-ms', '200'];

/** One running, bootstrapped agent; its API credential is kept to get fresh tokens. */
export interface Member {
  agent: AgentProcess;
  peerId: string;
  clientId: string;
  clientSecret: string;
  /** Admin token; refreshed by refreshToken() (tokens live 1 h on the agent's clock). */
  token: string;
}

/** What a test needs of its agents: a cut (gossip-cut.ts), a clock it moves (faketime.ts). */
export type MemberOptions = Pick<StartOptions, 'ownAddress' | 'movableClock'>;

/** Polls until fn returns something other than undefined; fails with `what` at the deadline. */
export async function eventually<T>(
  what: string,
  fn: () => Promise<T | undefined>,
  ms = 15_000,
  everyMs = 100,
): Promise<T> {
  const end = Date.now() + ms;
  let lastError: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined) return v;
    } catch (err) {
      lastError = err;
    }
    if (Date.now() > end) {
      throw new Error(
        `timed out waiting for: ${what}${lastError ? ` (last error: ${String(lastError)})` : ''}`,
      );
    }
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** Starts an agent for gossip tests and bootstraps it with a license of the vendor. */
export async function startMember(
  vendor: Vendor,
  license: Parameters<Vendor['sign']>[0],
  name = 'test',
  args: readonly string[] = GOSSIP_ARGS,
  options: MemberOptions = {},
): Promise<Member> {
  const agent = await AgentProcess.start({ vendor, extraArgs: [...args], ...options });
  try {
    const res = await agent.client.post('/v1/bootstrap', { json: { license: vendor.sign(license), name } });
    assert.equal(res.status, 201, `bootstrap: ${res.text}`);
    const creds = { clientId: res.body.client_id as string, clientSecret: res.body.client_secret as string };
    const token = await agent.client.token(creds.clientId, creds.clientSecret);
    return { agent, peerId: res.body.peer_id as string, ...creds, token };
  } catch (err) {
    await agent.stop().catch(() => undefined);
    throw err;
  }
}

/** `a` adds `b` by the handshake (POST /v1/peers); returns the answer. */
export function addPeer(a: Member, b: Member): Promise<ApiResponse> {
  return a.agent.client.post('/v1/peers', { token: a.token, json: { address: b.agent.address } });
}

/**
 * Starts `n` agents under one license and joins them into one cluster (each to the first);
 * `args` are the agents' extra serve flags (default: a 200 ms gossip interval).
 */
export async function startCluster(
  vendor: Vendor,
  n: number,
  license: Parameters<Vendor['sign']>[0],
  args: readonly string[] = GOSSIP_ARGS,
  options: MemberOptions = {},
): Promise<Member[]> {
  const members: Member[] = [];
  try {
    for (let i = 0; i < n; i++) {
      members.push(await startMember(vendor, license, `agent-${i}`, args, options));
    }
    for (const m of members.slice(1)) {
      const res = await addPeer(members[0]!, m);
      assert.equal(res.status, 201, `join: ${res.text}`);
    }
    await waitForPeers(members, n);
    return members;
  } catch (err) {
    await stopAll(members);
    throw err;
  }
}

/** Waits until every member lists exactly `n` active peers, the same on each. */
export async function waitForPeers(members: readonly Member[], n: number, ms = 15_000): Promise<void> {
  await eventually(
    `every member lists ${n} active peers`,
    async () => {
      const views = await Promise.all(members.map((m) => activePeerIds(m)));
      const first = JSON.stringify(views[0]);
      return views.every((v) => v.length === n && JSON.stringify(v) === first) ? true : undefined;
    },
    ms,
  );
}

export async function activePeerIds(m: Member): Promise<string[]> {
  const res = await m.agent.client.get('/v1/peers', { token: m.token });
  assert.equal(res.status, 200, res.text);
  return (res.body as { id: string; is_active: boolean }[])
    .filter((p) => p.is_active)
    .map((p) => p.id)
    .sort();
}

export async function stopAll(members: readonly Member[]): Promise<void> {
  for (const m of members) await m.agent.stop().catch((err) => console.error(String(err)));
}

/** A fresh admin token, valid on the agent's (possibly advanced) clock. */
export async function refreshToken(m: Member): Promise<void> {
  m.token = await m.agent.client.token(m.clientId, m.clientSecret);
}

/**
 * Moves each agent's clock forward by `ms` (agents started with movableClock), all at once, then
 * refreshes their tokens.
 */
export async function advanceClocks(members: readonly Member[], ms: number): Promise<void> {
  await Promise.all(members.map((m) => m.agent.advanceClock(ms)));
  for (const m of members) await refreshToken(m);
}

/** An agent a test holds an admin token for: a Member, or a Node of test/helpers/nodes.ts. */
type Reachable = Pick<Member, 'agent' | 'token'>;

/** Whether `observer` currently reports the peer `peerId` as reachable (GET /v1/peers/{id}). */
export async function reachableOn(observer: Reachable, peerId: string): Promise<boolean> {
  const res = await observer.agent.client.get(`/v1/peers/${peerId}`, { token: observer.token });
  assert.equal(res.status, 200, res.text);
  return res.body.reachable as boolean;
}

/** GET /metrics of an agent. */
export async function metricsOf(m: Reachable): Promise<string> {
  const res = await m.agent.client.get('/metrics', { token: m.token });
  assert.equal(res.status, 200, res.text);
  return res.text;
}

/** The value of one series, written as in the text (`name{labels}`), or 0 when it is absent. */
export function seriesValue(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line ? Number(line.slice(series.length + 1)) : 0;
}

/** mesh_gossip_messages_total of one message type and direction on an agent. */
export async function gossipMessages(
  m: Reachable,
  type: string,
  direction: 'sent' | 'received',
): Promise<number> {
  return seriesValue(
    await metricsOf(m),
    `mesh_gossip_messages_total{type="${type}",direction="${direction}"}`,
  );
}

/** The agent's time, as its (possibly moved) clock reads it. */
export const agentNow = (m: Member): number => m.agent.clock?.now() ?? Date.now();

/** The Ed25519 identity an agent signs gossip with, read from its data dir. */
export function identityOf(m: Member): Identity {
  return new Identity(readFileSync(joinPath(m.agent.dataDir, 'identity.key'), 'utf8'));
}

/** A signer that claims `peerId` but signs with a key that is not that peer's. */
export function impostor(peerId: string): Identity {
  const fresh = new Identity(Identity.generatePem());
  return { peerId, sign: (m: Buffer) => fresh.sign(m) } as unknown as Identity;
}

export interface LiveKey {
  kid: string;
  key: Buffer;
}

/** The gossip MAC key an agent derives from a cluster secret (cluster-credential.ts). */
export function macKeyFromSecret(secret: string): LiveKey {
  const hash = hashClusterSecret(secret);
  return { kid: keyId(hash), key: macKeyOf(hash) };
}

/** Seals a message as an agent would: signed by `signer`, MACed with `key` (none: unkeyed). */
export function sealMessage(
  signer: Identity,
  to: Member | string,
  type: string,
  body: unknown,
  key: LiveKey | undefined,
  sentAt: number,
): { envelope: Envelope; nonce: string } {
  return seal(signer, { type, to: typeof to === 'string' ? to : to.peerId, sent_at: sentAt, body }, key);
}

/** The body of a probe, as the failure detector sends it. */
export const PING_BODY = { root: 'x', inc: 0, suspected: false, rumors: [] } as const;

/** POST /internal/v1/gossip to an agent, no token. */
export function sendGossip(to: Member, envelope: Envelope): Promise<ApiResponse> {
  return to.agent.client.post('/internal/v1/gossip', { json: envelope });
}

/** The payload of a reply envelope (not verified: the test checks what it needs). */
export function replyPayload(res: ApiResponse): Payload {
  return JSON.parse((res.body as Envelope).payload) as Payload;
}

/**
 * Sends `receiver` a probe signed by `sender` (a member it knows) and MACed with `key`: how the
 * tests ask an agent whether it accepts a cluster secret.
 */
export async function probeWithKey(
  receiver: Member,
  sender: Member,
  key: LiveKey,
): Promise<{ res: ApiResponse; nonce: string }> {
  const { envelope, nonce } = sealMessage(
    identityOf(sender),
    receiver,
    'ping',
    PING_BODY,
    key,
    agentNow(receiver),
  );
  return { res: await sendGossip(receiver, envelope), nonce };
}

/** `receiver` accepts `key`: it answers the probe, to its sender, under the same key. */
export async function assertKeyAccepted(
  receiver: Member,
  sender: Member,
  key: LiveKey,
  what: string,
): Promise<void> {
  const { res, nonce } = await probeWithKey(receiver, sender, key);
  assert.equal(res.status, 200, `${what}: ${res.text}`);
  const reply = replyPayload(res);
  assert.equal(reply.type, 'ping-reply', what);
  assert.equal(reply.re, nonce, what);
  assert.equal(reply.to, sender.peerId, what);
  assert.equal((res.body as Envelope).kid, key.kid, `${what}: answered under the same key`);
}

/** `receiver` refuses `key` as a credential it does not hold (or no longer holds). */
export async function assertKeyRefused(
  receiver: Member,
  sender: Member,
  key: LiveKey,
  what: string,
): Promise<void> {
  const { res } = await probeWithKey(receiver, sender, key);
  assertError(res, 401, 'UNAUTHORIZED', what);
  assert.equal(res.body.error, 'gossip message refused:unknown_credential', what);
}

/**
 * A peer record that renames a peer: as the agent that owns it would write it, from the peer as
 * GET /v1/peers/{id} shows it, at a stamp of now (so it beats the record the agents hold), rank
 * active (ordinal 0), epoch 0.
 */
export function peerRenameRecord(
  peer: Record<string, unknown>,
  name: string,
  nowMs: number,
  writer: string,
): WireRecord {
  const body = {
    id: peer.id,
    name,
    public_key: peer.public_key,
    address: peer.address,
    is_active: peer.is_active,
    version: (peer.version as number) + 1,
    deactivated_at: peer.deactivated_at,
    created_at: peer.created_at,
    updated_at: new Date(nowMs).toISOString(),
  };
  const vkey = makeVkey(0, PEER_RANK.active, encodeStamp({ wall: nowMs, counter: 0, origin: writer }));
  return { key: `peer/${peer.id as string}`, vkey, body };
}

/** mesh_gossip_rejected_total by reason, as GET /metrics shows it. */
export async function rejectedCounts(m: Member): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  for (const line of (await metricsOf(m)).split('\n')) {
    const match = /^mesh_gossip_rejected_total\{reason="([a-z_]+)"\} (\d+(?:\.\d+)?)$/.exec(line);
    if (match) counts.set(match[1]!, Number(match[2]));
  }
  return counts;
}

/**
 * Everything an agent shows of the replicated state: peers (without its own liveness
 * observations), services, the cluster credential and the cluster identity.
 */
export async function replicatedView(m: Member): Promise<Record<string, unknown>> {
  const get = async (path: string) => {
    const res = await m.agent.client.get(path, { token: m.token });
    assert.equal(res.status, 200, `${path}: ${res.text}`);
    return res.body;
  };
  const peers = (await get('/v1/peers')) as Record<string, unknown>[];
  return {
    peers: peers.map((p) => withoutLiveness(p)),
    services: await get('/v1/services'),
    credential: await get('/v1/cluster/credentials'),
    identity: await get('/v1/cluster/identity'),
  };
}

/** The same view without what differs between agents by design (which peer is local). */
export async function sharedView(m: Member): Promise<Record<string, unknown>> {
  const v = await replicatedView(m);
  return {
    peers: (v.peers as Record<string, unknown>[]).map(({ is_local: _local, ...p }) => p),
    services: v.services,
    credential: v.credential,
    cluster_id: (v.identity as { cluster_id: string }).cluster_id,
  };
}

/** Waits until every member shows the same shared view; returns it. */
export async function waitForConvergence(
  members: readonly Member[],
  ms = 15_000,
): Promise<Record<string, unknown>> {
  return eventually(
    'every member shows the same replicated state',
    async () => {
      const views = await Promise.all(members.map((m) => sharedView(m)));
      const first = JSON.stringify(views[0]);
      return views.every((v) => JSON.stringify(v) === first) ? views[0] : undefined;
    },
    ms,
  );
}

/** GET /v1/cluster/credentials on an agent. */
export async function credentialOf(m: Member): Promise<{ version: number; rotated_by: string }> {
  const res = await m.agent.client.get('/v1/cluster/credentials', { token: m.token });
  assert.equal(res.status, 200, res.text);
  return res.body;
}

/** POST /v1/cluster/credentials/rotate on an agent; returns the answer with the secret. */
export async function rotate(
  m: Member,
): Promise<{ client_secret: string; version: number; rotated_by: string }> {
  const res = await m.agent.client.post('/v1/cluster/credentials/rotate', { token: m.token });
  assert.equal(res.status, 200, res.text);
  return res.body;
}
