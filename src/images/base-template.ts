import { execFile, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { constants } from 'node:fs';
import { chmod, copyFile, mkdir, mkdtemp, rename, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { RollboxError, type Image } from '../api/index.ts';
import { HOSTS_FILE, readMountInfo, splitFilesIn, storeTreeAsLayer, unmount, type LayerStore } from '../layers/index.ts';
import { CLUSTER_OWNER, OPERATOR, keys, type ImageRegistry, type LayerRegistry } from '../registry/index.ts';

/** What E2B's `base` has that its SDK's examples use (and pip, which Dockerfiles on it use). */
export const BASE_TEMPLATE_PACKAGES = ['bash', 'coreutils', 'git', 'python3', 'python3-pip', 'curl', 'sudo', 'ca-certificates'];
export const BASE_TEMPLATE_IMAGE = 'base';
/** Bumped whenever the steps below change what is built. */
const RECIPE_VERSION = 1;
/** Marks the image as this builder's (an operator's own image named `base` is left alone). */
const REF_PREFIX = 'rollbox-built:e2b-base/';
/** One build, start to end (about 100 s on a 2-core host with an empty package cache). */
const BUILD_TIMEOUT_MS = 15 * 60_000;
const LOCK_KEY = keys.lock('e2b-base-template');
/** How often a gateway that does not build looks for the one another gateway builds. */
const POLL_MS = 2000;
/** What a create asked too early is told to wait before it asks again. */
const RETRY_AFTER_SECONDS = 15;

export interface BaseTemplateConfig {
  suite: string;
  mirror: string;
  cacheDir: string;
}

export interface BaseTemplateDeps {
  redis: Redis;
  images: Pick<ImageRegistry, 'get' | 'put'>;
  layers: Pick<LayerRegistry, 'register' | 'publish'>;
  store: Pick<LayerStore, 'has' | 'putSplit'>;
  tmpDir: string;
  config: BaseTemplateConfig;
  logger: Logger;
  now?: () => number;
}

const run = promisify(execFile);

/**
 * E2B's default template `base`, built here from Debian packages: debootstrap (minbase
 * and the packages above) into a scratch tree, a `user` account with home `/home/user`
 * and passwordless sudo, package caches and docs left out; the tree becomes one EROFS
 * layer through the layer store (as an image import's does) and the image `base` (User
 * `user`, WorkingDir `/home/user`). Once per cluster: one gateway builds under a Redis
 * lock, the others wait for its image. The layer files are also kept in a cache dir by a
 * digest of the recipe (suite, mirror, packages, steps), so a cluster on the same host
 * (or after its Redis was reset) has it again in seconds; debootstrap's package cache too.
 */
export class BaseTemplate {
  private building: Promise<string> | undefined;
  private progress = { step: 'not started', sinceMs: 0 };
  private lastError: string | undefined;
  private readonly now: () => number;
  readonly recipe: string;

  constructor(private readonly deps: BaseTemplateDeps) {
    this.now = deps.now ?? Date.now;
    const { suite, mirror } = deps.config;
    this.recipe = `sha256:${createHash('sha256').update(JSON.stringify({ RECIPE_VERSION, suite, mirror, packages: BASE_TEMPLATE_PACKAGES })).digest('hex')}`;
  }

  /** The image's name once it is there; a build (or the wait for another gateway's) starts if none runs, and is waited for up to `waitMs`. */
  async imageName(waitMs: number): Promise<string> {
    if (await this.ready()) return BASE_TEMPLATE_IMAGE;
    const build = this.start();
    let timer: NodeJS.Timeout | undefined;
    const done = await Promise.race([build.then(() => true), new Promise<false>((r) => (timer = setTimeout(() => r(false), waitMs)))]).finally(() => clearTimeout(timer));
    if (done) return BASE_TEMPLATE_IMAGE;
    const seconds = Math.round((this.now() - this.progress.sinceMs) / 1000);
    throw new RollboxError('template_not_ready', `the E2B base template is being built on this cluster's first use of it (${this.progress.step}, ${seconds} s so far; about 100 s in all on a 2-core host, seconds once cached)${this.lastError ? `; the last attempt failed: ${this.lastError}` : ''}; retry shortly`, RETRY_AFTER_SECONDS);
  }

  /** Starts the build (or the wait for another gateway's) unless one runs; resolves to the image name. */
  start(): Promise<string> {
    this.building ??= this.buildOnce()
      .catch((err: unknown) => {
        this.lastError = err instanceof Error ? err.message : String(err);
        this.deps.logger.error({ err }, 'building the E2B base template failed; the next create of base tries again');
        throw err;
      })
      .finally(() => (this.building = undefined));
    this.building.catch(() => undefined);
    return this.building;
  }

  /**
   * Ours with this recipe and its layer in the store, or an operator's own image named
   * `base`, published cluster-wide (one stored before owners existed is published now: the
   * template is every tenant's).
   */
  private async ready(): Promise<boolean> {
    const image = await this.deps.images.get(OPERATOR, BASE_TEMPLATE_IMAGE);
    if (!image) return false;
    if (!image.published) await this.publish(image);
    if (!image.ref?.startsWith(REF_PREFIX)) return true;
    return image.digest === this.recipe && (await Promise.all(image.layers.map((l) => this.deps.store.has(l.digest)))).every(Boolean);
  }

  private async publish(image: Image): Promise<void> {
    for (const l of image.layers) await this.deps.layers.publish(l.digest, undefined);
    await this.deps.images.put(CLUSTER_OWNER, image);
  }

  private step(step: string): void {
    this.progress = { step, sinceMs: this.progress.sinceMs };
    this.deps.logger.info({ step }, 'E2B base template');
  }

  private async buildOnce(): Promise<string> {
    const { redis } = this.deps;
    this.progress = { step: 'waiting for the build lock', sinceMs: this.now() };
    for (const until = this.now() + BUILD_TIMEOUT_MS; ; ) {
      if (await this.ready()) return BASE_TEMPLATE_IMAGE;
      if ((await redis.set(LOCK_KEY, String(process.pid), 'PX', BUILD_TIMEOUT_MS, 'NX')) === 'OK') break;
      if (this.now() > until) throw new RollboxError('timeout', 'another gateway held the base template build lock too long');
      this.step('another gateway builds it');
      await new Promise((r) => setTimeout(r, POLL_MS));
    }
    try {
      if (await this.ready()) return BASE_TEMPLATE_IMAGE;
      const startedMs = this.now();
      const stored = (await this.fromCache()) ?? (await this.build());
      const image: Image = {
        name: BASE_TEMPLATE_IMAGE,
        digest: this.recipe,
        platform: 'linux/amd64',
        layers: [{ digest: stored.digest, diffId: this.recipe, sizeBytes: stored.sizeBytes }],
        config: { Env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'LANG=C.UTF-8'], User: 'user', WorkingDir: '/home/user' },
        sizeBytes: stored.sizeBytes,
        createdAt: new Date(this.now()).toISOString(),
        ref: `${REF_PREFIX}${this.deps.config.suite}`,
      };
      await this.deps.layers.register({ digest: stored.digest, sizeBytes: stored.sizeBytes, parents: [], createdAt: image.createdAt }, CLUSTER_OWNER);
      await this.publish(image);
      this.deps.logger.info({ digest: stored.digest, sizeBytes: stored.sizeBytes, ms: this.now() - startedMs }, 'E2B base template ready');
      return BASE_TEMPLATE_IMAGE;
    } finally {
      await redis.del(LOCK_KEY);
    }
  }

  private cachePaths() {
    const dir = path.join(this.deps.config.cacheDir, this.recipe.slice('sha256:'.length, 'sha256:'.length + 24));
    return { dir, meta: path.join(dir, 'layer.meta'), blob: path.join(dir, 'layer.blob') };
  }

  /** The layer files a build on this host kept, into the store again. */
  private async fromCache(): Promise<{ digest: string; sizeBytes: number } | undefined> {
    const cached = this.cachePaths();
    if (!(await stat(cached.meta).catch(() => undefined)) || !(await stat(cached.blob).catch(() => undefined))) return undefined;
    this.step('taking the layer from the cache');
    await mkdir(this.deps.tmpDir, { recursive: true });
    const work = await mkdtemp(path.join(this.deps.tmpDir, 'e2b-base-'));
    try {
      const files = splitFilesIn(work);
      await copyFile(cached.meta, files.metaPath, constants.COPYFILE_FICLONE);
      await copyFile(cached.blob, files.blobPath, constants.COPYFILE_FICLONE);
      return await this.deps.store.putSplit(files);
    } finally {
      await rm(work, { recursive: true, force: true });
    }
  }

  private async build(): Promise<{ digest: string; sizeBytes: number }> {
    await mkdir(this.deps.tmpDir, { recursive: true });
    const work = await mkdtemp(path.join(this.deps.tmpDir, 'e2b-base-'));
    const root = path.join(work, 'root');
    try {
      return await this.buildIn(work, root);
    } finally {
      // debootstrap mounts /proc and /sys (and may bind /dev) in the tree while it configures,
      // and a killed one leaves them: never remove a tree with the host's mounts in it.
      for (const p of (await this.mountsUnder(root)).sort((a, b) => b.length - a.length)) await unmount(p, { lazyFallback: true }).catch((err: unknown) => this.deps.logger.warn({ err, mount: p }, 'could not unmount'));
      if ((await this.mountsUnder(root)).length) this.deps.logger.error({ root }, 'the base template tree still has mounts in it; left in place');
      else await rm(work, { recursive: true, force: true });
    }
  }

  private async buildIn(work: string, root: string): Promise<{ digest: string; sizeBytes: number }> {
    const { suite, mirror, cacheDir } = this.deps.config;
    const debs = path.join(cacheDir, 'debs');
    await mkdir(debs, { recursive: true });
    await this.debootstrap(['--variant=minbase', `--include=${BASE_TEMPLATE_PACKAGES.join(',')}`, `--cache-dir=${debs}`, suite, root, mirror]);
    this.step('adding the user account');
    await run('chroot', [root, 'useradd', '--create-home', '--shell', '/bin/bash', '--uid', '1000', '--user-group', '--groups', 'sudo', 'user']);
    await writeFile(path.join(root, 'etc/sudoers.d/user'), 'user ALL=(ALL:ALL) NOPASSWD: ALL\n');
    await chmod(path.join(root, 'etc/sudoers.d/user'), 0o440);
    this.step('leaving out caches and docs');
    for (const dir of ['var/cache/apt/archives', 'var/lib/apt/lists', 'usr/share/doc', 'usr/share/man', 'usr/share/info', 'usr/share/locale']) await run('find', [path.join(root, dir), '-mindepth', '1', '-not', '-name', 'partial', '-not', '-name', 'lock', '-delete']).catch(() => undefined);
    // What the host put there while building is not the sandbox's; the runtime's mount target as in the busybox base.
    for (const [file, content] of [['etc/resolv.conf', ''], ['etc/hostname', 'sandbox\n'], ['etc/hosts', HOSTS_FILE]] as const) {
      await rm(path.join(root, file), { force: true });
      await writeFile(path.join(root, file), content);
    }
    await mkdir(path.join(root, '.rollbox'), { recursive: true });
    await writeFile(path.join(root, '.rollbox/busybox'), '', { mode: 0o755 });
    // debootstrap unmounts what it mounted when it succeeds; a tree with the host's mounts in it never becomes a layer.
    if (await this.mountsUnder(root).then((m) => m.length > 0)) throw new RollboxError('internal', `debootstrap left mounts under ${root}`);
    this.step('making the EROFS layer');
    const stored = await storeTreeAsLayer(root, await mkdtemp(path.join(work, 'layer-')), this.deps.store);
    await this.keepInCache(stored.files);
    return stored;
  }

  private async mountsUnder(root: string): Promise<string[]> {
    return (await readMountInfo()).map((m) => m.mountPoint).filter((p) => p.startsWith(`${root}/`));
  }

  private async keepInCache(files: { imagePath: string; blobPath?: string }): Promise<void> {
    if (!files.blobPath) return;
    const cached = this.cachePaths();
    await mkdir(cached.dir, { recursive: true });
    // Whole or absent: the blob last, each under a temporary name first.
    for (const [from, to] of [[files.imagePath, cached.meta], [files.blobPath, cached.blob]] as const) {
      await copyFile(from, `${to}.tmp`, constants.COPYFILE_FICLONE);
      await rename(`${to}.tmp`, to);
    }
  }

  /** debootstrap, its `I:` lines as the build's progress. */
  private debootstrap(args: string[]): Promise<void> {
    this.step('debootstrap: starting');
    return new Promise((resolve, reject) => {
      const child = spawn('debootstrap', args, { stdio: ['ignore', 'pipe', 'pipe'] });
      let tail = '';
      const timer = setTimeout(() => child.kill('SIGKILL'), BUILD_TIMEOUT_MS);
      createInterface({ input: child.stdout }).on('line', (line) => {
        tail = line;
        const m = /^I: (Retrieving|Validating|Extracting|Unpacking|Configuring|Installing|Base system)\S*\s*(\S*)/.exec(line);
        if (m) this.progress = { step: `debootstrap: ${m[1]!.toLowerCase()} ${m[2] ?? ''}`.trim(), sinceMs: this.progress.sinceMs };
      });
      child.stderr.on('data', (d: Buffer) => (tail = d.toString().trim().split('\n').at(-1) ?? tail));
      child.on('error', (err) => (clearTimeout(timer), reject(new RollboxError('internal', `debootstrap could not run (is the debootstrap package installed?): ${err.message}`))));
      child.on('close', (code) => {
        clearTimeout(timer);
        if (code === 0) resolve();
        else reject(new RollboxError('internal', `debootstrap exited ${code}: ${tail}`));
      });
    });
  }
}
