import http, { type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import https from 'node:https';
import { RollboxError, type ErrorCode } from '../api/index.ts';
import { RateFloor, type RateFloorOptions } from './rate-floor.ts';
import { checkDestination, lookupFor, type EgressPolicy } from './egress.ts';

/** How a pull talks to registries: its egress policy, its waits, and its end (the pull's signal). */
export interface Transport {
  egress: EgressPolicy;
  /** Longest wait for a registry: its answer's headers, and each chunk of a body. */
  timeoutMs: number;
  rateFloor: RateFloorOptions;
  /** The pull's end (stopped, or past its deadline): every request of it is cut, failing with its reason. */
  signal?: AbortSignal;
}

/** Connections to registries are kept open between the requests of a pull (and across pulls). */
const agents = { 'http:': new http.Agent({ keepAlive: true, maxSockets: 32 }), 'https:': new https.Agent({ keepAlive: true, maxSockets: 32 }) };

const TLS_CODES = /^(ERR_SSL_|ERR_TLS_|EPROTO$|CERT_|UNABLE_TO_|DEPTH_ZERO_|SELF_SIGNED_)/;

/** Why a registry could not be talked to, as a coded error (a plain-HTTP registry spoken to over TLS says what to configure). */
export function unreachable(url: URL, err: unknown): RollboxError {
  if (err instanceof RollboxError) return err;
  const code = (err as NodeJS.ErrnoException).code ?? '';
  const message = err instanceof Error ? err.message : String(err);
  const hint = url.protocol === 'https:' && TLS_CODES.test(code) ? ` (if ${url.host} speaks plain HTTP, list it in ROLLBOX_REGISTRY_INSECURE)` : '';
  return new RollboxError('registry_unavailable', `${url.host}: ${code ? `${code}: ` : ''}${message}${hint}`.slice(0, 500));
}

/** The pull's own end (its signal's reason) wins over what it did to a request. */
export function failureOf(url: URL, err: unknown, t: Pick<Transport, 'signal'>): RollboxError {
  if (t.signal?.aborted && t.signal.reason instanceof RollboxError) return t.signal.reason;
  return unreachable(url, err);
}

/**
 * One GET (a HEAD is never needed), answered once the status and headers are in; the body
 * is the caller's to read or `resume()`. The destination is held to the egress policy first
 * (scheme, port, address literal) and at connect time (each address its name resolves to).
 * The headers must be in within `timeoutMs` however slowly they trickle; the socket's idle
 * timeout bounds each wait after. Redirects are the caller's to follow (each hop comes back here).
 */
export function get(url: URL, headers: Record<string, string>, t: Transport, what: string): Promise<IncomingMessage> {
  checkDestination(url, t.egress, what);
  const lib = url.protocol === 'https:' ? https : http;
  const lookup = lookupFor(url, t.egress, what);
  return new Promise((resolve, reject) => {
    const req = lib.request(url, { method: 'GET', headers, agent: agents[url.protocol as 'http:' | 'https:'], timeout: t.timeoutMs, ...(lookup ? { lookup } : {}) }, (res) => {
      clearTimeout(headersDeadline);
      t.signal?.removeEventListener('abort', abort);
      res.once('error', () => undefined); // read by the caller; an early error must not be unhandled meanwhile
      resolve(res);
    });
    const noAnswer = (): RollboxError => new RollboxError('registry_unavailable', `${url.host}: no answer for ${Math.round(t.timeoutMs / 1000)} s`);
    const headersDeadline = setTimeout(() => req.destroy(noAnswer()), t.timeoutMs);
    const abort = (): void => void req.destroy(t.signal!.reason as Error);
    if (t.signal?.aborted) abort();
    else t.signal?.addEventListener('abort', abort, { once: true });
    req.once('timeout', () => req.destroy(noAnswer()));
    req.once('error', (err) => {
      clearTimeout(headersDeadline);
      t.signal?.removeEventListener('abort', abort);
      reject(failureOf(url, err, t));
    });
    req.end();
  });
}

/**
 * The whole body, up to `maxBytes`: more is refused with `oversize`'s code, naming the cap
 * (manifests, configs and tokens are small). It must come faster than the rate floor, and
 * stops with the pull.
 */
export async function readBody(res: IncomingMessage, url: URL, maxBytes: number, t: Transport, oversize: { code: ErrorCode; what: string }): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  const floor = new RateFloor(t.rateFloor, (got) => res.destroy(floor.error(`${oversize.what} from ${url.host}`, got)));
  const abort = (): void => void res.destroy(t.signal!.reason as Error);
  t.signal?.addEventListener('abort', abort, { once: true });
  try {
    if (t.signal?.aborted) abort();
    floor.want();
    for await (const chunk of res as AsyncIterable<Buffer>) {
      size += chunk.length;
      floor.got(chunk.length);
      if (size > maxBytes) {
        res.destroy();
        throw new RollboxError(oversize.code, `${oversize.what} from ${url.host} is larger than ${capText(maxBytes)}, the cap of its kind`);
      }
      chunks.push(chunk);
    }
  } catch (err) {
    throw failureOf(url, err, t);
  } finally {
    floor.pause();
    t.signal?.removeEventListener('abort', abort);
  }
  return Buffer.concat(chunks);
}

/** `4 MiB`, `64 KiB`, or bytes. */
function capText(bytes: number): string {
  if (bytes % (1024 * 1024) === 0) return `${bytes / (1024 * 1024)} MiB`;
  return bytes % 1024 === 0 ? `${bytes / 1024} KiB` : `${bytes} bytes`;
}

/**
 * The error codes of the distribution spec's error bodies (`{"errors":[{"code":...}]}`): the
 * only part of a registry's body an error message quotes (any other body, a redirect
 * target's or a proxy's page, is never quoted).
 */
const SPEC_ERROR_CODES = new Set(['BLOB_UNKNOWN', 'BLOB_UPLOAD_INVALID', 'BLOB_UPLOAD_UNKNOWN', 'DIGEST_INVALID', 'MANIFEST_BLOB_UNKNOWN', 'MANIFEST_INVALID', 'MANIFEST_UNKNOWN', 'MANIFEST_UNVERIFIED', 'NAME_INVALID', 'NAME_UNKNOWN', 'SIZE_INVALID', 'TAG_INVALID', 'UNAUTHORIZED', 'DENIED', 'UNSUPPORTED', 'TOOMANYREQUESTS']);

/** `MANIFEST_UNKNOWN` (the spec's codes found in a registry's JSON error body), or nothing. */
export function registryErrorOf(body: Buffer): string {
  try {
    const parsed = JSON.parse(body.toString('utf8')) as { errors?: { code?: unknown }[] };
    if (Array.isArray(parsed.errors)) return [...new Set(parsed.errors.map((e) => e?.code).filter((c): c is string => typeof c === 'string' && SPEC_ERROR_CODES.has(c)))].join(', ');
  } catch {
    /* not JSON */
  }
  return '';
}

export function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value.join(', ') : value;
}
