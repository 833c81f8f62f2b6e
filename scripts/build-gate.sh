#!/bin/sh
# rollbox-gate: fills lazy layer blobs on first read, and mounts split layers (src/layers/gate). Called by scripts/bootstrap.sh.
exec sh "$(dirname "$0")/build-static.sh" rollbox-gate src/layers/gate
