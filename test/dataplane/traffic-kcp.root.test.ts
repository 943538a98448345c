/** The data-plane traffic suite (traffic-suite.ts) with `kcp` services: the whole suite again, with transport_type kcp. */
import { trafficSuite } from './traffic-suite.js';

trafficSuite('kcp', 'mdpk', 43);
