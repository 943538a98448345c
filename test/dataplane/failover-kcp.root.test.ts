/** Failover between two exits, with kcp services (failover-suite.ts). */
import { failoverSuite } from './failover-suite.js';

failoverSuite('kcp');
