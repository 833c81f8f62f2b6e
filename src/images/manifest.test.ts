import { describe, expect, it } from 'vitest';
import { imageConfigOf, parseImageManifest } from './manifest.ts';

const DIFF_ID = `sha256:${'a'.repeat(64)}`;
const configBlob = (over: Record<string, unknown> = {}, config: Record<string, unknown> = {}) =>
  Buffer.from(JSON.stringify({ os: 'linux', architecture: 'amd64', config: { Env: ['PATH=/bin'], ...config }, rootfs: { type: 'layers', diff_ids: [DIFF_ID] }, ...over }));
const refused = (f: () => unknown) => {
  try {
    f();
  } catch (err) {
    return err as { code: string; message: string };
  }
  throw new Error('accepted');
};

describe('what a pull may store of an image config (checked as a create is)', () => {
  it('keeps a sound config', () => {
    expect(imageConfigOf(configBlob({}, { WorkingDir: '/app', User: '1000:1000', Cmd: ['sh'], Entrypoint: [] }), 1)).toEqual({
      config: { Env: ['PATH=/bin'], WorkingDir: '/app', User: '1000:1000', Cmd: ['sh'] },
      diffIds: [DIFF_ID],
      platform: 'linux/amd64',
    });
  });

  const cases: [string, Buffer, RegExp][] = [
    ['a variant that is not lowercase', configBlob({ variant: 'V8' }), /platform .*"linux\/amd64\/V8" is not os\/architecture/],
    ['Linux/x86-64', configBlob({ os: 'Linux', architecture: 'x86-64' }), /"Linux\/x86-64" is not/],
    ['an 8 MB architecture', configBlob({ architecture: 'a'.repeat(8_000_000) }), /platform \(os, architecture, variant\) of 8000006 characters/],
    ['a NUL in WorkingDir', configBlob({}, { WorkingDir: '/app\0x' }), /config\.WorkingDir: must not contain NUL/],
    ['a User of nobody:../../etc', configBlob({}, { User: 'nobody:../../etc' }), /config\.User: user is name, uid/],
    ['a NUL in an Env value', configBlob({}, { Env: ['A=1', 'B=x\0y'] }), /config\.Env\.1: must not contain NUL/],
    ['an Env value over 32 KiB', configBlob({}, { Env: [`BIG=${'x'.repeat(40_000)}`] }), /config\.Env\.0: Too big/],
    ['3.8 MB of Env', configBlob({}, { Env: Array.from({ length: 130 }, (_, i) => `V${i}=${'x'.repeat(30_000)}`) }), /config\.Env: env holds more than 262144 characters/],
    ['an Env name a create refuses', configBlob({}, { Env: ['a.b=1'] }), /config\.Env\.0: env names are/],
    ['an Env entry without =', configBlob({}, { Env: ['JUSTNAME'] }), /config\.Env\.0: an Env entry is NAME=value/],
  ];
  for (const [what, blob, message] of cases) {
    it(`refuses ${what}: invalid_image naming the field, quoting nothing long`, () => {
      const err = refused(() => imageConfigOf(blob, 1));
      expect(err.code).toBe('invalid_image');
      expect(err.message).toMatch(message);
      expect(err.message.length).toBeLessThan(400);
    });
  }

  it('refuses layer sizes that are not whole bytes', () => {
    const manifest = (size: number) => Buffer.from(JSON.stringify({ config: { digest: DIFF_ID, size: 10 }, layers: [{ digest: DIFF_ID, size }] }));
    for (const size of [1.5, 1e300, -1]) expect(refused(() => parseImageManifest(manifest(size), 'manifest m'))).toMatchObject({ code: 'invalid_image', message: expect.stringMatching(/^manifest m: layers\.0\.size: /) });
    expect(parseImageManifest(manifest(1234), 'm').layers[0]!.size).toBe(1234);
  });
});
