import { describe, expect, it } from 'vitest';
import { ImageName } from '../api/index.ts';
import { parseReference } from '../oci-registry/index.ts';
import { imageNameOf } from './pulls.ts';

describe('imageNameOf (the name a pull gets when it names none)', () => {
  it('is the reference as docker shows it, lowercased, with / : @ made -, and the platform unless linux/amd64', () => {
    const cases: [string, string | undefined, string][] = [
      ['python:3.12', undefined, 'python-3.12'],
      ['docker.io/library/python:3.12-slim', undefined, 'python-3.12-slim'],
      ['myorg/swe-task:1234', undefined, 'myorg-swe-task-1234'],
      ['127.0.0.1:5000/t/task:1', undefined, '127.0.0.1-5000-t-task-1'],
      ['ghcr.io/org/img:V1', undefined, 'ghcr.io-org-img-v1'],
      ['python:3.12', 'linux/arm64', 'python-3.12-linux-arm64'],
      [`python@sha256:${'a'.repeat(64)}`, undefined, `python-sha256-${'a'.repeat(64)}`],
    ];
    for (const [ref, platform, name] of cases) {
      expect(imageNameOf(parseReference(ref), platform), ref).toBe(name);
      expect(ImageName.safeParse(name).success, name).toBe(true);
    }
  });

  it('cuts a long one to 128 characters with a hash of the reference, still a valid name, distinct per reference', () => {
    const long = (tag: string) => imageNameOf(parseReference(`registry.example:5000/${'deep/'.repeat(20)}image:${tag}`));
    expect(long('1')).toHaveLength(128);
    expect(ImageName.safeParse(long('1')).success).toBe(true);
    expect(long('1')).not.toBe(long('2'));
  });
});
