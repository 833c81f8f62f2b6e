#!/bin/sh
# The microVM tier's host parts (docs/microvm.md): QEMU from Debian, and a guest kernel
# taken from Debian's cloud kernel package, downloaded with `apt-get download` and
# unpacked with `dpkg -x` into build/vm/ (never installed as this host's kernel). The
# kernel has ext4 built in; virtio, erofs and overlay are modules, so the guest's
# initramfs (built by scripts/build-vminit.sh) carries them. Quick when all is present.
# Called by scripts/bootstrap.sh.
set -e
cd "$(dirname "$0")/.."
out=build/vm
if ! command -v qemu-system-x86_64 >/dev/null; then
  echo "rollbox: installing qemu-system-x86 (microVM tier)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends qemu-system-x86 >&2
fi
# Only the modules the guest loads (src/workers/microvm/guest/stage0.c names them, in load
# order); virtio_balloon: the guest reports its free pages to the host (docs/microvm.md).
modules="virtio_ring virtio virtio_mmio virtio_console virtio_blk virtio_balloon libcrc32c erofs overlay failover net_failover virtio_net"
have_modules=yes
for m in $modules; do [ -f "$out/modules/$m.ko" ] || have_modules=no; done
if [ ! -f "$out/vmlinuz" ] || [ "$have_modules" = no ]; then
  # The metapackage names the current versioned kernel package.
  pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n 1)
  if [ -z "$pkg" ]; then
    apt-get update -qq >&2
    pkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n 1)
  fi
  [ -n "$pkg" ] || { echo "rollbox: no Debian cloud kernel package found (linux-image-cloud-amd64)" >&2; exit 1; }
  echo "rollbox: fetching the guest kernel $pkg (unpacked into $out, not installed)" >&2
  tmp=$(mktemp -d) && chmod 755 "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download "$pkg" >&2)
  dpkg -x "$tmp"/"$pkg"_*.deb "$tmp/x"
  release=${pkg#linux-image-}
  mkdir -p "$out.tmp/modules"
  cp "$tmp/x/boot/vmlinuz-$release" "$out.tmp/vmlinuz"
  cp "$tmp/x/boot/config-$release" "$out.tmp/config"
  for m in $modules; do
    f=$(find "$tmp/x/lib/modules/$release" -name "$m.ko*" | head -n 1)
    [ -n "$f" ] || { echo "rollbox: module $m not in $pkg" >&2; exit 1; }
    cp "$f" "$out.tmp/modules/"
  done
  echo "$pkg" > "$out.tmp/kernel-package"
  rm -rf "$out"
  mv "$out.tmp" "$out"
fi
sh scripts/build-vminit.sh
