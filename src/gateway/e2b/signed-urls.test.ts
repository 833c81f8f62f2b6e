import { getSignature } from 'e2b';
import { describe, expect, it } from 'vitest';
import { signatureOf } from './signed-urls.ts';

describe('signed file URLs', () => {
  it('sign as the E2B SDK signs: path, operation, user and token, with or without an expiration', async () => {
    const token = 'dGVuYW50.abc123';
    for (const [user, expirationInSeconds] of [[undefined, undefined], ['user', undefined], [undefined, 60], ['root', 3600]] as const) {
      const sdk = await getSignature({ path: '/data/x.txt', operation: 'write', user: user as string, expirationInSeconds, envdAccessToken: token });
      expect(signatureOf({ path: '/data/x.txt', operation: 'write', username: user ?? '', expiration: sdk.expiration ?? undefined }, token)).toBe(sdk.signature);
    }
    expect(signatureOf({ path: '/data/x.txt', operation: 'read', username: '', expiration: undefined }, token)).not.toBe(signatureOf({ path: '/data/y.txt', operation: 'read', username: '', expiration: undefined }, token));
  });
});
