#!/bin/sh
# Builds one of rollbox's static helpers from NAME's C sources (SRCDIR/*.c, with its *.h)
# into build/NAME: static (musl), so it runs on any host and in any base image. Rebuilt only
# when its sources or this script changed; written by rename, so a running copy is never
# half replaced. Usage: scripts/build-static.sh NAME SRCDIR [OPTIMIZE, default -O2]
set -e
cd "$(dirname "$0")/.."
name=$1
dir=$2
optimize=${3:--O2}
out=build/$name
want=$( (cat "$dir"/*.c; cat "$dir"/*.h 2>/dev/null || true; echo "$optimize"; cat scripts/build-static.sh) | sha256sum | cut -d' ' -f1)
if [ -x "$out" ] && [ "$(cat "$out.sha256" 2>/dev/null)" = "$want" ]; then exit 0; fi
command -v musl-gcc >/dev/null || { echo "rollbox: musl-gcc is missing (Debian package musl-tools)" >&2; exit 1; }
mkdir -p build
echo "rollbox: building $out" >&2
musl-gcc -static "$optimize" -Wall -Wextra -Werror -o "$out.tmp" "$dir"/*.c
strip "$out.tmp"
mv "$out.tmp" "$out"
echo "$want" > "$out.sha256.tmp"
mv "$out.sha256.tmp" "$out.sha256"
