#!/bin/sh
# Builds the microVM guest's initramfs (build/vm/initramfs.cpio.gz): rollbox-vminit as
# /init (src/workers/microvm/guest, static musl), the guest kernel's modules it loads,
# rollbox-init and a static busybox (bound read-only at /.rollbox in the guest, as in a
# container). Rebuilt only when an input changed. Called by scripts/install-microvm.sh.
set -e
cd "$(dirname "$0")/.."
dir=src/workers/microvm/guest
out=build/vm/initramfs.cpio.gz
busybox=$(command -v busybox)
want=$(cat "$dir"/*.c "$dir"/*.h scripts/build-vminit.sh build/rollbox-init "$busybox" build/vm/modules/*.ko | sha256sum | cut -d' ' -f1)
if [ -f "$out" ] && [ "$(cat "$out.sha256" 2>/dev/null)" = "$want" ]; then exit 0; fi
echo "rollbox: building $out" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/root/lib/modules" "$tmp/root/rollbox" "$tmp/root/proc" "$tmp/root/sys" "$tmp/root/dev" "$tmp/root/newroot"
musl-gcc -static -Os -Wall -Wextra -Werror -o "$tmp/root/init" "$dir"/*.c
strip "$tmp/root/init"
cp build/vm/modules/*.ko "$tmp/root/lib/modules/"
cp build/rollbox-init "$tmp/root/rollbox/init"
cp "$busybox" "$tmp/root/rollbox/busybox"
(cd "$tmp/root" && find . | sort | busybox cpio -o -H newc 2>/dev/null) | gzip -1 > "$out.tmp"
mv "$out.tmp" "$out"
echo "$want" > "$out.sha256"
