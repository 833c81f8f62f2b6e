import { describe, expect, it } from 'vitest';
import { checkDestination, checkRegistryAllowed, isInternalAddress, lookupFor, type EgressPolicy } from './egress.ts';

const policy = (internal: string[] = [], allowed: string[] = []): EgressPolicy => ({ internal: new Set(internal), allowed: new Set(allowed) });

describe('the egress policy of pulls', () => {
  it('knows loopback, link-local, private and reserved addresses, IPv4-mapped ones included', () => {
    for (const a of ['127.0.0.1', '127.9.9.9', '10.1.2.3', '172.16.0.1', '172.31.255.255', '192.168.1.1', '169.254.169.254', '100.64.0.1', '0.0.0.0', '224.0.0.1', '::1', '::', 'fe80::1', 'fd00::1', '::ffff:127.0.0.1', '::ffff:169.254.169.254', 'not-an-ip']) {
      expect(isInternalAddress(a), a).toBe(true);
    }
    for (const a of ['8.8.8.8', '172.32.0.1', '192.169.0.1', '1.1.1.1', '2606:4700::1111', '::ffff:8.8.8.8']) expect(isInternalAddress(a), a).toBe(false);
  });

  it('allows http(s) only, never port 0, and internal address literals only on hosts listed internal', () => {
    const p = policy(['127.0.0.1:5000', 'registry.lan']);
    for (const bad of ['file:///etc/passwd', 'data:text/plain,x', 'gopher://127.0.0.1:6379/_x', 'ftp://x.example/']) {
      expect(() => checkDestination(new URL(bad), p, 'a redirect'), bad).toThrow(expect.objectContaining({ code: 'registry_not_allowed' }));
    }
    expect(() => checkDestination(new URL('http://localhost:0/v2/'), p, 'x')).toThrow(/port 0/);
    expect(() => checkDestination(new URL('http://127.0.0.1:6379/'), p, 'x')).toThrow(/not listed in ROLLBOX_REGISTRY_INTERNAL/);
    expect(() => checkDestination(new URL('http://169.254.169.254/latest/meta-data'), p, 'x')).toThrow(expect.objectContaining({ code: 'registry_not_allowed' }));
    expect(() => checkDestination(new URL('http://[::1]:5000/'), p, 'x')).toThrow(expect.objectContaining({ code: 'registry_not_allowed' }));
    checkDestination(new URL('http://127.0.0.1:5000/v2/'), p, 'x');
    checkDestination(new URL('https://8.8.8.8/v2/'), p, 'x');
    checkDestination(new URL('https://registry.example/v2/'), p, 'x');
  });

  it('checks names at connect time, on every address they resolve to', async () => {
    const resolve = (url: string, p: EgressPolicy) =>
      new Promise<unknown>((done) => {
        const lookup = lookupFor(new URL(url), p, 'x');
        if (!lookup) return done('unchecked');
        lookup('localhost', { all: false }, (err, address) => done(err ?? address));
      });
    expect(await resolve('http://localhost:5000/', policy())).toMatchObject({ code: 'registry_not_allowed' });
    expect(await resolve('http://localhost:5000/', policy(['localhost:5000']))).toBe('unchecked');
    expect(await resolve('http://localhost:5000/', policy(['localhost']))).toBe('unchecked');
    expect(await resolve('http://localhost:5001/', policy(['localhost:5000']))).toMatchObject({ code: 'registry_not_allowed' });
  });

  it('holds refs to the allowlist when one is configured', () => {
    checkRegistryAllowed('anything.example', policy());
    const p = policy([], ['ghcr.io', 'reg.lan:5000']);
    checkRegistryAllowed('ghcr.io', p);
    checkRegistryAllowed('ghcr.io:443', p);
    checkRegistryAllowed('reg.lan:5000', p);
    expect(() => checkRegistryAllowed('reg.lan:5001', p)).toThrow(expect.objectContaining({ code: 'registry_not_allowed' }));
    expect(() => checkRegistryAllowed('docker.io', p)).toThrow(/not in ROLLBOX_REGISTRY_ALLOW/);
  });
});
