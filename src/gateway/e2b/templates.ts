import { RollboxError, type ImageSpec } from '../../api/index.ts';
import type { LayerRegistry, Reader } from '../../registry/index.ts';
import { DEFAULT_TEMPLATE } from './control-common.ts';

/** The cluster's E2B-like `base` template (src/images/base-template.ts), or none (E2B's `base` is then busybox). */
export interface BaseTemplateSource {
  /** The image's name once it is ready (waiting up to `waitMs` for a build under way); `template_not_ready` past that. */
  imageName(waitMs: number): Promise<string>;
}

/**
 * An E2B `templateID` as a rollbox image: `base` is the cluster's base template (or
 * busybox without one), a snapshot (a layer made by a snapshot, with parents) its parents
 * with the snapshot on top, anything else an image or layer name as given.
 */
export class E2bTemplates {
  constructor(
    private readonly deps: {
      layers: Pick<LayerRegistry, 'resolve'>;
      base: BaseTemplateSource | undefined;
      /** How long a create of `base` waits for the template's first build. */
      baseWaitMs: number;
    },
  ) {}

  /** As `reader` sees it: its own snapshots (`e2b-snapshot-*` names are the tenant's), published layers and images. */
  async imageOf(templateID: string, reader: Reader): Promise<ImageSpec | undefined> {
    if (templateID === DEFAULT_TEMPLATE) return this.deps.base ? { base: await this.deps.base.imageName(this.deps.baseWaitMs), layers: [] } : undefined;
    const layer = await this.deps.layers.resolve(templateID, reader).catch((err: unknown) => {
      if (err instanceof RollboxError && err.code === 'not_found') return undefined;
      throw err;
    });
    if (layer?.parents.length) return { base: layer.parents[0]!, layers: [...layer.parents.slice(1), layer.digest] };
    return { base: templateID, layers: [] };
  }
}
