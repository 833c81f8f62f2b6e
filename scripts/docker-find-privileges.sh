#!/bin/sh
# Finds by trying what a worker host needs in a Docker container: starts Redis and a gateway
# from wrangler-free-docker/compose.yaml, then one worker container per trial with one
# capability (or device, mount, security option) taken away from the compose file's set,
# and reports what each trial broke: the worker's start checks, its network self-test, a
# create, an exec, a pause/resume, an allowlist create. Needs a running Docker engine and the images of
# `npm run test:docker` (rollbox:docker-test, rollbox-redis-test:7).
# Usage: docker-find-privileges.sh [TRIAL...]   (default: every trial below)
set -eu
cd "$(dirname "$0")/.."
docker=/usr/bin/docker
image=${ROLLBOX_IMAGE:-rollbox:docker-test}
project=rbxprivs$$
port=${ROLLBOX_PORT:-18181}
export ROLLBOX_IMAGE="$image" REDIS_IMAGE=${REDIS_IMAGE:-rollbox-redis-test:7} ROLLBOX_PORT="$port"
dc() { docker-compose -p "$project" -f wrangler-free-docker/compose.yaml "$@"; }
# The capabilities tried: the compose file's, plus any named in EXTRA_CAPS (candidates).
CAPS="$(sed -n 's/^ *cap_add: \[\(.*\)\]/\1/p' wrangler-free-docker/compose.yaml | tr -d ',') ${EXTRA_CAPS:-}"
trap 'dc down -v >/dev/null 2>&1 || true' EXIT
dc up -d --no-build redis gateway >/dev/null 2>&1
url=http://127.0.0.1:$port
i=0; until curl -sf "$url/readyz" >/dev/null 2>&1 || [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/readyz")" = 503 ]; do i=$((i+1)); [ $i -lt 120 ] || { echo "gateway did not start" >&2; exit 1; }; sleep 1; done
token=$(dc exec -T gateway node bin/rollbox.js token issue --tenant privs --scopes admin --ttl 1h)
auth="Authorization: Bearer $token"
# The busybox base layer, from the host's static busybox.
root=$(mktemp -d); mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/proc" "$root/sys" "$root/dev"
cp /bin/busybox "$root/bin/"; for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$root/bin/$a"; done
tar -C "$root" -cf "$root.tar" . && rm -rf "$root"
curl -sf -H "$auth" -H 'content-type: application/x-tar' --data-binary "@$root.tar" "$url/v1/layers?name=busybox" >/dev/null; rm -f "$root.tar"
net=${project}_default

# One worker with the compose file's privileges less $1 (cap:NAME, dev:PATH, cgroup, seccomp, rule).
trial() {
  without=$1; caps=""; devs="--device /dev/loop-control"; rule="--device-cgroup-rule=b 7:* rmw"; cg="-v /sys/fs/cgroup:/sys/fs/cgroup"; sec="--security-opt seccomp=unconfined"
  for c in $CAPS; do [ "cap:$c" = "$without" ] || caps="$caps --cap-add $c"; done
  case $without in dev:/dev/loop-control) devs="";; rule) rule="--device-cgroup-rule=c 1:3 rmw";; cgroup) cg="";; seccomp) sec="";; esac
  node=trial-$(echo "$without" | tr -c 'a-zA-Z0-9\n' '-' | tr 'A-Z' 'a-z')
  # shellcheck disable=SC2086
  cid=$($docker run -d --network "$net" --cap-drop ALL $caps $devs "$rule" $cg $sec -v "${project}_layers:/layers" -v /var/lib/rollbox \
    -e REDIS_URL=redis://redis:6379 -e ROLLBOX_LAYER_STORE=/layers -e ROLLBOX_NODE_ID="$node" -e ROLLBOX_START_CHECKS=warn "$image" worker --destroy-on-exit)
  verdict=""; i=0
  while [ $i -lt 40 ]; do
    if [ "$($docker inspect -f '{{.State.Running}}' "$cid")" != true ]; then verdict="worker exited: $($docker logs "$cid" 2>&1 | grep -v '"level":30' | tail -n 2 | cut -c1-400 | tr '\n' ' ')"; break; fi
    nodes=$(curl -s -H "$auth" "$url/v1/nodes")
    if echo "$nodes" | grep -q "\"nodeId\":\"$node\"[^}]*\"healthy\":true" || echo "$nodes" | grep -q "\"healthy\":true[^}]*\"nodeId\":\"$node\""; then break; fi
    i=$((i+1)); sleep 1
  done
  if [ -z "$verdict" ]; then
    checks=$($docker logs "$cid" 2>&1 | grep -o 'worker host start check: [^"]*' | tr '\n' ';')
    selftest=$($docker logs "$cid" 2>&1 | grep -o '"msg":"network self-test [a-z]*' | head -1 | sed 's/"msg":"network self-test //')
    created=$(curl -s -H "$auth" -H 'content-type: application/json' -d '{"resources":{"memoryMiB":64}}' "$url/v1/sandboxes")
    id=$(echo "$created" | sed -n 's/.*"id":"\(sbx_[a-z0-9]*\)".*/\1/p')
    if [ -z "$id" ]; then verdict="create failed: $(echo "$created" | head -c 300)"
    else
      out=$(curl -s -H "$auth" -H 'content-type: application/json' -d '{"cmd":"echo ok-$((6*7))","timeoutMs":20000}' "$url/v1/sandboxes/$id/exec")
      echo "$out" | grep -q 'ok-42' && ex=ok || ex="exec failed: $(echo "$out" | head -c 200)"
      p=$(curl -s -o /dev/null -w '%{http_code}' -H "$auth" -H 'content-type: application/json' -d '{"mode":"freeze"}' "$url/v1/sandboxes/$id/pause")
      r=$(curl -s -o /dev/null -w '%{http_code}' -H "$auth" -H 'content-type: application/json' -d '{}' "$url/v1/sandboxes/$id/resume")
      curl -s -o /dev/null -H "$auth" -X DELETE "$url/v1/sandboxes/$id"
      # An allowlist sandbox (its veth, rules, resolver); TEST-NET-1, and no traffic is sent.
      allowed=$(curl -s -H "$auth" -H 'content-type: application/json' -d '{"resources":{"memoryMiB":64},"network":{"mode":"allowlist","allow":[{"cidr":"192.0.2.1/32","ports":[80]}]}}' "$url/v1/sandboxes")
      aid=$(echo "$allowed" | sed -n 's/.*"id":"\(sbx_[a-z0-9]*\)".*/\1/p')
      if [ -n "$aid" ]; then al=ok; curl -s -o /dev/null -H "$auth" -X DELETE "$url/v1/sandboxes/$aid"; else al="failed: $(echo "$allowed" | head -c 300)"; fi
      verdict="create ok; exec $ex; pause $p resume $r; network self-test ${selftest:-none}; allowlist create $al${checks:+; start checks: $checks}"
    fi
  fi
  $docker stop -t 60 "$cid" >/dev/null; $docker rm -v "$cid" >/dev/null
  echo "without $without: $verdict"
}

trials=${*:-"none $(for c in $CAPS; do printf 'cap:%s ' "$c"; done) dev:/dev/loop-control rule cgroup seccomp"}
for t in $trials; do trial "$t"; done
