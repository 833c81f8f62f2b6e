import { readFile } from 'node:fs/promises';
import { z } from 'zod';

/** A user and password (or token) for one registry. Never logged, never in an answer. */
export interface Credentials {
  username: string;
  password: string;
}

const DockerConfig = z.object({
  auths: z.record(z.string(), z.object({ auth: z.string().optional(), username: z.string().optional(), password: z.string().optional() }).loose()).default({}),
});

/**
 * The registry host an `auths` key names: Docker writes `https://index.docker.io/v1/` for
 * Docker Hub and a bare `host[:port]` (or a URL) for others.
 */
export function registryHostOf(key: string): string {
  const host = key.replace(/^[a-z]+:\/\//i, '').replace(/\/.*$/, '').toLowerCase();
  return host === 'index.docker.io' || host === 'registry-1.docker.io' ? 'docker.io' : host;
}

/**
 * Credentials per registry host from a Docker `config.json` (`auths`: `auth` is base64 of
 * `user:password`, or `username` and `password`). Entries with neither are skipped
 * (credential helpers are not run). A file that is not such JSON is an error naming the
 * file, never its content.
 */
export function parseDockerConfig(text: string, source: string): Map<string, Credentials> {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw new Error(`${source} is not JSON`);
  }
  const parsed = DockerConfig.safeParse(raw);
  if (!parsed.success) throw new Error(`${source} is not a Docker config.json ({"auths": {...}})`);
  const out = new Map<string, Credentials>();
  for (const [key, entry] of Object.entries(parsed.data.auths)) {
    let credentials: Credentials | undefined;
    if (entry.auth) {
      const decoded = Buffer.from(entry.auth, 'base64').toString('utf8');
      const colon = decoded.indexOf(':');
      if (colon > 0) credentials = { username: decoded.slice(0, colon), password: decoded.slice(colon + 1) };
    } else if (entry.username !== undefined && entry.password !== undefined) {
      credentials = { username: entry.username, password: entry.password };
    }
    if (credentials) out.set(registryHostOf(key), credentials);
  }
  return out;
}

/** The auth file, read at each pull (credentials changed on disk apply to the next pull); none configured: no credentials. */
export async function loadDockerConfig(file: string | undefined): Promise<Map<string, Credentials>> {
  if (!file) return new Map();
  return parseDockerConfig(await readFile(file, 'utf8'), file);
}
