import { createHash, randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import { RollboxError, isErrorCode, newId, type Image, type ImagePull, type ImageSpec, type ImageRecord, type ImportReport, type PullImageRequest, type PullProgress } from '../api/index.ts';
import { ReferenceError, checkDestination, checkRegistryAllowed, familiarName, parseReference, type EgressPolicy, type ImageReference } from '../oci-registry/index.ts';
import { CLUSTER_OWNER, lookupKeys, ownedKey, rankOf, removableKeys, splitKey, type ImagePullRecords, type ImageRegistry, type LayerRegistry, type Reader } from '../registry/index.ts';
import type { PullListener, PullTarget } from './pull.ts';

export interface ImagePullsDeps {
  images: Pick<ImageRegistry, 'get' | 'getAt' | 'has' | 'list' | 'put' | 'deleteAt'>;
  pulls: Pick<ImagePullRecords, 'get' | 'all' | 'active' | 'claim' | 'update' | 'delete'>;
  layers: Pick<LayerRegistry, 'resolve' | 'publish'>;
  /** `pullImage` with the gateway's layer store, registries and threads. */
  pull: (target: PullTarget, listener: PullListener, signal: AbortSignal) => Promise<Image & { pull: ImportReport }>;
  leaseMs: number;
  /** A pull ends `image_pull_timeout` this long after it started (a resumed one keeps its start). */
  deadlineMs: number;
  /** Refs to registries it refuses are refused at the request. */
  egress: EgressPolicy;
  logger: Logger;
  now: () => number;
}

/** A pull taken over this many times (its gateways kept stopping) ends failed instead. */
const MAX_RESUMES = 3;
const WAIT_POLL_MS = 200;
const STOP_WAIT_MS = 10_000;
const PROGRESS_WRITE_MS = 1000;
const DEFAULT_PLATFORM = 'linux/amd64';
const NAME_MAX = 128;
/** A failed pull's record says why in at most this much (a registry's text never grows it). */
const ERROR_MESSAGE_MAX = 1000;

/**
 * The image name a pull gets when it names none: the reference as Docker shows it
 * (`docker.io/` and `library/` dropped), lowercased, with every `/`, `:` and `@` made `-`,
 * and the platform after it unless it is linux/amd64: `python:3.12` -> `python-3.12`,
 * `127.0.0.1:5000/t/task:1` -> `127.0.0.1-5000-t-task-1`. Past 128 characters the end is
 * cut and a hash of the reference takes its place.
 */
export function imageNameOf(ref: ImageReference, platform: string = DEFAULT_PLATFORM): string {
  const name = `${familiarName(ref)}${platform === DEFAULT_PLATFORM ? '' : `-${platform}`}`.toLowerCase().replace(/[^a-z0-9._-]/g, '-');
  if (name.length <= NAME_MAX) return name;
  return `${name.slice(0, NAME_MAX - 13)}-${createHash('sha256').update(`${ref.canonical} ${platform}`).digest('hex').slice(0, 12)}`;
}

const emptyProgress = (): PullProgress => ({ layersTotal: 0, layersDone: 0, layersReused: 0, bytesTotal: 0, bytesDone: 0, bytesFetched: 0 });

/**
 * Image pulls across the cluster: a pull request claims the name's pull record in Redis
 * (joining one of the same ref already running, on any gateway) and runs it in the
 * background under a lease it renews while writing progress; a gateway finding a lapsed
 * lease (its gateway died) takes the pull over and runs it again from the start, reusing
 * every layer stored meanwhile. Creates whose image is a ref wait here.
 *
 * Names are per owner (src/registry/owners.ts): records and pulls live under
 * `<owner>/<name>`, a tenant reads its own names and then the cluster's (published by an
 * admin), never another tenant's.
 */
export class ImagePulls {
  private readonly running = new Map<string, AbortController>();
  private sweeper: NodeJS.Timeout | undefined;
  private stopping = false;

  constructor(private readonly deps: ImagePullsDeps) {}

  start(): void {
    this.sweeper = setInterval(() => void this.resumeOrphans().catch((err: unknown) => this.deps.logger.warn({ err }, 'image pull sweep failed')), Math.max(100, Math.floor(this.deps.leaseMs / 2)));
    this.sweeper.unref();
  }

  /** Stops this gateway's pulls and gives their leases up, so another gateway resumes them at once. */
  async stop(): Promise<void> {
    this.stopping = true;
    clearInterval(this.sweeper);
    const stopped = [...this.running.values()];
    for (const c of stopped) c.abort(new RollboxError('unavailable', 'the gateway running the pull is stopping'));
    // Each stops within moments (its streams are cut); a stuck one must not hold the gateway's stop.
    const deadline = this.deps.now() + STOP_WAIT_MS;
    while (this.running.size > 0 && this.deps.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  }

  /** `POST /v1/images/pull` into the owner's names: the record at once (state `pulling` for a new image). */
  async request(request: PullImageRequest, owner: string): Promise<ImageRecord> {
    const ref = parseRef(request.ref);
    // What can be told without a connection: a registry outside the allowlist, or an internal address literal.
    checkRegistryAllowed(ref.registry, this.deps.egress);
    checkDestination(new URL(`http://${ref.registry}`), this.deps.egress, `registry ${ref.registry}`);
    const name = request.name ?? imageNameOf(ref, request.platform);
    const reader = { tenant: owner, all: false };
    if (await this.deps.layers.resolve(name, reader).then(() => true, () => false)) {
      throw new RollboxError('conflict', `${name} is a layer's name; an image needs a name of its own (give the pull a name)`);
    }
    const key = ownedKey(owner, name);
    const existing = await this.deps.images.getAt(key);
    if (!request.name && existing && (existing.ref !== ref.canonical || existing.platform.split('/').slice(0, 2).join('/') !== request.platform.split('/').slice(0, 2).join('/'))) {
      throw new RollboxError('conflict', `image ${name} holds ${existing.ref ?? 'an imported image'}, not ${ref.canonical}: give the pull a name`);
    }
    const pull: ImagePull = { id: newId('pull'), ref: ref.canonical, platform: request.platform, state: 'pulling', startedAt: new Date(this.deps.now()).toISOString(), progress: emptyProgress(), resumed: 0 };
    const token = randomBytes(12).toString('hex');
    const claim = await this.deps.pulls.claim(key, pull, token, this.deps.leaseMs);
    if (claim.outcome === 'conflict') throw new RollboxError('conflict', `a pull of ${claim.pull.ref} (${claim.pull.platform}) into ${name} is running; wait for it or give this pull another name`);
    if (claim.outcome === 'started' || claim.outcome === 'resumable') this.run(key, claim.pull, token, claim.outcome === 'resumable');
    return (await this.recordAt(key))!;
  }

  /**
   * The image a create's `image.ref` names: one holding it already (no pull, as
   * `docker run` does): the owner's own, else a published one; else its pull into the
   * owner's names, waited for up to `waitMs`. Answers the image's name.
   */
  async imageFor(refText: string, platform: string = DEFAULT_PLATFORM, waitMs: number, owner: string): Promise<string> {
    const ref = parseRef(refText);
    const name = imageNameOf(ref, platform);
    const held = await this.deps.images.get({ tenant: owner, all: false }, name);
    if (held?.ref === ref.canonical) return name;
    const started = await this.request({ ref: refText, platform }, owner);
    const id = started.pull!.id;
    const deadline = this.deps.now() + waitMs;
    for (;;) {
      const pull = await this.deps.pulls.get(ownedKey(owner, name));
      if (!pull || pull.id !== id) throw new RollboxError('conflict', `the pull of ${ref.canonical} into ${name} was replaced by another`);
      if (pull.state === 'ready') return name;
      if (pull.state === 'failed') throw new RollboxError(pull.error && isErrorCode(pull.error.code) ? pull.error.code : 'internal', `pulling ${ref.canonical}: ${pull.error?.message ?? 'failed'}`);
      if (this.deps.now() >= deadline) throw new RollboxError('image_pull_timeout', `${ref.canonical} is still being pulled after ${Math.round(waitMs / 1000)} s (GET /v1/images/${name} shows how far); the pull goes on`, 10);
      await new Promise((r) => setTimeout(r, WAIT_POLL_MS));
    }
  }

  /** The record of a name as the reader sees it: its own, else the cluster's (another tenant's is not found). */
  async record(name: string, reader: Reader): Promise<ImageRecord> {
    for (const key of lookupKeys(reader, name)) {
      const record = await this.recordAt(key);
      if (record) return record;
    }
    throw new RollboxError('not_found', `image ${name} not found`);
  }

  private async recordAt(key: string): Promise<ImageRecord | undefined> {
    const [image, pull] = await Promise.all([this.deps.images.getAt(key), this.deps.pulls.get(key)]);
    return recordOf(splitKey(key).name, image, pull);
  }

  /** The images (and pulls) a reader sees, by name: its own shadow the cluster's. */
  async list(reader: Reader): Promise<ImageRecord[]> {
    const [images, pulls] = await Promise.all([this.deps.images.list(reader), this.deps.pulls.all()]);
    const byName = new Map(images.map((i) => [i.name, i]));
    const pullOf = new Map<string, { rank: number; pull: ImagePull }>();
    for (const [key, pull] of pulls) {
      const { owner, name } = splitKey(key);
      const rank = rankOf(reader, owner);
      if (rank >= 0 && (pullOf.get(name)?.rank ?? 3) > rank) pullOf.set(name, { rank, pull });
    }
    const names = [...new Set([...byName.keys(), ...pullOf.keys()])].sort();
    return names.flatMap((n) => recordOf(n, byName.get(n), pullOf.get(n)?.pull) ?? []);
  }

  /**
   * Removes the reader's image of that name (an admin's: also a published or owner-less
   * one) and its pull record; refused while its pull runs. Records that no longer parse
   * (an older version's) are removed too: the answer then says so.
   */
  async delete(name: string, reader: Reader): Promise<ImageRecord> {
    let key: string | undefined;
    for (const k of removableKeys(reader, name)) if (!key && ((await this.deps.images.has(k)) || (await this.deps.pulls.get(k)))) key = k;
    if (!key) throw new RollboxError('not_found', `image ${name} not found`);
    const record = await this.recordAt(key).catch((err: unknown) => {
      if (err instanceof RollboxError && err.code === 'invalid_image') return undefined;
      throw err;
    });
    if (record?.pull?.state === 'pulling') throw new RollboxError('invalid_state', `image ${name} is being pulled; delete it once the pull has ended`);
    const image = await this.deps.images.deleteAt(key);
    const pull = await this.deps.pulls.delete(key);
    if (record) return record;
    if (!image && !pull) throw new RollboxError('not_found', `image ${name} not found`);
    const message = 'its stored record was invalid (written under looser rules); removed';
    return { name, state: 'failed', platform: DEFAULT_PLATFORM, layers: [], config: { Env: [] }, sizeBytes: 0, createdAt: new Date(this.deps.now()).toISOString(), error: { code: 'invalid_image', message } };
  }

  /**
   * Publishes the reader's image of that name cluster-wide (an admin's call): a copy under
   * the cluster's names, its layers published, so every tenant creates from it.
   */
  async publish(name: string, reader: Reader): Promise<ImageRecord> {
    const image = await this.deps.images.get(reader, name);
    if (!image) throw new RollboxError('not_found', `image ${name} not found`);
    for (const l of image.layers) await this.deps.layers.publish(l.digest, undefined);
    await this.deps.images.put(CLUSTER_OWNER, image);
    return (await this.recordAt(ownedKey(CLUSTER_OWNER, name)))!;
  }

  /** Pulls whose gateway stopped renewing their lease: taken over here (one of older data, with no owner, is left). */
  private async resumeOrphans(): Promise<void> {
    if (this.stopping) return;
    for (const { name, leased } of await this.deps.pulls.active()) {
      if (leased || this.running.has(name) || splitKey(name).owner === undefined) continue;
      const pull = await this.deps.pulls.get(name);
      if (!pull || pull.state !== 'pulling') continue;
      const token = randomBytes(12).toString('hex');
      const claim = await this.deps.pulls.claim(name, pull, token, this.deps.leaseMs);
      if (claim.outcome === 'resumable') this.run(name, claim.pull, token, true);
    }
  }

  /** Runs a pull this gateway holds the lease of (`key`: `<owner>/<name>`), writing its progress (and renewing the lease) as it goes, to its one end. */
  private run(key: string, claimed: ImagePull, token: string, resumed: boolean): void {
    const { owner, name } = splitKey(key) as { owner: string; name: string };
    const controller = new AbortController();
    this.running.set(key, controller);
    let pull: ImagePull = resumed ? { ...claimed, resumed: claimed.resumed + 1, progress: emptyProgress() } : claimed;
    const { leaseMs, logger } = this.deps;
    // Writes in order, each renewing the lease; a lost lease (another gateway took the pull) stops this one.
    let writes = Promise.resolve();
    const write = (options: { ended?: boolean; giveUp?: boolean } = {}): Promise<void> => {
      const snapshot = pull;
      writes = writes.then(async () => {
        const held = await this.deps.pulls.update(key, snapshot, token, leaseMs, options).catch((err: unknown) => {
          logger.warn({ err, image: name }, 'image pull progress not written');
          return true;
        });
        if (!held && !options.ended && !options.giveUp) controller.abort(new RollboxError('conflict', `the pull of ${name} was taken over by another gateway`));
      });
      return writes;
    };
    // Progress readers see it within a second; the lease is renewed well within its term.
    const ticker = setInterval(() => void write(), Math.max(100, Math.min(PROGRESS_WRITE_MS, Math.floor(leaseMs / 3))));
    const { deadlineMs } = this.deps;
    const deadline = setTimeout(
      () => controller.abort(new RollboxError('image_pull_timeout', `the pull ran past its deadline of ${Math.round(deadlineMs / 1000)} s (ROLLBOX_IMAGE_PULL_DEADLINE_MS)`)),
      Math.max(0, Date.parse(claimed.startedAt) + deadlineMs - this.deps.now()),
    );
    const listener: PullListener = {
      planned: (digest, progress) => {
        pull = { ...pull, digest, progress };
        void write();
      },
      advanced: (progress) => {
        pull = { ...pull, progress };
      },
    };
    const finish = async (outcome: Partial<ImagePull>): Promise<void> => {
      clearInterval(ticker);
      pull = { ...pull, ...outcome, finishedAt: new Date(this.deps.now()).toISOString() };
      await write({ ended: true });
    };
    void (async () => {
      try {
        if (pull.resumed > MAX_RESUMES) throw new RollboxError('internal', `the pull was interrupted ${pull.resumed - 1} times (the gateways running it stopped)`);
        await write();
        const target = { owner, name, ref: parseRef(pull.ref), platform: pull.platform };
        logger.info({ image: name, ref: pull.ref, pull: pull.id, resumed: pull.resumed }, 'image pull started');
        const image = await this.deps.pull(target, listener, controller.signal);
        await finish({ state: 'ready', digest: image.digest });
        logger.info({ image: name, ref: pull.ref, pull: pull.id, layersBuilt: image.pull.layersBuilt, layersReused: image.pull.layersReused, bytes: image.pull.archiveBytes, durationMs: image.pull.durationMs }, 'image pulled');
      } catch (err) {
        if (this.stopping && controller.signal.aborted) {
          // Left `pulling`, its lease given up: another gateway (or this one restarted) resumes it.
          clearInterval(ticker);
          await write({ giveUp: true });
        } else if (!(controller.signal.reason instanceof RollboxError && controller.signal.reason.code === 'conflict')) {
          const error = err instanceof RollboxError ? { code: err.code, message: err.message.slice(0, ERROR_MESSAGE_MAX) } : { code: 'internal' as const, message: (err instanceof Error ? err.message : String(err)).slice(0, ERROR_MESSAGE_MAX) };
          logger.warn({ image: name, ref: pull.ref, pull: pull.id, code: error.code, reason: error.message }, 'image pull failed');
          await finish({ state: 'failed', error });
        } else clearInterval(ticker);
      } finally {
        clearTimeout(deadline);
        this.running.delete(key);
      }
    })();
  }
}

/** What creates and pools call with their image spec: a `ref` becomes the `base` of the image holding it (pulled first if none does). */
export function resolveImageRef(pulls: Pick<ImagePulls, 'imageFor'>, waitMs: number): (spec: ImageSpec, owner: string) => Promise<ImageSpec> {
  return async (spec, owner) => (spec.ref === undefined ? spec : { base: await pulls.imageFor(spec.ref, spec.platform, waitMs, owner), layers: spec.layers });
}

function parseRef(text: string): ImageReference {
  try {
    return parseReference(text);
  } catch (err) {
    if (err instanceof ReferenceError) throw new RollboxError('invalid_request', `ref: ${err.message}`);
    throw err;
  }
}

/** What the API shows of a name: the image if one is ready (with its latest pull), else its pull. */
function recordOf(name: string, image: Image | undefined, pull: ImagePull | undefined): ImageRecord | undefined {
  if (image) return { ...image, state: 'ready', ...(pull ? { pull } : {}) };
  if (!pull || pull.state === 'ready') return undefined;
  return {
    name,
    state: pull.state,
    ...(pull.digest ? { digest: pull.digest } : {}),
    platform: pull.platform,
    layers: [],
    config: { Env: [] },
    sizeBytes: 0,
    createdAt: pull.startedAt,
    ref: pull.ref,
    pull,
    ...(pull.error ? { error: pull.error } : {}),
  };
}
