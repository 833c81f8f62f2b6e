import fs from 'node:fs';

export type Accelerator = 'kvm' | 'tcg';

/**
 * KVM where /dev/kvm boots a standard guest: hardware virtualization (vmx or svm in the
 * CPU flags). A /dev/kvm without them (PVM, as on this kind of cloud VM) boots only
 * PVM-patched guest kernels, so the Debian guest kernel runs under TCG there. Chosen once
 * at start; the heartbeat reports it.
 */
export function detectAccelerator(paths: { devKvm?: string; cpuinfo?: string } = {}): Accelerator {
  const devKvm = paths.devKvm ?? '/dev/kvm';
  const cpuinfo = paths.cpuinfo ?? '/proc/cpuinfo';
  try {
    fs.accessSync(devKvm, fs.constants.R_OK | fs.constants.W_OK);
    const flags = fs.readFileSync(cpuinfo, 'utf8').match(/^flags\s*:(.*)$/m)?.[1] ?? '';
    return /\b(vmx|svm)\b/.test(flags) ? 'kvm' : 'tcg';
  } catch {
    return 'tcg';
  }
}

/** The host TSC in kHz: under TCG the guest's TSC counts host ticks (docs/microvm.md: tsc_early_khz). */
export function hostTscKhz(cpuinfo = '/proc/cpuinfo'): number | undefined {
  const mhz = fs.readFileSync(cpuinfo, 'utf8').match(/^cpu MHz\s*:\s*([\d.]+)$/m)?.[1];
  return mhz ? Math.round(Number(mhz) * 1000) : undefined;
}
