import { describe, expect, it } from 'vitest';
import { hashedPart } from './lua.ts';

describe('hashedPart', () => {
  it('is what Redis Cluster hashes: the first non-empty hash tag, else the whole key', () => {
    expect(hashedPart('rb:{sbx:a}:cmd:x')).toBe('sbx:a');
    expect(hashedPart('rb:{sbx:a}')).toBe('sbx:a');
    expect(hashedPart('rb:nodes')).toBe('rb:nodes');
    expect(hashedPart('rb:{}:x')).toBe('rb:{}:x');
    expect(hashedPart('rb:{a}{b}')).toBe('a');
    expect(hashedPart('rb:{open')).toBe('rb:{open');
    expect(hashedPart('')).toBe('');
  });
});
