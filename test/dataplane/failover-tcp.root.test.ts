/** Failover between two exits, with tcp services (failover-suite.ts). */
import { failoverSuite } from './failover-suite.js';

failoverSuite('tcp');
