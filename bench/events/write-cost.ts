/**
 * bench/events/write-cost: what recording a config event adds to one write, in process, on the
 * repo's disk with the agent's pragmas (WAL, synchronous=FULL). The same write, a service's
 * PUT through ServiceConfig.update (a replicated record and, with the log, its event in the same
 * transaction), on two stores side by side: one whose Replica records into an EventLog, one whose
 * Replica has none (as the unit tests build it: the agent always passes its log). Rounds
 * alternate between the two so disk noise hits both. Without HTTP, token checks and the
 * response, the write is smaller here than through the API, so the relative cost is larger
 * here than there: an upper bound for the API's.
 *
 * Run: node dist/bench/events/write-cost.js  (WRITES per round 500, ROUNDS 6)
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { HybridClock } from '../../src/cluster/hlc.js';
import { Replica } from '../../src/cluster/replica.js';
import { ServiceConfig } from '../../src/cluster/service-config.js';
import { systemClock } from '../../src/domain/clock.js';
import { EventLog } from '../../src/events/event-log.js';
import { Store } from '../../src/store/store.js';
import { serviceRecord } from '../../test/helpers/service-record.js';
import { fmt, median, REPO_ROOT } from '../api/measure.js';

const int = (v: string | undefined, d: number) => (v && /^\d+$/.test(v) ? Number(v) : d);
const WRITES = int(process.env.WRITES, 500);
const ROUNDS = int(process.env.ROUNDS, 6);
const ACTOR = { client_id: 'mcl_bench', agent: 'p1' };
const T = new Date().toISOString();

const peer = (id: string) => ({
  id,
  name: '',
  publicKey: `${id}-key`,
  address: `${id}:1`,
  isActive: true,
  version: 1,
  deactivatedAt: null,
  createdAt: T,
  updatedAt: T,
  vkey: '',
});

const dirs: string[] = [];

function setup(withLog: boolean) {
  const dir = mkdtempSync(join(REPO_ROOT, 'bench/results/events-cost-'));
  dirs.push(dir);
  const store = new Store(join(dir, 'db'));
  // SYNC=OFF: no fsync, so what is left is the CPU and the pages written.
  if (process.env.SYNC === 'OFF') store.db.pragma('synchronous = OFF');
  // The replica reads records only on a bootstrapped store: an agent state with dummy values.
  store.bootstrap({
    state: {
      license: {
        license_id: 'l',
        customer_id: 'c',
        issued_at: T,
        expires_at: T,
        max_nodes: 3,
        max_services: 10,
      } as never,
      localPeerId: 'p1',
      clusterId: 'c',
      description: '',
      bootstrappedAt: T,
      clusterCreatedBy: 'p1',
      clusterVkey: '',
      credentialVkey: '',
    },
    localPeer: peer('p0'),
    firstCredential: {
      clientId: 'mcl_bench',
      secretHash: Buffer.alloc(32),
      scopes: [],
      licenseId: 'l',
      createdAt: T,
      lastUsedAt: null,
    },
    clusterSecret: {
      kid: 'k',
      version: 1,
      clientId: 'mcc',
      secretHash: Buffer.alloc(32),
      rotatedBy: 'p1',
      rotatedAt: T,
      validUntil: null,
      replicated: true,
    },
  });
  for (const id of ['p1', 'p2']) store.insertPeer(peer(id));
  store.insertService(serviceRecord({ id: 'svc', sourcePeerId: 'p1', targetPeerId: 'p2' }));
  const log = withLog ? new EventLog(store, 'p1', systemClock) : undefined;
  const replica = new Replica(store, 'p1', new HybridClock('p1', systemClock), systemClock, undefined, log);
  const admission = { admitService: async () => {}, admitPeers: async () => {} };
  return { store, config: new ServiceConfig(store, systemClock, replica, admission) };
}

const parts = { without: setup(false), with: setup(true) };
const perWriteUs: Record<'with' | 'without', number[]> = { with: [], without: [] };
let n = 0;
for (let r = 0; r < ROUNDS * 2; r++) {
  const which = r % 2 === 0 ? 'without' : 'with';
  const { config } = parts[which];
  const t0 = performance.now();
  for (let i = 0; i < WRITES; i++) config.update('svc', { bandwidth_limit_mbps: ++n }, ACTOR);
  perWriteUs[which].push(((performance.now() - t0) * 1000) / WRITES);
}
const events = parts.with.store.eventTable.lastSeq();
for (const p of Object.values(parts)) p.store.close();
for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
const w = median(perWriteUs.with);
const wo = median(perWriteUs.without);
process.stdout.write(
  [
    `one service update, WAL + FULL: without the log ${perWriteUs.without.map((x) => fmt(x)).join(' ')} µs; with it ${perWriteUs.with.map((x) => fmt(x)).join(' ')} µs`,
    `median ${fmt(wo)} vs ${fmt(w)} µs per write: throughput with the log ${fmt(wo / w, 3)} of without (${events} events recorded)`,
  ].join('\n') + '\n',
);
