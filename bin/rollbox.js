#!/usr/bin/env node
// Entry point of the `rollbox` command: runs the TypeScript CLI through tsx so a
// checkout works without a build step.
import { register } from 'tsx/esm/api';
register();
const { runCli } = await import('../src/cli/index.ts');
await runCli(process.argv);
