export { BuildService, type BuildServiceDeps } from './service.ts';
export { StepCache, type StepCacheDeps } from './cache.ts';
export { runBuild, StepFailed, type BuildEngineDeps, type BuildRun } from './engine.ts';
export { planBuild, dockerfileOf, type BuildPlan } from './plan.ts';
export { parseDockerfile, expand, splitWords, type Instruction, type Stage, type ParsedDockerfile } from './dockerfile.ts';
export { readContext, dockerignore, globRegExp, selectSources, type BuildContextFiles, type ContextEntry } from './context.ts';
export { packTar, type TarHeader } from './tar.ts';
