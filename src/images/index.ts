export { importImage } from './import.ts';
export type { ImageImportDeps } from './import.ts';
export { ImportHolds } from './layer-set.ts';
export { chooseImage } from './manifest.ts';
export type { ChosenImage } from './manifest.ts';
export { pullImage } from './pull.ts';
export type { ImagePullDeps, PullListener, PullTarget } from './pull.ts';
export { ImagePulls, imageNameOf, resolveImageRef } from './pulls.ts';
export type { ImagePullsDeps } from './pulls.ts';
