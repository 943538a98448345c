/**
 * A ServiceRecord as the store keeps it, for unit tests of the store and the cluster: a plain tcp
 * service without interface, limit or health check, created at 2026-01-01, not yet replicated.
 */
import type { ServiceRecord } from '../../src/store/records.js';

export function serviceRecord(
  over: Partial<ServiceRecord> & Pick<ServiceRecord, 'id' | 'sourcePeerId' | 'targetPeerId'>,
): ServiceRecord {
  return {
    transportType: 'tcp',
    requiresInterface: false,
    desiredIpv4Cidr: null,
    desiredIpv6Cidr: null,
    fullyTransparent: false,
    bandwidthLimitMbps: 0,
    healthCheck: null,
    version: 1,
    createdAt: '2026-01-01T00:00:00.000Z',
    updatedAt: '2026-01-01T00:00:00.000Z',
    vkey: '',
    createdStamp: '',
    ...over,
  };
}
