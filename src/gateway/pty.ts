import { DEFAULT_BACKGROUND_TIMEOUT_MS, type ExecRequest, type PtyRequest } from '../api/index.ts';

/** A pty's default command: the image's shell, interactive and login (bash where there is one). */
export const PTY_DEFAULT_SHELL = '[ -x /bin/bash ] && exec /bin/bash -i -l; exec /bin/sh -i -l';
/** A terminal's default TERM (the request's env may set another). */
const PTY_TERM = 'xterm-256color';

/** The exec a pty request runs: a background command with stdin open, on the terminal. */
export function ptyExec(request: PtyRequest): ExecRequest {
  return {
    ...(request.argv ? { argv: request.argv } : { cmd: request.cmd ?? PTY_DEFAULT_SHELL }),
    env: { TERM: PTY_TERM, ...request.env },
    ...(request.cwd === undefined ? {} : { cwd: request.cwd }),
    ...(request.user === undefined ? {} : { user: request.user }),
    timeoutMs: request.timeoutMs ?? DEFAULT_BACKGROUND_TIMEOUT_MS,
    background: true,
    stdinOpen: true,
    ...(request.commandId === undefined ? {} : { commandId: request.commandId }),
  };
}
