/**
 * A PeerDirectory kept in memory and edited by hand: for tests of the transports and of the
 * dataplane (the agent's real directory reads the replicated store). Only the peers set here
 * are "active"; delete() is a peer being removed or deactivated.
 */
import type { PeerDirectory } from './tunnel.js';

export class StaticPeerDirectory implements PeerDirectory {
  private readonly byId = new Map<string, { publicKey: Buffer; address: string }>();
  private readonly byKey = new Map<string, string>();

  set(peerId: string, publicKey: Buffer, address: string): this {
    this.delete(peerId);
    this.byId.set(peerId, { publicKey: Buffer.from(publicKey), address });
    this.byKey.set(publicKey.toString('hex'), peerId);
    return this;
  }

  delete(peerId: string): boolean {
    const entry = this.byId.get(peerId);
    if (!entry) return false;
    this.byId.delete(peerId);
    this.byKey.delete(entry.publicKey.toString('hex'));
    return true;
  }

  peerByKey(rawPublicKey: Buffer): { id: string } | undefined {
    const id = this.byKey.get(rawPublicKey.toString('hex'));
    return id === undefined ? undefined : { id };
  }

  peer(peerId: string): { publicKey: Buffer; address: string } | undefined {
    return this.byId.get(peerId);
  }
}
