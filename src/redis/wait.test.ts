import { describe, expect, it } from 'vitest';
import { isRedisUnavailable, redactedRedisUrl } from './wait.ts';

describe('redactedRedisUrl', () => {
  it('never shows a password', () => {
    expect(redactedRedisUrl('redis://:s3cret@10.0.0.5:6379/0')).toBe('redis://:***@10.0.0.5:6379/0');
    expect(redactedRedisUrl('redis://app:s3cret@redis:6379')).not.toContain('s3cret');
    expect(redactedRedisUrl('redis://127.0.0.1:6379')).toBe('redis://127.0.0.1:6379');
  });

  it('never shows the password of a cluster URL (whose host list no URL parser takes)', () => {
    expect(redactedRedisUrl('redis+cluster://app:s3cret@10.0.0.5:6379,10.0.0.6:6379')).toBe('redis+cluster://app:***@10.0.0.5:6379,10.0.0.6:6379');
    expect(redactedRedisUrl('redis+cluster://:s%40cret@[::1]:7000')).toBe('redis+cluster://:***@[::1]:7000');
    expect(redactedRedisUrl('redis+cluster://127.0.0.1:7000,127.0.0.1:7001')).toBe('redis+cluster://127.0.0.1:7000,127.0.0.1:7001');
    expect(redactedRedisUrl('redis+cluster://:s3cret@a:1,b')).not.toContain('s3cret');
  });
});

describe('isRedisUnavailable', () => {
  it('tells a Redis that cannot serve now from a failure of rollbox', () => {
    for (const message of ['CLUSTERDOWN The cluster is down', 'Connection is closed.', 'Too many Cluster redirections. Last error: Error: Connection is closed.', 'LOADING Redis is loading the dataset in memory', 'READONLY You can\'t write against a read only replica.', 'connect ECONNREFUSED 127.0.0.1:7000']) expect(isRedisUnavailable(new Error(message)), message).toBe(true);
    expect(isRedisUnavailable(Object.assign(new Error('x'), { name: 'ClusterAllFailedError' }))).toBe(true);
    for (const message of ['ERR wrong number of arguments', 'CROSSSLOT Keys in request don\'t hash to the same slot', 'Cannot read properties of undefined']) expect(isRedisUnavailable(new Error(message)), message).toBe(false);
    expect(isRedisUnavailable('CLUSTERDOWN')).toBe(false);
  });
});
