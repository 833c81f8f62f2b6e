import type { Lineage } from '../api/index.ts';

/**
 * The frozen state children start from. Children on `clone.node` take a clone of the
 * parent's disk there (the fork point, made in a moment); the others stack the fork point
 * packed into a layer, which `layer()` packs once, when the first of them needs it.
 */
export interface ForkPoint {
  parent: string;
  parentKind: Lineage['parentKind'];
  /** The layers under the fork point (a cloned child stacks these; the others these plus the fork layer). */
  parentLayers: string[];
  clone?: { node: string; id: string; parentId: string };
  layer: () => Promise<string>;
  /** Whether layer() was called: the answer names the layer then. */
  packed: () => boolean;
  frozenMs?: number;
  /**
   * The parent saved whole (a microVM): every child is restored from the image of fork point
   * `id` (in the layer store), processes and all; `detachedCommands` ran in the parent then.
   */
  processes?: { id: string; detachedCommands: string[] };
}
