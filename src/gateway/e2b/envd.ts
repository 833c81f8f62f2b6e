import type { Context, MiddlewareHandler } from 'hono';
import type { GatewayApp } from '../routes/common.ts';
import { bodyLimit } from 'hono/body-limit';
import type { Redis } from 'ioredis';
import { RollboxError, isTerminal } from '../../api/index.ts';
import type { SandboxRegistry } from '../../registry/index.ts';
import type { EnvdAccess } from './access.ts';
import { ConnectError, MAX_MESSAGE_BYTES, connectErrorResponse } from './connect.ts';
import { userOf, type EnvdCall } from './envd-common.ts';
import { filesRoutes } from './envd-files.ts';
import { filesystemService, type E2bFilesApi } from './envd-filesystem.ts';
import { processService, type E2bProcessDeps } from './envd-process.ts';
import { restError } from './rest-error.ts';

export interface E2bEnvdDeps {
  redis: Redis;
  registry: Pick<SandboxRegistry, 'get'>;
  access: Pick<EnvdAccess, 'verify'>;
  execs: E2bProcessDeps['execs'];
  files: E2bFilesApi;
  /** The files API's cap; an upload's body may carry multipart framing on top. */
  filesMaxBytes: number;
}

const SANDBOX_HEADER = 'e2b-sandbox-id';
const GONE_STATUS = 502;

type Method = (c: Context, call: EnvdCall) => Promise<Response>;

/** The RPCs the SDK may call that rollbox does not serve (yet), each with why. */
const UNIMPLEMENTED: Record<string, string> = {
  'process.Process/Update': 'pty commands are not supported by rollbox',
  'filesystem.Filesystem/WatchDir': 'watching directories is not supported by rollbox yet',
  'filesystem.Filesystem/CreateWatcher': 'watching directories is not supported by rollbox yet',
  'filesystem.Filesystem/GetWatcherEvents': 'watching directories is not supported by rollbox yet',
  'filesystem.Filesystem/RemoveWatcher': 'watching directories is not supported by rollbox yet',
};

/**
 * envd, the API inside every E2B sandbox, served by the gateway for all sandboxes at one
 * origin (E2B_SANDBOX_URL): the `E2b-Sandbox-Id` header names the sandbox, the per-sandbox
 * `X-Access-Token` authenticates (except `GET /health`, as on E2B). A sandbox that is gone
 * answers 502, which the SDK reads as the sandbox's end (its TimeoutError).
 */
export function registerE2bEnvd(app: GatewayApp, deps: E2bEnvdDeps): void {
  const { registry, access } = deps;
  const process = processService(deps);
  const filesystem = filesystemService(deps.files);
  const files = filesRoutes(deps.files);
  const rpcs: Record<string, Method> = {
    'process.Process/Start': process.Start,
    'process.Process/Connect': process.Connect,
    'process.Process/List': process.List,
    'process.Process/SendSignal': process.SendSignal,
    'process.Process/SendInput': process.SendInput,
    'process.Process/StreamInput': process.StreamInput,
    'process.Process/CloseStdin': process.CloseStdin,
    'filesystem.Filesystem/Stat': filesystem.Stat,
    'filesystem.Filesystem/ListDir': filesystem.ListDir,
    'filesystem.Filesystem/MakeDir': filesystem.MakeDir,
    'filesystem.Filesystem/Move': filesystem.Move,
    'filesystem.Filesystem/Remove': filesystem.Remove,
  };

  const isGone = async (sandboxId: string) => {
    const sandbox = await registry.get(sandboxId);
    return !sandbox || isTerminal(sandbox.state) || sandbox.state === 'stopping';
  };
  const callOf = async (c: Context): Promise<EnvdCall> => {
    const sandboxId = c.req.header(SANDBOX_HEADER)!;
    const principal = await access.verify(sandboxId, c.req.header('x-access-token'));
    const guard = async <T,>(work: Promise<T>): Promise<T> => {
      try {
        return await work;
      } catch (err) {
        if (err instanceof RollboxError && (err.code === 'not_found' || err.code === 'invalid_state') && (await isGone(sandboxId))) {
          throw new ConnectError('unavailable', `sandbox ${sandboxId} is not running: it was killed or reached its timeout`, GONE_STATUS);
        }
        throw err;
      }
    };
    return { sandboxId, principal, user: userOf(c.req.header('authorization')), guard };
  };
  const needsSandbox: MiddlewareHandler = async (c, next) => {
    if (!c.req.header(SANDBOX_HEADER)) return c.json({ code: 400, message: `envd calls name their sandbox in the E2b-Sandbox-Id header` }, 400);
    await next();
  };
  // Connection: close, as the rest of the body may still be on its way (see withUploadBody).
  const rpcLimit = bodyLimit({ maxSize: MAX_MESSAGE_BYTES + 5, onError: (c) => (c.header('Connection', 'close'), connectErrorResponse(c, new ConnectError('resource_exhausted', `message larger than ${MAX_MESSAGE_BYTES} bytes`))) });
  const filesLimit = bodyLimit({
    maxSize: deps.filesMaxBytes + 64 * 1024,
    onError: (c) => (c.header('Connection', 'close'), restError(c, new RollboxError('payload_too_large', `body is larger than the files limit of ${deps.filesMaxBytes} bytes`))),
  });

  // A client stream (StreamInput) is read message by message, each within the cap
  // (readClientStream): bodyLimit would hold the whole stream until it ends.
  const limitUnlessClientStream: MiddlewareHandler = (c, next) => (c.req.param('method') === 'StreamInput' ? next() : rpcLimit(c, next));

  for (const service of ['process.Process', 'filesystem.Filesystem']) {
    app.post(`/${service}/:method`, needsSandbox, limitUnlessClientStream, async (c) => {
      const name = `${service}/${c.req.param('method')}`;
      try {
        const call = await callOf(c);
        if (UNIMPLEMENTED[name]) throw new ConnectError('unimplemented', `${name}: ${UNIMPLEMENTED[name]}`);
        const method = rpcs[name];
        if (!method) throw new ConnectError('unimplemented', `${name} is not a method of envd`);
        return await method(c, call);
      } catch (err) {
        return connectErrorResponse(c, err);
      }
    });
  }

  app.get('/health', needsSandbox, async (c) => c.body(null, (await isGone(c.req.header(SANDBOX_HEADER)!)) ? GONE_STATUS : 204));

  const rest = (handler: Method) => async (c: Context) => {
    try {
      return await handler(c, await callOf(c));
    } catch (err) {
      if (err instanceof ConnectError) return c.json({ code: err.httpStatus, message: err.message }, err.httpStatus as 400);
      return restError(c, err);
    }
  };
  app.get('/files', needsSandbox, rest(files.read));
  app.post('/files', needsSandbox, filesLimit, rest(files.write));
}
