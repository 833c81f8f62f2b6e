#!/bin/sh
# Installs what rollbox needs on a fresh Debian machine (run as root), and is quick
# when everything is already present. Called by `npm start`, `npm test` and the benches.
set -e
cd "$(dirname "$0")/.."

# iptables: rollbox's accept rules where a host's iptables (Docker's, say) filters sandbox
# traffic; python3-minimal: the tests build a Python layer from it for POST /run_code;
# python3-pytest, python3-httpx, python3-venv, python3-wheel: the Python client's tests (clients/python);
# chromium: the batch page's test drives it headless; attr (setfattr) and zstd: image import
# (xattrs and opaque directories of image layers; zstd-compressed layers); docker-registry,
# skopeo and openssl: the image pull tests run a real registry on loopback, push images into
# it and make the token auth's certificate. xfsprogs: each worker host's scratch filesystem
# is XFS, whose reflinks let a fork clone a sandbox's disk without copying its data.
# debootstrap: the E2B `base` template is built from Debian packages (src/images/base-template.ts).
missing=""
for pkg in runc erofs-utils redis-server busybox-static nftables iptables iproute2 e2fsprogs xfsprogs attr zstd musl-tools gcc debootstrap python3-minimal python3-pytest python3-httpx python3-venv python3-wheel chromium docker-registry skopeo openssl; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $pkg"
done

if [ -n "$missing" ]; then
  echo "rollbox: installing apt packages:$missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  # A policy-rc.d that says no keeps Debian from starting the services it installs
  # (redis-server, docker-registry): rollbox and its tests start their own, on ports they pick.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get install -y -qq --no-install-recommends $missing >&2
fi

# A system registry left running by an earlier install (it listens on :5000): stopped.
if [ -x /etc/init.d/docker-registry ] && /etc/init.d/docker-registry status >/dev/null 2>&1; then
  /etc/init.d/docker-registry stop >&2 || true
fi

# Installed dependencies are stamped with the lockfile's hash: a content check, because
# mtimes lie in fresh checkouts and worktrees (and a needless `npm ci` wipes node_modules).
lock_hash=$(sha256sum package-lock.json | cut -d' ' -f1)
stamp=node_modules/.rollbox-lock-sha256
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_hash" ]; then
  echo "rollbox: installing npm dependencies" >&2
  npm ci --no-audit --no-fund >&2
  echo "$lock_hash" > "$stamp"
fi

# The sandboxes' PID 1 (src/workers/init/rollbox-init.c).
sh scripts/build-init.sh
# The lazy layers' gate and the split layers' mount helper (src/layers/gate/rollbox-gate.c).
sh scripts/build-gate.sh
# The swap pause's prefetch helper (src/swap/rollbox-memctl.c).
sh scripts/build-memctl.sh
# The port relay's helper into sandboxes' network namespaces (src/ports/rollbox-portfwd.c).
sh scripts/build-portfwd.sh
# The microVM tier: QEMU, the guest kernel (unpacked from Debian's cloud kernel package, not
# installed) and the guest initramfs (docs/microvm.md).
sh scripts/install-microvm.sh
