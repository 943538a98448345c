import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { type ExitDestinations, ExitReach, lookupAddress } from './exit-reach.js';
import type { RouteAnswer } from './kernel/port.js';

const lan: RouteAnswer = { dev: 'lan0', gateway: null, prefix: '10.1.2.0/24', usable: true, operstate: 'UP' };
const uplink: RouteAnswer = {
  dev: 'eth0',
  gateway: '192.0.2.1',
  prefix: '0.0.0.0/0',
  usable: true,
  operstate: 'UP',
};
const LAN_SERVICE: ExitDestinations = { serviceId: 's1', destinations: [{ cidr: '10.1.2.0/24' }] };

const verdictOf = (reach: ExitReach, s: ExitDestinations, answers: (RouteAnswer | null)[]) =>
  reach.judge([s], answers).get(s.serviceId);

describe('ExitReach', () => {
  it('looks a host route up by itself, and a /31 by its network address', () => {
    assert.equal(lookupAddress('10.1.2.3/32'), '10.1.2.3');
    assert.equal(lookupAddress('10.1.2.2/31'), '10.1.2.2');
    assert.equal(lookupAddress('fd00::5/128'), 'fd00::5');
    assert.equal(lookupAddress('fd00::/64'), 'fd00::1');
  });

  it('asks for a catch-all by a unicast address it covers; 0.0.0.0/8 and ::/3 have none', () => {
    assert.equal(lookupAddress('0.0.0.0/0'), '1.0.0.1');
    assert.equal(lookupAddress('0.0.0.0/1'), '1.0.0.1');
    assert.equal(lookupAddress('0.0.0.0/8'), null);
    assert.equal(lookupAddress('::/0'), '2000::1');
    assert.equal(lookupAddress('::/3'), null);
    // Nothing to ask for: no query, and nothing that can fail.
    const reach = new ExitReach();
    const odd: ExitDestinations = { serviceId: 'z', destinations: [{ cidr: '0.0.0.0/8' }] };
    assert.deepEqual(reach.queries([odd]), []);
    assert.deepEqual(reach.judge([odd], []).get('z'), { canForward: true, detail: '' });
  });

  it('asks with the mark the exit gives its own traffic', () => {
    assert.deepEqual(new ExitReach(0x2000_0000).queries([LAN_SERVICE]), [
      { dst: '10.1.2.1', mark: 0x2000_0000 },
    ]);
  });

  it('asks for each destination by its first host (never IPv6 subnet-router anycast), from the service address', () => {
    const reach = new ExitReach();
    assert.deepEqual(
      reach.queries([
        { serviceId: 'a', destinations: [{ cidr: '10.1.2.0/24' }, { cidr: '0.0.0.0/0' }] },
        { serviceId: 'b', destinations: [{ cidr: 'fd00:1::/64', from: 'fd00:9::7' }] },
      ]),
      [{ dst: '10.1.2.1' }, { dst: '1.0.0.1' }, { dst: 'fd00:1::1', from: 'fd00:9::7' }],
    );
  });

  it('can forward through a usable device; not without a route or without carrier', () => {
    const reach = new ExitReach();
    assert.deepEqual(verdictOf(reach, LAN_SERVICE, [lan]), { canForward: true, detail: '' });
    assert.deepEqual(verdictOf(reach, LAN_SERVICE, [null]), {
      canForward: false,
      detail: 'no route toward 10.1.2.0/24',
    });
    assert.deepEqual(
      verdictOf(reach, LAN_SERVICE, [{ ...lan, usable: false, operstate: 'LOWERLAYERDOWN' }]),
      {
        canForward: false,
        detail: '10.1.2.0/24: lan0 is lowerlayerdown',
      },
    );
  });

  it('a LAN route gone, the lookup falling through to the default route, is no route; back is fine', () => {
    const reach = new ExitReach();
    assert.equal(verdictOf(reach, LAN_SERVICE, [lan])?.canForward, true);
    assert.deepEqual(verdictOf(reach, LAN_SERVICE, [uplink]), {
      canForward: false,
      detail: '10.1.2.0/24: its /24 route is gone, the kernel would use 0.0.0.0/0 via eth0',
    });
    assert.equal(verdictOf(reach, LAN_SERVICE, [uplink])?.canForward, false, 'for as long as it lasts');
    assert.equal(verdictOf(reach, LAN_SERVICE, [lan])?.canForward, true);
    // A more specific route than before is fine, and becomes the one to keep.
    const host = { ...lan, prefix: '10.1.2.0/25' };
    assert.equal(verdictOf(reach, LAN_SERVICE, [host])?.canForward, true);
    assert.equal(verdictOf(reach, LAN_SERVICE, [lan])?.canForward, false);
  });

  it('a destination first reached by the default route (to the internet) keeps it as its route', () => {
    const reach = new ExitReach();
    const web: ExitDestinations = { serviceId: 'w', destinations: [{ cidr: '198.51.100.0/24' }] };
    assert.equal(verdictOf(reach, web, [uplink])?.canForward, true);
    assert.equal(verdictOf(reach, web, [uplink])?.canForward, true);
  });

  it('forgets a destination whose route went, and a service no longer given', () => {
    const reach = new ExitReach();
    assert.equal(verdictOf(reach, LAN_SERVICE, [lan])?.canForward, true);
    // The route's destination changes and changes back: learnt afresh, default route included.
    const other: ExitDestinations = { serviceId: 's1', destinations: [{ cidr: '10.9.0.0/16' }] };
    assert.equal(verdictOf(reach, other, [uplink])?.canForward, true);
    assert.equal(verdictOf(reach, LAN_SERVICE, [uplink])?.canForward, true);
    assert.equal(reach.judge([], []).size, 0);
    assert.equal(verdictOf(reach, LAN_SERVICE, [uplink])?.canForward, true);
  });

  it('judges several services from one list of answers, each by its own', () => {
    const reach = new ExitReach();
    const two: ExitDestinations = {
      serviceId: 's2',
      destinations: [{ cidr: '10.3.0.0/16' }, { cidr: '10.1.2.0/24' }],
    };
    const verdicts = reach.judge([LAN_SERVICE, two], [lan, { ...lan, prefix: '10.3.0.0/16' }, null]);
    assert.equal(verdicts.get('s1')?.canForward, true);
    assert.deepEqual(verdicts.get('s2'), { canForward: false, detail: 'no route toward 10.1.2.0/24' });
  });
});
