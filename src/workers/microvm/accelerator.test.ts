import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { detectAccelerator, hostTscKhz } from './accelerator.ts';
import { qemuArgs } from './qemu.ts';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'rb-accel-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));
const file = (name: string, text: string): string => {
  fs.writeFileSync(path.join(dir, name), text);
  return path.join(dir, name);
};

describe('accelerator', () => {
  const devKvm = file('kvm', '');
  it('is kvm only where /dev/kvm opens and the CPU has vmx or svm', () => {
    expect(detectAccelerator({ devKvm, cpuinfo: file('vmx', 'flags\t\t: fpu vmx sse\ncpu MHz\t\t: 2445.406\n') })).toBe('kvm');
    expect(detectAccelerator({ devKvm, cpuinfo: file('svm', 'flags\t\t: fpu svm\n') })).toBe('kvm');
    // A PVM /dev/kvm (no hardware virtualization flag) boots no standard guest.
    expect(detectAccelerator({ devKvm, cpuinfo: file('pvm', 'flags\t\t: fpu sse hypervisor\n') })).toBe('tcg');
    expect(detectAccelerator({ devKvm: path.join(dir, 'absent'), cpuinfo: path.join(dir, 'vmx') })).toBe('tcg');
  });
  it('reads the host TSC for the guest\'s early calibration', () => {
    expect(hostTscKhz(path.join(dir, 'vmx'))).toBe(2445406);
  });
});

describe('qemuArgs', () => {
  const base = { qemuBinary: 'qemu-system-x86_64', kernel: '/k', initramfs: '/i', diskImage: '/d.ext4', vcpus: 2, memoryMiB: 256, agentSocket: '/a.sock', qmpSocket: '/q.sock', ramFile: '/dev/shm/r.ram' };
  it('gives layers read-only disks by serial, a split layer its blob, and TCG its TSC', () => {
    const args = qemuArgs({ ...base, accelerator: 'tcg', tscKhz: 2445406, layerImages: [{ imagePath: '/l0.meta', blobPath: '/l0.blob' }, { imagePath: '/l1.erofs' }] });
    const joined = args.join(' ');
    expect(joined).toContain('file=/l0.meta,format=raw,if=none,readonly=on');
    expect(joined).toContain('file=/l0.blob,format=raw,if=none,readonly=on');
    expect(joined).toContain('serial=rbl0b');
    expect(joined).toContain('file=/l1.erofs,format=raw,if=none,readonly=on');
    expect(joined).not.toMatch(/file=\/d\.ext4[^ ]*readonly/);
    const cmdline = args[args.indexOf('-append') + 1]!;
    expect(cmdline).toContain('rollbox.layers=2');
    expect(cmdline).toContain('rollbox.blobs=10');
    expect(cmdline).toContain('tsc_early_khz=2445406');
    // TCG's translation buffer capped: QEMU's 1 GiB default would be charged to the sandbox's cgroup.
    expect(args.slice(0, 2)).toEqual(['-accel', 'tcg,tb-size=64']);
    // No NIC: network mode none.
    expect(joined).not.toMatch(/netdev|virtio-net/);
    // The guest's RAM is a shared file (hibernation copies it), the machine's memory backend; a create waits for no incoming state.
    expect(joined).toContain('memory-backend-file,id=ram,size=256M,mem-path=/dev/shm/r.ram,share=on');
    expect(args[args.indexOf('-M') + 1]).toContain('memory-backend=ram');
    expect(args).not.toContain('-incoming');
  });
  it('hands memory back: the balloon device, a small translation buffer, the report order and reclaim on the guest command line', () => {
    const args = qemuArgs({ ...base, accelerator: 'tcg', layerImages: [{ imagePath: '/l0' }], returnMemory: { cacheReclaimSeconds: 10 } });
    expect(args.slice(0, 2)).toEqual(['-accel', 'tcg,tb-size=32']);
    expect(args.join(' ')).toContain('virtio-balloon-device,free-page-reporting=on');
    const cmdline = args[args.indexOf('-append') + 1]!.split(' ');
    expect(cmdline).toContain('rollbox.reportorder=5');
    expect(cmdline).toContain('rollbox.reclaim=10');
    // Off (no returnMemory): none of it, the buffer as before.
    const off = qemuArgs({ ...base, accelerator: 'tcg', layerImages: [{ imagePath: '/l0' }] }).join(' ');
    expect(off).not.toMatch(/virtio-balloon|rollbox\.reportorder|rollbox\.reclaim/);
  });
  it('starts a restore paused, waiting for its saved device state', () => {
    const args = qemuArgs({ ...base, accelerator: 'tcg', layerImages: [{ imagePath: '/l0' }], incoming: true });
    expect(args.join(' ')).toContain('-S -incoming defer');
  });
  it('runs KVM with the host CPU and no TSC override', () => {
    const args = qemuArgs({ ...base, accelerator: 'kvm', tscKhz: 1, layerImages: [{ imagePath: '/l0' }] });
    expect(args.join(' ')).toContain('-cpu host');
    expect(args[args.indexOf('-append') + 1]).not.toContain('tsc_early_khz');
  });
});
