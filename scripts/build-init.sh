#!/bin/sh
# Builds rollbox-init, every sandbox's PID 1, from src/workers/init/*.c into
# build/rollbox-init: static (musl), so it runs in any base image. Rebuilt only when the
# source or this script changed. Called by scripts/bootstrap.sh.
set -e
cd "$(dirname "$0")/.."
dir=src/workers/init
out=build/rollbox-init
want=$(cat "$dir"/*.c "$dir"/*.h scripts/build-init.sh | sha256sum | cut -d' ' -f1)
if [ -x "$out" ] && [ "$(cat "$out.sha256" 2>/dev/null)" = "$want" ]; then exit 0; fi
command -v musl-gcc >/dev/null || { echo "rollbox: musl-gcc is missing (Debian package musl-tools)" >&2; exit 1; }
mkdir -p build
echo "rollbox: building $out" >&2
musl-gcc -static -Os -Wall -Wextra -Werror -o "$out.tmp" "$dir"/*.c
strip "$out.tmp"
mv "$out.tmp" "$out"
echo "$want" > "$out.sha256"
