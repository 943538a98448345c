/**
 * Store records as the API shows them: the documented field names and forms. Pure.
 */
import type { PeerRecord } from '../store/records.js';

export function peerView(p: PeerRecord, localPeerId: string | undefined) {
  return {
    id: p.id,
    name: p.name,
    public_key: p.publicKey,
    is_local: p.id === localPeerId,
    address: p.address,
    created_at: p.createdAt,
    is_active: p.isActive,
    version: p.version,
    deactivated_at: p.deactivatedAt,
  };
}
