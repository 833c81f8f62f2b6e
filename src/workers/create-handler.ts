import { existsSync } from 'node:fs';
import { RollboxError, hasNetwork, reservationOf, type CreateJob, type Sandbox } from '../api/index.ts';
import type { LayerFiles } from '../layers/index.ts';
import { handOverOps } from '../queues/index.ts';
import { decideAdmission } from './admission.ts';
import { carriedCommandOf, readCarriedCommands } from './carried-commands.ts';
import type { HostContext } from './host-context.ts';
import type { LocalSandbox } from './local-sandboxes.ts';
import { runAndDiscard } from './run-once.ts';

/**
 * A create request taken from this host's inbox: admitted or refused here (the second
 * step of placement), then started. Also wakes hibernated sandboxes. Idempotent by the
 * sandbox's state: a redelivered request answers with what already happened.
 */
export async function handleCreate(ctx: HostContext, job: CreateJob): Promise<void> {
  const { registry, runtime } = ctx.deps;
  const sandbox = await registry.get(job.sandboxId);
  if (!sandbox || sandbox.node !== ctx.nodeId) return; // re-placed elsewhere or expired
  // pending: a new sandbox; hibernated: one coming back from its packed writable layer.
  if (sandbox.state !== 'pending' && sandbox.state !== 'hibernated') {
    if (sandbox.state === 'running') await ctx.reply(job.replyTo, { kind: 'created', requestId: job.requestId, nodeId: ctx.nodeId });
    return;
  }
  const request = reservationOf(sandbox.spec.resources);
  // A ready sandbox of a warm pool, claimed by the gateway for this create: admitted as if
  // its reservation were already this request's (it becomes that below).
  const pooled = sandbox.pool && sandbox.state === 'pending' ? ctx.local.get(sandbox.id) : undefined;
  const ready = pooled?.pool && !pooled.starting ? pooled : undefined;
  // Lazy layers not mounted here yet: the chunk cache they may take (awaited before the decision and its reservation, which follow without a break).
  const layerCacheBytes = ctx.deps.layerCache && !ready ? await ctx.deps.layerCache.demandBytes([...sandbox.layerDigests, ...(sandbox.hibernationLayer ? [sandbox.hibernationLayer] : [])]) : 0;
  let decision = ctx.stopped ? ({ admit: false, reason: 'worker host stopping' } as const) : decideAdmission(ctx.admissionState(ready), { ...request, layerCacheBytes });
  ctx.local.noteHandled(sandbox.id, ctx.now());
  // The gateway places allowlist sandboxes only where the self-test passes; its view may be a heartbeat old.
  const { networkHealth } = ctx;
  if (decision.admit && hasNetwork(sandbox.spec.network) && networkHealth?.allowlist === 'failing') {
    decision = { admit: false, reason: `sandbox networking fails its self-test here: ${networkHealth.detail}` };
  }
  // Saved whole to a layer store this host does not share: another host wakes it.
  const wholeImage = sandbox.state === 'hibernated' && sandbox.hibernatedWhole ? ctx.deps.hibernatedImageDirOf(sandbox.id) : undefined;
  if (decision.admit && wholeImage && !existsSync(wholeImage)) decision = { admit: false, reason: `the saved image of sandbox ${sandbox.id} is not in this host's layer store` };
  // A fork's child that keeps its parent's processes: restored from the fork's image, which is in the layer store hosts share.
  const { lineage } = sandbox;
  const forkImage = sandbox.state === 'pending' && lineage?.processes && lineage.forkPoint ? ctx.deps.forkImageDirOf(lineage.forkPoint) : undefined;
  if (decision.admit && forkImage && !existsSync(forkImage)) decision = { admit: false, reason: `the image of fork ${lineage!.forkPoint} is not in this host's layer store` };
  if (!decision.admit) {
    // Placed again elsewhere (cold, under the same id): this host's copy must not stay offered.
    if (ready) await ctx.removeLocal(sandbox.id);
    ctx.log.info({ sandboxId: sandbox.id, reason: decision.reason }, 'admission refused');
    await ctx.reply(job.replyTo, { kind: 'refused', requestId: job.requestId, nodeId: ctx.nodeId, reason: decision.reason });
    return;
  }
  // Reserved at once, before anything awaits: a create admitted beside it sees it.
  const local: LocalSandbox = { id: sandbox.id, ...request, expiresAtMs: Infinity, starting: true, layerCacheBytes };
  ctx.local.set(local);
  const moved = await registry.transition(sandbox.id, 'creating', { from: ['pending', 'hibernated'], node: ctx.nodeId });
  if (moved.kind !== 'ok') {
    // Cancelled or timed out meanwhile (a claimed pool sandbox goes too: it was taken off its list).
    if (ready) await ctx.removeLocal(sandbox.id);
    else ctx.local.delete(sandbox.id);
    return;
  }
  // A waking sandbox: its spec as of the move, since a stage change to a hibernated
  // sandbox is written only while it is hibernated (registry patchSpec). A new one's
  // spec never changes before it runs.
  const spec = sandbox.state === 'hibernated' ? ((await registry.get(sandbox.id))?.spec ?? sandbox.spec) : sandbox.spec;
  // Commands it hibernated with, running in its saved guest: taken into this host's inbox once it runs here.
  const carried = wholeImage ? await readCarriedCommands(wholeImage) : [];
  try {
    const bound = ready && (await bindPooled(ctx, sandbox.id, spec));
    const layerImages = bound ? [] : await Promise.all(sandbox.layerDigests.map((digest) => layerImage(ctx, digest)));
    const hibernated = sandbox.hibernationLayer;
    if (!bound) await runtime.create({
      sandboxId: sandbox.id,
      tier: spec.tier,
      layerImages,
      restoreUpper: hibernated ? await layerImage(ctx, hibernated) : undefined,
      // A fork's child started from a clone of its parent's disk (a fork point on this host).
      ...(sandbox.state === 'pending' && lineage?.forkPoint && !lineage.forkLayer && !forkImage ? { forkPoint: lineage.forkPoint } : {}),
      ...(wholeImage ? { restoreWhole: wholeImage } : {}),
      ...(forkImage ? { restoreFork: forkImage } : {}),
      resources: spec.resources,
      class: spec.class,
      env: spec.env,
      workdir: spec.workdir ?? '/',
      ...(spec.user ? { user: spec.user } : {}),
      hiddenPaths: spec.hiddenPaths,
      network: spec.network,
      ...(spec.allowPrivilegeEscalation ? { allowPrivilegeEscalation: true } : {}),
    });
    // Before it is running for its callers: a signal or stdin sent after the wake finds the command attached here.
    await handOverOps(ctx.deps.redis, ctx.nodeId, carried);
    const startedAtMs = ctx.now();
    // A sandbox back from hibernation keeps the TTL it started with.
    local.starting = false;
    ctx.setExpiry(local, Date.parse(sandbox.expiresAt ?? '') || startedAtMs + sandbox.spec.ttlSeconds * 1000);
    const running = await registry.transition(sandbox.id, 'running', {
      from: ['creating'],
      node: ctx.nodeId,
      startedAt: new Date(startedAtMs).toISOString(),
      expiresAt: new Date(local.expiresAtMs).toISOString(),
      // Its contents are in the upper dir again; the layer is left to garbage collection.
      hibernationLayer: hibernated ? '' : undefined,
      hibernatedWhole: wholeImage ? false : undefined,
    });
    if (running.kind !== 'ok') {
      // Deleted or failed while starting: undo, and finish a delete that arrived meanwhile.
      await ctx.removeLocal(sandbox.id);
      await registry.transition(sandbox.id, 'terminated', { from: ['stopping'] });
      await ctx.reply(job.replyTo, { kind: 'error', requestId: job.requestId, error: { code: 'conflict', message: `sandbox became ${running.kind === 'refused' ? running.current : 'missing'} while starting` } });
      return;
    }
    // A run goes on outside the create: the host's limit on starts in flight is not held by a command.
    if (job.run) void runAndDiscard(ctx, sandbox.id, { ...job, run: job.run }).catch((err: unknown) => ctx.log.error({ err, sandboxId: sandbox.id }, 'answering a run failed'));
    else await ctx.reply(job.replyTo, { kind: 'created', requestId: job.requestId, nodeId: ctx.nodeId });
  } catch (err) {
    ctx.log.error({ err, sandboxId: sandbox.id }, 'create failed');
    await ctx.removeLocal(sandbox.id);
    const message = err instanceof Error ? err.message : String(err);
    await registry.transition(sandbox.id, 'failed', { failureReason: 'infra_error', detail: message });
    for (const command of carried.map(carriedCommandOf)) if (command) await ctx.deps.commands.markUnknown(command.sandboxId, command.commandId, `its sandbox failed to wake: ${message}`);
    await ctx.reply(job.replyTo, { kind: 'error', requestId: job.requestId, error: { code: 'internal', message: `sandbox failed to start: ${message}` } });
  }
}

async function layerImage(ctx: HostContext, digest: string): Promise<LayerFiles> {
  const files = await ctx.deps.layerFiles(digest);
  if (!files) throw new RollboxError('internal', `layer ${digest} is not available on node ${ctx.nodeId}`);
  return files;
}

/**
 * Binds a claimed pool sandbox to its create (limits, env, workdir, hidden paths,
 * network). False when it cannot be (its init died, say): it is destroyed, and the
 * caller starts the sandbox cold under the same id.
 */
async function bindPooled(ctx: HostContext, id: string, spec: Sandbox['spec']): Promise<boolean> {
  try {
    await ctx.deps.runtime.claim(id, { resources: spec.resources, env: spec.env, workdir: spec.workdir ?? '/', ...(spec.user ? { user: spec.user } : {}), hiddenPaths: spec.hiddenPaths, network: spec.network });
    return true;
  } catch (err) {
    ctx.log.warn({ err, sandboxId: id }, 'binding a warm-pool sandbox failed; starting it cold');
    await ctx.deps.runtime.destroy(id);
    return false;
  }
}
