#!/usr/bin/env bash
# cpu.sh measures CPU per operation per node, brain beside etcd (etcdref:
# etcd 3.7 from go.etcd.io/etcd/server/v3/embed), at a fixed offered rate.
#
# Throughput on a small shared host moves by ±20% between runs; the CPU a
# store spends per acknowledged operation at a rate both systems sustain
# does not. For each cluster size, for ROUNDS rounds, alternating which
# system goes first, it starts a fresh cluster (one process per member on
# loopback), and runs each benchmark with brainbench --rate --cpu: an idle
# window first (each node's CPU without load), then DURATION of load at
# RATE operations per second spread over every node's endpoint, of which
# the last MEASURE is measured. Then it prints one table: medians over the
# rounds of acknowledged ops/s, CPU µs per op on the busiest node and in
# total, p99, and brain/etcd ratios, with the projected capacity with
# equal cores per node (etcd busiest ÷ brain busiest), and each node's
# share.
#
#   bench/cpu.sh                          # 1 and 3 nodes, 3 rounds
#   bench/cpu.sh --sizes "1 3 6" --rounds 5 --rate 600
#   bench/cpu.sh --sizes 3 --rounds 1 --modes create --profile DIR
#
# With --profile DIR, every node serves /debug/pprof and, during the
# measured window of each PROFILE_MODES benchmark, a CPU profile of each
# node is saved as DIR/<system>-<nodes>-r<round>-<mode>-n<i>.pprof, with
# brain's /brain/v1/status of each node beside it (which groups it leads:
# its role).
#
# Every parameter can be set as an environment variable or as a flag; run
# bench/cpu.sh --help for the list. The JSON results stay in the work dir
# with --keep.
set -euo pipefail

SIZES=${SIZES:-"1 3"}           # cluster sizes, each measured for both systems
ROUNDS=${ROUNDS:-3}             # alternating rounds per size
MODES=${MODES:-"create update put get list"}
RATE=${RATE:-500}               # create, update, put, get: operations/s offered
LIST_RATE=${LIST_RATE:-10}      # full lists/s offered
DURATION=${DURATION:-20s}       # load per benchmark
MEASURE=${MEASURE:-10s}         # the measured end of it
IDLE=${IDLE:-5s}                # idle window before each benchmark
CLIENTS=${CLIENTS:-64}
CONNS=${CONNS:-12}
VALUE_SIZE=${VALUE_SIZE:-1024}
KEYS=${KEYS:-5000}              # update, put, get, list key space
RESOURCES=${RESOURCES:-configmaps,events,leases,pods}
QUOTA=${QUOTA:-8589934592}
BIN_DIR=${BIN_DIR:-}
KEEP=${KEEP:-0}
PROFILE=${PROFILE:-}            # a directory: save CPU profiles of every node there
PROFILE_MODES=${PROFILE_MODES:-create}

FLAG_VARS="SIZES ROUNDS MODES RATE LIST_RATE DURATION MEASURE IDLE CLIENTS CONNS VALUE_SIZE KEYS RESOURCES QUOTA BIN_DIR KEEP PROFILE PROFILE_MODES"
# shellcheck source=bench/flags.sh
source "$(dirname "$0")/flags.sh"
parse_flags "$@"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/brain-cpu.XXXXXX")
BIN=${BIN_DIR:-$WORK/bin}
NODES=1
# shellcheck source=bench/cluster.sh
source "$(dirname "$0")/cluster.sh"

say "building into $BIN"
mkdir -p "$BIN" "$WORK/results" ${PROFILE:+"$PROFILE"}
(cd "$ROOT" && go build -o "$BIN/brainnode" ./cmd/brainnode &&
	(cd cmd/etcdref && GOWORK=off go build -o "$BIN/etcdref" .) &&
	go build -o "$BIN/brainbench" ./cmd/brainbench)

# seconds D: the whole seconds of a duration given as N, Ns or Nm.
seconds() {
	case $1 in
	*m) echo $((${1%m} * 60)) ;;
	*s) echo "${1%s}" ;;
	*) echo "$1" ;;
	esac
}

# profile_window NAME: once the benchmark started at the same moment
# reaches its measured window (after IDLE and DURATION-MEASURE), save a
# CPU profile of the window from every endpoint in EPS, and brain's status.
profile_window() {
	local name=$1 i=0 ep pids=()
	sleep $(($(seconds "$IDLE") + $(seconds "$DURATION") - $(seconds "$MEASURE")))
	for ep in ${EPS//,/ }; do
		curl -sf -m $(($(seconds "$MEASURE") + 20)) -o "$PROFILE/$name-n$i.pprof" \
			"http://$ep/debug/pprof/profile?seconds=$(seconds "$MEASURE")" &
		pids+=($!)
		if [[ $name == brain* ]]; then
			curl -sf -m 5 -o "$PROFILE/$name-n$i.status.json" "http://$ep/brain/v1/status" || true
		fi
		i=$((i + 1))
	done
	local rc=0 p
	for p in "${pids[@]}"; do wait "$p" || rc=1; done
	return $rc
}

ETCD_VERSION=
# measure KIND: one round of every benchmark on a fresh KIND cluster.
measure() {
	local kind=$1 mode rate
	start_cluster "$kind"
	if [[ $kind == etcd && -z $ETCD_VERSION ]]; then
		ETCD_VERSION=$(curl -s -m 5 "http://${EPS%%,*}/version" | sed -n 's/.*"etcdserver":"\([^"]*\)".*/\1/p')
	fi
	for mode in $MODES; do
		rate=$RATE
		[[ $mode == list ]] && rate=$LIST_RATE
		say "$kind, $NODES node(s): $mode at $rate/s for $DURATION (last $MEASURE measured, $IDLE idle first)"
		local extra=()
		[[ $mode == list ]] || extra=(--resources "$RESOURCES")
		[[ $mode == create ]] || extra+=(--keys "$KEYS")
		local profiler=
		if [[ -n $PROFILE && " $PROFILE_MODES " == *" $mode "* ]]; then
			profile_window "$kind-$NODES-r$round-$mode" &
			profiler=$!
		fi
		"$BIN/brainbench" "$mode" --endpoints "$EPS" --clients "$CLIENTS" --conns "$CONNS" \
			--value-size "$VALUE_SIZE" --total 0 --duration "$DURATION" --measure-last "$MEASURE" \
			--rate "$rate" --cpu --cpu-idle "$IDLE" --quiet "${extra[@]}" \
			--json-out "$WORK/results/$kind-$NODES.jsonl" >"$WORK/$kind-$NODES-$mode.txt" ||
			{ say "$kind $mode FAILED:"; cat "$WORK/$kind-$NODES-$mode.txt" >&2; FAILED=1; }
		[[ -z $profiler ]] || wait "$profiler" || { say "profiling $kind $mode FAILED"; FAILED=1; }
	done
	stop_cluster "$kind"
	rm -rf "$WORK"/"$kind"*.data
}

say "parameters: sizes $SIZES, $ROUNDS rounds, rate $RATE/s (list $LIST_RATE/s), $DURATION per benchmark (last $MEASURE measured), $(nproc) CPUs"
for NODES in $SIZES; do
	for ((round = 1; round <= ROUNDS; round++)); do
		if ((round % 2)); then order="brain etcd"; else order="etcd brain"; fi
		for kind in $order; do
			measure "$kind"
		done
	done
done

echo
"$BIN/brainbench" cpu-table --etcd-version "$ETCD_VERSION" "$WORK"/results/*.jsonl
if [[ $FAILED -ne 0 ]]; then
	say "FAILED: see the messages above"
	exit 1
fi
