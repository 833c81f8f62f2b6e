import { createHash } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import { RollboxError } from '../api/index.ts';
import { meteredBlob } from './blob-stream.ts';
import { parseChallenges, type Challenge } from './challenge.ts';
import type { Credentials } from './credentials.ts';
import { checkRegistryAllowed } from './egress.ts';
import { get, header, readBody, registryErrorOf, unreachable, type Transport } from './http.ts';
import { INDEX_MEDIA_TYPES, MANIFEST_ACCEPT, MANIFEST_MEDIA_TYPES, SCHEMA1_MEDIA_TYPES } from './media-types.ts';
import type { ImageReference } from './reference.ts';

/** How a gateway reaches registries (operator config), and the pull's end (`signal`). */
export interface RegistryOptions extends Transport {
  /** Per registry host (`docker.io`, `127.0.0.1:5000`): from the Docker config.json. */
  credentials: ReadonlyMap<string, Credentials>;
  /** Registry hosts spoken to over plain HTTP; any other is HTTPS. */
  insecure: ReadonlySet<string>;
  /** Per registry host: mirror base URLs (`http://127.0.0.1:5000`), tried in order before the registry itself. */
  mirrors: ReadonlyMap<string, readonly string[]>;
  now?: () => number;
}

export interface FetchedManifest {
  mediaType: string;
  /** sha256 of the bytes (checked against the digest asked for and the registry's `Docker-Content-Digest`). */
  digest: string;
  bytes: Buffer;
}

const MANIFEST_MAX_BYTES = 4 * 1024 * 1024;
const TOKEN_MAX_BYTES = 1024 * 1024;
/** A token without `expires_in` lasts 60 s (the distribution spec's default and minimum). */
const TOKEN_MIN_SECONDS = 60;
/** A token this close to its end is replaced before a request rather than refused after it. */
const TOKEN_REFRESH_MARGIN_MS = 10_000;
const MAX_REDIRECTS = 5;
const REDIRECTS = new Set([301, 302, 303, 307, 308]);

interface Endpoint {
  base: URL;
  /** Whose credentials it takes: its host[:port]. */
  host: string;
  mirror: boolean;
  pinged: boolean;
  scheme: 'none' | 'basic' | 'bearer';
  bearer?: Record<string, string>;
  token?: { value: string; expiresAtMs: number };
  /** A mirror that could not be reached: skipped for the rest of the pull. */
  down?: RollboxError;
}

/** The `mediaType` a manifest or index names itself (undefined: none, or not JSON). */
function mediaTypeIn(bytes: Buffer): string | undefined {
  try {
    const type = (JSON.parse(bytes.toString('utf8')) as { mediaType?: unknown }).mediaType;
    return typeof type === 'string' ? type : undefined;
  } catch {
    return undefined;
  }
}

const sha256 = (buf: Buffer): string => `sha256:${createHash('sha256').update(buf).digest('hex')}`;

/**
 * One repository of one registry, for one pull: the OCI distribution API's reads (the
 * `/v2/` ping, manifests, blobs), anonymous or with Basic or Bearer-token auth as the
 * registry's `WWW-Authenticate` challenge asks (a token is fetched from its realm, with
 * the configured credentials if any, renewed as it nears its end, fetched again once on a
 * 401), redirects followed (credentials are not sent to another host), mirrors first.
 * Credentials appear in no message.
 */
export class RegistryRepository {
  private readonly endpoints: Endpoint[];
  private readonly now: () => number;

  constructor(
    readonly ref: ImageReference,
    private readonly options: RegistryOptions,
  ) {
    this.now = options.now ?? Date.now;
    checkRegistryAllowed(ref.registry, options.egress);
    const origin = ref.registry === 'docker.io' ? 'https://registry-1.docker.io' : `${options.insecure.has(ref.registry) ? 'http' : 'https'}://${ref.registry}`;
    const bases = [...(options.mirrors.get(ref.registry) ?? []).map((m) => ({ url: m, mirror: true })), { url: origin, mirror: false }];
    this.endpoints = bases.map(({ url, mirror }) => {
      const base = new URL(url);
      return { base, host: mirror ? base.host : ref.registry, mirror, pinged: false, scheme: 'none' };
    });
  }

  /** A manifest or index by tag or digest, checked against its digest. */
  async manifest(reference: string = this.ref.reference): Promise<FetchedManifest> {
    const what = `${this.ref.registry}/${this.ref.repository}:${reference}`.replace(/:sha256:/, '@sha256:');
    const { res, url } = await this.fromEndpoints(`manifests/${reference}`, { accept: MANIFEST_ACCEPT }, what);
    const bytes = await readBody(res, url, MANIFEST_MAX_BYTES, this.options, { code: 'invalid_image', what: `manifest ${what}` });
    const digest = sha256(bytes);
    if (reference.startsWith('sha256:') && digest !== reference) throw new RollboxError('invalid_image', `manifest ${what}: its bytes hash to ${digest}`);
    const claimed = header(res.headers, 'docker-content-digest');
    if (claimed && claimed.startsWith('sha256:') && claimed !== digest) throw new RollboxError('invalid_image', `manifest ${what}: the registry names it ${claimed}, its bytes hash to ${digest}`);
    let mediaType = (header(res.headers, 'content-type') ?? '').split(';')[0]!.trim();
    if (!INDEX_MEDIA_TYPES.has(mediaType) && !MANIFEST_MEDIA_TYPES.has(mediaType)) {
      // Some registries answer application/json: the document names its own type.
      mediaType = mediaTypeIn(bytes) ?? mediaType;
    }
    if (SCHEMA1_MEDIA_TYPES.has(mediaType)) throw new RollboxError('invalid_image', `${what} is a Docker schema 1 manifest (not supported: push it again with a current client)`);
    if (!INDEX_MEDIA_TYPES.has(mediaType) && !MANIFEST_MEDIA_TYPES.has(mediaType)) throw new RollboxError('invalid_image', `${what}: not an image manifest or index (${mediaType ? JSON.stringify(mediaType.slice(0, 80)) : 'no media type'})`);
    return { mediaType, digest, bytes };
  }

  /** A small blob (an image config), whole and checked against its digest. */
  async blob(digest: string, maxBytes: number): Promise<Buffer> {
    const { res, url } = await this.blobAnswer(digest);
    const bytes = await readBody(res, url, maxBytes, this.options, { code: 'invalid_image', what: `blob ${digest}` });
    if (sha256(bytes) !== digest) throw new RollboxError('invalid_image', `blob ${digest}: its bytes hash to ${sha256(bytes)}`);
    return bytes;
  }

  /**
   * A layer blob as a stream of exactly `sizeBytes` bytes (fewer or more is an error). Its
   * digest is the reader's to check (the layer pipeline hashes what it reads anyway).
   */
  async blobStream(digest: string, sizeBytes: number): Promise<Readable> {
    const { res, url } = await this.blobAnswer(digest);
    const length = header(res.headers, 'content-length');
    if (length !== undefined && Number(length) !== sizeBytes) {
      res.resume();
      throw new RollboxError('invalid_image', `blob ${digest}: ${url.host} serves ${length} bytes, the manifest says ${sizeBytes}`);
    }
    return meteredBlob(res, url, digest, sizeBytes, this.options);
  }

  private async blobAnswer(digest: string): Promise<{ res: IncomingMessage; url: URL }> {
    return this.fromEndpoints(`blobs/${digest}`, {}, `blob ${digest} of ${this.ref.registry}/${this.ref.repository}`);
  }

  /** The first endpoint (mirrors, then the registry) that answers 200; the registry's own failure when none does. */
  private async fromEndpoints(pathTail: string, headers: Record<string, string>, what: string): Promise<{ res: IncomingMessage; url: URL }> {
    let mirrorFailure: RollboxError | undefined;
    for (const endpoint of this.endpoints) {
      if (endpoint.down) continue;
      try {
        const answer = await this.send(endpoint, `/v2/${this.ref.repository}/${pathTail}`, headers);
        if (answer.res.statusCode === 200) return answer;
        throw await this.statusError(answer.res, answer.url, what);
      } catch (err) {
        if (!endpoint.mirror) throw err;
        const failure = unreachable(endpoint.base, err);
        if (failure.code === 'registry_unavailable') endpoint.down = failure;
        mirrorFailure = failure;
      }
    }
    throw mirrorFailure ?? new RollboxError('internal', 'no registry endpoint');
  }

  private async statusError(res: IncomingMessage, url: URL, what: string): Promise<RollboxError> {
    // Only the spec's error codes are quoted: the body may be anyone's (a redirect's target, a proxy).
    const detail = registryErrorOf(await readBody(res, url, 64 * 1024, this.options, { code: 'registry_unavailable', what: 'an error body' }).catch(() => Buffer.alloc(0)));
    const status = res.statusCode ?? 0;
    const text = `${url.host} answered ${status} for ${what}${detail ? ` (${detail})` : ''}`;
    if (status === 404) return new RollboxError(what.startsWith('blob ') ? 'invalid_image' : 'image_not_found', text);
    if (status === 401 || status === 403) return new RollboxError('registry_unauthorized', text);
    return new RollboxError('registry_unavailable', text);
  }

  /** One request to an endpoint: authorized as it asks, retried once after a 401, redirects followed. */
  private async send(endpoint: Endpoint, path: string, headers: Record<string, string>): Promise<{ res: IncomingMessage; url: URL }> {
    await this.ping(endpoint);
    let url = new URL(path, endpoint.base);
    let authorization = await this.authorization(endpoint);
    let retried = false;
    for (let hops = 0; hops <= MAX_REDIRECTS; ) {
      const res = await get(url, { ...headers, ...(authorization ? { authorization } : {}) }, this.options, hops > 0 ? `a redirect of ${endpoint.base.host}` : endpoint.base.host);
      const status = res.statusCode ?? 0;
      if (status === 401 && !retried && url.origin === endpoint.base.origin) {
        res.resume();
        retried = true;
        authorization = await this.answerChallenge(endpoint, header(res.headers, 'www-authenticate'), true);
        continue;
      }
      const location = header(res.headers, 'location');
      if (REDIRECTS.has(status) && location) {
        res.resume();
        if (!URL.canParse(location, url)) throw new RollboxError('registry_unavailable', `${endpoint.base.host} redirected ${path} to something that is not a URL`);
        url = new URL(location, url);
        // A blob store's signed URL: our credentials are not for it.
        if (url.origin !== endpoint.base.origin) authorization = undefined;
        hops++;
        continue;
      }
      return { res, url };
    }
    throw new RollboxError('registry_unavailable', `${endpoint.base.host}: more than ${MAX_REDIRECTS} redirects for ${path}`);
  }

  /** `GET /v2/` once per endpoint: reachable, a registry, and which auth it wants. */
  private async ping(endpoint: Endpoint): Promise<void> {
    if (endpoint.pinged) return;
    const url = new URL('/v2/', endpoint.base);
    const res = await get(url, {}, this.options, endpoint.base.host);
    res.resume();
    const status = res.statusCode ?? 0;
    if (status === 401) await this.answerChallenge(endpoint, header(res.headers, 'www-authenticate'), false);
    else if (status !== 200) throw new RollboxError('registry_unavailable', `${endpoint.base.host} answered ${status} for /v2/: not an OCI distribution registry`);
    endpoint.pinged = true;
  }

  private credentialsOf(endpoint: Endpoint): Credentials | undefined {
    return this.options.credentials.get(endpoint.host);
  }

  /** The Authorization header for the endpoint's next request (a token renewed when near its end). */
  private async authorization(endpoint: Endpoint): Promise<string | undefined> {
    if (endpoint.scheme === 'basic') {
      const c = this.credentialsOf(endpoint);
      return c && `Basic ${Buffer.from(`${c.username}:${c.password}`).toString('base64')}`;
    }
    if (endpoint.scheme !== 'bearer') return undefined;
    if (!endpoint.token || this.now() >= endpoint.token.expiresAtMs - TOKEN_REFRESH_MARGIN_MS) endpoint.token = await this.fetchToken(endpoint);
    return `Bearer ${endpoint.token.value}`;
  }

  /**
   * A 401's challenge. Bearer: a new token from its realm. Basic: the credentials, unless
   * they were what was refused. `afterRequest`: the 401 answered a request that carried
   * what we had, so nothing new to try means refused.
   */
  private async answerChallenge(endpoint: Endpoint, headerValue: string | undefined, afterRequest: boolean): Promise<string | undefined> {
    const challenges: Challenge[] = parseChallenges(headerValue ?? '');
    const bearer = challenges.find((c) => c.scheme === 'bearer' && c.params.realm);
    const refused = (): RollboxError =>
      new RollboxError('registry_unauthorized', `${endpoint.base.host} refused ${this.credentialsOf(endpoint) ? 'the configured credentials' : 'anonymous access (no credentials configured for it)'} for ${this.ref.repository}`);
    if (bearer) {
      endpoint.scheme = 'bearer';
      endpoint.bearer = bearer.params;
      endpoint.token = undefined;
      return this.authorization(endpoint);
    }
    if (challenges.some((c) => c.scheme === 'basic')) {
      if ((afterRequest && endpoint.scheme === 'basic') || !this.credentialsOf(endpoint)) throw refused();
      endpoint.scheme = 'basic';
      return this.authorization(endpoint);
    }
    throw afterRequest ? refused() : new RollboxError('registry_unavailable', `${endpoint.base.host} asks for authentication it does not name (no Bearer realm or Basic challenge in its WWW-Authenticate)`);
  }

  /** A pull token from the realm the registry named: `token` or `access_token`, valid `expires_in` seconds (60 when unsaid). */
  private async fetchToken(endpoint: Endpoint): Promise<{ value: string; expiresAtMs: number }> {
    const params = endpoint.bearer ?? {};
    let url: URL;
    try {
      url = new URL(params.realm ?? '');
    } catch {
      throw new RollboxError('registry_unavailable', `${endpoint.base.host} names a token realm that is not a URL`);
    }
    if (params.service) url.searchParams.set('service', params.service);
    url.searchParams.set('scope', `repository:${this.ref.repository}:pull`);
    const c = this.credentialsOf(endpoint);
    const res = await get(url, c ? { authorization: `Basic ${Buffer.from(`${c.username}:${c.password}`).toString('base64')}` } : {}, this.options, `the token realm of ${endpoint.base.host}`);
    const status = res.statusCode ?? 0;
    if (status === 401 || status === 403) {
      res.resume();
      throw new RollboxError('registry_unauthorized', `the token service of ${endpoint.base.host} (${url.host}) refused ${c ? 'the configured credentials' : 'an anonymous pull'} for ${this.ref.repository}`);
    }
    const body = await readBody(res, url, TOKEN_MAX_BYTES, this.options, { code: 'registry_unavailable', what: `the token answer for ${endpoint.base.host}` });
    if (status !== 200) throw new RollboxError('registry_unavailable', `the token service of ${endpoint.base.host} (${url.host}) answered ${status}`);
    let parsed: { token?: unknown; access_token?: unknown; expires_in?: unknown };
    try {
      parsed = JSON.parse(body.toString('utf8')) as typeof parsed;
    } catch {
      throw new RollboxError('registry_unavailable', `the token service of ${endpoint.base.host} (${url.host}) answered something that is not JSON`);
    }
    const value = typeof parsed.token === 'string' && parsed.token ? parsed.token : typeof parsed.access_token === 'string' ? parsed.access_token : '';
    if (!value) throw new RollboxError('registry_unavailable', `the token service of ${endpoint.base.host} (${url.host}) answered no token`);
    const seconds = typeof parsed.expires_in === 'number' && parsed.expires_in > TOKEN_MIN_SECONDS ? parsed.expires_in : TOKEN_MIN_SECONDS;
    return { value, expiresAtMs: this.now() + seconds * 1000 };
  }
}
