/**
 * The peer handshake's messages and signatures (docs/decisions.md §5), pure. Two agents prove
 * possession of their Ed25519 keys by each signing a fresh nonce chosen by the other:
 *
 *   initiator                                   responder
 *   GET  /v1/cluster/identity  ---------------> (public: peer_id, public_key, license_id)
 *   POST /internal/v1/handshake/hello {initiator, nonce_a}
 *                              <--------------- {responder, nonce_b, signature_b}
 *        signature_b = Sign_responder(RESPONDER_CONTEXT || JCS{nonce_a, nonce_b, initiator_peer_id, responder})
 *   POST /internal/v1/handshake/confirm {nonce_b, signature_a, cluster_records}
 *        signature_a = Sign_initiator(INITIATOR_CONTEXT || JCS{nonce_a, nonce_b, initiator, responder_peer_id, cluster_records})
 *                              <--------------- {accepted, cluster_records, signature_c}   (responder has added the initiator)
 *        signature_c = Sign_responder(CONFIRM_CONTEXT || JCS{nonce_a, nonce_b, cluster_records})
 *   initiator adds the responder.
 *
 * cluster_records are each side's cluster and credential records; both sides then adopt the
 * surviving cluster's pair (mergedClusterRecords), and gossip brings the rest of each cluster.
 *
 * The contexts keep a signature made for one role from being replayed as the other; nonces are
 * single-use on the responder and expire after HANDSHAKE_TTL_MS. Neither side changes anything
 * before the other has proven its key.
 */
import { randomBytes } from 'node:crypto';
import canonicalize from 'canonicalize';
import { peerIdFromPublicKey } from '../domain/ids.js';
import type { License } from '../domain/license.js';
import { verifyPeerSignature } from './identity.js';
import { epochOf, isWellFormed, liftToEpoch, type WireRecord } from './replicated-records.js';

export const HANDSHAKE_VERSION = 1;
export const HANDSHAKE_TTL_MS = 10_000;
const RESPONDER_CONTEXT = 'mesh-agent handshake v1 responder\n';
const INITIATOR_CONTEXT = 'mesh-agent handshake v1 initiator\n';
const CONFIRM_CONTEXT = 'mesh-agent handshake v1 confirm\n';

/** What each side tells the other about itself and its cluster. */
export interface HandshakePeerInfo {
  peer_id: string;
  public_key: string;
  address: string;
  /** When this peer was created (its bootstrap): kept as is by the other side. */
  created_at: string;
  license_id: string;
  /**
   * The signed license the agent was bootstrapped with. The license_id alone is public (the
   * identity endpoint shows it); holding a license signed by a trusted vendor key is what
   * entitles an agent to join (checked with verifyLicense on both sides).
   */
  license: License;
  cluster_id: string;
  cluster_created_by: string;
  /** The oldest active peer of its cluster, which decides whose cluster id survives a merge. */
  oldest_peer_id: string;
  oldest_peer_created_at: string;
  active_peer_ids: string[];
  /** Services of its cluster: a merge must fit max_services too (docs/decisions.md §5). */
  service_count: number;
  /**
   * The agent's own peer name and record version, so that the row the other side writes for it
   * keeps them (that write sorts after the agent's own record). Absent from older agents.
   */
  name?: string;
  version?: number;
}

export interface HelloRequest {
  version: number;
  initiator: HandshakePeerInfo;
  nonce_a: string;
}

export interface HelloResponse {
  version: number;
  responder: HandshakePeerInfo;
  nonce_b: string;
  signature_b: string;
}

export interface ConfirmRequest {
  nonce_b: string;
  signature_a: string;
  /**
   * The initiator's cluster and credential records (replicated-records.ts), sent only once the
   * responder has proven its key: the side whose cluster survives the merge gives both.
   */
  cluster_records: WireRecord[];
}

export interface ConfirmResponse {
  accepted: true;
  peer_id: string;
  /** The responder's cluster and credential records as they were before the merge. */
  cluster_records: WireRecord[];
  /** The responder's signature over both nonces and its records (CONFIRM_CONTEXT). */
  signature_c: string;
}

export const newNonce = (): string => randomBytes(32).toString('base64');

function signingInput(context: string, fields: Record<string, unknown>): Buffer {
  return Buffer.concat([Buffer.from(context, 'utf8'), Buffer.from(canonicalize(fields) ?? '', 'utf8')]);
}

export function responderSigningInput(
  nonceA: string,
  nonceB: string,
  initiatorPeerId: string,
  responder: HandshakePeerInfo,
) {
  return signingInput(RESPONDER_CONTEXT, {
    nonce_a: nonceA,
    nonce_b: nonceB,
    initiator_peer_id: initiatorPeerId,
    responder,
  });
}

export function initiatorSigningInput(
  nonceA: string,
  nonceB: string,
  initiator: HandshakePeerInfo,
  responderPeerId: string,
  clusterRecords: readonly WireRecord[],
) {
  return signingInput(INITIATOR_CONTEXT, {
    nonce_a: nonceA,
    nonce_b: nonceB,
    initiator,
    responder_peer_id: responderPeerId,
    cluster_records: clusterRecords,
  });
}

export function confirmSigningInput(nonceA: string, nonceB: string, clusterRecords: readonly WireRecord[]) {
  return signingInput(CONFIRM_CONTEXT, { nonce_a: nonceA, nonce_b: nonceB, cluster_records: clusterRecords });
}

/**
 * The cluster and credential records both agents adopt after a merge: the surviving cluster's,
 * lifted to an epoch above all four so that they beat everything either cluster wrote before.
 * Both sides compute the same records from the same inputs.
 */
export function mergedClusterRecords(
  winner: readonly WireRecord[],
  loser: readonly WireRecord[],
): WireRecord[] {
  const epoch = Math.max(...[...winner, ...loser].map((r) => epochOf(r.vkey))) + 1;
  return winner.map((r) => liftToEpoch(r, epoch));
}

/** Exactly a cluster record and a credential record, well formed. */
export function isClusterTransfer(records: unknown): records is WireRecord[] {
  return (
    Array.isArray(records) &&
    records.length === 2 &&
    records.every(isWellFormed) &&
    (records[0] as WireRecord).key === 'cluster' &&
    (records[1] as WireRecord).key === 'credential'
  );
}

/** A peer id must be the one its public key yields: nobody can claim another agent's id. */
export function peerIdMatchesKey(info: { peer_id: string; public_key: string }): boolean {
  const raw = Buffer.from(info.public_key, 'base64');
  return (
    raw.length === 32 &&
    raw.toString('base64') === info.public_key &&
    peerIdFromPublicKey(raw) === info.peer_id
  );
}

export function verifySignature(publicKey: string, input: Buffer, signatureBase64: string): boolean {
  const signature = Buffer.from(signatureBase64, 'base64');
  return signature.toString('base64') === signatureBase64 && verifyPeerSignature(publicKey, input, signature);
}

/**
 * Which cluster keeps its id when two merge: the one whose oldest peer is older; ties by the
 * lower peer id (docs/decisions.md §5). Both sides compute the same answer.
 */
export function survivingCluster(a: HandshakePeerInfo, b: HandshakePeerInfo): HandshakePeerInfo {
  const ta = Date.parse(a.oldest_peer_created_at);
  const tb = Date.parse(b.oldest_peer_created_at);
  if (ta !== tb) return ta < tb ? a : b;
  return a.oldest_peer_id <= b.oldest_peer_id ? a : b;
}
