/**
 * A tiny static x86-64 ELF that makes ONE system call with fixed arguments and exits with
 * its errno (0 when the call succeeded). Busybox has no tool for ptrace, bpf or keyctl, and
 * a shell cannot tell seccomp's EPERM from a missing capability's; this probe makes the raw
 * call and the exit code says exactly what the kernel answered. Built here byte by byte so
 * tests need no compiler. Pointer arguments are NULL: a call that got past the filter then
 * fails with EFAULT/EINVAL, which the test can tell from EPERM.
 */
export const SYSCALLS = {
  mount: 165,
  umount2: 166,
  ptrace: 101,
  keyctl: 250,
  unshare: 272,
  setns: 308,
  bpf: 321,
  init_module: 175,
  kexec_load: 246,
  open_by_handle_at: 304,
  userfaultfd: 323,
  perf_event_open: 298,
  io_uring_setup: 425,
  pidfd_open: 434,
  pidfd_getfd: 438,
} as const;

const LOAD_ADDRESS = 0x400000n;
const HEADER_BYTES = 64 + 56;

/**
 * With `then`, a second call follows whose first argument is the first call's result
 * (pidfd_open, then pidfd_getfd on the fd it returned); the exit code is the second's errno.
 */
export function syscallProbe(nr: number, args: readonly (number | bigint)[] = [], then?: { nr: number; args: readonly (number | bigint)[] }): Buffer {
  const imm64 = (prefix: number[], value: number | bigint): Buffer => {
    const b = Buffer.alloc(prefix.length + 8);
    Buffer.from(prefix).copy(b);
    b.writeBigInt64LE(BigInt(value), prefix.length);
    return b;
  };
  // rax = nr; rdi, rsi, rdx, r10, r8, r9 = args; syscall
  const registers = [[0x48, 0xbf], [0x48, 0xbe], [0x48, 0xba], [0x49, 0xba], [0x49, 0xb8], [0x49, 0xb9]];
  const code = Buffer.concat([
    imm64([0x48, 0xb8], nr),
    ...registers.map((prefix, i) => imm64(prefix, args[i] ?? 0)),
    Buffer.from([0x0f, 0x05]),
    // then: rdi = rax (the first call's result); rax = nr2; rsi, rdx, ... = its other args; syscall
    ...(then ? [Buffer.from([0x48, 0x89, 0xc7]), imm64([0x48, 0xb8], then.nr), ...registers.slice(1).map((prefix, i) => imm64(prefix, then.args[i + 1] ?? 0)), Buffer.from([0x0f, 0x05])] : []),
    // rax = -rax; rdi = rax; if rax <= 0 (the call succeeded) rdi = 0; exit(rdi)
    Buffer.from([0x48, 0xf7, 0xd8, 0x48, 0x89, 0xc7, 0x48, 0x85, 0xc0, 0x7f, 0x02, 0x31, 0xff, 0xb8, 0x3c, 0x00, 0x00, 0x00, 0x0f, 0x05]),
  ]);
  const fileSize = BigInt(HEADER_BYTES + code.length);
  const elf = Buffer.alloc(HEADER_BYTES);
  Buffer.from([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0]).copy(elf, 0); // ELF64, little endian, SysV
  elf.writeUInt16LE(2, 16); // ET_EXEC
  elf.writeUInt16LE(0x3e, 18); // x86-64
  elf.writeUInt32LE(1, 20);
  elf.writeBigUInt64LE(LOAD_ADDRESS + BigInt(HEADER_BYTES), 24); // entry
  elf.writeBigUInt64LE(64n, 32); // program headers right after this header
  elf.writeUInt16LE(64, 52);
  elf.writeUInt16LE(56, 54);
  elf.writeUInt16LE(1, 56);
  // One PT_LOAD, read + execute, the whole file at LOAD_ADDRESS.
  elf.writeUInt32LE(1, 64);
  elf.writeUInt32LE(5, 68);
  elf.writeBigUInt64LE(0n, 72);
  elf.writeBigUInt64LE(LOAD_ADDRESS, 80);
  elf.writeBigUInt64LE(LOAD_ADDRESS, 88);
  elf.writeBigUInt64LE(fileSize, 96);
  elf.writeBigUInt64LE(fileSize, 104);
  elf.writeBigUInt64LE(0x1000n, 112);
  return Buffer.concat([elf, code]);
}
