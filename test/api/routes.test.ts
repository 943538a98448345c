/**
 * Routes over real HTTP (API document, Routes; docs/decisions.md §3, §5, §6): bulk create (ids and
 * count, all or none), IPv4 and IPv6, every INVALID_CIDR case, priority bounds, the list, PUT
 * (only given fields change), DELETE, every 404, the numeric route id in the path, and the
 * 401/403 rows. Two agents joined; services S (A→B) and T (B→A) on the first agent.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { assertError } from '../helpers/api-assertions.js';
import { makeVendor } from '../helpers/licenses.js';
import { type Node, scopedToken, startNode } from '../helpers/nodes.js';

const MAX_ROUTE_ID = 2 ** 53 - 1;
const UNKNOWN_SERVICE = '00000000-0000-4000-8000-000000000000';
const ROUTE_FIELDS = ['dest_cidr', 'id', 'priority', 'service_id', 'source_cidr'];

interface RouteIn {
  priority?: unknown;
  source_cidr?: unknown;
  dest_cidr?: unknown;
}

describe('routes API', () => {
  const vendor = makeVendor();
  let a: Node;
  let b: Node;
  let s: string; // service A→B
  let t: string; // service B→A
  let readToken: string;
  let writeToken: string;

  const api = () => a.agent.client;
  const post = (serviceId: string, json: unknown, token = a.token) =>
    api().post(`/v1/services/${serviceId}/routes`, { token, json });
  const addRoutes = (serviceId: string, routes: RouteIn[]) => post(serviceId, { routes });
  const put = (serviceId: string, routeId: number | string, json: unknown, token = a.token) =>
    api().put(`/v1/services/${serviceId}/routes/${routeId}`, { token, json });
  const del = (serviceId: string, routeId: number | string, token = a.token) =>
    api().delete(`/v1/services/${serviceId}/routes/${routeId}`, { token });
  const routesOf = async (serviceId: string) => {
    const res = await api().get(`/v1/services/${serviceId}/routes`, { token: a.token });
    assert.equal(res.status, 200, res.text);
    return res.body as {
      id: number;
      service_id: string;
      priority: number;
      source_cidr: string | null;
      dest_cidr: string | null;
    }[];
  };
  const routeOf = async (serviceId: string, id: number) =>
    (await routesOf(serviceId)).find((r) => r.id === id);
  const addOne = async (serviceId: string, route: RouteIn): Promise<number> => {
    const res = await addRoutes(serviceId, [route]);
    assert.equal(res.status, 201, res.text);
    return res.body.route_ids[0] as number;
  };
  /** A request that must be refused leaves the service's routes exactly as they were. */
  const unchanged = async (serviceId: string, attempt: () => Promise<void>) => {
    const before = await routesOf(serviceId);
    await attempt();
    assert.deepEqual(await routesOf(serviceId), before);
  };

  before(async () => {
    [a, b] = await Promise.all([startNode(vendor), startNode(vendor)]);
    const join = await api().post('/v1/peers', {
      token: a.token,
      json: { address: `127.0.0.1:${b.agent.port}` },
    });
    assert.equal(join.status, 201, join.text);
    const first = await api().post('/v1/services', { token: a.token, json: { target_peer_id: b.peerId } });
    assert.equal(first.status, 201, first.text);
    s = first.body.id;
    const second = await api().post('/v1/services', {
      token: a.token,
      json: { source_peer_id: b.peerId, target_peer_id: a.peerId },
    });
    assert.equal(second.status, 201, second.text);
    t = second.body.id;
    [readToken, writeToken] = await Promise.all([
      scopedToken(a, 'services.read'),
      scopedToken(a, 'services.write'),
    ]);
  });

  after(async () => {
    for (const n of [a, b]) if (n) assert.equal(await n.agent.stop(), 0);
  });

  describe('create', () => {
    it('creates routes in bulk: 201 with route_ids (distinct integers in [1, 2^53-1]) and count', async () => {
      const res = await addRoutes(s, [
        { priority: 0, dest_cidr: '10.0.0.0/8' },
        { priority: 100, source_cidr: '192.168.1.0/24', dest_cidr: '172.16.0.0/12' },
        { priority: 65535, source_cidr: '0.0.0.0/0' },
        { priority: 7, dest_cidr: '203.0.113.5/32' },
      ]);
      assert.equal(res.status, 201, res.text);
      assert.deepEqual(Object.keys(res.body).sort(), ['count', 'route_ids']);
      assert.equal(res.body.count, 4);
      assert.equal(res.body.route_ids.length, 4);
      for (const id of res.body.route_ids) {
        assert.ok(Number.isSafeInteger(id) && id >= 1 && id <= MAX_ROUTE_ID, `route id ${id} in range`);
      }
      assert.equal(new Set(res.body.route_ids).size, 4, 'distinct ids');
      // Random ids (docs/decisions.md §5): not a small sequence.
      assert.ok(
        res.body.route_ids.some((id: number) => id > 2 ** 32),
        'ids are drawn from the whole range',
      );

      const listed = await routesOf(s);
      for (const [i, expected] of [
        { priority: 0, source_cidr: null, dest_cidr: '10.0.0.0/8' },
        { priority: 100, source_cidr: '192.168.1.0/24', dest_cidr: '172.16.0.0/12' },
        { priority: 65535, source_cidr: '0.0.0.0/0', dest_cidr: null },
        { priority: 7, source_cidr: null, dest_cidr: '203.0.113.5/32' },
      ].entries()) {
        const id = res.body.route_ids[i];
        assert.deepEqual(
          listed.find((r) => r.id === id),
          { id, service_id: s, ...expected },
          `route ${i}`,
        );
      }
      // A single route is a bulk of one.
      const one = await addRoutes(s, [{ priority: 1, dest_cidr: '10.0.0.0/8' }]);
      assert.equal(one.status, 201, one.text);
      assert.equal(one.body.count, 1);
    });

    it('creates IPv6 routes, source only, destination only and both; addresses in canonical form', async () => {
      const res = await addRoutes(s, [
        { priority: 1, source_cidr: '2001:DB8::/32' },
        { priority: 2, dest_cidr: '2001:db8:0:0:0:0:0:0/48' },
        { priority: 3, source_cidr: 'fd00::/8', dest_cidr: '2001:db8:abcd:12::/64' },
        { priority: 4, dest_cidr: '::/0' },
        { priority: 5, dest_cidr: '2001:db8::1/128' },
      ]);
      assert.equal(res.status, 201, res.text);
      assert.equal(res.body.count, 5);
      const [r1, r2, r3, r4, r5] = res.body.route_ids as number[];
      assert.deepEqual(await routeOf(s, r1!), {
        id: r1,
        service_id: s,
        priority: 1,
        source_cidr: '2001:db8::/32',
        dest_cidr: null,
      });
      assert.deepEqual(await routeOf(s, r2!), {
        id: r2,
        service_id: s,
        priority: 2,
        source_cidr: null,
        dest_cidr: '2001:db8::/48',
      });
      assert.deepEqual(await routeOf(s, r3!), {
        id: r3,
        service_id: s,
        priority: 3,
        source_cidr: 'fd00::/8',
        dest_cidr: '2001:db8:abcd:12::/64',
      });
      assert.equal((await routeOf(s, r4!))?.dest_cidr, '::/0');
      assert.equal((await routeOf(s, r5!))?.dest_cidr, '2001:db8::1/128');
      // The single service form carries them too.
      const single = await api().get(`/v1/services/${s}`, { token: a.token });
      assert.ok(single.body.routes.some((r: { id: number }) => r.id === r3));
    });

    it('writes all routes or none: one bad route among valid ones is 400 and nothing is created', async () => {
      const good = { priority: 1, dest_cidr: '10.9.0.0/16' };
      const bad: [string, RouteIn, string][] = [
        ['host bits', { priority: 2, dest_cidr: '10.9.0.1/16' }, 'INVALID_CIDR'],
        ['garbage', { priority: 2, source_cidr: 'garbage' }, 'INVALID_CIDR'],
        [
          'mixed families',
          { priority: 2, source_cidr: '10.0.0.0/8', dest_cidr: '2001:db8::/32' },
          'INVALID_CIDR',
        ],
        ['priority out of range', { priority: 65536, dest_cidr: '10.8.0.0/16' }, 'INVALID_REQUEST'],
        ['no CIDR', { priority: 2 }, 'INVALID_REQUEST'],
      ];
      for (const [what, route, code] of bad) {
        for (const routes of [
          [route, good, good],
          [good, route, good],
          [good, good, route],
        ]) {
          await unchanged(s, async () => assertError(await addRoutes(s, routes), 400, code, what));
        }
      }
    });

    it('refuses every malformed CIDR: 400 INVALID_CIDR, as source or destination', async () => {
      const cases: [string, string][] = [
        ['IPv4 prefix 33', '10.0.0.0/33'],
        ['IPv4 prefix -1', '10.0.0.0/-1'],
        ['IPv6 prefix 129', '2001:db8::/129'],
        ['empty prefix', '10.0.0.0/'],
        ['no prefix', '10.0.0.0'],
        ['IPv6 without prefix', '2001:db8::'],
        ['prefix with a leading zero', '10.0.0.0/08'],
        ['octet with a leading zero', '010.0.0.0/8'],
        ['octet 256', '256.0.0.0/8'],
        ['three octets', '10.0.0/24'],
        ['leading space', ' 10.0.0.0/8'],
        ['trailing space', '10.0.0.0/8 '],
        ['space before the slash', '10.0.0.0 /8'],
        ['space after the slash', '10.0.0.0/ 8'],
        ['IPv4 host bits set', '10.0.0.1/8'],
        ['IPv4 host bits set, /31', '192.0.2.1/31'],
        ['IPv6 host bits set', '2001:db8::1/32'],
        ['IPv4-mapped IPv6', '::ffff:10.0.0.0/104'],
        ['IPv4-compatible IPv6', '::10.0.0.0/104'],
        ['IPv6 zone id', 'fe80::%eth0/64'],
        ['two double colons', '2001::db8::/32'],
        ['IPv6 group of five digits', '2001:0db80::/32'],
        ['two slashes', '10.0.0.0/8/8'],
        ['hex prefix', '10.0.0.0/0x8'],
        ['garbage', 'garbage'],
        ['empty string', ''],
        ['a slash only', '/'],
        ['very long', `10.0.0.0/${'8'.repeat(200)}`],
        ['unicode digits', '١٠.0.0.0/8'],
      ];
      for (const [what, cidr] of cases) {
        for (const field of ['source_cidr', 'dest_cidr']) {
          await unchanged(s, async () => {
            assertError(
              await addRoutes(s, [{ priority: 1, [field]: cidr }]),
              400,
              'INVALID_CIDR',
              `${what} as ${field}`,
            );
          });
        }
      }
    });

    it('refuses source and destination of different families: 400 INVALID_CIDR', async () => {
      for (const [src, dst] of [
        ['10.0.0.0/8', '2001:db8::/32'],
        ['2001:db8::/32', '10.0.0.0/8'],
        ['0.0.0.0/0', '::/0'],
      ]) {
        await unchanged(s, async () => {
          assertError(
            await addRoutes(s, [{ priority: 1, source_cidr: src, dest_cidr: dst }]),
            400,
            'INVALID_CIDR',
            `${src} ${dst}`,
          );
        });
      }
    });

    it('refuses a priority that is not an integer from 0 to 65535: 400 INVALID_REQUEST', async () => {
      for (const priority of [-1, 65536, 1.5, '1', null, true, 1e10]) {
        await unchanged(s, async () => {
          assertError(
            await addRoutes(s, [{ priority, dest_cidr: '10.0.0.0/8' }]),
            400,
            'INVALID_REQUEST',
            String(priority),
          );
        });
      }
      await unchanged(s, async () => {
        assertError(await addRoutes(s, [{ dest_cidr: '10.0.0.0/8' }]), 400, 'INVALID_REQUEST', 'no priority');
      });
    });

    it('refuses a route with neither source_cidr nor dest_cidr: 400 INVALID_REQUEST', async () => {
      for (const route of [
        { priority: 1 },
        { priority: 1, source_cidr: null, dest_cidr: null },
        { priority: 1, source_cidr: null },
      ]) {
        await unchanged(s, async () => {
          assertError(await addRoutes(s, [route]), 400, 'INVALID_REQUEST', JSON.stringify(route));
        });
      }
    });

    it('refuses a body without a routes array: 400 INVALID_REQUEST', async () => {
      const cases: [string, unknown][] = [
        ['missing routes', {}],
        ['routes null', { routes: null }],
        ['routes empty', { routes: [] }],
        ['routes an object', { routes: { priority: 1, dest_cidr: '10.0.0.0/8' } }],
        ['routes a string', { routes: '10.0.0.0/8' }],
        ['a route that is not an object', { routes: [5] }],
        ['a JSON array body', [{ priority: 1, dest_cidr: '10.0.0.0/8' }]],
        ['route fields at the top level', { priority: 1, dest_cidr: '10.0.0.0/8' }],
      ];
      for (const [what, body] of cases) {
        await unchanged(s, async () => assertError(await post(s, body), 400, 'INVALID_REQUEST', what));
      }
    });
  });

  describe('read', () => {
    it("lists a service's routes with exactly id, service_id, priority, source_cidr, dest_cidr", async () => {
      const onT = await addOne(t, { priority: 9, source_cidr: '10.20.0.0/16', dest_cidr: '10.30.0.0/16' });
      const list = await routesOf(t);
      assert.ok(list.length >= 1);
      for (const r of list) {
        assert.deepEqual(Object.keys(r).sort(), ROUTE_FIELDS);
        assert.equal(r.service_id, t);
        assert.ok(Number.isSafeInteger(r.id));
      }
      assert.deepEqual(
        list.find((r) => r.id === onT),
        {
          id: onT,
          service_id: t,
          priority: 9,
          source_cidr: '10.20.0.0/16',
          dest_cidr: '10.30.0.0/16',
        },
      );
      // Each service lists only its own routes.
      assert.ok(!(await routesOf(s)).some((r) => r.id === onT));
      assert.ok((await routesOf(s)).every((r) => r.service_id === s));
    });

    it('GET of the routes of an unknown service: 404 NOT_FOUND', async () => {
      assertError(
        await api().get(`/v1/services/${UNKNOWN_SERVICE}/routes`, { token: a.token }),
        404,
        'NOT_FOUND',
      );
    });
  });

  describe('update', () => {
    it('changes only the given fields and answers with the route', async () => {
      const id = await addOne(s, { priority: 10, source_cidr: '10.1.0.0/16', dest_cidr: '10.2.0.0/16' });
      const steps: [unknown, Record<string, unknown>][] = [
        [{ priority: 11 }, { priority: 11, source_cidr: '10.1.0.0/16', dest_cidr: '10.2.0.0/16' }],
        [
          { dest_cidr: '10.3.0.0/16' },
          { priority: 11, source_cidr: '10.1.0.0/16', dest_cidr: '10.3.0.0/16' },
        ],
        [
          { source_cidr: '10.4.0.0/16' },
          { priority: 11, source_cidr: '10.4.0.0/16', dest_cidr: '10.3.0.0/16' },
        ],
        [{ source_cidr: null }, { priority: 11, source_cidr: null, dest_cidr: '10.3.0.0/16' }],
        [{}, { priority: 11, source_cidr: null, dest_cidr: '10.3.0.0/16' }],
        [{ note: 'ignored' }, { priority: 11, source_cidr: null, dest_cidr: '10.3.0.0/16' }],
        // Both CIDRs to another family in one request is fine.
        [
          { source_cidr: '2001:DB8:1::/48', dest_cidr: '2001:db8:2::/48', priority: 0 },
          { priority: 0, source_cidr: '2001:db8:1::/48', dest_cidr: '2001:db8:2::/48' },
        ],
      ];
      for (const [body, expected] of steps) {
        const res = await put(s, id, body);
        assert.equal(res.status, 200, `${JSON.stringify(body)}: ${res.text}`);
        assert.deepEqual(Object.keys(res.body).sort(), ROUTE_FIELDS);
        assert.deepEqual(res.body, { id, service_id: s, ...expected }, JSON.stringify(body));
        assert.deepEqual(await routeOf(s, id), res.body, 'GET shows what PUT answered');
      }
    });

    it('refuses a change that makes the route invalid: 400, and the route is unchanged', async () => {
      const id = await addOne(s, { priority: 10, source_cidr: '10.1.0.0/16', dest_cidr: '10.2.0.0/16' });
      const cases: [string, unknown, string][] = [
        ['dest to another family than source', { dest_cidr: '2001:db8::/32' }, 'INVALID_CIDR'],
        ['source to another family than dest', { source_cidr: '::/0' }, 'INVALID_CIDR'],
        ['dest with host bits', { dest_cidr: '10.2.0.1/16' }, 'INVALID_CIDR'],
        ['source garbage', { source_cidr: 'nope' }, 'INVALID_CIDR'],
        ['IPv4-mapped dest', { dest_cidr: '::ffff:10.2.0.0/112' }, 'INVALID_CIDR'],
        ['both CIDRs null', { source_cidr: null, dest_cidr: null }, 'INVALID_REQUEST'],
        ['priority -1', { priority: -1 }, 'INVALID_REQUEST'],
        ['priority 65536', { priority: 65536 }, 'INVALID_REQUEST'],
        ['priority 1.5', { priority: 1.5 }, 'INVALID_REQUEST'],
        ['priority "1"', { priority: '1' }, 'INVALID_REQUEST'],
        ['a good priority with a bad CIDR', { priority: 3, dest_cidr: '10.2.0.0/33' }, 'INVALID_CIDR'],
      ];
      for (const [what, body, code] of cases) {
        await unchanged(s, async () => assertError(await put(s, id, body), 400, code, what));
      }
      // A single-family route with one CIDR may take the other family for that CIDR.
      const onlyDest = await addOne(s, { priority: 10, dest_cidr: '10.2.0.0/16' });
      const switched = await put(s, onlyDest, { dest_cidr: '2001:db8::/32' });
      assert.equal(switched.status, 200, switched.text);
      assert.equal(switched.body.dest_cidr, '2001:db8::/32');
    });

    it('PUT of an unknown service, an unknown route, or a route of another service: 404 NOT_FOUND', async () => {
      const onS = await addOne(s, { priority: 1, dest_cidr: '10.50.0.0/16' });
      const onT = await addOne(t, { priority: 1, dest_cidr: '10.60.0.0/16' });
      assertError(await put(UNKNOWN_SERVICE, onS, { priority: 2 }), 404, 'NOT_FOUND', 'unknown service');
      assertError(await put(s, 12345, { priority: 2 }), 404, 'NOT_FOUND', 'unknown route');
      assertError(await put(s, MAX_ROUTE_ID, { priority: 2 }), 404, 'NOT_FOUND', 'largest route id');
      await unchanged(t, async () => {
        assertError(await put(s, onT, { priority: 2 }), 404, 'NOT_FOUND', "T's route under S");
      });
      // 400 comes before 404 (docs/decisions.md §3).
      assertError(
        await put(UNKNOWN_SERVICE, onS, { dest_cidr: 'bad' }),
        400,
        'INVALID_CIDR',
        'bad body, unknown service',
      );
      assertError(await put(s, 12345, { priority: -1 }), 400, 'INVALID_REQUEST', 'bad body, unknown route');
    });
  });

  describe('delete', () => {
    it('deletes a route: {deleted: true}, then 404; the other routes stay', async () => {
      const res = await addRoutes(s, [
        { priority: 1, dest_cidr: '10.70.0.0/16' },
        { priority: 2, dest_cidr: '10.71.0.0/16' },
      ]);
      const [gone, kept] = res.body.route_ids as number[];
      const countBefore = (await routesOf(s)).length;
      const d = await del(s, gone!);
      assert.equal(d.status, 200, d.text);
      assert.deepEqual(d.body, { deleted: true });
      assert.equal(await routeOf(s, gone!), undefined);
      assert.ok(await routeOf(s, kept!));
      assert.equal((await routesOf(s)).length, countBefore - 1);
      const listed = (await api().get('/v1/services', { token: a.token })).body.find(
        (x: { id: string }) => x.id === s,
      );
      assert.equal(listed.route_count, countBefore - 1);
      assertError(await del(s, gone!), 404, 'NOT_FOUND', 'delete again');
      assertError(await put(s, gone!, { priority: 3 }), 404, 'NOT_FOUND', 'put after delete');
    });

    it('DELETE of an unknown service, an unknown route, or a route of another service: 404 NOT_FOUND', async () => {
      const onS = await addOne(s, { priority: 1, dest_cidr: '10.80.0.0/16' });
      const onT = await addOne(t, { priority: 1, dest_cidr: '10.81.0.0/16' });
      assertError(await del(UNKNOWN_SERVICE, onS), 404, 'NOT_FOUND', 'unknown service');
      assertError(await del(s, 1), 404, 'NOT_FOUND', 'unknown route');
      await unchanged(t, async () => assertError(await del(s, onT), 404, 'NOT_FOUND', "T's route under S"));
      assert.ok(await routeOf(s, onS));
    });

    it('POST to an unknown service: 404 NOT_FOUND, after body validation (a bad body is 400)', async () => {
      assertError(
        await addRoutes(UNKNOWN_SERVICE, [{ priority: 1, dest_cidr: '10.0.0.0/8' }]),
        404,
        'NOT_FOUND',
        'good body',
      );
      assertError(
        await addRoutes(UNKNOWN_SERVICE, [{ priority: 1, dest_cidr: '10.0.0.1/8' }]),
        400,
        'INVALID_CIDR',
        'bad cidr',
      );
      assertError(await post(UNKNOWN_SERVICE, {}), 400, 'INVALID_REQUEST', 'no routes');
    });
  });

  describe('route id in the path', () => {
    it('refuses a route id that is not a decimal integer from 1 to 2^53-1: 400 INVALID_REQUEST', async () => {
      const id = await addOne(s, { priority: 1, dest_cidr: '10.90.0.0/16' });
      const malformed = ['abc', '1.5', '0', '-1', String(2 ** 53), '99999999999999999999', '1a', '%20'];
      // Numbers in forms other than plain decimal are malformed too, also for an existing id.
      const loose = ['1e3', '0x10', '%205', '+5', '007', `0${id}`, `${id}.0`, `${id}%20`];
      for (const bad of [...malformed, ...loose]) {
        await unchanged(s, async () => {
          assertError(await put(s, bad, { priority: 2 }), 400, 'INVALID_REQUEST', `PUT ${bad}`);
          assertError(await del(s, bad), 400, 'INVALID_REQUEST', `DELETE ${bad}`);
        });
      }
      assert.ok(await routeOf(s, id));
      // The bounds themselves are valid ids (unknown here): 404.
      assertError(await del(s, 1), 404, 'NOT_FOUND', 'id 1');
      assertError(await del(s, MAX_ROUTE_ID), 404, 'NOT_FOUND', 'id 2^53-1');
    });
  });

  describe('authorization', () => {
    it('401 without a valid token on every route operation', async () => {
      const id = await addOne(s, { priority: 1, dest_cidr: '10.100.0.0/16' });
      for (const token of [undefined, 'garbage']) {
        const o = token === undefined ? {} : { token };
        await unchanged(s, async () => {
          assertError(await api().get(`/v1/services/${s}/routes`, o), 401, 'UNAUTHORIZED', 'GET');
          assertError(
            await api().post(`/v1/services/${s}/routes`, { ...o, json: {} }),
            401,
            'UNAUTHORIZED',
            'POST',
          );
          assertError(
            await api().put(`/v1/services/${s}/routes/${id}`, { ...o, json: { priority: 2 } }),
            401,
            'UNAUTHORIZED',
            'PUT',
          );
          assertError(
            await api().put(`/v1/services/${s}/routes/abc`, { ...o, json: {} }),
            401,
            'UNAUTHORIZED',
            'PUT bad id',
          );
          assertError(await api().delete(`/v1/services/${s}/routes/${id}`, o), 401, 'UNAUTHORIZED', 'DELETE');
        });
      }
    });

    it('403 for a token without the scope, before validation and lookup', async () => {
      const id = await addOne(s, { priority: 1, dest_cidr: '10.101.0.0/16' });
      await unchanged(s, async () => {
        assertError(
          await api().get(`/v1/services/${s}/routes`, { token: writeToken }),
          403,
          'FORBIDDEN',
          'GET with write',
        );
        assertError(
          await api().get(`/v1/services/${UNKNOWN_SERVICE}/routes`, { token: writeToken }),
          403,
          'FORBIDDEN',
          'GET unknown with write',
        );
        assertError(
          await post(s, { routes: [{ priority: 1, dest_cidr: '10.0.0.0/8' }] }, readToken),
          403,
          'FORBIDDEN',
          'POST',
        );
        assertError(await post(UNKNOWN_SERVICE, {}, readToken), 403, 'FORBIDDEN', 'bad POST on unknown');
        assertError(await put(s, id, { priority: 2 }, readToken), 403, 'FORBIDDEN', 'PUT');
        assertError(await put(s, 'abc', { priority: -1 }, readToken), 403, 'FORBIDDEN', 'bad PUT');
        assertError(await del(s, id, readToken), 403, 'FORBIDDEN', 'DELETE');
      });
      // services.read reads; services.write writes.
      assert.equal((await api().get(`/v1/services/${s}/routes`, { token: readToken })).status, 200);
      const added = await post(s, { routes: [{ priority: 4, dest_cidr: '10.102.0.0/16' }] }, writeToken);
      assert.equal(added.status, 201, added.text);
      assert.equal((await put(s, added.body.route_ids[0], { priority: 5 }, writeToken)).status, 200);
      assert.equal((await del(s, added.body.route_ids[0], writeToken)).status, 200);
    });
  });
});
