/**
 * A fresh Ed25519 identity as tests and benches of the transports need it: the private key, the
 * raw 32-byte public key (what tunnels pin and directories hold) and the peer id derived from it.
 */
import { createPublicKey, generateKeyPairSync, type KeyObject } from 'node:crypto';
import { peerIdFromPublicKey } from '../../src/domain/ids.js';

export interface PeerIdentity {
  key: KeyObject;
  raw: Buffer;
  id: string;
}

export function newPeerIdentity(): PeerIdentity {
  const key = generateKeyPairSync('ed25519').privateKey;
  const raw = Buffer.from(createPublicKey(key).export({ format: 'jwk' }).x as string, 'base64url');
  return { key, raw, id: peerIdFromPublicKey(raw) };
}
