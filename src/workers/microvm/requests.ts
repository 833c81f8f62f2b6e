import { RollboxError, type ErrorCode } from '../../api/index.ts';
import { MuxKind, type VmChannel, type VmRequestKind } from './channel.ts';

/** A hide or a freeze takes milliseconds; a guest that does not answer in this long is not answering. */
const QUICK_REQUEST_TIMEOUT_MS = 15_000;

/** A request's result status (guest/vminit.h MUX_RESULT). */
export const ResultStatus = { ok: 0, changed: 1, failed: 2, tooLarge: 3 } as const;

/**
 * A quick request to the guest's trusted side (hidden paths, a freeze): resolves once it
 * answered ok; its failure's message (e.g. "X is a symbolic link") rejects with `refused`,
 * a guest that does not answer as `internal`.
 */
export async function guestRequest(channel: VmChannel, kind: VmRequestKind, body: Buffer, what: string, refused: ErrorCode): Promise<void> {
  const req = channel.request(kind, body);
  req.data.resume(); // these answer with a result only
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      req.cancel();
      reject(new RollboxError('internal', `the microVM's guest did not ${what} within ${QUICK_REQUEST_TIMEOUT_MS} ms`));
    }, QUICK_REQUEST_TIMEOUT_MS);
  });
  try {
    const result = await Promise.race([req.result, timedOut]).catch((err: Error) => {
      throw err instanceof RollboxError ? err : new RollboxError('internal', `the microVM's guest did not ${what}: ${err.message}`);
    });
    if (result.length < 4 || result.readUInt32LE(0) !== ResultStatus.ok) {
      throw new RollboxError(refused, `could not ${what}: ${result.subarray(4).toString('utf8') || 'the guest refused'}`);
    }
  } finally {
    clearTimeout(timer);
  }
}

/** The hidden paths wanted now, each NUL-ended (guest/hide.c). */
export function hiddenPathsBody(paths: readonly string[]): Buffer {
  return Buffer.concat(paths.map((p) => Buffer.from(`${p}\0`, 'utf8')));
}

/** Hides and reveals inside the guest so that exactly `paths` are hidden (the guest knows what it hid). */
export function setGuestHiddenPaths(channel: VmChannel, paths: readonly string[]): Promise<void> {
  return guestRequest(channel, MuxKind.policy, hiddenPathsBody(paths), 'change its hidden paths', 'invalid_request');
}

/** Freezes (every process of the sandbox stopped, in the guest's cgroup freezer) or thaws the sandbox. */
export function setGuestFrozen(channel: VmChannel, frozen: boolean): Promise<void> {
  return guestRequest(channel, MuxKind.freeze, Buffer.from([frozen ? 1 : 0]), frozen ? 'freeze its sandbox' : 'thaw its sandbox', 'internal');
}
