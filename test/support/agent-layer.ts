import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { build } from 'esbuild';

/** An agent (a .ts file) bundled with its SDKs into one file node runs. */
export async function bundleAgent(entry: string, outfile: string): Promise<void> {
  await build({
    entryPoints: [entry],
    bundle: true,
    platform: 'node',
    target: 'node20',
    format: 'esm',
    outfile,
    // Some bundled CommonJS calls require() for node built-ins.
    banner: { js: "import { createRequire } from 'node:module'; const require = createRequire(import.meta.url);" },
    logLevel: 'error',
  });
}

/**
 * A layer holding an agent as it would ship: this host's node binary and the libraries it
 * links, and the agent (`<agentsDir>/<name>.ts`, test/support/agents by default) bundled
 * with its SDKs into one file at /agent/<name>.mjs. Returned as a tar for POST /v1/layers.
 */
export async function agentLayerTar(names: string[], agentsDir = path.join(import.meta.dirname, 'agents')): Promise<Buffer> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-agent-'));
  try {
    await fs.mkdir(path.join(dir, 'agent'));
    for (const name of names) await bundleAgent(path.join(agentsDir, `${name}.ts`), path.join(dir, 'agent', `${name}.mjs`));
    const node = await fs.realpath(process.execPath);
    const libs = ['libdl.so.2', 'libstdc++.so.6', 'libm.so.6', 'libgcc_s.so.1', 'libpthread.so.0', 'libc.so.6'].map((l) => `lib/x86_64-linux-gnu/${l}`);
    const archive = path.join(dir, 'layer.tar');
    execFileSync('tar', ['-C', '/', '-chf', archive, node.slice(1), 'lib64/ld-linux-x86-64.so.2', ...libs]);
    execFileSync('tar', ['-C', dir, '-rf', archive, 'agent']);
    return await fs.readFile(archive);
  } finally {
    await fs.rm(dir, { recursive: true, force: true });
  }
}
