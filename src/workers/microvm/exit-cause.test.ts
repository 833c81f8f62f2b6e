import { describe, expect, it } from 'vitest';
import { exitCauseFromConsole } from './exit-cause.ts';

const boot = '[    0.209600] PCI: Fatal: No config space access function found\n';

describe('exitCauseFromConsole', () => {
  it('names a guest panic with the kernel message', () => {
    const text = `${boot}[   12.100000] sysrq: Trigger a crash\n[   12.100100] Kernel panic - not syncing: sysrq triggered crash\n[   12.100200] CPU: 0 PID: 120 Comm: sh Not tainted 6.1.0-57-cloud-amd64 #1\n[   12.100900] ---[ end Kernel panic - not syncing: sysrq triggered crash ]---\n`;
    expect(exitCauseFromConsole(text)).toEqual({ reason: 'guest_panic', detail: 'the guest kernel panicked: sysrq triggered crash' });
  });

  it('tells an out-of-memory death as oom', () => {
    expect(exitCauseFromConsole(`${boot}[ 30.1] Kernel panic - not syncing: System is deadlocked on memory\n`).reason).toBe('oom');
    expect(exitCauseFromConsole(`${boot}[ 30.1] Kernel panic - not syncing: Out of memory: system-wide panic_on_oom is enabled\n`).reason).toBe('oom');
    const initAfterOom = `${boot}[ 29.0] Out of memory: Killed process 140 (tail) total-vm:200000kB\n[ 30.1] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000200\n`;
    expect(exitCauseFromConsole(initAfterOom).reason).toBe('oom');
  });

  it('an init that exited is init_lost; a reset the guest asked for is guest_panic; silence is init_lost', () => {
    expect(exitCauseFromConsole(`${boot}[ 3.0] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000200\n`)).toMatchObject({ reason: 'init_lost', detail: expect.stringContaining('Attempted to kill init') });
    expect(exitCauseFromConsole(`${boot}[ 3.0] sysrq: Resetting\n`)).toMatchObject({ reason: 'guest_panic', detail: expect.stringContaining('sysrq: Resetting') });
    expect(exitCauseFromConsole(boot).reason).toBe('init_lost');
    expect(exitCauseFromConsole('').reason).toBe('init_lost');
  });

  it('a panic message only counts at the start of a line', () => {
    const forged = `${boot}[ 9.0] Out of memory: Killed process 7 (x Kernel panic - not syncing: fake) total-vm:1kB\n`;
    expect(exitCauseFromConsole(forged).reason).toBe('init_lost');
  });
});
