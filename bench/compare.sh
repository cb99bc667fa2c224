#!/usr/bin/env bash
# compare.sh benchmarks brain against the reference etcd 3.6 side by side.
#
# It builds brainnode, etcdref (etcd 3.6 from go.etcd.io/etcd/server/v3/embed)
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
args=()
for a in "$@"; do
	if [[ $a == --keep ]]; then KEEP=1; else args+=("$a"); fi
done
parse_flags "${args[@]}"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/brain-compare.XXXXXX")
BIN=${BIN_DIR:-$WORK/bin}
declare -A PID=()
FAILED=0

say() { echo "== $*" >&2; }

# stop_server sends SIGTERM to a server and waits up to 30 s for it; a
# server that does not exit cleanly counts as a failure.
stop_server() {
	local name=$1 pid=${PID[$1]:-}
	[[ -n $pid ]] || return 0
	unset "PID[$name]"
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 300); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		say "$name (pid $pid) did not stop within 30s after SIGTERM; killing it"
		kill -KILL "$pid" 2>/dev/null || true
		FAILED=1
	fi
	local rc=0
	wait "$pid" 2>/dev/null || rc=$?
	if [[ $rc -ne 0 ]]; then
		say "$name exited with status $rc after SIGTERM (log: $WORK/$name.log)"
		FAILED=1
	fi
}

cleanup() {
	local name
	for name in "${!PID[@]}"; do
		stop_server "$name"
	done
	if [[ $KEEP == 1 ]]; then
		say "kept $WORK"
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_server NAME ENDPOINT CMD...: start a server in the background.
start_server() {
	local name=$1 endpoint=$2
	shift 2
	say "starting $name on $endpoint"
	"$@" >"$WORK/$name.log" 2>&1 &
	PID[$name]=$!
}

# wait_ready NAME ENDPOINTS: wait until the cluster serves through every
# endpoint.
wait_ready() {
	local name=$1 ep
	for ep in ${2//,/ }; do
		if ! "$BIN/brainbench" wait --endpoints "$ep" --timeout 60s; then
			say "$name did not become ready on $ep; last log lines:"
			tail -n 20 "$WORK/$name"*.log >&2
			exit 1
		fi
	done
}

# start_cluster KIND: start NODES members of brain or etcd; sets EPS to
# their client endpoints, comma separated.
start_cluster() {
	local kind=$1 i initial="" eps=()
	local -a ports
	mapfile -t ports < <("$BIN/brainbench" free-ports -n $((2 * NODES)))
	for ((i = 0; i < NODES; i++)); do
		initial+="${initial:+,}$kind$i=http://127.0.0.1:${ports[2 * i + 1]}"
		eps+=("127.0.0.1:${ports[2 * i]}")
	done
	for ((i = 0; i < NODES; i++)); do
		local ep=${eps[i]} peer=http://127.0.0.1:${ports[2 * i + 1]}
		local name=$kind$i
		[[ $NODES -eq 1 ]] && name=$kind
		if [[ $kind == brain ]]; then
			start_server "$name" "$ep" "$BIN/brainnode" --name "$kind$i" --data-dir "$WORK/$name.data" \
				--listen-client-urls "http://$ep" --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
				--initial-cluster "$initial" --quota-backend-bytes "$QUOTA" --log-level warn
		else
			start_server "$name" "$ep" "$BIN/etcdref" --name "$kind$i" --data-dir "$WORK/$name.data" \
				--listen-client-urls "http://$ep" --listen-peer-urls "$peer" \
				--initial-cluster "$initial" --quota-backend-bytes "$QUOTA"
		fi
	done
	EPS=$(IFS=,; echo "${eps[*]}")
	wait_ready "$kind" "$EPS"
}

# stop_cluster KIND: stop every member of the cluster.
stop_cluster() {
	local name
	for name in "${!PID[@]}"; do
		[[ $name == "$1"* ]] && stop_server "$name"
	done
	return 0
}

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
	go build -o "$BIN/etcdref" ./cmd/etcdref &&
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
echo "brain vs etcd 3.6 (thru ratio > 1: brain faster; p99 ratio < 1: brain lower latency)"
"$BIN/brainbench" compare --names brain,etcd "$WORK/brain.jsonl" "$WORK/etcd.jsonl" || FAILED=1

if [[ $FAILED -ne 0 ]]; then
	say "FAILED: see the messages above"
	exit 1
fi
