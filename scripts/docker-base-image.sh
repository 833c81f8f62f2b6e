#!/bin/sh
# Builds a local stand-in for node:20-bookworm-slim from Debian's own packages, for hosts
# that reach no image registry: debootstrap (minbase) of bookworm from the host's own apt
# mirror, plus the files of the host's installed `nodejs` package (Node 20: Debian's own
# bookworm package is Node 18, so Node comes from whatever package the host installed),
# imported with `docker import`. Usage: docker-base-image.sh [TAG] (default rollbox-base:bookworm).
# Build rollbox on it with `--build-arg BASE_IMAGE=TAG`.
set -eu
tag=${1:-rollbox-base:bookworm}
docker=${DOCKER:-docker}
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" = 20 ] || { echo "rollbox: the host's node is $(node -v), not Node 20" >&2; exit 1; }
dpkg-query -W nodejs >/dev/null 2>&1 || { echo "rollbox: node is not installed from a package (nodejs) here" >&2; exit 1; }
# The first Debian (not security) URI of the host's apt sources.
mirror=$(grep -h -E '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
  | sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//; s/[[:space:]].*//' | grep -v security | head -n1)
[ -n "$mirror" ] || { echo "rollbox: no Debian mirror in the host's apt sources" >&2; exit 1; }
work=$(mktemp -d /var/tmp/rollbox-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "rollbox: debootstrap bookworm (minbase) from $mirror" >&2
debootstrap --variant=minbase --include=ca-certificates,libstdc++6 bookworm "$work/rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 \
  || { tail -n 20 "$work/debootstrap.log" >&2; exit 1; }
echo "rollbox: adding the host's nodejs package ($(dpkg-query -W -f='${Version}' nodejs))" >&2
# The package's files, and npm as it is now (npm may have updated itself since the install).
npm_dir=$(dirname "$(readlink -f "$(command -v npm)")")/..
{ dpkg -L nodejs | grep -v '^/usr/lib/node_modules/npm/' | while read -r f; do [ -d "$f" ] || echo "$f"; done; } \
  | tar -c --no-recursion -T - 2>/dev/null | tar -x -C "$work/rootfs"
rm -rf "$work/rootfs/usr/lib/node_modules/npm"
mkdir -p "$work/rootfs/usr/lib/node_modules"
cp -a "$(readlink -f "$npm_dir")" "$work/rootfs/usr/lib/node_modules/npm"
chroot "$work/rootfs" sh -c 'node -e "process.exit(0)" && npm -v >/dev/null' || { echo "rollbox: node or npm does not run in the new base" >&2; exit 1; }
# The host's CA bundle, for Node (npm) in builds on this base: where TLS to the npm registry
# passes a re-signing proxy, its CA is in the host's bundle and not in Debian's.
cp /etc/ssl/certs/ca-certificates.crt "$work/rootfs/usr/local/share/rollbox-host-ca.crt"
# As in Debian's docker images: no apt caches, no recommends.
printf 'APT::Install-Recommends "false";\n' > "$work/rootfs/etc/apt/apt.conf.d/90rollbox-norecommends"
rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
echo "rollbox: docker import as $tag" >&2
tar -C "$work/rootfs" -c . | "$docker" import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change 'ENV NODE_EXTRA_CA_CERTS=/usr/local/share/rollbox-host-ca.crt' --change 'CMD ["node"]' - "$tag" >/dev/null
