#!/bin/sh
# Debian's Docker engine and compose v1, plus debootstrap for a locally built base image:
# what `npm run test:docker` needs (no image registry is reachable from this project's hosts).
set -eu
missing=""
command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
command -v docker-compose >/dev/null 2>&1 || missing="$missing docker-compose"
command -v debootstrap >/dev/null 2>&1 || missing="$missing debootstrap"
if [ -n "$missing" ]; then
  echo "rollbox: installing$missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
