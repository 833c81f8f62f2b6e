import type { Context, MiddlewareHandler } from 'hono';
import type { GatewayApp } from '../routes/common.ts';
import { bodyLimit } from 'hono/body-limit';
import type { Redis } from 'ioredis';
import { RollboxError, isTerminal, type Sandbox } from '../../api/index.ts';
import type { Principal } from '../../iam/index.ts';
import type { SandboxRegistry } from '../../registry/index.ts';
import type { SandboxService } from '../sandbox-service.ts';
import type { TtlService } from '../ttl-service.ts';
import { principalOf, type EnvdAccess } from './access.ts';
import { ConnectError, MAX_MESSAGE_BYTES, connectErrorResponse } from './connect.ts';
import { userOf, type EnvdCall } from './envd-common.ts';
import { filesRoutes } from './envd-files.ts';
import { filesystemService, type E2bFilesApi } from './envd-filesystem.ts';
import { processService, type E2bProcessDeps } from './envd-process.ts';
import { watchService, type E2bWatchDeps } from './envd-watch.ts';
import { FileMetadata } from './file-metadata.ts';
import { restError } from './rest-error.ts';
import { SignedUrls } from './signed-urls.ts';

export interface E2bEnvdDeps {
  redis: Redis;
  registry: Pick<SandboxRegistry, 'get'>;
  access: Pick<EnvdAccess, 'verify' | 'tokenFor'>;
  execs: E2bProcessDeps['execs'] & E2bWatchDeps['execs'];
  files: E2bFilesApi;
  /** The files API's cap; an upload's body may carry multipart framing on top. */
  filesMaxBytes: number;
  /** For `autoResume` sandboxes: a call into one that is paused resumes it first. */
  sandboxes: Pick<SandboxService, 'setPaused'>;
  ttls: Pick<TtlService, 'setTtl'>;
}

const SANDBOX_HEADER = 'e2b-sandbox-id';
const GONE_STATUS = 502;
/** envd's port: a per-sandbox host `49983-<id>.<domain>` names the sandbox as the header does. */
const ENVD_HOST = /^49983-(sbx_[a-z0-9]+)\./;

type Method = (c: Context, call: EnvdCall) => Promise<Response>;

/**
 * envd, the API inside every E2B sandbox, served by the gateway for all sandboxes at one
 * origin (E2B_SANDBOX_URL): the `E2b-Sandbox-Id` header names the sandbox, the per-sandbox
 * `X-Access-Token` authenticates (except `GET /health`, as on E2B). A sandbox that is gone
 * answers 502, which the SDK reads as the sandbox's end (its TimeoutError).
 */
export function registerE2bEnvd(app: GatewayApp, deps: E2bEnvdDeps): void {
  const { registry, access } = deps;
  const process = processService(deps);
  const metadata = new FileMetadata(deps.redis);
  const filesystem = filesystemService(deps.files, metadata);
  const watch = watchService(deps);
  const files = filesRoutes(deps.files, metadata);
  const signed = new SignedUrls(deps.redis, access);
  const rpcs: Record<string, Method> = {
    'process.Process/Start': process.Start,
    'process.Process/Connect': process.Connect,
    'process.Process/List': process.List,
    'process.Process/SendSignal': process.SendSignal,
    'process.Process/SendInput': process.SendInput,
    'process.Process/Update': process.Update,
    'process.Process/StreamInput': process.StreamInput,
    'process.Process/CloseStdin': process.CloseStdin,
    'filesystem.Filesystem/Stat': filesystem.Stat,
    'filesystem.Filesystem/ListDir': filesystem.ListDir,
    'filesystem.Filesystem/MakeDir': filesystem.MakeDir,
    'filesystem.Filesystem/Move': filesystem.Move,
    'filesystem.Filesystem/Remove': filesystem.Remove,
    'filesystem.Filesystem/WatchDir': watch.WatchDir,
    'filesystem.Filesystem/CreateWatcher': watch.CreateWatcher,
    'filesystem.Filesystem/GetWatcherEvents': watch.GetWatcherEvents,
    'filesystem.Filesystem/RemoveWatcher': watch.RemoveWatcher,
  };

  const isGone = (sandbox: Sandbox | undefined) => !sandbox || isTerminal(sandbox.state) || sandbox.state === 'stopping';
  const isPaused = (sandbox: Sandbox | undefined) => sandbox?.state === 'paused' || sandbox?.state === 'hibernated';
  /** As E2B's proxy answers for a sandbox that is gone, or paused (its envd does not run then). */
  const unreachable = async (sandboxId: string): Promise<ConnectError | undefined> => {
    const sandbox = await registry.get(sandboxId);
    if (isGone(sandbox)) return new ConnectError('unavailable', `sandbox ${sandboxId} is not running: it was killed or reached its timeout`, GONE_STATUS);
    if (isPaused(sandbox)) return new ConnectError('unavailable', `sandbox ${sandboxId} is paused: Sandbox.connect resumes it`, GONE_STATUS);
    return undefined;
  };
  /** E2B's autoResume: the paused sandbox runs again, for its whole TTL, before the call goes on (two calls at once: one resumes it). */
  const wake = async (principal: Principal, sandbox: Sandbox) => {
    try {
      await deps.sandboxes.setPaused(principal, sandbox.id, false);
    } catch (err) {
      if ((await registry.get(sandbox.id))?.state !== 'running') throw err;
    }
    await deps.ttls.setTtl(principal, sandbox.id, sandbox.spec.ttlSeconds, { extendOnly: true });
  };
  const sandboxIdOf = (c: Context) => c.req.header(SANDBOX_HEADER) ?? ENVD_HOST.exec(c.req.header('host') ?? '')?.[1];
  /** The call's sandbox and principal: from its access token, or (a signed file URL) as verified already. */
  const callOf = async (c: Context, verified?: { sandboxId: string; principal: Principal }): Promise<EnvdCall> => {
    const sandboxId = verified?.sandboxId ?? sandboxIdOf(c)!;
    const principal = verified?.principal ?? (await access.verify(sandboxId, c.req.header('x-access-token')));
    const explain = async (err: unknown): Promise<unknown> => {
      const codes = ['not_found', 'invalid_state', 'result_unknown', 'node_lost'];
      return (err instanceof RollboxError && codes.includes(err.code) && (await unreachable(sandboxId))) || err;
    };
    const guard = async <T,>(work: Promise<T>): Promise<T> => {
      try {
        return await work;
      } catch (err) {
        throw await explain(err);
      }
    };
    let record: Promise<Sandbox> | undefined;
    const sandbox = () =>
      (record ??= registry.get(sandboxId).then((s) => {
        if (!s || s.tenant !== principal.tenant) throw new ConnectError('unavailable', `sandbox ${sandboxId} is not running: it was killed or reached its timeout`, GONE_STATUS);
        return s;
      }));
    const current = await sandbox().catch(() => undefined);
    if (current && isPaused(current) && current.spec.onTtl?.autoResume) {
      await wake(principal, current);
      record = undefined;
    }
    return { sandboxId, principal, user: userOf(c.req.header('authorization')), guard, explain, sandbox };
  };
  const needsSandbox: MiddlewareHandler = async (c, next) => {
    // A signed file URL may name no sandbox: its signature does (signed-urls.ts).
    if (!sandboxIdOf(c) && !(c.req.path === '/files' && c.req.query('signature'))) return c.json({ code: 400, message: `envd calls name their sandbox in the E2b-Sandbox-Id header` }, 400);
    await next();
  };
  /** A `/files` call: the access token, or a URL signed with it (downloadUrl / uploadUrl), as envd takes them. */
  const filesCallOf = async (c: Context, operation: 'read' | 'write'): Promise<EnvdCall> => {
    const signature = c.req.query('signature');
    if (c.req.header('x-access-token') || !signature) return callOf(c);
    const expiration = c.req.query('signature_expiration');
    if (expiration !== undefined && !/^\d{1,12}$/.test(expiration)) throw new ConnectError('invalid_argument', 'signature_expiration is unix seconds');
    const request = { path: c.req.query('path') ?? '', operation, username: c.req.query('username') ?? '', signature, expiration: expiration === undefined ? undefined : Number(expiration) };
    const { sandboxId, tenant } = await signed.verify(request, sandboxIdOf(c));
    return callOf(c, { sandboxId, principal: principalOf(sandboxId, tenant) });
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
        const method = rpcs[name];
        if (!method) throw new ConnectError('unimplemented', `${name} is not a method of envd`);
        return await method(c, call);
      } catch (err) {
        return connectErrorResponse(c, err);
      }
    });
  }

  // 502 once it is gone or while it is paused: the SDK's isRunning() is then false.
  app.get('/health', needsSandbox, async (c) => c.body(null, (await unreachable(sandboxIdOf(c)!)) ? GONE_STATUS : 204));

  const rest = (handler: Method, operation: 'read' | 'write') => async (c: Context) => {
    try {
      return await handler(c, await filesCallOf(c, operation));
    } catch (err) {
      if (err instanceof ConnectError) return c.json({ code: err.httpStatus, message: err.message }, err.httpStatus as 400);
      return restError(c, err);
    }
  };
  app.get('/files', needsSandbox, rest(files.read, 'read'));
  app.post('/files', needsSandbox, filesLimit, rest(files.write, 'write'));
}
