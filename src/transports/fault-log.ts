/**
 * Counts the connections a transport refused or dropped, by reason, and logs them without
 * letting a flood of bad connections flood the log: the first of each reason is logged, then at
 * most one line per reason per interval carrying how many were not logged. Used by
 * src/transports only.
 */
import type { FaultReason, TransportLogger } from './tunnel.js';

const REASONS: readonly FaultReason[] = [
  'upgrade',
  'handshake',
  'certificate',
  'unknown-peer',
  'wrong-key',
  'not-dialer',
  'resumed',
  'busy',
  'protocol',
  'corrupt',
  'dead',
  'revoked',
];

export class FaultLog {
  private readonly counts = Object.fromEntries(REASONS.map((r) => [r, 0])) as Record<FaultReason, number>;
  private readonly lastLoggedAt = new Map<FaultReason, number>();
  private readonly unlogged = new Map<FaultReason, number>();

  constructor(
    private readonly logger: TransportLogger | undefined,
    private readonly kind: string,
    private readonly intervalMs = 10_000,
    private readonly now: () => number = () => performance.now(),
  ) {}

  record(reason: FaultReason, details: Record<string, unknown>): void {
    this.counts[reason]++;
    if (!this.logger) return;
    const now = this.now();
    const last = this.lastLoggedAt.get(reason);
    if (last !== undefined && now - last < this.intervalMs) {
      this.unlogged.set(reason, (this.unlogged.get(reason) ?? 0) + 1);
      return;
    }
    const suppressed = this.unlogged.get(reason) ?? 0;
    this.unlogged.delete(reason);
    this.lastLoggedAt.set(reason, now);
    // Expected in normal operation (a peer died, a peer was removed): not worth a warning.
    const quiet = reason === 'dead' || reason === 'revoked';
    const fields = { transport: this.kind, reason, ...details, ...(suppressed ? { suppressed } : {}) };
    if (quiet) this.logger.info(fields, 'tunnel connection closed');
    else this.logger.warn(fields, 'tunnel connection refused');
  }

  snapshot(): Readonly<Record<FaultReason, number>> {
    return { ...this.counts };
  }
}
