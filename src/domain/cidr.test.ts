import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseCidr } from './cidr.js';
import { parsePeerAddress } from './peer-address.js';

describe('parseCidr', () => {
  it('accepts networks in IPv4 and IPv6 and returns canonical text', () => {
    assert.equal(parseCidr('10.0.0.0/8', true)?.text, '10.0.0.0/8');
    assert.equal(parseCidr('0.0.0.0/0', true)?.text, '0.0.0.0/0');
    assert.equal(parseCidr('2001:DB8:0:0:0:0:0:0/32', true)?.text, '2001:db8::/32');
    assert.equal(parseCidr('::/0', true)?.text, '::/0');
    assert.equal(parseCidr('fe80:0:0:1::/64', true)?.text, 'fe80:0:0:1::/64');
    assert.equal(parseCidr('1:0:0:2:0:0:0:0/128', true)?.text, '1:0:0:2::/128');
  });
  it('refuses host bits for networks but not for interface addresses', () => {
    assert.equal(parseCidr('10.0.0.1/8', true), undefined);
    assert.equal(parseCidr('10.0.0.1/8', false)?.text, '10.0.0.1/8');
    assert.equal(parseCidr('2001:db8::1/64', true), undefined);
  });
  it('refuses malformed text', () => {
    for (const bad of [
      '10.0.0.0',
      '10.0.0.0/33',
      '10.0.0.0/-1',
      '10.0.0.0/08',
      '010.0.0.0/8',
      '10.0.0.256/32',
      ' 10.0.0.0/8',
      '10.0.0.0/8 ',
      '10.0.0/8',
      '::ffff:10.0.0.0/104',
      '::10.0.0.0/104',
      'fe80::%eth0/64',
      '2001:db8::/129',
      '1::2::3/64',
      '1:2:3:4:5:6:7:8:9/64',
      '12345::/16',
      '10.0.0.0/8/8',
      '',
    ]) {
      assert.equal(parseCidr(bad, false), undefined, bad);
    }
  });
});

describe('parsePeerAddress', () => {
  it('accepts host:port with IPv6 in brackets', () => {
    assert.equal(parsePeerAddress('127.0.0.1:7480')?.text, '127.0.0.1:7480');
    assert.equal(parsePeerAddress('[::1]:7480')?.text, '[::1]:7480');
    assert.equal(parsePeerAddress('Agent-1.Example:1')?.text, 'agent-1.example:1');
    assert.equal(parsePeerAddress('h:65535')?.port, 65535);
  });
  it('refuses bad ports, unbracketed IPv6, junk', () => {
    for (const bad of [
      'h:0',
      'h:65536',
      'h:00080',
      '::1:80',
      'h',
      ':80',
      '[::1]',
      'a b:1',
      '1.2.3.999:80',
      `${'a'.repeat(10000)}:1`,
      'h:-1',
      '[zz::1]:80',
    ]) {
      assert.equal(parsePeerAddress(bad), undefined, bad.slice(0, 40));
    }
  });
});
