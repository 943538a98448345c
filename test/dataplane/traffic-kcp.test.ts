/** The data-plane traffic suite (traffic-suite.ts) with `kcp` services: issue 8's "the whole data-plane test suite with transport_type kcp". */
import { trafficSuite } from './traffic-suite.js';

trafficSuite('kcp', 'mdpk', 43);
