#!/usr/bin/env bash
# Runs the docker-compose 3-node cluster.
#
#   deploy/cluster.sh up     build the image (brainnode compiled inside it), start
#   deploy/cluster.sh down   stop and delete the containers and volumes
#   deploy/cluster.sh test   up, then write through every node, kill -9 a
#                            container mid-load, restart it, check nothing
#                            acknowledged was lost and a watch saw every
#                            write once; then down
#
# Environment: COMPOSE_PROJECT_NAME (default "brain"); GO_IMAGE, the Go
# image the build compiles in (default: golang:1.26 if docker has it, else
# one deploy/go-image.sh makes from the local Go installation, since this
# script must work where no image can be pulled).
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
	if [ -z "${GO_IMAGE:-}" ]; then
		if docker image inspect golang:1.26 >/dev/null 2>&1; then
			GO_IMAGE=golang:1.26
		else
			GO_IMAGE="$(deploy/go-image.sh)"
		fi
	fi
	export GO_IMAGE
	export GOPROXY="${GOPROXY:-$(go env GOPROXY)}"
	echo "==> building the image (compiling brainnode in $GO_IMAGE) and starting the cluster"
	compose build
	compose up -d
}

case "${1:-}" in
up)
	build
	echo "==> cluster up: etcdctl --endpoints 127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793 endpoint status -w table"
	;;
down)
	compose down -v
	;;
test)
	compose down -v >/dev/null 2>&1 || true
	trap 'echo "==> logs"; compose logs --tail=30 || true; compose down -v --rmi local >/dev/null 2>&1 || true; docker image prune -f --filter label=brain.build-stage=true >/dev/null 2>&1 || true' EXIT
	build
	echo "==> running the failover scenario"
	victim="$(compose ps -q brain1)"
	go run ./deploy/composetest \
		--endpoints 127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793 \
		--kill "$victim"
	trap - EXIT
	compose down -v --rmi local
	docker image prune -f --filter label=brain.build-stage=true >/dev/null
	echo "==> compose test passed"
	;;
*)
	echo "usage: $0 up|down|test" >&2
	exit 2
	;;
esac
