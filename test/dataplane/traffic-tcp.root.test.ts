/** The data-plane traffic suite (traffic-suite.ts) with `tcp` services. */
import { trafficSuite } from './traffic-suite.js';

trafficSuite('tcp', 'mdpt', 41);
