/**
 * bench:pull — bench:import's pull arm alone (bench/support/pull-arm.ts): an image of this
 * host's files (over 1 GB in four layers), gzip and zstd, pulled from a loopback registry
 * against its floor measured in the same run (`skopeo copy` plus decompressing the blobs
 * with the fastest tool), and a create naming the ref never seen against that pull plus a
 * create with the image held. BENCH_IMPORT_GZIP_LEVEL (6) for the gzip blobs. Progress on
 * stderr, a chart in bench/out/pull.svg, one JSON line last.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pullArms, pullChart } from './support/pull-arm.ts';

const work = await fs.mkdtemp(path.join(os.tmpdir(), 'rollbox-bench-pull-'));
process.once('SIGINT', () => void fs.rm(work, { recursive: true, force: true }).finally(() => process.exit(130)));
try {
  const pull = await pullArms(work, Number(process.env.BENCH_IMPORT_GZIP_LEVEL ?? 6), (line) => process.stderr.write(`${line}\n`));
  const chart = pullChart(pull, path.resolve(import.meta.dirname, 'out', 'pull.svg'));
  console.log(JSON.stringify({ bench: 'pull', ...pull, chart, note: 'floor = skopeo copy + decompressing every blob to a file with the fastest tool (as many at once as a pull); pullToFloor = rollbox image pull end to end / floor, pullOnGatewayToFloor = the pull record\'s start to end / floor (target <= 1.25 each: >= 0.8 of the floor\'s speed); unseenRefToPullPlusHeld = POST /v1/run naming the ref on a fresh cluster / (the pull on the gateway + the same run with the image held) (target <= 1.25)' }));
} finally {
  await fs.rm(work, { recursive: true, force: true });
}
