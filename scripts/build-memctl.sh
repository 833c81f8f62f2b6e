#!/bin/sh
# rollbox-memctl: prefetches a swapped sandbox's memory before it thaws (src/swap). Called by scripts/bootstrap.sh.
exec sh "$(dirname "$0")/build-static.sh" rollbox-memctl src/swap
