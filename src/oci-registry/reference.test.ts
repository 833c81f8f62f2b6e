import { describe, expect, it } from 'vitest';
import { parseChallenges } from './challenge.ts';
import { parseDockerConfig, registryHostOf } from './credentials.ts';
import { familiarName, parseReference } from './reference.ts';

describe('parseReference (as docker reads references)', () => {
  const cases: [string, string, string, string][] = [
    ['busybox', 'docker.io', 'library/busybox', 'docker.io/library/busybox:latest'],
    ['python:3.12', 'docker.io', 'library/python', 'docker.io/library/python:3.12'],
    ['myorg/task:1', 'docker.io', 'myorg/task', 'docker.io/myorg/task:1'],
    ['docker.io/library/python:3.12-slim', 'docker.io', 'library/python', 'docker.io/library/python:3.12-slim'],
    ['index.docker.io/myorg/task', 'docker.io', 'myorg/task', 'docker.io/myorg/task:latest'],
    ['ghcr.io/org/sub/img:v1.2', 'ghcr.io', 'org/sub/img', 'ghcr.io/org/sub/img:v1.2'],
    ['127.0.0.1:5000/t/task:1', '127.0.0.1:5000', 't/task', '127.0.0.1:5000/t/task:1'],
    ['localhost/app', 'localhost', 'app', 'localhost/app:latest'],
    ['Registry.Example:5000/app', 'registry.example:5000', 'app', 'registry.example:5000/app:latest'],
    ['localhost:5000/a__b/c-d.e_f', 'localhost:5000', 'a__b/c-d.e_f', 'localhost:5000/a__b/c-d.e_f:latest'],
  ];
  for (const [input, registry, repository, canonical] of cases) {
    it(`reads ${input}`, () => {
      expect(parseReference(input)).toMatchObject({ registry, repository, canonical });
    });
  }

  it('fetches by digest when one is given, keeping the tag in the canonical form', () => {
    const hex = 'a'.repeat(64);
    expect(parseReference(`python@sha256:${hex}`)).toEqual({ registry: 'docker.io', repository: 'library/python', digest: `sha256:${hex}`, reference: `sha256:${hex}`, canonical: `docker.io/library/python@sha256:${hex}` });
    expect(parseReference(`reg.io:443/x:1@sha256:${hex}`)).toMatchObject({ tag: '1', reference: `sha256:${hex}`, canonical: `reg.io:443/x:1@sha256:${hex}` });
  });

  it('refuses what docker refuses', () => {
    for (const bad of ['', 'Python:3', 'a//b', 'a/-b', 'x:', 'x:-tag', `x@sha256:${'a'.repeat(63)}`, 'x@md5:abc', 'reg.io/UPPER', `x:${'t'.repeat(129)}`, 'bad_host.:5000/x', 'localhost:0/x', '127.0.0.1:99999/x', 'reg.io:65536/x']) {
      expect(() => parseReference(bad), bad).toThrow(/is not an image reference/);
    }
  });

  it('shows references as docker does', () => {
    expect(familiarName(parseReference('docker.io/library/python:3.12'))).toBe('python:3.12');
    expect(familiarName(parseReference('myorg/task:1'))).toBe('myorg/task:1');
    expect(familiarName(parseReference('127.0.0.1:5000/t/task'))).toBe('127.0.0.1:5000/t/task:latest');
  });
});

describe('parseChallenges', () => {
  it('reads Bearer and Basic challenges, quoted or not, several in one header', () => {
    expect(parseChallenges('Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull"')).toEqual([
      { scheme: 'bearer', params: { realm: 'https://auth.example/token', service: 'registry.example', scope: 'repository:a/b:pull' } },
    ]);
    expect(parseChallenges('Basic realm="basic-realm"')).toEqual([{ scheme: 'basic', params: { realm: 'basic-realm' } }]);
    expect(parseChallenges('Basic realm="a, b", Bearer realm=https://t/x, error="insufficient_scope"')).toEqual([
      { scheme: 'basic', params: { realm: 'a, b' } },
      { scheme: 'bearer', params: { realm: 'https://t/x', error: 'insufficient_scope' } },
    ]);
    expect(parseChallenges('bearer realm = "x\\"y"')).toEqual([{ scheme: 'bearer', params: { realm: 'x"y' } }]);
    expect(parseChallenges('')).toEqual([]);
  });
});

describe('parseDockerConfig', () => {
  it('reads auth (base64 user:password) and username/password entries, keyed by registry host', () => {
    const config = JSON.stringify({
      auths: {
        'https://index.docker.io/v1/': { auth: Buffer.from('hub-user:pa:ss').toString('base64') },
        '127.0.0.1:5000': { username: 'u', password: 'p' },
        'https://ghcr.io': { auth: Buffer.from('g:h').toString('base64'), email: 'x@y' },
        'helper.example': {},
      },
      credsStore: 'desktop',
    });
    const creds = parseDockerConfig(config, '/etc/rollbox/auth.json');
    expect([...creds]).toEqual([
      ['docker.io', { username: 'hub-user', password: 'pa:ss' }],
      ['127.0.0.1:5000', { username: 'u', password: 'p' }],
      ['ghcr.io', { username: 'g', password: 'h' }],
    ]);
    expect(registryHostOf('registry-1.docker.io')).toBe('docker.io');
  });

  it('names the file, never its content, when it is not a config', () => {
    expect(() => parseDockerConfig('{"auths": "secret-value"}', '/x/auth.json')).toThrow(/^\/x\/auth\.json is not a Docker config\.json/);
    expect(() => parseDockerConfig('secret-value', '/x/auth.json')).toThrow(/^\/x\/auth\.json is not JSON$/);
  });
});
