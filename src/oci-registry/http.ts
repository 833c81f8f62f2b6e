import http, { type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import https from 'node:https';
import { RollboxError } from '../api/index.ts';

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

/**
 * One GET (a HEAD is never needed), answered once the status and headers are in; the body
 * is the caller's to read or `resume()`. `idleMs` bounds every wait for the server: the
 * answer, and each chunk of the body after it. Redirects are the caller's to follow.
 */
export function get(url: URL, headers: Record<string, string>, idleMs: number): Promise<IncomingMessage> {
  const lib = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    const req = lib.request(url, { method: 'GET', headers, agent: agents[url.protocol as 'http:' | 'https:'], timeout: idleMs }, (res) => {
      res.once('error', () => undefined); // read by the caller; an early error must not be unhandled meanwhile
      resolve(res);
    });
    req.once('timeout', () => req.destroy(new RollboxError('registry_unavailable', `${url.host}: no answer for ${Math.round(idleMs / 1000)} s`)));
    req.once('error', (err) => reject(unreachable(url, err)));
    req.end();
  });
}

/** The whole body, up to `maxBytes` (more is refused: manifests, configs and tokens are small). */
export async function readBody(res: IncomingMessage, url: URL, maxBytes: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > maxBytes) {
        res.destroy();
        throw new RollboxError('invalid_image', `${url.host} answered ${url.pathname} with more than ${maxBytes} bytes`);
      }
      chunks.push(chunk);
    }
  } catch (err) {
    throw unreachable(url, err);
  }
  return Buffer.concat(chunks);
}

/** `MANIFEST_UNKNOWN: manifest unknown` from a registry's JSON error body, or the start of the body. */
export function registryErrorOf(body: Buffer): string {
  try {
    const parsed = JSON.parse(body.toString('utf8')) as { errors?: { code?: string; message?: string }[] };
    if (Array.isArray(parsed.errors) && parsed.errors.length > 0) return parsed.errors.map((e) => [e.code, e.message].filter(Boolean).join(': ')).join('; ').slice(0, 300);
  } catch {
    /* not JSON */
  }
  return body.toString('utf8').replace(/\s+/g, ' ').trim().slice(0, 200);
}

export function header(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value.join(', ') : value;
}
