#!/bin/sh
# Builds rollbox-portfwd (connects the worker's port relay to ports inside sandboxes'
# network namespaces) from src/ports/*.c into build/rollbox-portfwd: static (musl), like
# the sandbox init. Rebuilt only when the source or this script changed. Called by
# scripts/bootstrap.sh.
set -e
cd "$(dirname "$0")/.."
dir=src/ports
out=build/rollbox-portfwd
want=$(cat "$dir"/*.c scripts/build-portfwd.sh | sha256sum | cut -d' ' -f1)
if [ -x "$out" ] && [ "$(cat "$out.sha256" 2>/dev/null)" = "$want" ]; then exit 0; fi
command -v musl-gcc >/dev/null || { echo "rollbox: musl-gcc is missing (Debian package musl-tools)" >&2; exit 1; }
mkdir -p build
echo "rollbox: building $out" >&2
musl-gcc -static -O2 -Wall -Wextra -Werror -o "$out.tmp" "$dir"/*.c
strip "$out.tmp"
mv "$out.tmp" "$out"
echo "$want" > "$out.sha256"
