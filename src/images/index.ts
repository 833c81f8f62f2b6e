export { ImportHolds, importImage } from './import.ts';
export type { ImageImportDeps } from './import.ts';
export { chooseImage } from './manifest.ts';
export type { ChosenImage } from './manifest.ts';
