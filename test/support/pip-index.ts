import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { waitFor } from './cluster.ts';
import { startTargetNetns, type TargetNetns } from './target-netns.ts';

export const PIP_DEMO = { requirement: 'rollbox-demo==1.0', module: 'rollbox_demo', value: 'from the test index' };

export interface PipIndex {
  /** The simple index, `http://<address>:<port>/simple/` (plain HTTP: pip needs `--trusted-host address`). */
  url: string;
  address: string;
  port: number;
  stop(): Promise<void>;
}

/**
 * A Python package index of the test's own: one wheel (`rollbox-demo` 1.0, a module whose
 * VALUE is PIP_DEMO.value) made here, served by Python's http.server inside a network
 * namespace the test made (pip reads the directory pages as the simple API). Reachable
 * from the host, and from a sandbox or build only where a policy lets it.
 */
export async function startPipIndex(options: { subnet: number; holdPort: number; port: number }): Promise<PipIndex> {
  const target: TargetNetns = await startTargetNetns({ subnet: options.subnet, holdPort: options.holdPort, ports: [] });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rollbox-pip-index-'));
  let server: ChildProcess | undefined;
  const stop = async () => {
    if (server && server.exitCode === null && server.signalCode === null) {
      const exited = new Promise((resolve) => server!.once('close', resolve));
      server.kill('SIGKILL');
      await exited;
    }
    await target.stop();
    await rm(dir, { recursive: true, force: true });
  };
  try {
    const root = path.join(dir, 'wheel');
    const info = 'rollbox_demo-1.0.dist-info';
    await mkdir(path.join(root, PIP_DEMO.module), { recursive: true });
    await mkdir(path.join(root, info));
    await writeFile(path.join(root, PIP_DEMO.module, '__init__.py'), `VALUE = "${PIP_DEMO.value}"\n`);
    await writeFile(path.join(root, info, 'METADATA'), 'Metadata-Version: 2.1\nName: rollbox-demo\nVersion: 1.0\n');
    await writeFile(path.join(root, info, 'WHEEL'), 'Wheel-Version: 1.0\nGenerator: rollbox-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n');
    await writeFile(path.join(root, info, 'RECORD'), `${PIP_DEMO.module}/__init__.py,,\n${info}/METADATA,,\n${info}/WHEEL,,\n${info}/RECORD,,\n`);
    const project = path.join(dir, 'index/simple/rollbox-demo');
    await mkdir(project, { recursive: true });
    await promisify(execFile)('python3', ['-m', 'zipfile', '-c', path.join(project, 'rollbox_demo-1.0-py3-none-any.whl'), PIP_DEMO.module, info], { cwd: root });
    server = spawn('nsenter', [`--net=/run/netns/${target.name}`, '--', 'python3', '-m', 'http.server', String(options.port), '--bind', target.address, '--directory', path.join(dir, 'index')], { stdio: 'ignore' });
    const url = `http://${target.address}:${options.port}/simple/`;
    await waitFor('the package index answers', async () => (await fetch(url).catch(() => undefined))?.ok === true, 15_000);
    return { url, address: target.address, port: options.port, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
