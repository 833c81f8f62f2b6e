import { randomBytes } from 'node:crypto';
import { link, mkdir, open, readFile, unlink } from 'node:fs/promises';
import path from 'node:path';

/** Shorter secrets are refused: HS256 is only as strong as its key (RFC 7518 §3.2 asks ≥ 256 bits). */
const MIN_SECRET_CHARS = 32;

/**
 * The HS256 key for the embedded default. First use creates `secretFile` holding 32 random
 * bytes as base64url text (mode 0600, parent dir created 0700); later uses read it back.
 *
 * The HMAC key is the UTF-8 bytes of the trimmed file content (not the decoded bytes), so
 * an operator-provided secret file works as-is and other tools can use the file text as
 * the shared secret directly.
 *
 * Concurrency: the secret is written to a private temp file and then hard-linked into
 * place. `link` never overwrites, so when two processes (gateway and CLI, or two
 * gateways) start together exactly one link wins and the loser reads the winner's
 * secret. `rename` would silently replace a secret the other process may already use.
 */
export async function loadOrCreateHsSecret(secretFile: string): Promise<Uint8Array<ArrayBuffer>> {
  const existing = await readSecret(secretFile);
  if (existing) return existing;

  await mkdir(path.dirname(secretFile), { recursive: true, mode: 0o700 });
  const tmp = `${secretFile}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
  const fh = await open(tmp, 'wx', 0o600);
  try {
    // chmod again: the open mode is filtered by the umask.
    await fh.chmod(0o600);
    await fh.writeFile(`${randomBytes(32).toString('base64url')}\n`);
    // Durable before it becomes visible: a crash must not leave an empty secret behind.
    await fh.sync();
  } finally {
    await fh.close();
  }
  try {
    await link(tmp, secretFile);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    // Another process won the race; its secret is the one.
  } finally {
    await unlink(tmp).catch(() => {});
  }
  const created = await readSecret(secretFile);
  if (!created) throw new Error(`JWT secret file ${secretFile} vanished right after creation`);
  return created;
}

async function readSecret(secretFile: string): Promise<Uint8Array<ArrayBuffer> | undefined> {
  let text: string;
  try {
    text = await readFile(secretFile, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  const secret = text.trim();
  if (secret.length < MIN_SECRET_CHARS) {
    // Never echo the content: it is (part of) a secret.
    throw new Error(`JWT secret file ${secretFile} holds fewer than ${MIN_SECRET_CHARS} characters; refusing a weak HS256 key`);
  }
  return new TextEncoder().encode(secret);
}
