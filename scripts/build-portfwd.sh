#!/bin/sh
# rollbox-portfwd: connects the worker's port relay to ports inside sandboxes' network namespaces (src/ports). Called by scripts/bootstrap.sh.
exec sh "$(dirname "$0")/build-static.sh" rollbox-portfwd src/ports
