#!/bin/sh
# rollbox-init, every sandbox's PID 1 (src/workers/init). Called by scripts/bootstrap.sh.
exec sh "$(dirname "$0")/build-static.sh" rollbox-init src/workers/init -Os
