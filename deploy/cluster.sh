#!/usr/bin/env bash
# Runs the docker-compose 3-node cluster.
#
#   deploy/cluster.sh up     build the static binary and the image, start
#   deploy/cluster.sh down   stop and delete the containers and volumes
#   deploy/cluster.sh test   up, then write through every node, kill -9 a
#                            container mid-load, restart it, check nothing
#                            acknowledged was lost and a watch saw every
#                            write once; then down
#
# Environment: COMPOSE_PROJECT_NAME (default "brain").
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-brain}"

if command -v docker-compose >/dev/null 2>&1; then
	compose() { docker-compose "$@"; }
else
	compose() { docker compose "$@"; }
fi

build() {
	if [ ! -s deploy/gossip.key ]; then
		echo "==> writing a gossip key to deploy/gossip.key"
		(umask 077 && head -c 32 /dev/urandom | base64 > deploy/gossip.key)
	fi
	echo "==> building a static brainnode"
	CGO_ENABLED=0 go build -trimpath -buildvcs=auto -o bin/brainnode ./cmd/brainnode
	echo "==> building the image and starting the cluster"
	compose up -d --build
}

case "${1:-}" in
up)
	build
	echo "==> cluster up: etcdctl --endpoints localhost:23791,localhost:23792,localhost:23793 endpoint status -w table"
	;;
down)
	compose down -v
	;;
test)
	compose down -v >/dev/null 2>&1 || true
	trap 'echo "==> logs"; compose logs --tail=30 || true; compose down -v >/dev/null 2>&1 || true' EXIT
	build
	echo "==> running the failover scenario"
	victim="$(compose ps -q brain1)"
	go run ./deploy/composetest \
		--endpoints localhost:23791,localhost:23792,localhost:23793 \
		--kill "$victim"
	trap - EXIT
	compose down -v
	echo "==> compose test passed"
	;;
*)
	echo "usage: $0 up|down|test" >&2
	exit 2
	;;
esac
