import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import type { ClusterSecretRecord, PeerRecord, RouteRecord, ServiceRecord } from '../store/records.js';
import { hashClusterSecret, keyId } from './cluster-credential.js';
import { encodeStamp } from './hlc.js';
import { Identity } from './identity.js';
import { clusterRecord, credentialRecord, peerRecord, routeRecord, serviceRecord } from './replica.js';
import {
  DELETED_RANK,
  isWellFormed,
  keyOf,
  LIVE_RANK,
  liftToEpoch,
  makeVkey,
  PEER_RANK,
  parseVkey,
  splitKey,
  vkeyWall,
  type WireRecord,
} from './replicated-records.js';

const T = '2026-01-01T00:00:00.000Z';
const WALL = Date.parse(T);
const stamp = (counter = 0, origin = 'ab12') => encodeStamp({ wall: WALL, counter, origin });
const vk = (ordinal: number, epoch = 0) => makeVkey(epoch, ordinal, stamp());

const identity = new Identity(Identity.generatePem());

const peerRow = (over: Partial<PeerRecord> = {}): PeerRecord => ({
  id: identity.peerId,
  name: 'site-a',
  publicKey: identity.publicKeyBase64,
  address: '127.0.0.1:7000',
  isActive: true,
  version: 1,
  deactivatedAt: null,
  createdAt: T,
  updatedAt: T,
  vkey: vk(PEER_RANK.active),
  ...over,
});

const serviceRow = (over: Partial<ServiceRecord> = {}): ServiceRecord => ({
  id: '7c1b2a8e-27a4-4c55-8a31-6f0d1c1e2b3a',
  sourcePeerId: 'a'.repeat(32),
  targetPeerId: 'b'.repeat(32),
  transportType: 'tcp',
  requiresInterface: true,
  desiredIpv4Cidr: '10.1.0.1/24',
  desiredIpv6Cidr: null,
  fullyTransparent: false,
  bandwidthLimitMbps: 100,
  healthCheck: { tcp: '10.1.0.9:443', interval_ms: 1000, failures: 3 },
  version: 3,
  createdAt: T,
  updatedAt: T,
  vkey: vk(LIVE_RANK),
  createdStamp: stamp(),
  ...over,
});

const routeRow = (over: Partial<RouteRecord> = {}): RouteRecord => ({
  id: 4_503_599_627_370_497,
  serviceId: '7c1b2a8e-27a4-4c55-8a31-6f0d1c1e2b3a',
  priority: 10,
  sourceCidr: null,
  destCidr: '10.2.0.0/16',
  version: 1,
  createdAt: T,
  updatedAt: T,
  vkey: vk(LIVE_RANK),
  ...over,
});

const secret = (name: string, version: number, validUntil: string | null): ClusterSecretRecord => {
  const secretHash = hashClusterSecret(name);
  return {
    kid: keyId(secretHash),
    version,
    clientId: 'mcc_x',
    secretHash,
    rotatedBy: identity.peerId,
    rotatedAt: T,
    validUntil,
    replicated: true,
  };
};

const credential = (): WireRecord =>
  credentialRecord([secret('current', 3, null), secret('old', 2, '2026-01-02T00:00:00.000Z')], vk(3));

/** A copy of `r` with `body[field] = value`. */
const withField = (r: WireRecord, field: string, value: unknown): WireRecord => ({
  ...r,
  body: { ...r.body, [field]: value },
});

describe('isWellFormed accepts records built from real rows', { timeout: 30_000 }, () => {
  it('peer, active and inactive', () => {
    assert.equal(isWellFormed(peerRecord(peerRow())), true);
    const inactive = peerRow({ isActive: false, deactivatedAt: T, vkey: vk(PEER_RANK.inactive) });
    assert.equal(isWellFormed(peerRecord(inactive)), true);
  });

  it('service, with and without interface addresses, either transport', () => {
    assert.equal(isWellFormed(serviceRecord(serviceRow())), true);
    const plain = serviceRow({ requiresInterface: false, desiredIpv4Cidr: null, transportType: 'kcp' });
    assert.equal(isWellFormed(serviceRecord(plain)), true);
  });

  it('service with each kind of health_check, with none, and from an agent before the field', () => {
    const icmp = serviceRow({ healthCheck: { icmp: 'fd00::1', interval_ms: 100, failures: 10 } });
    assert.equal(isWellFormed(serviceRecord(icmp)), true);
    const none = serviceRecord(serviceRow({ healthCheck: null }));
    assert.equal(none.body!.health_check, null);
    assert.equal(isWellFormed(none), true);
    const { health_check: _absent, ...older } = none.body!;
    assert.equal(isWellFormed({ ...none, body: older }), true);
    // Defaults left out by the sender: well formed (the receiver fills them in).
    assert.equal(isWellFormed(withField(none, 'health_check', { tcp: '[fd00::1]:443' })), true);
  });

  it('route', () => {
    assert.equal(isWellFormed(routeRecord(routeRow())), true);
    assert.equal(isWellFormed(routeRecord(routeRow({ id: 1, sourceCidr: '::/0', destCidr: null }))), true);
  });

  it('cluster and credential', () => {
    assert.equal(isWellFormed(clusterRecord('0a7c5f4e-0000-4000-8000-000000000000', 'ab', vk(0))), true);
    assert.equal(isWellFormed(credential()), true);
    assert.equal(isWellFormed(credentialRecord([secret('only', 1, null)], makeVkey(0, 1, stamp()))), true);
  });

  it('tombstones of services, routes and peers at their ranks', () => {
    assert.equal(isWellFormed({ key: 'service/x', vkey: vk(DELETED_RANK), body: null }), true);
    assert.equal(isWellFormed({ key: 'route/12', vkey: vk(DELETED_RANK), body: null }), true);
    assert.equal(
      isWellFormed({ key: `peer/${identity.peerId}`, vkey: vk(PEER_RANK.removed), body: null }),
      true,
    );
  });

  it('records in any epoch (property)', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 0xffffff }),
        fc.integer({ min: 0, max: 16 ** 12 - 1 }),
        fc.integer({ min: 0, max: 16 ** 6 - 1 }),
        (epoch, wall, counter) => {
          const s = encodeStamp({ wall, counter, origin: 'ab' });
          assert.equal(
            isWellFormed(serviceRecord(serviceRow({ vkey: makeVkey(epoch, LIVE_RANK, s) }))),
            true,
          );
          assert.equal(
            isWellFormed({ key: 'route/1', vkey: makeVkey(epoch, DELETED_RANK, s), body: null }),
            true,
          );
        },
      ),
    );
  });
});

describe('isWellFormed refuses', { timeout: 30_000 }, () => {
  it('what is not a record', () => {
    for (const bad of [null, undefined, 'service/x', 42, [], {}, { key: 'service/x' }]) {
      assert.equal(isWellFormed(bad), false, JSON.stringify(bad));
    }
    const good = serviceRecord(serviceRow());
    assert.equal(isWellFormed({ ...good, key: 7 }), false);
    assert.equal(isWellFormed({ ...good, vkey: 7 }), false);
    assert.equal(isWellFormed({ ...good, body: undefined }), false);
    assert.equal(isWellFormed({ ...good, body: [] }), false);
    assert.equal(isWellFormed({ ...good, body: 'text' }), false);
  });

  it('a bad vkey', () => {
    const good = serviceRecord(serviceRow());
    const s = stamp();
    for (const vkey of [
      '',
      'garbage',
      `000000.00000000`,
      `000000.00000000.`,
      `00000.00000000.${s}`,
      `000000.0000000.${s}`,
      `00000G.00000000.${s}`,
      `000000.0000000A.${s}`,
      `000000.00000000.not-a-stamp`,
      `000000.00000000.${s.toUpperCase()}`,
      ` 000000.00000000.${s}`,
    ]) {
      assert.equal(isWellFormed({ ...good, vkey }), false, vkey);
    }
  });

  it('an unknown or malformed key', () => {
    const good = serviceRecord(serviceRow());
    for (const key of [
      'service',
      'service/',
      'services/x',
      'svc/x',
      '/x',
      `service/${'x'.repeat(129)}`,
      '',
    ]) {
      assert.equal(isWellFormed({ ...good, key }), false, key);
    }
    assert.equal(isWellFormed({ key: 'tombstone/x', vkey: vk(DELETED_RANK), body: null }), false);
  });

  it('a key whose id is not the body id', () => {
    const s = serviceRecord(serviceRow());
    assert.equal(isWellFormed({ ...s, key: 'service/other' }), false);
    const r = routeRecord(routeRow({ id: 5 }));
    assert.equal(isWellFormed({ ...r, key: 'route/6' }), false);
    assert.equal(isWellFormed({ ...r, key: 'route/05' }), false);
    const p = peerRecord(peerRow());
    assert.equal(isWellFormed({ ...p, key: `peer/${'c'.repeat(32)}` }), false);
    // A service body under a route key, and the other way round.
    assert.equal(isWellFormed({ ...s, key: 'route/5' }), false);
    assert.equal(isWellFormed({ ...r, key: `service/${routeRow().serviceId}` }), false);
  });

  it('a live record with a tombstone ordinal', () => {
    assert.equal(isWellFormed(serviceRecord(serviceRow({ vkey: vk(DELETED_RANK) }))), false);
    assert.equal(isWellFormed(routeRecord(routeRow({ vkey: vk(DELETED_RANK) }))), false);
    assert.equal(isWellFormed(peerRecord(peerRow({ vkey: vk(PEER_RANK.removed) }))), false);
    const inactive = { isActive: false, deactivatedAt: T };
    assert.equal(isWellFormed(peerRecord(peerRow({ ...inactive, vkey: vk(PEER_RANK.removed) }))), false);
    // Any other ordinal is just as wrong.
    assert.equal(isWellFormed(serviceRecord(serviceRow({ vkey: vk(7) }))), false);
  });

  it('a peer claiming the inactive rank while is_active is true, or the reverse', () => {
    assert.equal(isWellFormed(peerRecord(peerRow({ vkey: vk(PEER_RANK.inactive) }))), false);
    const inactiveActiveRank = peerRow({ isActive: false, deactivatedAt: T, vkey: vk(PEER_RANK.active) });
    assert.equal(isWellFormed(peerRecord(inactiveActiveRank)), false);
  });

  it('tombstones at a live rank', () => {
    assert.equal(isWellFormed({ key: 'service/x', vkey: vk(LIVE_RANK), body: null }), false);
    assert.equal(isWellFormed({ key: 'route/1', vkey: vk(LIVE_RANK), body: null }), false);
    assert.equal(isWellFormed({ key: 'service/x', vkey: vk(PEER_RANK.removed), body: null }), false);
    assert.equal(isWellFormed({ key: 'peer/x', vkey: vk(PEER_RANK.inactive), body: null }), false);
    assert.equal(isWellFormed({ key: 'peer/x', vkey: vk(DELETED_RANK), body: null }), false);
  });

  it('cluster and credential tombstones', () => {
    for (let ordinal = 0; ordinal < 4; ordinal++) {
      assert.equal(isWellFormed({ key: 'cluster', vkey: vk(ordinal), body: null }), false);
      assert.equal(isWellFormed({ key: 'credential', vkey: vk(ordinal), body: null }), false);
    }
  });

  it('a cluster record at an ordinal other than 0', () => {
    assert.equal(isWellFormed(clusterRecord('c', 'ab', vk(1))), false);
  });

  it('a credential whose ordinal is not its version', () => {
    const good = credential();
    assert.equal(isWellFormed({ ...good, vkey: vk(2) }), false);
    assert.equal(isWellFormed({ ...good, vkey: vk(4) }), false);
    assert.equal(isWellFormed({ ...good, vkey: vk(0) }), false);
  });

  it('a malformed credential', () => {
    const good = credential();
    const body = good.body as { current: Record<string, unknown>; previous: Record<string, unknown>[] };
    const bad = (b: unknown) => isWellFormed({ ...good, body: b });
    assert.equal(
      bad({ ...body, current: { ...body.current, valid_until: T } }),
      false,
      'current with an end',
    );
    assert.equal(bad({ ...body, current: { ...body.current, key: 'c2hvcnQ=' } }), false, 'key not 32 bytes');
    assert.equal(bad({ ...body, previous: 'none' }), false, 'previous not an array');
    assert.equal(bad({ current: body.current }), false, 'previous missing');
    assert.equal(
      bad({ ...body, previous: [{ ...body.previous[0], version: -1 }] }),
      false,
      'previous malformed',
    );
    assert.equal(bad({ ...body, previous: Array(17).fill(body.previous[0]) }), false, 'too many previous');
    assert.equal(bad({ ...body, previous: Array(16).fill(body.previous[0]) }), true, '16 previous');
    for (const field of ['client_id', 'version', 'key', 'rotated_by', 'rotated_at', 'valid_until']) {
      assert.equal(bad({ ...body, current: { ...body.current, [field]: 12.5 } }), false, field);
    }
  });

  it('a malformed cluster record', () => {
    const good = clusterRecord('c', 'ab', vk(0));
    assert.equal(isWellFormed(withField(good, 'cluster_id', 1)), false);
    assert.equal(isWellFormed(withField(good, 'created_by', null)), false);
  });

  // For each field: values that must be refused there.
  const badValues: Record<string, Record<string, unknown[]>> = {
    peer: {
      id: [undefined, 1, null],
      name: [undefined, null, 1, 'x'.repeat(1025)],
      public_key: [undefined, null, 5],
      address: [undefined, null, {}],
      is_active: [undefined, 'true', 1, null],
      version: [undefined, -1, 1.5, '1', Number.MAX_SAFE_INTEGER + 1],
      deactivated_at: [undefined, 'yesterday', 0],
      created_at: [undefined, null, 'not a time', 1],
      updated_at: [undefined, null, 'not a time'],
    },
    service: {
      id: [undefined, null, 7],
      source_peer_id: [undefined, null, 1],
      target_peer_id: [undefined, null, 1],
      transport_type: [undefined, 'udp', 'TCP', null],
      requires_interface: [undefined, 'yes', 0],
      desired_ipv4_cidr: [undefined, 10, false],
      desired_ipv6_cidr: [undefined, 6, true],
      fully_transparent: [undefined, null, 'no'],
      bandwidth_limit_mbps: [undefined, -1, 0.5, '100', null],
      health_check: [
        {},
        'tcp:10.1.0.9:443',
        [],
        false,
        { tcp: '10.1.0.9:443', icmp: '10.1.0.9' },
        { tcp: 'exit.example:443' },
        { icmp: '10.1.0.9', failures: 0 },
        { icmp: '10.1.0.9', interval_ms: 10 },
      ],
      version: [undefined, -1, 2.5],
      created_at: [undefined, 'soon'],
      updated_at: [undefined, 'soon', null],
    },
    route: {
      id: [undefined, 0, -3, 1.5, '4503599627370497'],
      service_id: [undefined, null, 1],
      priority: [undefined, -1, 65536, 1.5, '10'],
      source_cidr: [undefined, 1],
      dest_cidr: [undefined, {}],
      version: [undefined, -1, 0.1],
      created_at: [undefined, 'never'],
      updated_at: [undefined, 'never'],
    },
  };
  const goods: Record<string, WireRecord> = {
    peer: peerRecord(peerRow()),
    service: serviceRecord(serviceRow()),
    route: routeRecord(routeRow()),
  };

  for (const [kind, fields] of Object.entries(badValues)) {
    it(`a ${kind} body with a malformed field`, () => {
      const good = goods[kind]!;
      assert.equal(isWellFormed(good), true);
      for (const [field, values] of Object.entries(fields)) {
        for (const value of values) {
          const r = withField(good, field, value);
          // Changing the id would also break the key match; keep the key in step where it can be.
          if (field === 'id' && (typeof value === 'string' || typeof value === 'number')) {
            r.key = `${kind}/${value}`;
          }
          assert.equal(isWellFormed(r), false, `${kind}.${field} = ${JSON.stringify(value)}`);
        }
      }
    });
  }

  it('any single field replaced by a value of the wrong type (property)', () => {
    const kinds = Object.keys(goods);
    fc.assert(
      fc.property(
        fc.constantFrom(...kinds),
        fc.nat(),
        fc.oneof(fc.constant(undefined), fc.object(), fc.array(fc.nat()), fc.constant(Number.NaN)),
        (kind, pick, value) => {
          const good = goods[kind]!;
          const fields = Object.keys(good.body!);
          const field = fields[pick % fields.length]!;
          // Optional: agents that predate it send none.
          if (field === 'health_check' && value === undefined) return;
          assert.equal(isWellFormed(withField(good, field, value)), false, `${kind}.${field}`);
        },
      ),
    );
  });
});

describe('vkeys and keys', { timeout: 30_000 }, () => {
  it('makeVkey and parseVkey round-trip', () => {
    const s = stamp(5, 'ff');
    assert.deepEqual(parseVkey(makeVkey(3, 2, s)), { epoch: 3, ordinal: 2, stamp: s });
    assert.equal(vkeyWall(makeVkey(3, 2, s)), WALL);
    assert.equal(vkeyWall('garbage'), 0);
  });

  it('epoch beats ordinal beats stamp in string order (property)', () => {
    const part = fc.record({
      epoch: fc.integer({ min: 0, max: 0xffffff }),
      ordinal: fc.integer({ min: 0, max: 0xffffffff }),
      wall: fc.integer({ min: 0, max: 16 ** 12 - 1 }),
      counter: fc.integer({ min: 0, max: 16 ** 6 - 1 }),
      origin: fc.stringMatching(/^[0-9a-f]{32}$/),
    });
    fc.assert(
      fc.property(part, part, (a, b) => {
        const key = (p: typeof a) => makeVkey(p.epoch, p.ordinal, encodeStamp(p));
        const tuple = (p: typeof a) => [p.epoch, p.ordinal, p.wall, p.counter] as const;
        const ta = tuple(a);
        const tb = tuple(b);
        let expected = 0;
        for (let i = 0; i < ta.length && expected === 0; i++) expected = Math.sign(ta[i]! - tb[i]!);
        if (expected === 0) expected = a.origin < b.origin ? -1 : a.origin > b.origin ? 1 : 0;
        const ka = key(a);
        const kb = key(b);
        assert.equal(ka < kb ? -1 : ka > kb ? 1 : 0, expected);
      }),
    );
  });

  it('liftToEpoch keeps ordinal and stamp', () => {
    const r = clusterRecord('c', 'ab', makeVkey(0, 0, stamp(9)));
    const lifted = liftToEpoch(r, 5);
    assert.deepEqual(parseVkey(lifted.vkey), { epoch: 5, ordinal: 0, stamp: stamp(9) });
    assert.deepEqual(lifted.body, r.body);
    assert.ok(lifted.vkey > r.vkey);
  });

  it('splitKey and keyOf agree', () => {
    assert.deepEqual(splitKey(keyOf('service', 'abc')), { kind: 'service', id: 'abc' });
    assert.deepEqual(splitKey(keyOf('route', 12)), { kind: 'route', id: '12' });
    assert.deepEqual(splitKey(keyOf('cluster')), { kind: 'cluster', id: '' });
    assert.deepEqual(splitKey('credential'), { kind: 'credential', id: '' });
    assert.equal(splitKey('cluster/x'), undefined);
  });
});
