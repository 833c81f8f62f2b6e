import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LayerMounts, LayerStore, buildBusyboxBase } from '../src/layers/index.ts';
import { openCommand, releaseCommands, type CommandChannel } from '../src/workers/init/index.ts';
import { Frame, FrameDecoder, encodeAttach, encodeSpawn, frame } from '../src/workers/init/protocol.ts';
import { createRuncRuntime, type RuncRuntime } from '../src/workers/runtime/index.ts';

/**
 * Durable commands at the init's own level (rollbox-init.c), through its socket in a real
 * runc sandbox: detach, replay, offsets, spill to disk, grace, and frames it must refuse.
 */
let top: string;
let rt: RuncRuntime;
let socketPath: string;
const SANDBOX = `d${randomBytes(4).toString('hex')}`;

beforeAll(async () => {
  top = await mkdtemp(path.join(os.tmpdir(), 'rollbox-init-durable-'));
  const store = new LayerStore(path.join(top, 'store'));
  await mkdir(path.join(top, 'tmp'), { recursive: true });
  const base = (await buildBusyboxBase({ store, tmpDir: path.join(top, 'tmp') })).files;
  rt = createRuncRuntime({ dataDir: path.join(top, 'node'), nodeId: `t${randomBytes(3).toString('hex')}`, layerMounts: new LayerMounts({ dataDir: path.join(top, 'node'), storeDir: store.dir }), scratchSizeGiB: 1 });
  await rt.create({ sandboxId: SANDBOX, layerImages: [base], resources: { cpuMillis: 1000, memoryMiB: 64, diskMiB: 64, pids: 64 }, class: 'latency', env: {}, workdir: '/', hiddenPaths: [] });
  socketPath = rt.initSocketOf(SANDBOX);
});

afterAll(async () => {
  await rt?.reconcile(new Set()).catch((err: unknown) => console.error('final reconcile failed', err));
  if (top) await rm(top, { recursive: true, force: true });
});

const spawnOf = (argv: string[], commandId: string, graceMs = 30_000) => ({ argv, env: {}, cwd: '/', slot: '', stdoutCapBytes: 1 << 20, stderrCapBytes: 1 << 20, oomScoreAdj: 0, durable: { commandId, graceMs } });

/** Collects a channel's output and outcome. */
async function drain(channel: CommandChannel, out: Buffer[]): Promise<{ stdout: string; outcome: Awaited<CommandChannel['outcome']> }> {
  const outcome = await channel.outcome;
  return { stdout: Buffer.concat(out).toString('utf8'), outcome };
}

async function attach(commandId: string, fromOffset = 0): Promise<{ stdout: string; outcome: Awaited<CommandChannel['outcome']>; channel: CommandChannel; attached?: { pid: number; exited: boolean } }> {
  const out: Buffer[] = [];
  let attached: { pid: number; exited: boolean } | undefined;
  const channel = await openCommand(socketPath, { attach: { commandId, fromOffset } }, { onOutput: (s, c) => s === 'stdout' && out.push(c), onAttached: (a) => (attached = a) });
  return { ...(await drain(channel, out)), channel, attached };
}

/** A raw connection: writes `bytes`, returns every frame the init sent until it closed (or `waitMs`). */
async function raw(bytes: Buffer, waitMs = 1500): Promise<{ frames: { type: number; text: string }[]; closed: boolean }> {
  const socket = net.createConnection(socketPath);
  const frames: { type: number; text: string }[] = [];
  const decoder = new FrameDecoder();
  let closed = false;
  await new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, waitMs);
    socket.on('data', (d) => decoder.push(d, (type, payload) => frames.push({ type, text: payload.toString('utf8') })));
    socket.on('error', () => {});
    socket.on('close', () => {
      closed = true;
      clearTimeout(timer);
      resolve();
    });
    socket.write(bytes);
  });
  socket.destroy();
  return { frames, closed };
}

const initPid = (): number => Number(execFileSync('runc', ['--root', rt.runcRoot, 'state', `rb-${SANDBOX}`], { encoding: 'utf8' }).match(/"pid":\s*(\d+)/)![1]);
function readlinkSafe(p: string): string {
  try {
    return readlinkSync(p);
  } catch {
    return '';
  }
}

/** The init's children (ps exits 1 when it has none). */
const processesIn = (): string => {
  try {
    return execFileSync('ps', ['-o', 'args=', '--ppid', String(initPid())], { encoding: 'utf8' });
  } catch {
    return '';
  }
};

async function waitForGone(args: string[]): Promise<void> {
  for (let i = 0; i < 100 && args.some((a) => processesIn().includes(a)); i++) await new Promise((r) => setTimeout(r, 50));
  for (const a of args) expect(processesIn()).not.toContain(a);
}

describe('durable commands in the init', () => {
  it('run on when their connection drops; an attach replays all output (spilled past 64 KiB) then the exit; forget drops them', async () => {
    // 917 KiB of numbered lines, written while no connection holds the command.
    const script = 'i=0; while [ $i -lt 20 ]; do sleep 0.05; i=$((i+1)); done; seq 1 150000; echo end >&2; exit 5';
    const first = await openCommand(socketPath, { spawn: spawnOf(['sh', '-c', script], 'big-1') });
    first.close();
    const replay = await attach('big-1');
    const expected = Array.from({ length: 150_000 }, (_, i) => `${i + 1}\n`).join('');
    expect(replay.outcome).toEqual({ kind: 'exit', exitCode: 5, waitStatus: 5 << 8, oomKills: 0 });
    expect(replay.stdout.length).toBe(expected.length);
    expect(replay.stdout === expected).toBe(true);
    // Not forgotten: a second attach replays it again, whole.
    replay.channel.close();
    const again = await attach('big-1');
    expect(again.attached).toMatchObject({ exited: true });
    expect(again.stdout === expected).toBe(true);
    // The log past 64 KiB is an unnamed file on the sandbox's disk, not the init's memory.
    const fds = readdirSync(`/proc/${initPid()}/fd`).map((fd) => readlinkSafe(`/proc/${initPid()}/fd/${fd}`));
    expect(fds.some((l) => /\/#\d+ \(deleted\)$/.test(l) || l.includes('/tmp/'))).toBe(true);
    again.channel.forget();
    await new Promise((r) => setTimeout(r, 100));
    expect((await attach('big-1')).outcome).toEqual({ kind: 'unknown' });
  });

  it('keeps the output of a command whose spill file meets a full disk (it moves to memory), whole and in order', async () => {
    // Spilled to /tmp after the first 108 KiB; then the sandbox's disk is filled, and the rest must still be kept.
    const script = 'sleep 0.3; seq 1 20000; dd if=/dev/zero of=/root/fill bs=1M 2>/dev/null; df -k / | tail -1 >&2; seq 20001 150000; rm /root/fill';
    const first = await openCommand(socketPath, { spawn: spawnOf(['sh', '-c', script], 'full-1') });
    first.close();
    await new Promise((r) => setTimeout(r, 200));
    let replay = await attach('full-1');
    for (let i = 0; i < 50 && replay.outcome.kind !== 'exit'; i++) {
      replay.channel.close();
      await new Promise((r) => setTimeout(r, 200));
      replay = await attach('full-1');
    }
    expect(replay.outcome).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(replay.stdout === Array.from({ length: 150_000 }, (_, i) => `${i + 1}\n`).join('')).toBe(true);
    // The log moved to a memfd (the spill file could not grow).
    const fds = readdirSync(`/proc/${initPid()}/fd`).map((fd) => readlinkSafe(`/proc/${initPid()}/fd/${fd}`));
    expect(fds.some((l) => l.startsWith('/memfd:rollbox-output'))).toBe(true);
    replay.channel.forget();
  });

  it('an attach from an offset gets only what came after it', async () => {
    const out: Buffer[] = [];
    const first = await openCommand(socketPath, { spawn: spawnOf(['sh', '-c', 'echo one; sleep 0.5; echo two'], 'offset-1') }, { onOutput: (_s, c) => out.push(c) });
    for (let i = 0; i < 100 && out.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
    expect(Buffer.concat(out).toString()).toBe('one\n');
    const offset = first.offset;
    first.close();
    const rest = await attach('offset-1', offset);
    expect(rest.stdout).toBe('two\n');
    expect(rest.outcome).toMatchObject({ kind: 'exit', exitCode: 0 });
    rest.channel.forget();
  });

  it('a command nobody attaches to within its grace is killed and forgotten', async () => {
    const first = await openCommand(socketPath, { spawn: spawnOf(['sleep', '77'], 'grace-1', 300) });
    await new Promise((r) => setTimeout(r, 100));
    expect(processesIn()).toContain('sleep 77');
    first.close();
    await new Promise((r) => setTimeout(r, 900));
    expect((await attach('grace-1')).outcome).toEqual({ kind: 'unknown' });
    expect(processesIn()).not.toContain('sleep 77');
  });

  it('RELEASE lets go of every durable command: it runs on past its grace, its output dropped, no longer attachable', async () => {
    // One detached already, one still held by its connection: both are let go of.
    const detached = await openCommand(socketPath, { spawn: spawnOf(['sh', '-c', 'sleep 1.2; yes | head -c 300000; sleep 30'], 'rel-1', 300) });
    const held = await openCommand(socketPath, { spawn: spawnOf(['sleep', '79'], 'rel-2', 300) });
    await new Promise((r) => setTimeout(r, 100));
    detached.close();
    expect(await releaseCommands(socketPath)).toBe(2);
    await expect(held.outcome).rejects.toThrow();
    // Past their grace (300 ms), with 300 KB of output nobody reads (more than a pipe holds): running still.
    await new Promise((r) => setTimeout(r, 1800));
    expect(processesIn()).toContain('sleep 79');
    expect(processesIn()).toContain('sleep 30');
    for (const id of ['rel-1', 'rel-2']) expect((await attach(id)).outcome).toEqual({ kind: 'unknown' });
    // A new command may take a released one's id; the released ones are reaped when they end.
    const reused = await openCommand(socketPath, { spawn: spawnOf(['true'], 'rel-2') });
    expect(await reused.outcome).toMatchObject({ kind: 'exit', exitCode: 0 });
    reused.forget();
    // Each command leads its own process group (the init's setsid): ended by that id.
    const released = execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(initPid())], { encoding: 'utf8' }).split('\n').filter((l) => /sleep (79|30)$/.test(l.trim()));
    expect(released).toHaveLength(2);
    for (const line of released) process.kill(-Number(line.trim().split(/\s+/)[0]), 'SIGKILL');
    await waitForGone(['sleep 79', 'sleep 30']);
  });

  it('signals the attached command and takes over a connection that still holds it', async () => {
    // Started before the attach: two new connections may be read in either order (the init's session table is not a queue).
    let started!: () => void;
    const running = new Promise<void>((r) => (started = r));
    const first = await openCommand(socketPath, { spawn: spawnOf(['sleep', '78'], 'sig-1') }, { onStarted: () => started() });
    await running;
    // A second connection attaches while the first is open: it takes the command over.
    const out: Buffer[] = [];
    const second = await openCommand(socketPath, { attach: { commandId: 'sig-1' } }, { onOutput: (_s, c) => out.push(c) });
    await expect(first.outcome).rejects.toThrow(/closed the connection/);
    second.signal(15);
    expect(await second.outcome).toMatchObject({ kind: 'exit', exitCode: 128 + 15 });
    second.forget();
  });

  it('refuses malformed frames with an error and stays up', async () => {
    const errorOf = async (bytes: Buffer) => (await raw(bytes)).frames.map((f) => [f.type, f.text]);
    // A frame longer than any the init takes: the connection is dropped.
    const huge = Buffer.alloc(8);
    huge[0] = Frame.stdin;
    huge.writeUInt32LE(64 << 20, 4);
    expect((await raw(huge)).closed).toBe(true);
    expect(await errorOf(frame(Frame.attach, Buffer.from('short')))).toEqual([[Frame.error, 'malformed attach frame']]);
    expect(await errorOf(frame(Frame.attach, Buffer.concat([Buffer.alloc(8), Buffer.from('no-nul')])))).toEqual([[Frame.error, 'malformed attach frame']]);
    expect(await errorOf(frame(Frame.attach, Buffer.concat([Buffer.alloc(8), Buffer.from(`${'x'.repeat(129)}\0`)])))).toEqual([[Frame.error, 'malformed attach frame']]);
    expect(await errorOf(encodeAttach('never-spawned'))).toEqual([[Frame.unknown, '']]);
    expect(await errorOf(frame(99))).toEqual([[Frame.error, 'unknown frame type 99']]);
    // A durable spawn without its grace, and one whose id is taken.
    const noGrace = encodeSpawn({ ...spawnOf(['true'], 'g'), hasStdin: false }).subarray(0, -4);
    noGrace.writeUInt32LE(noGrace.length - 8, 4);
    expect(await errorOf(noGrace)).toEqual([[Frame.error, 'malformed command id']]);
    // Started first (openCommand only sends the spawn): then the id is the init's.
    let holderStarted!: () => void;
    const started = new Promise<void>((r) => (holderStarted = r));
    const holder = await openCommand(socketPath, { spawn: spawnOf(['sleep', '79'], 'dup-1') }, { onStarted: () => holderStarted() });
    await started;
    expect((await errorOf(encodeSpawn({ ...spawnOf(['true'], 'dup-1'), hasStdin: false }))).at(-1)).toEqual([Frame.error, 'a command of that id exists']);
    holder.signal(9);
    await holder.outcome;
    holder.forget();
    // A bad signal number on a running command's connection.
    const spawnThenBadSignal = Buffer.concat([encodeSpawn({ ...spawnOf(['sleep', '80'], 'badsig-1'), hasStdin: false }), frame(Frame.signal, Buffer.from([0, 1, 0, 0]))]);
    expect((await errorOf(spawnThenBadSignal)).map(([t]) => t)).toEqual([Frame.started, Frame.error]);
    // Still answering, with true results.
    const ok = await openCommand(socketPath, { spawn: spawnOf(['sh', '-c', 'echo alive'], 'alive-1') });
    expect(await ok.outcome).toMatchObject({ kind: 'exit', exitCode: 0 });
    ok.forget();
    // What the init holds after all that stays small (its RSS, in the sandbox's memory).
    const rssKiB = Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${initPid()}/status`, 'utf8'))![1]);
    console.log(JSON.stringify({ initRssKiB: rssKiB }));
  });
});
