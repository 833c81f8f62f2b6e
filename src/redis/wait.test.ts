import { describe, expect, it } from 'vitest';
import { redactedRedisUrl } from './wait.ts';

describe('redactedRedisUrl', () => {
  it('never shows a password', () => {
    expect(redactedRedisUrl('redis://:s3cret@10.0.0.5:6379/0')).toBe('redis://:***@10.0.0.5:6379/0');
    expect(redactedRedisUrl('redis://app:s3cret@redis:6379')).not.toContain('s3cret');
    expect(redactedRedisUrl('redis://127.0.0.1:6379')).toBe('redis://127.0.0.1:6379');
  });
});
