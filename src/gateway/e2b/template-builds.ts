import { randomBytes } from 'node:crypto';
import { gunzipSync } from 'node:zlib';
import { bodyLimit } from 'hono/body-limit';
import type { Redis } from 'ioredis';
import { z } from 'zod';
import { ExecRequest, RollboxError, type Build, type BuildContext, type BuildLogEvent, BuildRequest } from '../../api/index.ts';
import { ImageName } from '../../api/image.ts';
import type { E2bKeyStore, Principal } from '../../iam/index.ts';
import type { GatewayApp } from '../routes/common.ts';
import type { ExecService } from '../exec-service.ts';
import type { SandboxService } from '../sandbox-service.ts';
import { jsonOf, parse, routeOf } from './control-common.ts';
import { restError } from './rest-error.ts';

/** What template builds need of src/builds (BuildService), and how a context tar is packed from the uploads. */
export interface E2bBuildsDeps {
  redis: Redis;
  keys: Pick<E2bKeyStore, 'verify'>;
  builds: {
    putContext(principal: Principal, archive: Buffer): Promise<BuildContext>;
    request(principal: Principal, request: BuildRequest): Promise<Build>;
    get(principal: Principal, id: string): Promise<Build>;
    log(principal: Principal, id: string, after: number): Promise<{ build: Build; events: BuildLogEvent[] }>;
  };
  /** The uploaded files of COPY steps as one context tar: each upload's entries under `prefix(hash)/`. */
  mergeUploads: (uploads: { prefix: string; tar: Buffer }[]) => Promise<Buffer>;
  contextMaxBytes: number;
  uploadTtlMs: number;
}

const Step = z.object({ type: z.string(), args: z.array(z.string()).default([]), filesHash: z.string().regex(/^[0-9a-f]{64}$/).optional(), force: z.boolean().optional() }).passthrough();
const TriggerBody = z
  .object({ fromImage: z.string().min(1).max(512).optional(), fromTemplate: z.string().min(1).max(128).optional(), steps: z.array(Step).max(1000).default([]), startCmd: z.string().max(64 * 1024).optional(), readyCmd: z.string().max(64 * 1024).optional() })
  .passthrough();
const RequestBody = z.object({ name: z.string().min(1).max(256).optional(), alias: z.string().min(1).max(256).optional(), tags: z.array(z.string()).optional() }).passthrough();

const keyOf = {
  build: (buildID: string) => `rb:e2b-template-build:${buildID}`,
  files: (hash: string) => `rb:e2b-template-files:${hash}`,
  upload: (token: string) => `rb:e2b-template-upload:${token}`,
  commands: (template: string) => `rb:e2b-template-commands:${template}`,
};
const prefixOf = (hash: string) => `e2b-files-${hash.slice(0, 16)}`;
/** A word for a Dockerfile line, quoted so spaces, quotes and `$` stay as they are. */
const quoted = (s: string) => JSON.stringify(s).replace(/\$/g, '\\$');

/**
 * E2B's template builds (`Template.build` of the SDK) through rollbox's image builds: the
 * template's steps become Dockerfile instructions, the files of each COPY (uploaded as E2B
 * uploads them, a tar.gz per files hash) one context, and the template's name the image's
 * name, which `Sandbox.create(name)` then takes. Start and ready commands are kept with the
 * template (docs/e2b.md).
 */
export function registerE2bTemplateBuilds(app: GatewayApp, deps: E2bBuildsDeps): void {
  const route = routeOf(deps.keys);
  app.post(
    '/v3/templates',
    route(async (c, principal) => {
      const body = parse(RequestBody, await jsonOf(c), 'body');
      const templateID = (body.name ?? body.alias ?? '').split(':')[0]!;
      parse(ImageName, templateID, 'name');
      const buildID = `tb_${randomBytes(9).toString('hex')}`;
      await deps.redis.set(keyOf.build(buildID), JSON.stringify({ templateID, tenant: principal.tenant }), 'PX', deps.uploadTtlMs * 24);
      return c.json({ templateID, buildID, aliases: [templateID], names: [templateID], tags: body.tags ?? ['default'], public: false }, 202);
    }),
  );
  app.get(
    '/templates/:templateID/files/:hash',
    route(async (c) => {
      const hash = c.req.param('hash')!;
      if (!/^[0-9a-f]{64}$/.test(hash)) throw new RollboxError('invalid_request', 'hash: 64 hex digits');
      if (await deps.redis.exists(keyOf.files(hash))) return c.json({ present: true }, 200);
      const token = randomBytes(18).toString('hex');
      await deps.redis.set(keyOf.upload(token), hash, 'PX', deps.uploadTtlMs);
      return c.json({ present: false, url: `${new URL(c.req.url).origin}/e2b-template-uploads/${token}` }, 200);
    }),
  );
  app.use('/e2b-template-uploads/*', bodyLimit({ maxSize: deps.contextMaxBytes, onError: (c) => (c.header('Connection', 'close'), restError(c, new RollboxError('payload_too_large', `files past ROLLBOX_BUILD_CONTEXT_MAX_BYTES (${deps.contextMaxBytes})`))) }));
  // The upload URL is the credential (one token, one files hash, short-lived), as E2B's are presigned.
  app.put('/e2b-template-uploads/:token', async (c) => {
    try {
      const hash = await deps.redis.get(keyOf.upload(c.req.param('token')!));
      if (!hash) throw new RollboxError('not_found', 'no such upload (or it expired): ask for the files link again');
      const body = Buffer.from(await c.req.arrayBuffer());
      if (body.length > deps.contextMaxBytes) throw new RollboxError('payload_too_large', `files past ROLLBOX_BUILD_CONTEXT_MAX_BYTES (${deps.contextMaxBytes})`);
      const tar = body[0] === 0x1f && body[1] === 0x8b ? gunzipSync(body, { maxOutputLength: deps.contextMaxBytes }) : body;
      await deps.redis.set(keyOf.files(hash), tar, 'PX', deps.uploadTtlMs);
      await deps.redis.del(keyOf.upload(c.req.param('token')!));
      return c.body(null, 200);
    } catch (err) {
      return restError(c, err);
    }
  });
  app.post(
    '/v2/templates/:templateID/builds/:buildID',
    route(async (c, principal) => {
      const build = await started(c.req.param('buildID')!, c.req.param('templateID')!, principal);
      if (build.rollboxBuild) throw new RollboxError('conflict', `build ${c.req.param('buildID')!} was started already`);
      const body = parse(TriggerBody, await jsonOf(c), 'body');
      const { steps, hashes } = dockerfileSteps(body);
      const uploads = await Promise.all(
        [...hashes].map(async (hash) => {
          const tar = await deps.redis.getBuffer(keyOf.files(hash));
          if (!tar) throw new RollboxError('invalid_request', `the files of hash ${hash} were not uploaded (or expired): build again`);
          return { prefix: prefixOf(hash), tar };
        }),
      );
      const context = uploads.length ? (await deps.builds.putContext(principal, await deps.mergeUploads(uploads))).context : undefined;
      const queued = await deps.builds.request(principal, BuildRequest.parse({ name: build.templateID, steps, ...(context ? { context } : {}) }));
      await deps.redis.set(keyOf.build(c.req.param('buildID')!), JSON.stringify({ ...build, rollboxBuild: queued.id }), 'PX', deps.uploadTtlMs * 24);
      await deps.redis.set(keyOf.commands(build.templateID), JSON.stringify({ startCmd: body.startCmd ?? null, readyCmd: body.readyCmd ?? null }));
      return c.body('', 202, { 'content-length': '0' });
    }),
  );
  app.get(
    '/templates/:templateID/builds/:buildID/status',
    route(async (c, principal) => {
      const buildID = c.req.param('buildID')!;
      const record = await started(buildID, c.req.param('templateID')!, principal);
      const offset = Math.max(0, Number(c.req.query('logsOffset') ?? 0) || 0);
      const base = { templateID: record.templateID, buildID };
      if (!record.rollboxBuild) return c.json({ ...base, status: 'waiting', logEntries: [], logs: [] }, 200);
      const { build, events } = await deps.builds.log(principal, record.rollboxBuild, offset - 1);
      const logEntries = events.map((e) => ({ timestamp: new Date().toISOString(), level: e.kind === 'output' || e.state === 'failed' ? 'error' : 'info', message: messageOf(e, build) }));
      const status = build.state === 'ready' ? 'ready' : build.state === 'failed' ? 'error' : 'building';
      const failedAt = build.steps.findIndex((s) => s.state === 'failed');
      const reason = build.state === 'failed' ? { message: `${build.error?.message ?? 'the build failed'}${build.failedStep ? `\n${build.failedStep.output}` : ''}`, ...(failedAt > 0 ? { step: String(failedAt) } : {}), logEntries: [] } : undefined;
      return c.json({ ...base, status, logEntries, logs: logEntries.map((l) => l.message), ...(reason ? { reason } : {}) }, 200);
    }),
  );

  async function started(buildID: string, templateID: string, principal: Principal): Promise<{ templateID: string; tenant: string; rollboxBuild?: string }> {
    const json = await deps.redis.get(keyOf.build(buildID));
    const record = json ? (JSON.parse(json) as { templateID: string; tenant: string; rollboxBuild?: string }) : undefined;
    if (!record || record.tenant !== principal.tenant || record.templateID !== templateID) throw new RollboxError('not_found', `template build ${buildID} not found`);
    return record;
  }
}

function messageOf(e: BuildLogEvent, build: Build): string {
  if (e.kind === 'output') return e.text ?? '';
  if (e.kind === 'end') return `build ${e.state}: ${e.text ?? ''}`;
  return `[${(e.step ?? 0) + 1}/${build.steps.length}] ${e.state}: ${e.text ?? ''}`;
}

/**
 * The template as Dockerfile instructions: FROM its image or template, then each step
 * (RUN with a user switches to it and back; COPY from the files uploaded under its hash,
 * with its user and mode).
 */
export function dockerfileSteps(body: z.infer<typeof TriggerBody>): { steps: string[]; hashes: Set<string> } {
  const from = body.fromImage ?? body.fromTemplate;
  if (!from) throw new RollboxError('invalid_request', 'a template needs fromImage or fromTemplate');
  const steps = [`FROM ${from}`];
  const hashes = new Set<string>();
  let user = '';
  for (const [index, step] of body.steps.entries()) {
    const at = `steps[${index}]`;
    switch (step.type) {
      case 'RUN': {
        const [command, runAs] = step.args;
        if (!command) throw new RollboxError('invalid_request', `${at}: RUN needs a command`);
        if (runAs && runAs !== user) steps.push(`USER ${runAs}`, `RUN ${command}`, `USER ${user || 'root'}`);
        else steps.push(`RUN ${command}`);
        break;
      }
      case 'COPY': {
        const [src, dest, owner, mode] = step.args;
        if (!src || !dest || !step.filesHash) throw new RollboxError('invalid_request', `${at}: COPY needs a source, a destination and its files hash`);
        hashes.add(step.filesHash);
        const flags = [owner ? `--chown=${owner}` : '', mode ? `--chmod=${mode.replace(/^0+(?=\d{3})/, '')}` : ''].filter(Boolean).join(' ');
        steps.push(`COPY ${flags} [${quoted(`${prefixOf(step.filesHash)}/${src.replace(/^\.?\/+/, '')}`)}, ${quoted(dest)}]`.replace('COPY  [', 'COPY ['));
        break;
      }
      case 'ENV': {
        const pairs: string[] = [];
        for (let i = 0; i + 1 < step.args.length; i += 2) pairs.push(`${step.args[i]}=${quoted(step.args[i + 1]!)}`);
        if (pairs.length) steps.push(`ENV ${pairs.join(' ')}`);
        break;
      }
      case 'WORKDIR':
      case 'USER':
        if (!step.args[0]) throw new RollboxError('invalid_request', `${at}: ${step.type} needs an argument`);
        if (step.type === 'USER') user = step.args[0];
        steps.push(`${step.type} ${step.args[0]}`);
        break;
      default:
        throw new RollboxError('build_unsupported', `${at}: the template step ${step.type} is not supported`);
    }
  }
  return { steps, hashes };
}

/** How long a create waits for a template's ready command to succeed (E2B waits for it at build time; its create timeout is 60 s). */
const READY_WAIT_MS = 45_000;
const READY_POLL_MS = 250;

/**
 * A sandbox of a template built with start and ready commands: the start command runs in
 * the background, then the ready command until it exits 0 (as E2B runs them before its
 * snapshot; rollbox keeps no process memory in an image, so a create runs them). Not ready
 * in time: the sandbox is deleted and the create answers `timeout`.
 */
export async function startTemplate(
  deps: { redis: Redis; execs: Pick<ExecService, 'exec' | 'startBackground'>; sandboxes: Pick<SandboxService, 'delete'> },
  principal: Principal,
  sandboxId: string,
  template: string,
): Promise<void> {
  const json = await deps.redis.get(keyOf.commands(template));
  const commands = json ? (JSON.parse(json) as { startCmd: string | null; readyCmd: string | null }) : undefined;
  if (!commands?.startCmd) return;
  const sh = (cmd: string, background: boolean) => ExecRequest.parse({ argv: ['/bin/sh', '-c', cmd], background, ...(background ? {} : { timeoutMs: 10_000 }) });
  await deps.execs.startBackground(principal, sandboxId, sh(commands.startCmd, true));
  if (!commands.readyCmd) return;
  for (const deadline = Date.now() + READY_WAIT_MS; ; ) {
    const ready = await deps.execs.exec(principal, sandboxId, sh(commands.readyCmd, false));
    if (ready.exitCode === 0 && !ready.timedOut) return;
    if (Date.now() >= deadline) {
      await deps.sandboxes.delete(principal, sandboxId).catch(() => undefined);
      throw new RollboxError('timeout', `template ${template}: its ready command did not succeed within ${READY_WAIT_MS / 1000} s (last exit ${ready.exitCode}: ${ready.stderr.slice(-200)})`);
    }
    await new Promise((r) => setTimeout(r, READY_POLL_MS));
  }
}
