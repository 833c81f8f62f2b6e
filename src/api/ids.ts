import { randomBytes } from 'node:crypto';

/** `sbx_3kq9...`: a prefix naming the kind, then 12 random base-36-ish characters. */
export function newId(prefix: string): string {
  return `${prefix}_${randomBytes(10).toString('base64url').replace(/[-_]/g, '').toLowerCase().slice(0, 12).padEnd(12, '0')}`;
}
