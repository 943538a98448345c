/**
 * Services over real HTTP (API document, Services; docs/decisions.md §3, §5, §6): create with defaults
 * and with every field, the exact field sets of the create, list and single forms, the list
 * filters, every documented error row, the transparent-mode rules, PUT (only given fields
 * change; fixed fields), DELETE with its cascade, and the validation order 401 → 403 → 400 →
 * 404 → 409/422. Three agents joined into one cluster; every service call goes to the first.
 */
import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, it } from 'node:test';
import { assertError } from '../helpers/api-assertions.js';
import { makeVendor } from '../helpers/licenses.js';
import { type Node, scopedToken, startNode } from '../helpers/nodes.js';

const TIMESTAMP = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const UNKNOWN_ID = '00000000-0000-4000-8000-000000000000';

const CREATE_FIELDS = [
  'created_at',
  'id',
  'requires_interface',
  'source_peer_id',
  'target_peer_id',
  'transport_type',
];
const COMMON_FIELDS = [
  'bandwidth_limit_mbps',
  'created_at',
  'fully_transparent',
  'id',
  'interface_ipv4_cidr',
  'interface_ipv6_cidr',
  'requires_interface',
  'source_peer_id',
  'target_peer_id',
  'transport_type',
  // extra fields of docs/decisions.md §5/§7
  'health_check',
  'is_active',
  'version',
];
const LIST_FIELDS = [...COMMON_FIELDS, 'route_count'].sort();
const SINGLE_FIELDS = [...COMMON_FIELDS, 'routes'].sort();
const SINGLE_ROUTE_FIELDS = ['dest_cidr', 'id', 'priority', 'source_cidr'];

const keys = (o: object) => Object.keys(o).sort();

describe('services API', () => {
  const vendor = makeVendor();
  let a: Node;
  let b: Node;
  let c: Node;
  let readToken: string;
  let writeToken: string;

  const api = () => a.agent.client;
  const create = (json: unknown, token = a.token) => api().post('/v1/services', { token, json });
  const getOne = (id: string) => api().get(`/v1/services/${id}`, { token: a.token });
  const list = async (query = '') => {
    const res = await api().get(`/v1/services${query}`, { token: a.token });
    assert.equal(res.status, 200, res.text);
    return res.body as Record<string, unknown>[];
  };
  const created = async (json: unknown): Promise<string> => {
    const res = await create(json);
    assert.equal(res.status, 201, res.text);
    return res.body.id as string;
  };

  before(async () => {
    // max_services 2 with three peers: the limit is reachable with distinct (source, target) pairs.
    [a, b, c] = await Promise.all([
      startNode(vendor, { max_services: 2 }),
      startNode(vendor, { max_services: 2 }),
      startNode(vendor, { max_services: 2 }),
    ]);
    for (const other of [b, c]) {
      const res = await api().post('/v1/peers', {
        token: a.token,
        json: { address: `127.0.0.1:${other.agent.port}` },
      });
      assert.equal(res.status, 201, res.text);
    }
    [readToken, writeToken] = await Promise.all([
      scopedToken(a, 'services.read'),
      scopedToken(a, 'services.write'),
    ]);
  });

  after(async () => {
    for (const n of [a, b, c]) if (n) assert.equal(await n.agent.stop(), 0);
  });

  // Every test starts with no service, so the license limit of 2 never gets in the way.
  beforeEach(async () => {
    for (const s of await list()) {
      const res = await api().delete(`/v1/services/${s.id}`, { token: a.token });
      assert.equal(res.status, 200, res.text);
    }
  });

  describe('create', () => {
    it('creates with the target only: source = local peer, tcp, no interface, not transparent, 0 Mbps', async () => {
      const before = Date.now();
      const res = await create({ target_peer_id: b.peerId });
      assert.equal(res.status, 201, res.text);
      assert.deepEqual(keys(res.body), CREATE_FIELDS);
      assert.equal(typeof res.body.id, 'string');
      assert.ok(res.body.id.length > 0);
      assert.equal(res.body.source_peer_id, a.peerId);
      assert.equal(res.body.target_peer_id, b.peerId);
      assert.equal(res.body.transport_type, 'tcp');
      assert.equal(res.body.requires_interface, false);
      assert.match(res.body.created_at, TIMESTAMP);
      const t = Date.parse(res.body.created_at);
      assert.ok(t >= before - 1000 && t <= Date.now() + 1000, 'created_at is now');

      const one = await getOne(res.body.id);
      assert.equal(one.status, 200, one.text);
      assert.deepEqual(one.body, {
        id: res.body.id,
        source_peer_id: a.peerId,
        target_peer_id: b.peerId,
        transport_type: 'tcp',
        requires_interface: false,
        interface_ipv4_cidr: null,
        interface_ipv6_cidr: null,
        fully_transparent: false,
        bandwidth_limit_mbps: 0,
        health_check: null,
        created_at: res.body.created_at,
        is_active: true,
        version: 1,
        routes: [],
      });
    });

    it('creates with every field given; interface addresses are reported in canonical form', async () => {
      const res = await create({
        source_peer_id: b.peerId,
        target_peer_id: c.peerId,
        transport_type: 'tcp',
        requires_interface: true,
        desired_ipv4_cidr: '192.0.2.10/24',
        desired_ipv6_cidr: '2001:DB8:0:0::10/64',
        fully_transparent: true,
        bandwidth_limit_mbps: 250,
      });
      assert.equal(res.status, 201, res.text);
      assert.deepEqual(keys(res.body), CREATE_FIELDS);
      assert.equal(res.body.source_peer_id, b.peerId);
      assert.equal(res.body.target_peer_id, c.peerId);
      assert.equal(res.body.transport_type, 'tcp');
      assert.equal(res.body.requires_interface, true);
      const one = (await getOne(res.body.id)).body;
      assert.equal(one.interface_ipv4_cidr, '192.0.2.10/24');
      assert.equal(one.interface_ipv6_cidr, '2001:db8::10/64');
      assert.equal(one.fully_transparent, true);
      assert.equal(one.bandwidth_limit_mbps, 250);

      const kcp = await create({
        target_peer_id: c.peerId,
        transport_type: 'kcp',
        requires_interface: true,
        desired_ipv4_cidr: '198.51.100.7/25',
        fully_transparent: false,
        bandwidth_limit_mbps: 1,
      });
      assert.equal(kcp.status, 201, kcp.text);
      assert.equal(kcp.body.transport_type, 'kcp');
      assert.equal(kcp.body.source_peer_id, a.peerId);
      const k = (await getOne(kcp.body.id)).body;
      assert.equal(k.interface_ipv4_cidr, '198.51.100.7/25');
      assert.equal(k.interface_ipv6_cidr, null);
      assert.equal(k.bandwidth_limit_mbps, 1);
    });

    it('refuses a malformed body: 400 INVALID_REQUEST, and creates nothing', async () => {
      const t = b.peerId;
      const cases: [string, unknown][] = [
        ['missing target_peer_id', {}],
        ['missing target_peer_id with other fields', { transport_type: 'tcp', requires_interface: false }],
        ['target_peer_id a number', { target_peer_id: 5 }],
        ['target_peer_id null', { target_peer_id: null }],
        ['target_peer_id empty', { target_peer_id: '' }],
        ['source_peer_id a number', { target_peer_id: t, source_peer_id: 7 }],
        ['requires_interface a string', { target_peer_id: t, requires_interface: 'true' }],
        ['fully_transparent a number', { target_peer_id: t, fully_transparent: 1 }],
        ['bandwidth -1', { target_peer_id: t, bandwidth_limit_mbps: -1 }],
        ['bandwidth 1.5', { target_peer_id: t, bandwidth_limit_mbps: 1.5 }],
        ['bandwidth "1"', { target_peer_id: t, bandwidth_limit_mbps: '1' }],
        ['bandwidth null', { target_peer_id: t, bandwidth_limit_mbps: null }],
        ['source = target', { source_peer_id: b.peerId, target_peer_id: b.peerId }],
        ['target = the local peer, source defaulted to it', { target_peer_id: a.peerId }],
        [
          'desired_ipv4_cidr without requires_interface',
          { target_peer_id: t, desired_ipv4_cidr: '192.0.2.1/24' },
        ],
        [
          'desired_ipv6_cidr with requires_interface false',
          { target_peer_id: t, requires_interface: false, desired_ipv6_cidr: '2001:db8::1/64' },
        ],
        [
          'desired_ipv4_cidr holding an IPv6 address',
          { target_peer_id: t, requires_interface: true, desired_ipv4_cidr: '2001:db8::1/64' },
        ],
        [
          'desired_ipv6_cidr holding an IPv4 address',
          { target_peer_id: t, requires_interface: true, desired_ipv6_cidr: '192.0.2.1/24' },
        ],
        [
          'desired_ipv4_cidr without a prefix',
          { target_peer_id: t, requires_interface: true, desired_ipv4_cidr: '192.0.2.1' },
        ],
        ['desired_ipv4_cidr a number', { target_peer_id: t, requires_interface: true, desired_ipv4_cidr: 5 }],
        ['a JSON array', [{ target_peer_id: t }]],
        ['a JSON string', 'target'],
      ];
      for (const [what, body] of cases) assertError(await create(body), 400, 'INVALID_REQUEST', what);
      const notJson = await api().post('/v1/services', {
        token: a.token,
        body: '{"target_peer_id":',
        headers: { 'content-type': 'application/json' },
      });
      assertError(notJson, 400, 'INVALID_REQUEST', 'not JSON');
      assert.deepEqual(await list(), []);
    });

    it('refuses a transport other than tcp or kcp: 400 INVALID_TRANSPORT', async () => {
      for (const transport_type of ['udp', 'TCP', 'Kcp', '', ' tcp', 5, null, true]) {
        const res = await create({ target_peer_id: b.peerId, transport_type });
        assertError(res, 400, 'INVALID_TRANSPORT', JSON.stringify(transport_type));
      }
      assert.deepEqual(await list(), []);
    });

    it('refuses an unknown target peer and an unknown source peer: 404 NOT_FOUND', async () => {
      assertError(await create({ target_peer_id: 'no-such-peer' }), 404, 'NOT_FOUND', 'unknown target');
      assertError(
        await create({ source_peer_id: 'no-such-peer', target_peer_id: b.peerId }),
        404,
        'NOT_FOUND',
        'unknown source',
      );
      assertError(
        await create({ source_peer_id: 'no-such-peer', target_peer_id: 'no-such-either' }),
        404,
        'NOT_FOUND',
        'both unknown',
      );
      assert.deepEqual(await list(), []);
    });

    it('refuses a second service for the same pair: 409 ALREADY_EXISTS; the reverse pair is allowed', async () => {
      const first = await created({ target_peer_id: b.peerId });
      // The same pair however it is spelled, and whatever the other fields.
      for (const body of [
        { target_peer_id: b.peerId },
        { source_peer_id: a.peerId, target_peer_id: b.peerId, transport_type: 'kcp' },
        { target_peer_id: b.peerId, requires_interface: true, bandwidth_limit_mbps: 9 },
      ]) {
        assertError(await create(body), 409, 'ALREADY_EXISTS', JSON.stringify(body));
      }
      const reverse = await create({ source_peer_id: b.peerId, target_peer_id: a.peerId });
      assert.equal(reverse.status, 201, reverse.text);
      assert.deepEqual(
        (await list()).map((s) => s.id),
        [first, reverse.body.id],
      );
      // The original is untouched by the refused attempts.
      const one = (await getOne(first)).body;
      assert.equal(one.transport_type, 'tcp');
      assert.equal(one.version, 1);
    });

    it('refuses a service beyond max_services: 422 SERVICE_LIMIT_EXCEEDED; room again after a delete', async () => {
      const first = await created({ target_peer_id: b.peerId });
      await created({ target_peer_id: c.peerId });
      const third = await create({ source_peer_id: b.peerId, target_peer_id: c.peerId });
      assertError(third, 422, 'SERVICE_LIMIT_EXCEEDED', 'third service');
      assert.equal((await list()).length, 2);
      // At the limit, an existing pair is still the more specific 409; a bad body still 400.
      assertError(await create({ target_peer_id: b.peerId }), 409, 'ALREADY_EXISTS', 'duplicate at limit');
      assertError(
        await create({ source_peer_id: b.peerId, target_peer_id: c.peerId, transport_type: 'udp' }),
        400,
        'INVALID_TRANSPORT',
        'bad body at limit',
      );
      assert.equal((await api().delete(`/v1/services/${first}`, { token: a.token })).status, 200);
      const again = await create({ source_peer_id: b.peerId, target_peer_id: c.peerId });
      assert.equal(again.status, 201, again.text);
    });

    it('refuses each invalid transparent combination on create: 400 INVALID_REQUEST', async () => {
      const t = b.peerId;
      const cases: [string, unknown][] = [
        [
          'kcp + transparent',
          { target_peer_id: t, transport_type: 'kcp', requires_interface: true, fully_transparent: true },
        ],
        [
          'requires_interface false + transparent',
          { target_peer_id: t, requires_interface: false, fully_transparent: true },
        ],
        ['requires_interface absent + transparent', { target_peer_id: t, fully_transparent: true }],
        [
          'kcp, no interface, transparent',
          { target_peer_id: t, transport_type: 'kcp', fully_transparent: true },
        ],
      ];
      for (const [what, body] of cases) assertError(await create(body), 400, 'INVALID_REQUEST', what);
      assert.deepEqual(await list(), []);
      // The valid combination: tcp (given or defaulted) with an interface.
      const ok = await create({ target_peer_id: t, requires_interface: true, fully_transparent: true });
      assert.equal(ok.status, 201, ok.text);
      assert.equal(ok.body.transport_type, 'tcp');
    });
  });

  describe('read', () => {
    it('list form: exactly the documented fields (+ is_active, version), route_count correct', async () => {
      const withRoutes = await created({
        target_peer_id: b.peerId,
        requires_interface: true,
        desired_ipv6_cidr: '2001:db8::5/64',
      });
      const withoutRoutes = await created({ source_peer_id: b.peerId, target_peer_id: c.peerId });
      const added = await api().post(`/v1/services/${withRoutes}/routes`, {
        token: a.token,
        json: {
          routes: [
            { priority: 1, dest_cidr: '10.0.0.0/8' },
            { priority: 2, source_cidr: '192.168.0.0/16' },
            { priority: 3, source_cidr: '2001:db8::/32', dest_cidr: '2001:db8:1::/48' },
          ],
        },
      });
      assert.equal(added.status, 201, added.text);
      const items = await list();
      assert.equal(items.length, 2);
      for (const item of items) {
        assert.deepEqual(keys(item), LIST_FIELDS);
        assert.match(item.created_at as string, TIMESTAMP);
        assert.equal(item.is_active, true);
        assert.equal(item.version, 1);
      }
      const byId = new Map(items.map((s) => [s.id, s]));
      assert.equal(byId.get(withRoutes)?.route_count, 3);
      assert.equal(byId.get(withRoutes)?.interface_ipv4_cidr, null);
      assert.equal(byId.get(withRoutes)?.interface_ipv6_cidr, '2001:db8::5/64');
      assert.equal(byId.get(withoutRoutes)?.route_count, 0);
      assert.equal(byId.get(withoutRoutes)?.source_peer_id, b.peerId);
      // route_count follows deletes.
      const routeId = added.body.route_ids[0];
      await api().delete(`/v1/services/${withRoutes}/routes/${routeId}`, { token: a.token });
      assert.equal((await list()).find((s) => s.id === withRoutes)?.route_count, 2);
    });

    it('single form: the list fields with routes (id, priority, source_cidr, dest_cidr) instead of route_count', async () => {
      const id = await created({ target_peer_id: b.peerId });
      const added = await api().post(`/v1/services/${id}/routes`, {
        token: a.token,
        json: {
          routes: [
            { priority: 10, source_cidr: '10.1.0.0/16', dest_cidr: '10.2.0.0/16' },
            { priority: 20, dest_cidr: '2001:db8::/32' },
          ],
        },
      });
      assert.equal(added.status, 201, added.text);
      const res = await getOne(id);
      assert.equal(res.status, 200, res.text);
      assert.deepEqual(keys(res.body), SINGLE_FIELDS);
      assert.ok(!('route_count' in res.body));
      assert.equal(res.body.routes.length, 2);
      for (const r of res.body.routes) {
        assert.deepEqual(keys(r), SINGLE_ROUTE_FIELDS);
        assert.ok(Number.isInteger(r.id));
      }
      const byPriority = [...res.body.routes].sort((x, y) => x.priority - y.priority);
      assert.deepEqual(byPriority, [
        { id: added.body.route_ids[0], priority: 10, source_cidr: '10.1.0.0/16', dest_cidr: '10.2.0.0/16' },
        { id: added.body.route_ids[1], priority: 20, source_cidr: null, dest_cidr: '2001:db8::/32' },
      ]);
      // The single form agrees with the list form on every shared field.
      const { route_count, ...fromList } = (await list()).find((s) => s.id === id)!;
      const { routes, ...fromSingle } = res.body;
      assert.equal(route_count, routes.length);
      assert.deepEqual(fromSingle, fromList);
    });

    it('filters the list by source_peer_id, target_peer_id and requires_interface, alone and combined', async () => {
      const s1 = await created({ target_peer_id: b.peerId, requires_interface: true });
      const s2 = await created({ source_peer_id: b.peerId, target_peer_id: c.peerId });
      const ids = async (query: string) => (await list(query)).map((s) => s.id).sort();
      const cases: [string, string[]][] = [
        ['', [s1, s2]],
        [`?source_peer_id=${a.peerId}`, [s1]],
        [`?source_peer_id=${b.peerId}`, [s2]],
        [`?source_peer_id=${c.peerId}`, []],
        [`?target_peer_id=${b.peerId}`, [s1]],
        [`?target_peer_id=${c.peerId}`, [s2]],
        [`?target_peer_id=${a.peerId}`, []],
        ['?requires_interface=true', [s1]],
        ['?requires_interface=false', [s2]],
        ['?source_peer_id=unknown-peer', []],
        [`?source_peer_id=${b.peerId}&target_peer_id=${c.peerId}`, [s2]],
        [`?source_peer_id=${a.peerId}&target_peer_id=${c.peerId}`, []],
        [`?source_peer_id=${a.peerId}&requires_interface=true`, [s1]],
        [`?source_peer_id=${a.peerId}&requires_interface=false`, []],
        [`?target_peer_id=${c.peerId}&requires_interface=false`, [s2]],
        [`?source_peer_id=${a.peerId}&target_peer_id=${b.peerId}&requires_interface=true`, [s1]],
        [`?source_peer_id=${a.peerId}&target_peer_id=${b.peerId}&requires_interface=false`, []],
      ];
      for (const [query, expected] of cases) assert.deepEqual(await ids(query), [...expected].sort(), query);
    });

    it('refuses a requires_interface filter that is not true or false: 400 INVALID_REQUEST', async () => {
      for (const value of ['maybe', 'yes', 'TRUE1', '2']) {
        const res = await api().get(`/v1/services?requires_interface=${value}`, { token: a.token });
        assertError(res, 400, 'INVALID_REQUEST', value);
      }
    });

    it('GET, PUT and DELETE of an unknown service: 404 NOT_FOUND', async () => {
      assertError(await getOne(UNKNOWN_ID), 404, 'NOT_FOUND', 'GET');
      assertError(
        await api().put(`/v1/services/${UNKNOWN_ID}`, { token: a.token, json: { bandwidth_limit_mbps: 5 } }),
        404,
        'NOT_FOUND',
        'PUT',
      );
      assertError(
        await api().put(`/v1/services/${UNKNOWN_ID}`, { token: a.token, json: {} }),
        404,
        'NOT_FOUND',
        'PUT {}',
      );
      assertError(
        await api().delete(`/v1/services/${UNKNOWN_ID}`, { token: a.token }),
        404,
        'NOT_FOUND',
        'DELETE',
      );
      assertError(
        await api().get(`/v1/services/${UNKNOWN_ID}/routes`, { token: a.token }),
        404,
        'NOT_FOUND',
        'GET routes',
      );
    });
  });

  describe('update', () => {
    it('changes only the given fields, answers with the single form, and raises version', async () => {
      const id = await created({
        target_peer_id: b.peerId,
        requires_interface: true,
        desired_ipv4_cidr: '192.0.2.10/24',
        bandwidth_limit_mbps: 10,
      });
      await api().post(`/v1/services/${id}/routes`, {
        token: a.token,
        json: { routes: [{ priority: 5, dest_cidr: '10.0.0.0/8' }] },
      });
      const original = (await getOne(id)).body;

      const bw = await put(id, { bandwidth_limit_mbps: 50 });
      assert.equal(bw.status, 200, bw.text);
      assert.deepEqual(keys(bw.body), SINGLE_FIELDS);
      assert.deepEqual(bw.body, { ...original, bandwidth_limit_mbps: 50, version: 2 });
      assert.deepEqual((await getOne(id)).body, bw.body, 'GET shows what PUT answered');

      const v6 = await put(id, { desired_ipv6_cidr: '2001:DB8::7/64' });
      assert.equal(v6.status, 200, v6.text);
      assert.deepEqual(v6.body, { ...bw.body, interface_ipv6_cidr: '2001:db8::7/64', version: 3 });

      const v4 = await put(id, { desired_ipv4_cidr: '198.51.100.1/25' });
      assert.deepEqual(v4.body, { ...v6.body, interface_ipv4_cidr: '198.51.100.1/25', version: 4 });

      const cleared = await put(id, { desired_ipv4_cidr: null });
      assert.equal(cleared.status, 200, cleared.text);
      assert.deepEqual(cleared.body, { ...v4.body, interface_ipv4_cidr: null, version: 5 });

      // Unknown extra fields are ignored; documented fields still apply.
      const extra = await put(id, { bandwidth_limit_mbps: 0, colour: 'blue' });
      assert.equal(extra.status, 200, extra.text);
      assert.equal(extra.body.bandwidth_limit_mbps, 0);
      assert.ok(!('colour' in extra.body));

      // Turning the interface off clears its addresses.
      const off = await put(id, { requires_interface: false });
      assert.equal(off.status, 200, off.text);
      assert.equal(off.body.requires_interface, false);
      assert.equal(off.body.interface_ipv4_cidr, null);
      assert.equal(off.body.interface_ipv6_cidr, null);
      assert.ok(off.body.version > extra.body.version);
      // Everything else as created.
      for (const f of [
        'id',
        'source_peer_id',
        'target_peer_id',
        'transport_type',
        'fully_transparent',
        'created_at',
        'routes',
      ]) {
        assert.deepEqual(off.body[f], original[f], f);
      }

      // And on again, with an address in the same request.
      const on = await put(id, { requires_interface: true, desired_ipv4_cidr: '192.0.2.99/24' });
      assert.equal(on.status, 200, on.text);
      assert.equal(on.body.interface_ipv4_cidr, '192.0.2.99/24');
      assert.equal(on.body.interface_ipv6_cidr, null);
    });

    it('refuses interface addresses without an interface and malformed values: 400, nothing changes', async () => {
      const id = await created({ target_peer_id: b.peerId });
      const cases: [string, unknown][] = [
        ['ipv4 on a service without interface', { desired_ipv4_cidr: '192.0.2.1/24' }],
        ['ipv6 on a service without interface', { desired_ipv6_cidr: '2001:db8::1/64' }],
        [
          'ipv4 with requires_interface false',
          { requires_interface: false, desired_ipv4_cidr: '192.0.2.1/24' },
        ],
        ['ipv4 holding IPv6', { requires_interface: true, desired_ipv4_cidr: '2001:db8::1/64' }],
        ['garbage address', { requires_interface: true, desired_ipv6_cidr: 'garbage' }],
        ['bandwidth -1', { bandwidth_limit_mbps: -1 }],
        ['bandwidth 1.5', { bandwidth_limit_mbps: 1.5 }],
        ['bandwidth "1"', { bandwidth_limit_mbps: '1' }],
        ['requires_interface a string', { requires_interface: 'yes' }],
        ['a JSON array', []],
      ];
      for (const [what, body] of cases) assertError(await put(id, body), 400, 'INVALID_REQUEST', what);
      const after = (await getOne(id)).body;
      assert.equal(after.version, 1);
      assert.equal(after.requires_interface, false);
      assert.equal(after.bandwidth_limit_mbps, 0);
    });

    it('refuses requires_interface false on a transparent service: 400 INVALID_REQUEST, nothing changes', async () => {
      const id = await created({
        target_peer_id: b.peerId,
        requires_interface: true,
        fully_transparent: true,
        desired_ipv4_cidr: '192.0.2.10/24',
      });
      assertError(await put(id, { requires_interface: false }), 400, 'INVALID_REQUEST', 'interface off');
      assertError(
        await put(id, { requires_interface: false, fully_transparent: false }),
        400,
        'INVALID_REQUEST',
        'interface and transparency off',
      );
      const after = (await getOne(id)).body;
      assert.equal(after.requires_interface, true);
      assert.equal(after.fully_transparent, true);
      assert.equal(after.interface_ipv4_cidr, '192.0.2.10/24');
      assert.equal(after.version, 1);
      // requires_interface true again is no change of rule: allowed.
      assert.equal((await put(id, { requires_interface: true })).status, 200);
    });

    it('refuses another value for a field fixed at creation: 400; the same value is accepted', async () => {
      const id = await created({ target_peer_id: b.peerId, transport_type: 'tcp' });
      const refused: [string, unknown][] = [
        ['transport_type', 'kcp'],
        ['transport_type', 'udp'],
        ['fully_transparent', true],
        ['source_peer_id', c.peerId],
        ['target_peer_id', c.peerId],
      ];
      for (const [field, value] of refused) {
        // A transport other than tcp or kcp is INVALID_TRANSPORT, as on create; a valid but
        // different one is refused as a change of a fixed field.
        const code = value === 'udp' ? 'INVALID_TRANSPORT' : 'INVALID_REQUEST';
        assertError(await put(id, { [field]: value }), 400, code, `${field}=${value}`);
        // Combined with an allowed change, the whole request is refused.
        assertError(
          await put(id, { bandwidth_limit_mbps: 77, [field]: value }),
          400,
          code,
          `${field}=${value} with bandwidth`,
        );
      }
      let one = (await getOne(id)).body;
      assert.equal(one.version, 1);
      assert.equal(one.bandwidth_limit_mbps, 0);
      assert.equal(one.transport_type, 'tcp');
      assert.equal(one.target_peer_id, b.peerId);

      const same = await put(id, {
        transport_type: 'tcp',
        fully_transparent: false,
        source_peer_id: a.peerId,
        target_peer_id: b.peerId,
        bandwidth_limit_mbps: 3,
      });
      assert.equal(same.status, 200, same.text);
      assert.equal(same.body.bandwidth_limit_mbps, 3);
      one = (await getOne(id)).body;
      assert.equal(one.transport_type, 'tcp');
      assert.equal(one.source_peer_id, a.peerId);
      assert.equal(one.target_peer_id, b.peerId);
    });
  });

  describe('health_check (extension, docs/decisions.md §7)', () => {
    const TCP = { tcp: '10.1.2.3:443', interval_ms: 1000, failures: 3 };

    it('create: shown back on GET single and list, canonical and with its defaults; absent or null is none', async () => {
      const tcp = await created({ target_peer_id: b.peerId, health_check: { tcp: '[FD00:0::1]:443' } });
      const icmp = await created({
        source_peer_id: b.peerId,
        target_peer_id: c.peerId,
        health_check: { icmp: '10.1.2.3', interval_ms: 250, failures: 5 },
      });
      const tcpWant = { tcp: '[fd00::1]:443', interval_ms: 1000, failures: 3 };
      const icmpWant = { icmp: '10.1.2.3', interval_ms: 250, failures: 5 };
      assert.deepEqual((await getOne(tcp)).body.health_check, tcpWant);
      assert.deepEqual((await getOne(icmp)).body.health_check, icmpWant);
      const byId = new Map((await list()).map((s) => [s.id, s]));
      assert.deepEqual(byId.get(tcp)?.health_check, tcpWant);
      assert.deepEqual(byId.get(icmp)?.health_check, icmpWant);

      for (const id of [tcp, icmp]) await api().delete(`/v1/services/${id}`, { token: a.token });
      const none = await created({ target_peer_id: b.peerId });
      const nulled = await created({
        source_peer_id: b.peerId,
        target_peer_id: c.peerId,
        health_check: null,
      });
      for (const id of [none, nulled]) assert.equal((await getOne(id)).body.health_check, null);
      for (const item of await list()) assert.equal(item.health_check, null);
    });

    it('update: sets, replaces whole, leaves it when absent, removes it with null; version rises only on a change', async () => {
      const id = await created({ target_peer_id: b.peerId });
      const set = await put(id, { health_check: { tcp: '10.1.2.3:443' } });
      assert.equal(set.status, 200, set.text);
      assert.deepEqual(keys(set.body), SINGLE_FIELDS);
      assert.deepEqual(set.body.health_check, TCP);
      assert.equal(set.body.version, 2);
      assert.deepEqual((await getOne(id)).body, set.body, 'GET shows what PUT answered');

      const same = await put(id, { health_check: { failures: 3, tcp: '10.1.2.3:443' } });
      assert.deepEqual(same.body, set.body, 'the same check again writes nothing');

      // Replaced whole: what the new value leaves out takes its default, not the old value.
      const icmp = await put(id, { health_check: { icmp: 'FD00::1', failures: 2 } });
      assert.equal(icmp.status, 200, icmp.text);
      assert.deepEqual(icmp.body.health_check, { icmp: 'fd00::1', interval_ms: 1000, failures: 2 });
      assert.equal(icmp.body.version, 3);

      const other = await put(id, { bandwidth_limit_mbps: 9 });
      assert.deepEqual(other.body.health_check, icmp.body.health_check, 'absent: unchanged');

      const removed = await put(id, { health_check: null });
      assert.equal(removed.status, 200, removed.text);
      assert.equal(removed.body.health_check, null);
      assert.equal(removed.body.version, 5);
      assert.equal((await list())[0]?.health_check, null);
    });

    it('refuses each kind of invalid value: 400 INVALID_REQUEST on create and update, nothing changes', async () => {
      const id = await created({ target_peer_id: b.peerId, health_check: TCP });
      const original = (await getOne(id)).body;
      const cases: [string, unknown][] = [
        ['a string', 'tcp:10.1.2.3:443'],
        ['a number', 443],
        ['an array', [TCP]],
        ['neither tcp nor icmp', {}],
        ['only timings', { interval_ms: 500, failures: 2 }],
        ['both tcp and icmp', { tcp: '10.1.2.3:443', icmp: '10.1.2.3' }],
        ['tcp a host name', { tcp: 'exit.example.com:443' }],
        ['tcp localhost', { tcp: 'localhost:443' }],
        ['tcp without a port', { tcp: '10.1.2.3' }],
        ['tcp port 0', { tcp: '10.1.2.3:0' }],
        ['tcp port 65536', { tcp: '10.1.2.3:65536' }],
        ['tcp IPv6 without brackets', { tcp: 'fd00::1:443' }],
        ['tcp IPv6 with a zone', { tcp: '[fe80::1%eth0]:443' }],
        ['tcp unspecified', { tcp: '0.0.0.0:443' }],
        ['tcp multicast', { tcp: '[ff02::1]:443' }],
        ['tcp a number', { tcp: 443 }],
        ['tcp null', { tcp: null }],
        ['tcp too long', { tcp: `${'1'.repeat(60)}:443` }],
        ['icmp with a port', { icmp: '10.1.2.3:443' }],
        ['icmp in brackets', { icmp: '[fd00::1]' }],
        ['icmp a host name', { icmp: 'gateway.lan' }],
        ['icmp a CIDR', { icmp: '10.1.2.0/24' }],
        ['icmp broadcast', { icmp: '255.255.255.255' }],
        ['interval_ms 99', { ...TCP, interval_ms: 99 }],
        ['interval_ms 60001', { ...TCP, interval_ms: 60_001 }],
        ['interval_ms 1.5', { ...TCP, interval_ms: 1.5 }],
        ['interval_ms "1000"', { ...TCP, interval_ms: '1000' }],
        ['interval_ms null', { ...TCP, interval_ms: null }],
        ['failures 0', { ...TCP, failures: 0 }],
        ['failures 11', { ...TCP, failures: 11 }],
        ['failures true', { ...TCP, failures: true }],
      ];
      for (const [what, health_check] of cases) {
        assertError(await put(id, { health_check }), 400, 'INVALID_REQUEST', `update: ${what}`);
        // Together with a valid change: the whole request is refused.
        assertError(
          await put(id, { bandwidth_limit_mbps: 7, health_check }),
          400,
          'INVALID_REQUEST',
          `update with another field: ${what}`,
        );
        assertError(
          await create({ source_peer_id: b.peerId, target_peer_id: c.peerId, health_check }),
          400,
          'INVALID_REQUEST',
          `create: ${what}`,
        );
      }
      assert.deepEqual((await getOne(id)).body, original);
      assert.deepEqual(
        (await list()).map((s) => s.id),
        [id],
      );
      // 400 before 404 (docs/decisions.md §3): a bad check on an unknown service.
      assertError(
        await put(UNKNOWN_ID, { health_check: { tcp: 'exit.example.com:443' } }),
        400,
        'INVALID_REQUEST',
        'unknown service',
      );
    });
  });

  describe('delete', () => {
    it('deletes a service and its routes: {deleted: true}, then 404 for it and for its routes', async () => {
      const id = await created({ target_peer_id: b.peerId });
      const added = await api().post(`/v1/services/${id}/routes`, {
        token: a.token,
        json: {
          routes: [
            { priority: 1, dest_cidr: '10.0.0.0/8' },
            { priority: 2, dest_cidr: '10.1.0.0/16' },
          ],
        },
      });
      assert.equal(added.status, 201, added.text);
      const del = await api().delete(`/v1/services/${id}`, { token: a.token });
      assert.equal(del.status, 200, del.text);
      assert.deepEqual(del.body, { deleted: true });
      assertError(await getOne(id), 404, 'NOT_FOUND', 'GET after delete');
      assertError(
        await api().get(`/v1/services/${id}/routes`, { token: a.token }),
        404,
        'NOT_FOUND',
        'routes',
      );
      assertError(
        await api().put(`/v1/services/${id}/routes/${added.body.route_ids[0]}`, {
          token: a.token,
          json: { priority: 9 },
        }),
        404,
        'NOT_FOUND',
        'PUT route of deleted service',
      );
      assertError(
        await api().delete(`/v1/services/${id}`, { token: a.token }),
        404,
        'NOT_FOUND',
        'DELETE again',
      );
      assert.deepEqual(await list(), []);
      // The pair is free again, and the new service starts without the old routes.
      const again = await created({ target_peer_id: b.peerId });
      assert.deepEqual((await getOne(again)).body.routes, []);
      assert.equal((await list())[0]?.route_count, 0);
    });
  });

  describe('authorization and validation order', () => {
    it('401 without a valid token, before anything else', async () => {
      const id = await created({ target_peer_id: b.peerId });
      const bad = { bandwidth_limit_mbps: -1 };
      for (const token of [undefined, 'not-a-token', `${a.token}x`]) {
        const opts = token === undefined ? {} : { token };
        assertError(await api().get('/v1/services', opts), 401, 'UNAUTHORIZED', 'list');
        assertError(await api().get(`/v1/services/${id}`, opts), 401, 'UNAUTHORIZED', 'get');
        assertError(await api().get(`/v1/services/${UNKNOWN_ID}`, opts), 401, 'UNAUTHORIZED', 'get unknown');
        assertError(
          await api().post('/v1/services', { ...opts, json: { transport_type: 'udp' } }),
          401,
          'UNAUTHORIZED',
          'post bad',
        );
        assertError(
          await api().put(`/v1/services/${UNKNOWN_ID}`, { ...opts, json: bad }),
          401,
          'UNAUTHORIZED',
          'put',
        );
        assertError(await api().delete(`/v1/services/${UNKNOWN_ID}`, opts), 401, 'UNAUTHORIZED', 'delete');
      }
      assert.equal((await list()).length, 1);
    });

    it('403 for a token without the scope, before body validation and lookup', async () => {
      const id = await created({ target_peer_id: b.peerId });
      // services.write does not grant services.read.
      assertError(
        await api().get('/v1/services', { token: writeToken }),
        403,
        'FORBIDDEN',
        'list with write',
      );
      assertError(
        await api().get(`/v1/services/${id}`, { token: writeToken }),
        403,
        'FORBIDDEN',
        'get with write',
      );
      assertError(
        await api().get('/v1/services?requires_interface=maybe', { token: writeToken }),
        403,
        'FORBIDDEN',
        'bad query with write',
      );
      // services.read cannot write, whatever the body or id.
      assertError(
        await api().post('/v1/services', { token: readToken, json: { target_peer_id: c.peerId } }),
        403,
        'FORBIDDEN',
        'create with read',
      );
      assertError(
        await api().post('/v1/services', { token: readToken, json: { transport_type: 'udp' } }),
        403,
        'FORBIDDEN',
        'bad create with read',
      );
      assertError(
        await api().put(`/v1/services/${UNKNOWN_ID}`, {
          token: readToken,
          json: { bandwidth_limit_mbps: -1 },
        }),
        403,
        'FORBIDDEN',
        'bad put on unknown with read',
      );
      assertError(
        await api().put(`/v1/services/${id}`, { token: readToken, json: {} }),
        403,
        'FORBIDDEN',
        'put with read',
      );
      assertError(
        await api().delete(`/v1/services/${id}`, { token: readToken }),
        403,
        'FORBIDDEN',
        'delete with read',
      );
      assertError(
        await api().delete(`/v1/services/${UNKNOWN_ID}`, { token: readToken }),
        403,
        'FORBIDDEN',
        'delete unknown',
      );
      // Peers scopes do not reach services.
      const peersToken = await scopedToken(a, 'peers.read', 'peers.write');
      assertError(await api().get('/v1/services', { token: peersToken }), 403, 'FORBIDDEN', 'peers token');
      assert.equal((await list()).length, 1);
      assert.equal((await getOne(id)).body.version, 1);
    });

    it('400 before 404: a bad body on an unknown service or peer is 400', async () => {
      assertError(
        await put(UNKNOWN_ID, { bandwidth_limit_mbps: -1 }, writeToken),
        400,
        'INVALID_REQUEST',
        'bad bandwidth on unknown service',
      );
      assertError(
        await put(UNKNOWN_ID, { desired_ipv4_cidr: 'garbage' }, writeToken),
        400,
        'INVALID_REQUEST',
        'bad address on unknown service',
      );
      assertError(
        await put(UNKNOWN_ID, { bandwidth_limit_mbps: 5 }, writeToken),
        404,
        'NOT_FOUND',
        'good body',
      );
      assertError(
        await create({ target_peer_id: 'no-such-peer', transport_type: 'udp' }, writeToken),
        400,
        'INVALID_TRANSPORT',
        'bad transport to unknown target',
      );
      assertError(
        await create({ target_peer_id: 'no-such-peer', fully_transparent: true }, writeToken),
        400,
        'INVALID_REQUEST',
        'bad combination to unknown target',
      );
      assertError(
        await create({ target_peer_id: 'no-such-peer', bandwidth_limit_mbps: 1.5 }, writeToken),
        400,
        'INVALID_REQUEST',
        'bad bandwidth to unknown target',
      );
      assertError(
        await create({ target_peer_id: 'no-such-peer' }, writeToken),
        404,
        'NOT_FOUND',
        'good body',
      );
    });

    it('400 before 409: a bad body for an existing pair is 400', async () => {
      await created({ target_peer_id: b.peerId });
      assertError(
        await create({
          target_peer_id: b.peerId,
          transport_type: 'kcp',
          fully_transparent: true,
          requires_interface: true,
        }),
        400,
        'INVALID_REQUEST',
        'bad combination on an existing pair',
      );
      assertError(
        await create({ target_peer_id: b.peerId, transport_type: 'UDP' }),
        400,
        'INVALID_TRANSPORT',
        'bad transport on an existing pair',
      );
      // A write-only token can create.
      const ok = await create({ target_peer_id: c.peerId }, writeToken);
      assert.equal(ok.status, 201, ok.text);
    });
  });

  function put(id: string, json: unknown, token = a.token) {
    return api().put(`/v1/services/${id}`, { token, json });
  }
});
