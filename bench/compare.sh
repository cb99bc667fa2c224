#!/usr/bin/env bash
# compare.sh benchmarks brain against the reference etcd (3.7) side by side.
#
# It builds brainnode, etcdref (etcd 3.7 from go.etcd.io/etcd/server/v3/embed)
# and brainbench; starts a brain cluster of NODES nodes on free loopback
# ports with fresh data directories, runs `brainbench all` and `brainbench
# watch` against it (clients spread over every node), stops it, does the
# same with an etcd cluster of NODES members, and prints a table of
# brain/etcd ratios. It exits non-zero if any benchmark failed (errors or a
# failed watch verification) or a server did not start or stop cleanly.
#
#   bench/compare.sh --nodes 3      # 3-node brain vs 3-member etcd
#
# Every parameter can be set as an environment variable or as a flag:
#
#   bench/compare.sh --total 100000 --rate 1000
#   TOTAL=100000 RATE=1000 bench/compare.sh
#
# Run bench/compare.sh --help for the list.
set -euo pipefail

CLIENTS=${CLIENTS:-64}            # concurrent workers
CONNS=${CONNS:-16}                # gRPC connections
VALUE_SIZE=${VALUE_SIZE:-1024}    # bytes per value
TOTAL=${TOTAL:-20000}             # operations of create, update and put
LIST_TOTAL=${LIST_TOTAL:-100}     # full lists in the list phase
KEYS=${KEYS:-10000}               # key space of update, put and list
PAGE_SIZE=${PAGE_SIZE:-500}       # keys per list page
WATCHERS=${WATCHERS:-100}         # watch streams
RATE=${RATE:-500}                 # writes/s during the watch benchmark
WATCH_DURATION=${WATCH_DURATION:-10s}
WATCH_KEYS=${WATCH_KEYS:-1000}    # keys the watch writes cycle over
SEED=${SEED:-1}
NODES=${NODES:-1}                 # nodes of each cluster
RESOURCES=${RESOURCES:-configmaps,events,leases,pods} # create/update/put spread over these (empty: one prefix)
QUOTA=${QUOTA:-8589934592}        # --quota-backend-bytes of both servers
BIN_DIR=${BIN_DIR:-}              # where to build; default: the temp dir
KEEP=${KEEP:-0}                   # 1: keep the temp dir (data, logs, JSON)

FLAG_VARS="CLIENTS CONNS VALUE_SIZE TOTAL LIST_TOTAL KEYS PAGE_SIZE WATCHERS RATE WATCH_DURATION WATCH_KEYS SEED NODES RESOURCES QUOTA BIN_DIR KEEP"
# shellcheck source=bench/flags.sh
source "$(dirname "$0")/flags.sh"
parse_flags "$@"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/brain-compare.XXXXXX")
BIN=${BIN_DIR:-$WORK/bin}

# shellcheck source=bench/cluster.sh
source "$(dirname "$0")/cluster.sh"

# run_benchmarks NAME ENDPOINT: run all and watch, appending JSON results
# to $WORK/NAME.jsonl; failures are recorded, not fatal.
run_benchmarks() {
	local name=$1 endpoint=$2
	local common=(--endpoints "$endpoint" --clients "$CLIENTS" --conns "$CONNS"
		--value-size "$VALUE_SIZE" --seed "$SEED" --json-out "$WORK/$name.jsonl")
	: >"$WORK/$name.jsonl"
	printf '\n### %s (%s)\n' "$name" "$endpoint"
	say "$name: create, update, put, list (total $TOTAL, list-total $LIST_TOTAL, keys $KEYS)"
	"$BIN/brainbench" all "${common[@]}" --total "$TOTAL" --list-total "$LIST_TOTAL" \
		--keys "$KEYS" --page-size "$PAGE_SIZE" --resources "$RESOURCES" || { say "$name: all FAILED"; FAILED=1; }
	say "$name: watch ($WATCHERS watchers, $RATE writes/s for $WATCH_DURATION)"
	"$BIN/brainbench" watch "${common[@]}" --watchers "$WATCHERS" --rate "$RATE" \
		--duration "$WATCH_DURATION" --keys "$WATCH_KEYS" || { say "$name: watch FAILED"; FAILED=1; }
	local member
	for member in "${!PID[@]}"; do
		[[ $member == "$name"* ]] || continue
		if ! kill -0 "${PID[$member]}" 2>/dev/null; then
			say "$member died during the benchmarks; last log lines:"
			tail -n 20 "$WORK/$member.log" >&2
			unset "PID[$member]"
			FAILED=1
		fi
	done
}

say "building into $BIN"
mkdir -p "$BIN"
(cd "$ROOT" && go build -o "$BIN/brainnode" ./cmd/brainnode &&
	(cd cmd/etcdref && GOWORK=off go build -o "$BIN/etcdref" .) &&
	go build -o "$BIN/brainbench" ./cmd/brainbench)

say "parameters: $NODES node(s) per cluster, clients $CLIENTS, conns $CONNS, value $VALUE_SIZE B, $(nproc) CPUs"
# One cluster at a time, so neither competes with the other's background
# work (heartbeats, compaction) for the CPUs.
start_cluster brain
run_benchmarks brain "$EPS"
say "brain data: $(du -sch "$WORK"/brain*.data | tail -1 | cut -f1)"
stop_cluster brain
start_cluster etcd
run_benchmarks etcd "$EPS"
say "etcd data: $(du -sch "$WORK"/etcd*.data | tail -1 | cut -f1)"
stop_cluster etcd

echo
echo "brain vs etcd 3.7 (thru ratio > 1: brain faster; p99 ratio < 1: brain lower latency)"
"$BIN/brainbench" compare --names brain,etcd "$WORK/brain.jsonl" "$WORK/etcd.jsonl" || FAILED=1

if [[ $FAILED -ne 0 ]]; then
	say "FAILED: see the messages above"
	exit 1
fi
