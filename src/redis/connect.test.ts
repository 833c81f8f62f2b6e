import { describe, expect, it } from 'vitest';
import { parseRedisTarget } from './connect.ts';

describe('parseRedisTarget', () => {
  it('reads a single Redis URL as it is', () => {
    expect(parseRedisTarget('redis://:pw@10.0.0.5:6379/0')).toEqual({ kind: 'single', url: 'redis://:pw@10.0.0.5:6379/0' });
    expect(parseRedisTarget('rediss://redis.internal:6380')).toEqual({ kind: 'single', url: 'rediss://redis.internal:6380' });
  });

  it('reads a cluster node list, with user, password (percent-decoded) and IPv6 hosts', () => {
    expect(parseRedisTarget('redis+cluster://127.0.0.1:7000,127.0.0.1:7001')).toEqual({ kind: 'cluster', nodes: [{ host: '127.0.0.1', port: 7000 }, { host: '127.0.0.1', port: 7001 }] });
    expect(parseRedisTarget('redis+cluster://app:p%40ss:w@redis-a:6379,[::1]:6380/')).toEqual({ kind: 'cluster', nodes: [{ host: 'redis-a', port: 6379 }, { host: '::1', port: 6380 }], username: 'app', password: 'p@ss:w' });
    expect(parseRedisTarget('redis+cluster://:secret@h:1')).toEqual({ kind: 'cluster', nodes: [{ host: 'h', port: 1 }], password: 'secret' });
  });

  it('says what is wrong with a malformed list, without the password', () => {
    expect(() => parseRedisTarget('redis+cluster://')).toThrow(/no nodes/);
    expect(() => parseRedisTarget('redis+cluster://:secret@a:1,b')).toThrow(/node 2 \("b"\) is not host:port/);
    expect(() => parseRedisTarget('redis+cluster://:secret@a:1,b')).not.toThrow(/secret/);
    expect(() => parseRedisTarget('redis+cluster://a:1,,b:2')).toThrow(/node 2/);
    expect(() => parseRedisTarget('redis+cluster://a:70000')).toThrow(/node 1/);
    expect(() => parseRedisTarget('redis+cluster://a:1,b:2/3')).toThrow(/no path, database or query/);
  });
});
