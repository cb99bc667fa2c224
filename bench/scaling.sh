#!/usr/bin/env bash
# scaling.sh measures write throughput against cluster size: the same
# kube-shaped create load on brain clusters of 1, 3 and 6 nodes and on etcd
# 3.6 clusters of the same sizes, every node a container limited to the
# same CPU share (docker run --cpus), one cluster at a time.
#
# It builds static brainnode and etcdref binaries and images FROM scratch
# (nothing is pulled), runs brainbench on the host against the containers'
# addresses on a private bridge network (no port publishing, so no
# docker-proxy in the path), prints a table and writes results.tsv,
# rounds.tsv (every measurement of every --repeat round) and scaling.png
# (tools/benchplot) into OUT.
#
#   bench/scaling.sh                       # sizes 1 3 6, 0.25 CPU per node
#   bench/scaling.sh --sizes "3 6" --cpus 0.5 --total 40000
#
# Workloads: "spread" writes creates over RESOURCES (one partition each:
# brain's --initial-split-points are the resources' prefixes); "hot" (with
# --hot 1, the default) writes every create under /registry/pods/, the case
# only load-based splitting can spread: brain runs it with HOT_FLAGS
# (load-based splits, fast rebalancing) and HOT_WARMUP warm-up puts under
# the prefix, then waits HOT_SETTLE for replicas and leaders to move.
# Every brain measurement starts once no leadership has moved for SETTLE
# seconds (see --settle).
#
# Side by side (--side-by-side 3, the default): two independent 3-node
# clusters, each under half the clients and half the creates, at the same
# time. Their summed throughput is what twice the nodes would do with
# perfect scaling *on this host and at this client count*: six busy
# containers share the cores as in the 6-node run, and each node has as
# many writes in flight as a node of the 6-node cluster (with a fixed
# --clients, half as many as a node of one 3-node cluster; brain's cost
# per write grows as that falls, see bench/JOURNAL.md, "Writes in flight per
# node"). So "6 nodes / 2 x 3 side by side" is what one bigger cluster
# loses to cross-node work; it is not a measurement on machines of their
# own.
#
# Against another build (--against REV): brain built from git revision REV
# ("brainb") runs next to brain built from this tree: at each size one
# cluster of each build at the same time under the same load, each with
# its own brainbench, and their measured windows start together. The host's speed drifts by
# a third within minutes here, which no sequence of separate runs can
# tell from a change's effect; two clusters measured at once share the
# drift, so the summary's per-round ratio of REV to this tree is the
# change's effect (at twice the host load of one cluster alone).
#
#   bench/scaling.sh --sizes 3 --against HEAD~1 --spread 0 --repeat 3
#
# Sizes at the same time (--together 1): each round measures one cluster
# of every size at once, windows started together, so the ratio between
# sizes, the scaling figure, is taken under the same drift of the host's
# speed (and under the load of all the clusters: with 3 and 6 nodes, nine
# busy containers).
#
# Every parameter can be set as an environment variable or as a flag; run
# bench/scaling.sh --help for the list.
set -euo pipefail

SIZES=${SIZES:-1 3 6}             # cluster sizes
CPUS=${CPUS:-0.25}                # CPU share of every node (docker --cpus)
CPU_PERIOD=${CPU_PERIOD:-100000}  # CFS period in µs the share is enforced over (docker's default 100000; smaller: shorter throttling stalls)
MEMORY=${MEMORY:-2g}              # memory limit of every node
CLIENTS=${CLIENTS:-256}           # concurrent workers (64 leaves brain latency-bound)
# >0: each cluster gets this many concurrent workers per node instead of
# CLIENTS (the load grows with the cluster, as a bigger Kubernetes
# cluster's does; with a fixed CLIENTS a bigger cluster has fewer writes
# in flight per node, which costs brain more per write, see bench/JOURNAL.md)
CLIENTS_PER_NODE=${CLIENTS_PER_NODE:-0}
CONNS=${CONNS:-32}                # gRPC connections
VALUE_SIZE=${VALUE_SIZE:-1024}    # bytes per value
TOTAL=${TOTAL:-20000}             # creates per measurement
WARMUP=${WARMUP:-2000}            # puts before measuring
RESOURCES=${RESOURCES:-configmaps,deployments,endpoints,events,leases,namespaces,nodes,pods,replicasets,secrets,serviceaccounts,services}
HOT=${HOT:-1}                     # 1: also measure the one-prefix load
SPREAD=${SPREAD:-1}               # 0: skip the spread load (brain's one-prefix runs and etcd only)
SIDE_BY_SIDE=${SIDE_BY_SIDE:-3}   # sizes N also measured as two N-node clusters side by side ("" for none)
SYSTEMS=${SYSTEMS:-brain etcd}    # which systems to measure
OUT=${OUT:-}                      # result directory (default: a temp dir, kept)
SEED=${SEED:-1}
HASHED=${HASHED:-1}               # 1: brainbench --hashed-names (writes anywhere under a prefix, as generated names)
# Watches per resource open while brainbench writes (brainbench
# --resource-watchers), each on its resource's prefix, on one node, spread
# over the nodes: one per kube-apiserver, as each keeps a watch per
# resource. Both systems serve them. 0: none.
RESOURCE_WATCHERS=${RESOURCE_WATCHERS:-1}
# Where the resource watches start: brainbench puts watch i on endpoint
# i mod N, so with one watch (the one-prefix load watches one resource)
# it is on the first endpoint. 1: the measured run's endpoints are
# rotated so the first is a node without the cluster's central duty
# (brain: leading neither the TSO nor the meta group; etcd: not the
# leader), the same in every cluster. 0: n1, whatever it leads. A
# brain node's member ID hashes its peer address, so which node leads
# the TSO varies from cluster to cluster, and with watch-apart 0 it was
# the watch's node in 6 of 22 6-node clusters measured on 2026-12-05;
# that node was then saturated while the others used 50-60% of their
# share, which moved a paired comparison by several percent either way
# (bench/JOURNAL.md, "The balancer at rest, and the TSO beside the
# watch").
WATCH_APART=${WATCH_APART:-1}
# Extra brainnode flags. The default: with resource watches, a node merges
# only the partitions they cover on it, from 5 s after its start (it
# merges every partition until then); without, every node merges every
# partition all the time, as a node would with watches on every key.
BRAIN_FLAGS=${BRAIN_FLAGS:-}
HOT_FLAGS=${HOT_FLAGS:---split-write-rate 200 --split-window 3s --rebalance-interval 2s --leader-balance-interval 1s} # brain's extra flags for the hot run
HOT_WARMUP=${HOT_WARMUP:-30000}   # puts under the hot prefix before measuring (splits happen)
HOT_SETTLE=${HOT_SETTLE:-20}      # seconds to wait after the hot warm-up (replicas and leaders move)
# Creates under the hot prefix once the split partitions are at their
# placement, at the measurement's rate, so the splits that rate calls for
# and the leader balancer's moves for the load spread over them happen
# before the measurement, followed by another wait for placement (it
# keeps the leader moves through the quiet settle after:
# loadMemoryHalfLife in server/loadbalance.go).
HOT_BALANCE=${HOT_BALANCE:-20000}
# >0: measure the hot load in its steady state instead: once the warm-up's
# splits are placed, one create run lasts HOT_RAMP + HOT_MEASURE seconds
# without a pause, and only the creates that end in its last HOT_MEASURE
# seconds are measured (brainbench --measure-last; the nodes' counters
# are sampled over the same window). The ramp replaces the HOT_BALANCE
# creates and the waits after them: the load splits, replica moves and
# leader moves it calls for happen under the load, as under a real
# apiserver's, not across a quiet pause that resets the leader
# balancer's view. 0: the HOT_BALANCE phase, then TOTAL measured creates.
HOT_MEASURE=${HOT_MEASURE:-0}
HOT_RAMP=${HOT_RAMP:-45}
# Then, at most this many seconds more until every split partition's
# replicas are at its placement (brain_partitions_off_placement is 0 on
# every node), so the hot measurement is of the spread cluster, not of
# one still moving replicas (each move a snapshot of the partition).
# 0: don't wait.
HOT_PLACEMENT_MAX=${HOT_PLACEMENT_MAX:-240}
# Rounds: every measurement is made this many times, the sizes
# alternating within a round (3, 6, 3, 6, ...), so that a drift of the
# host's speed falls on both sides of a ratio. results.tsv and the plot
# hold each measurement's median; rounds.tsv holds every one, and the
# summary prints each round's ratios between sizes and their median.
REPEAT=${REPEAT:-1}
# Brain's leaders move after a cluster starts: elections place them
# anywhere, then every node's leader balancer (each 5 s) hands the groups
# it leads to their preferred nodes, ~10 transfers at 6 nodes, each
# pausing a partition's writes. After the warm-up, wait until no
# leadership has moved for SETTLE seconds (at most SETTLE_MAX; then
# measure anyway, with a warning), so that every measurement is of a
# settled cluster. 0: don't wait (measure straight after the warm-up).
SETTLE=${SETTLE:-12}
SETTLE_MAX=${SETTLE_MAX:-90}
PROFILE=${PROFILE:-0}             # >0: CPU-profile every brain node for this many seconds of each measurement (OUT/*.pprof)
# >0: after each measurement's warm-up, the cluster sits this many
# seconds without load and the CPU its nodes use meanwhile is reported:
# background work (raft ticks and heartbeats, gossip, placement, feeds,
# Pebble's compactions) takes that much of every node's share at that
# size.
IDLE=${IDLE:-0}
# GOMAXPROCS of every node, brain's and etcd's: "auto" is the whole CPUs of
# the share, at least 1; "go" is Go's default (which is at least 2 under a
# CPU quota; in a 0.15 CPU quota both systems used 18-31% less CPU per
# create with one thread than with two, see README's "Configuration").
GOMAXPROCS_NODES=${GOMAXPROCS_NODES:-auto}
NETWORK=${NETWORK:-bridge}        # bridge: nodes on a private bridge network; host: on the host's loopback (ports 40000 up), no bridge between nodes
TOGETHER=${TOGETHER:-0}           # 1: the sizes of a round are measured at the same time, one cluster of each (see above; SIDE_BY_SIDE is ignored; not with AGAINST)
AGAINST=${AGAINST:-}              # a git revision: measure brain built from it next to this tree's, at the same time (see above; SYSTEMS and SIDE_BY_SIDE are ignored)

FLAG_VARS="SIZES CPUS CPU_PERIOD MEMORY CLIENTS CLIENTS_PER_NODE CONNS VALUE_SIZE TOTAL WARMUP RESOURCES RESOURCE_WATCHERS WATCH_APART HOT SPREAD SIDE_BY_SIDE SYSTEMS OUT SEED HASHED BRAIN_FLAGS HOT_FLAGS HOT_WARMUP HOT_SETTLE HOT_BALANCE HOT_MEASURE HOT_RAMP HOT_PLACEMENT_MAX REPEAT SETTLE SETTLE_MAX PROFILE IDLE GOMAXPROCS_NODES NETWORK TOGETHER AGAINST"
# shellcheck source=bench/flags.sh
source "$(dirname "$0")/flags.sh"
parse_flags "$@"

if [[ -z $BRAIN_FLAGS ]]; then
	if [[ $RESOURCE_WATCHERS == 0 ]]; then
		BRAIN_FLAGS="--log-level warn --watch-feeds-idle-after -1s"
	else
		BRAIN_FLAGS="--log-level warn --watch-feeds-idle-after 5s"
	fi
fi
for v in TOGETHER CLIENTS CLIENTS_PER_NODE CONNS TOTAL WARMUP RESOURCE_WATCHERS WATCH_APART HOT_BALANCE HOT_MEASURE HOT_RAMP HOT_PLACEMENT_MAX REPEAT SETTLE SETTLE_MAX PROFILE IDLE; do
	if [[ ! ${!v} =~ ^[0-9]+$ ]]; then
		echo "scaling.sh: --$(tr 'A-Z_' 'a-z-' <<<"$v") must be a whole number, not ${!v}" >&2
		exit 2
	fi
done
if ((REPEAT < 1 || CLIENTS < 1 || CONNS < 1)); then
	echo "scaling.sh: --repeat, --clients and --conns must be at least 1" >&2
	exit 2
fi
if ((TOGETHER)) && [[ -n $AGAINST ]]; then
	# --against already measures its two builds at once, size by size.
	echo "scaling.sh: --together and --against do not combine: --against measures each size's two builds at the same time" >&2
	exit 2
fi

# The share as a quota per CFS period (docker --cpus is period 100000).
QUOTA=$(awk -v c="$CPUS" -v p="$CPU_PERIOD" 'BEGIN { printf "%d", c * p }')
case $GOMAXPROCS_NODES in
auto) GOMAXPROCS_NODES=$(awk -v c="$CPUS" 'BEGIN { n = int(c); printf "%d", n < 1 ? 1 : n }') ;;
go) GOMAXPROCS_NODES= ;;
*[!0-9]* | 0)
	echo "scaling.sh: --gomaxprocs-nodes must be auto, go or a positive number, not $GOMAXPROCS_NODES" >&2
	exit 2
	;;
esac
if ((QUOTA < 1000)); then
	echo "scaling.sh: --cpus $CPUS over a --cpu-period of $CPU_PERIOD µs is a quota of $QUOTA µs; the kernel's least is 1000 (raise --cpu-period)" >&2
	exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/brain-scaling.XXXXXX")}
mkdir -p "$OUT"
BIN=$OUT/bin
NET=brainscale$$
PREFIX=bscale$$
FAILED=0
ERRORS=() # measurements recorded with failed creates

say() { echo "== $(date +%H:%M:%S) $*" >&2; }

cleanup() {
	local ids
	ids=$(docker ps -aq --filter "name=^$PREFIX-" || true)
	[[ -z $ids ]] || docker rm -f $ids >/dev/null 2>&1 || true
	docker network rm "$NET" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "building static binaries and images into $BIN"
mkdir -p "$BIN/brain" "$BIN/etcd"
(cd "$ROOT" && CGO_ENABLED=0 go build -o "$BIN/brain/server" ./cmd/brainnode &&
	(cd cmd/etcdref && GOWORK=off CGO_ENABLED=0 go build -o "$BIN/etcd/server" .) &&
	go build -o "$BIN/brainbench" ./cmd/brainbench)
KINDS="brain etcd"
if [[ -n $AGAINST ]]; then
	# The other build, from a clean export of REV (its own go.mod and
	# go.sum; nothing of this tree's working copy).
	say "building brainnode at $AGAINST"
	mkdir -p "$OUT/against-src" "$BIN/brainb"
	git -C "$ROOT" archive "$AGAINST" | tar -x -C "$OUT/against-src"
	(cd "$OUT/against-src" && CGO_ENABLED=0 go build -o "$BIN/brainb/server" ./cmd/brainnode)
	KINDS+=" brainb"
	SYSTEMS=brain SIDE_BY_SIDE=""
fi
((TOGETHER == 0)) || SIDE_BY_SIDE=""
for kind in $KINDS; do
	printf 'FROM scratch\nCOPY server /server\nENTRYPOINT ["/server"]\n' >"$BIN/$kind/Dockerfile"
	docker build -q -t "brainscale-$kind:dev" "$BIN/$kind" >/dev/null
done
docker network create "$NET" >/dev/null

# host_busy: jiffies the whole machine spent busy and in total so far
# (/proc/stat), to tell whether a measurement saturated the host.
# Then the busy jiffies split: user (with nice), system, irq and softirq,
# steal (time the hypervisor gave to others), for host_report.
host_busy() { awk '/^cpu / { print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9, $2+$3, $4, $7+$8, $9; exit }' /proc/stat; }

# bench_cpu VAR: sets VAR to the CPU time in seconds this shell's
# waited-for children (brainbench, curl) used so far. It must run in this
# shell, not in $(...): a subshell starts with its children's count at
# zero.
bench_cpu() {
	times >"$OUT/.times.$BASHPID"
	printf -v "$1" '%s' "$(awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, t, "m"); s += t[1] * 60 + t[2] } ; print s }' "$OUT/.times.$BASHPID")"
}

# host_report BUSY_BEFORE BUSY_AFTER CPU_BEFORE CPU_AFTER BENCH_BEFORE
# BENCH_AFTER OPS: the whole machine's CPU per operation, split as
# /proc/stat splits it, next to what the nodes' cgroups were charged and
# what brainbench used. What is in neither is kernel work done outside
# the nodes' and brainbench's time (network processing run while a CPU
# was otherwise idle, docker, the kernel's threads): if co-location made
# the nodes pay for work that ran uncharged before, the nodes' share
# rises while the host's total per operation does not.
host_report() {
	local nodes
	nodes=$(($(nodes_cpu_ns "$3" "$4") / 1000))
	awk -v a="$1" -v b="$2" -v nodes="$nodes" -v b0="$5" -v b1="$6" -v ops="$7" -v hz="$(getconf CLK_TCK)" 'BEGIN {
		split(a, x, " "); split(b, y, " "); u = 1e6 / hz / ops
		printf "%.0f us of host CPU (user %.0f, system %.0f, irq %.0f, steal %.0f): nodes %.0f", (y[1] - x[1]) * u, (y[3] - x[3]) * u, (y[4] - x[4]) * u, (y[5] - x[5]) * u, (y[6] - x[6]) * u, nodes / ops
		if (b0 == "" || b1 == "") {
			printf ", the rest %.0f (brainbench not sampled)", (y[1] - x[1]) * u - (y[6] - x[6]) * u - nodes / ops
			exit
		}
		bench = (b1 - b0) * 1e6
		printf ", brainbench %.0f, neither %.0f", bench / ops, (y[1] - x[1]) * u - (y[6] - x[6]) * u - nodes / ops - bench / ops }'
}

# node_cpu KIND N: for every node of the cluster, "name usage_ns
# throttled_periods periods" from its cgroup (v1 cpu,cpuacct or v2), to
# tell how busy each node was and whether its share throttled it.
node_cpu() {
	local kind=$1 n=$2 i pid path
	for ((i = 1; i <= n; i++)); do
		pid=$(docker inspect -f '{{.State.Pid}}' "$PREFIX-$kind$i" 2>/dev/null) || continue
		path=$(awk -F: '$2 ~ /(^|,)cpuacct(,|$)/ { print $3 } $2 == "" { v2 = $3 } END { if (v2 != "" && NR == 1) print v2 }' "/proc/$pid/cgroup")
		if [[ -f /sys/fs/cgroup/cpuacct$path/cpuacct.usage ]]; then
			echo "n$i $(cat "/sys/fs/cgroup/cpuacct$path/cpuacct.usage") $(awk '/nr_throttled/ { t = $2 } /nr_periods/ { p = $2 } END { print t + 0, p + 0 }' "/sys/fs/cgroup/cpu$path/cpu.stat")"
		elif [[ -f /sys/fs/cgroup$path/cpu.stat ]]; then
			awk -v n="n$i" '/usage_usec/ { u = $2 * 1000 } /nr_throttled/ { t = $2 } /nr_periods/ { p = $2 } END { print n, u + 0, t + 0, p + 0 }' "/sys/fs/cgroup$path/cpu.stat"
		fi
	done
}

# cpu_report BEFORE AFTER T0 T1 [DECIMALS]: per node, the CPU it used
# between times T0 and T1 (date +%s.%N) as a share of one CPU (DECIMALS
# places, default 2; with DECIMALS the nodes' total follows) and the
# fraction of CFS periods it was throttled in.
cpu_report() {
	join <(echo "$1") <(echo "$2") | awk -v s="$(awk -v a="$3" -v b="$4" 'BEGIN { print b - a }')" -v d="${5:-2}" -v total="${5:+1}" '
		{ c = ($5 - $2) / 1e9 / s; sum += c
		  printf "%s %." d "f CPU (throttled %.0f%%)  ", $1, c, (($7 - $4) > 0 ? 100 * ($6 - $3) / ($7 - $4) : 0) }
		END { if (total) printf "total %." d "f CPU", sum }'
}

# nodes_cpu_ns BEFORE AFTER: the CPU time in ns all nodes used between two
# node_cpu readings, as a whole number (mawk prints a plain "print" of
# one above 2^31 as 1.2e+10, which shell arithmetic refuses).
nodes_cpu_ns() { join <(echo "$1") <(echo "$2") | awk '{ s += $5 - $2 } END { printf "%.0f\n", s }'; }

# node_io KIND N: "reads writes faults", the read and write system calls
# (/proc/PID/io: sockets, files) and the minor page faults (/proc/PID/stat)
# the cluster's node processes had so far. A page fault is a first touch
# of memory the process had not used (a growing heap, a new memtable): a
# few microseconds of CPU each, paid while a node's memory still grows.
node_io() {
	local kind=$1 n=$2 i pid
	for ((i = 1; i <= n; i++)); do
		pid=$(docker inspect -f '{{.State.Pid}}' "$PREFIX-$kind$i" 2>/dev/null) || continue
		cat "/proc/$pid/io" 2>/dev/null || true
		# The command name in parentheses may hold spaces: fields after it.
		sed -n 's/^.*) /minflt /p' "/proc/$pid/stat" 2>/dev/null | awk '{ print $1, $9 }' || true
	done | awk '/^syscr/ { r += $2 } /^syscw/ { w += $2 } /^minflt/ { f += $2 } END { print r + 0, w + 0, f + 0 }'
}

# per_create CPU_BEFORE CPU_AFTER IO_BEFORE IO_AFTER OPS: the cluster's
# CPU time and system calls per operation. Steadier from run to run than
# the throughput on a small host, so the first place to look when a
# change's effect on the throughput is lost in the noise.
per_create() {
	local cpu
	cpu=$(nodes_cpu_ns "$1" "$2")
	awk -v cpu="$cpu" -v a="$3" -v b="$4" -v ops="$5" 'BEGIN {
		split(a, x, " "); split(b, y, " ")
		printf "%.0f us of node CPU, %.1f read and %.1f write system calls, %.1f page faults", cpu / 1000 / ops, (y[1] - x[1]) / ops, (y[2] - x[2]) / ops, (y[3] - x[3]) / ops }'
}

# brain_work FILE: the brain cluster's counters of internal work (from
# every node's /metrics on EPS, which are kept in FILE), summed: raft
# message batches and messages received, raft rounds, log syncs, writes
# forwarded to a leader, TSO requests from other nodes, feed messages
# streamed to other nodes; and as counts: the fates of writes at deposed
# leaders, sent calls lost to broken connections, leaderships gained and
# leader transfers (MsgTimeoutNow received), partition splits, the
# storage engines' memtable flushes and compactions (and of those, the moves
# and delete-only ones, which rewrite no data); and as bytes: flushed,
# compacted (written by compactions) and ingested (replica snapshots), and
# of the flushed and compacted bytes those written to blob files
# (separated values).
brain_work() {
	node_metrics "$EPS" >"$1"
	awk '
		/^brain_raft_batches_received_total / { v[1] += $NF }
		/^brain_raft_messages_received_total[{ ]/ { v[2] += $NF }
		/^brain_raft_round_groups_count / { v[3] += $NF }
		/^brain_raft_log_sync_seconds_count / { v[4] += $NF }
		/^brain_internal_calls_total\{op="(txn|put|delete_range)"\}/ { v[5] += $NF }
		/^brain_internal_calls_total\{op="tso_next"\}/ { v[6] += $NF }
		/^brain_feed_messages_sent_total[{ ]/ { v[7] += $NF }
		/^brain_raft_deposed_proposals_total\{fate="applied"\}/ { v[8] += $NF }
		/^brain_raft_deposed_proposals_total\{fate="dropped"\}/ { v[9] += $NF }
		/^brain_raft_deposed_proposals_total\{fate="unknown"\}/ { v[10] += $NF }
		/^brain_internal_calls_broken_total\{sent="true"\}/ { v[11] += $NF }
		/^brain_raft_leadership_changes_total\{change="gained"\}/ { v[12] += $NF }
		/^brain_raft_messages_received_total\{type="MsgTimeoutNow"\}/ { v[13] += $NF }
		/^brain_partition_splits_total\{/ { v[14] += $NF }
		/^brain_pebble_flushes_total / { v[15] += $NF }
		/^brain_pebble_compactions_total[{ ]/ { v[16] += $NF }
		/^brain_pebble_compactions_total\{kind="(move|delete_only)"\}/ { v[17] += $NF }
		/^brain_pebble_flushed_bytes_total / { v[18] += $NF }
		/^brain_pebble_compacted_bytes_total / { v[19] += $NF }
		/^brain_pebble_ingested_bytes_total / { v[20] += $NF }
		/^brain_pebble_blob_flushed_bytes_total / { v[21] += $NF }
		/^brain_pebble_blob_compacted_bytes_total / { v[22] += $NF }
		END { for (i = 1; i <= 22; i++) printf "%.0f%s", v[i], (i < 22 ? " " : "\n") }' "$1"
}

# raft_waits BEFORE AFTER: where the raft batches between nodes waited
# from one metrics snapshot (node_metrics) to the other, over all nodes:
# p50 / p99 of brain_raft_send_queue_seconds (queued to taken by the
# sender), _batch_transit_seconds (queued to read by the receiver) and
# _inbox_wait_seconds (delivered to stepped), as their buckets' upper
# bounds, and the node whose batches arrived latest (highest transit p50).
raft_waits() {
	awk '
		FNR == 1 { f++ }
		/^# node / { node = $3; next }
		/^brain_raft_(send_queue|batch_transit|inbox_wait)_seconds_bucket\{/ {
			m = $1; sub(/^brain_raft_/, "", m); sub(/_seconds_bucket.*/, "", m)
			le = $1; sub(/.*le="/, "", le); sub(/".*/, "", le)
			v = (f == 1 ? -$NF : $NF)
			all[m, le] += v
			if (!(le in seen)) { seen[le] = 1; les[++nle] = le }
			if (m == "batch_transit") { per[node, le] += v; if (!(node in isnode)) { isnode[node] = 1; nodes[++nn] = node } }
		}
		function num(le) { return le == "+Inf" ? 1e300 : le + 0 }
		function dur(le) {
			if (le == "+Inf") return "more"
			le += 0
			return le < 1 ? sprintf("%.3g ms", le * 1000) : sprintf("%.3g s", le)
		}
		# quantile of the cumulative buckets arr[key, le]; "-" if empty
		function qt(arr, key, frac,    i, tot) {
			tot = arr[key, "+Inf"]
			if (tot <= 0) return ""
			for (i = 1; i <= nle; i++) if (arr[key, les[i]] >= frac * tot) return les[i]
			return "+Inf"
		}
		function pair(arr, key,    a) {
			a = qt(arr, key, 0.5)
			return a == "" ? "no samples" : dur(a) " / " dur(qt(arr, key, 0.99))
		}
		END {
			for (i = 2; i <= nle; i++) for (j = i; j > 1 && num(les[j]) < num(les[j - 1]); j--) { t = les[j]; les[j] = les[j - 1]; les[j - 1] = t }
			worst = ""; wq = -1
			for (i = 1; i <= nn; i++) { x = qt(per, nodes[i], 0.5); if (x != "" && num(x) > wq) { wq = num(x); worst = nodes[i]; wle = x } }
			printf "p50 / p99 send queue %s, transit %s, inbox %s", pair(all, "send_queue"), pair(all, "batch_transit"), pair(all, "inbox_wait")
			if (worst != "") printf "; latest arrivals at %s (transit p50 %s)", worst, dur(wle)
			print ""
		}' "$1" "$2"
}

# stepdowns KIND N: how often the leaders on KIND's N nodes (this
# cluster's PREFIX) stepped down for want of a quorum since the nodes
# started (raft's CheckQuorum warning in their logs).
stepdowns() {
	local i c total=0
	for ((i = 1; i <= $2; i++)); do
		c=$(docker logs "$PREFIX-$1$i" 2>&1 | grep -c "since quorum is not active" || true)
		total=$((total + ${c:-0}))
	done
	echo "$total"
}

# node_metrics ENDPOINTS [PATH]: the /metrics (or PATH) of every node at
# ENDPOINTS (comma separated), each after a "# node ENDPOINT" line; a node
# that does not answer within 5 s adds nothing.
node_metrics() {
	local ep
	for ep in ${1//,/ }; do
		echo "# node $ep"
		curl -s --max-time 5 "http://$ep${2:-/metrics}" || true
	done
}

# duty_nodes KIND ENDPOINTS: the 1-based positions, in ENDPOINTS (comma
# separated), of the nodes with the cluster's central duty, one per line:
# brain's leaders of the TSO (group 1) and the meta group (group 2), or
# etcd's leader.
duty_nodes() {
	local pat='^brain_raft_is_leader\{group="[12]"\} 1$'
	[[ $1 == etcd* ]] && pat='^etcd_server_is_leader 1$'
	node_metrics "$2" | awk -v pat="$pat" '/^# node / { i++ } $0 ~ pat { print i }' | sort -un
}

# watch_endpoints KIND ENDPOINTS: ENDPOINTS rotated so that the first (where
# brainbench's first resource watch goes) is a node without the cluster's
# central duty (see WATCH_APART); as given when every node has one, or
# under --watch-apart 0.
watch_endpoints() {
	local eps duty i
	IFS=, read -r -a eps <<<"$2"
	if ((WATCH_APART == 0 || RESOURCE_WATCHERS == 0)); then
		echo "$2"
		return
	fi
	duty=" $(duty_nodes "$1" "$2" | tr '\n' ' ') "
	for ((i = 0; i < ${#eps[@]}; i++)); do
		if [[ $duty != *" $((i + 1)) "* ]]; then
			(IFS=,; echo "${eps[*]:i},${eps[*]:0:i}" | sed 's/,$//')
			return
		fi
	done
	echo "$2"
}

# duties_report BEFORE AFTER: who had the central duties as a window
# ended and who served the resource watches during it, from the node
# metrics sampled as it began and ended (nodes n1.. in EPS order): brain's
# TSO and meta leaders, and the nodes whose watch responses grew.
duties_report() {
	awk '
		FNR == 1 { f++; n = 0 }
		/^# node / { n++ }
		f == 1 && /^brain_watch_responses_total / { before[n] = $NF }
		f == 2 && /^brain_raft_is_leader\{group="1"\} 1$/ { tso = tso " n" n }
		f == 2 && /^brain_raft_is_leader\{group="2"\} 1$/ { meta = meta " n" n }
		f == 2 && /^brain_watch_responses_total / && $NF > before[n] { w = w " n" n }
		END { printf "TSO leader%s, meta leader%s, watches served by%s", (tso == "" ? " none" : tso), (meta == "" ? " none" : meta), (w == "" ? " none" : w) }' "$1" "$2"
}

# applied_report BEFORE AFTER: how the window's partition writes fell on
# the nodes, from the node metrics sampled as it began and ended (nodes
# n1.. in EPS order): each node's share of the writes its replicas applied
# (brain_partition_writes_total counts a write on every replica, so with
# copysets the nodes of one set show the same share) and the busiest
# node's share over the mean. A busiest node well over the mean is a
# cluster whose load the balancer has not spread: its busy nodes bound the
# throughput while the others have CPU to spare.
applied_report() {
	awk '
		FNR == 1 { f++; n = 0 }
		/^# node / { n++; if (n > nodes) nodes = n }
		f == 1 && /^brain_partition_writes_total / { before[n] = $NF }
		f == 2 && /^brain_partition_writes_total / { d[n] = $NF - before[n]; sum += d[n] }
		END {
			if (sum <= 0) { printf "none"; exit }
			for (i = 1; i <= nodes; i++) { printf "n%d %.0f%%  ", i, 100 * d[i] / sum; if (d[i] > most) most = d[i] }
			printf "busiest %.2fx the mean", most * nodes / sum
		}' "$1" "$2"
}

# leaderships_gained ENDPOINTS: the leaderships of groups the nodes at
# ENDPOINTS (comma separated) gained since they started, summed.
leaderships_gained() {
	node_metrics "$1" | awk '/^brain_raft_leadership_changes_total\{change="gained"\}/ { s += $NF } END { printf "%.0f\n", s }'
}

# settle_leaders LABEL ENDPOINTS: waits until no leadership moved on the
# nodes at ENDPOINTS for SETTLE seconds, at most SETTLE_MAX (see SETTLE).
settle_leaders() {
	((SETTLE > 0)) || return 0
	local start=$SECONDS quiet=$SECONDS moved=0 last now
	last=$(leaderships_gained "$2")
	while ((SECONDS - quiet < SETTLE)); do
		if ((SECONDS - start >= SETTLE_MAX)); then
			say "$1: WARNING: leaderships still moving after ${SETTLE_MAX}s ($moved moved); measuring anyway"
			return 0
		fi
		sleep 1
		now=$(leaderships_gained "$2")
		if ((now != last)); then
			moved=$((moved + now - last))
			last=$now
			quiet=$SECONDS
		fi
	done
	say "$1: leaders settled ($moved leaderships moved after the warm-up, none in the last ${SETTLE}s)"
}

# settle_placement LABEL ENDPOINTS: waits until no node at ENDPOINTS leads
# a partition off its placement, twice in a row 2 s apart, for at most
# HOT_PLACEMENT_MAX seconds, and says how long that took and how many
# partitions the cluster has.
settle_placement() {
	((HOT_PLACEMENT_MAX > 0)) || return 0
	local start=$SECONDS zeros=0 off parts
	while ((zeros < 2)); do
		off=$(node_metrics "$2" | awk '/^brain_partitions_off_placement / { s += $NF } END { print s + 0 }')
		if ((off == 0)); then zeros=$((zeros + 1)); else zeros=0; fi
		((zeros < 2)) || break
		if ((SECONDS - start >= HOT_PLACEMENT_MAX)); then
			say "$1: WARNING: $off partition(s) still off their placement after ${HOT_PLACEMENT_MAX}s more; measuring anyway"
			return 0
		fi
		sleep 2
	done
	parts=$(node_metrics "$2" | awk '/^brain_raft_is_leader\{group="[0-9]+"\} 1/ { split($1, a, "\""); if (a[2] + 0 >= 100) n++ } END { print n + 0 }')
	say "$1: every partition's replicas at its placement $((SECONDS - start))s after the settle ($parts partitions)"
}

# work_per_create BEFORE AFTER OPS: brain_work's counts per operation, and
# the fates of the writes deposed leaders had in flight and the calls to
# other nodes a broken connection failed after they were sent (counts).
work_per_create() {
	awk -v a="$1" -v b="$2" -v ops="$3" 'BEGIN {
		split(a, x, " "); split(b, y, " ")
		for (i = 1; i <= 7; i++) d[i] = (y[i] - x[i]) / ops
		for (i = 8; i <= 17; i++) d[i] = y[i] - x[i]
		for (i = 18; i <= 22; i++) d[i] = (y[i] - x[i]) / 1048576
		fl = d[18] + d[21]; co = d[19] + d[22]
		printf "%.2f raft batches received (%.2f messages), %.2f raft rounds, %.2f log syncs, %.2f forwarded writes, %.3f TSO requests, %.2f feed messages; writes in flight at deposed leaders: %d applied, %d dropped (retried), %d unknown; %d sent calls failed by a broken connection; %d leaderships gained (%d by transfer); %d partition splits; %d memtable flushes and %d compactions (%d of them moves or delete-only), %.0f MiB flushed (%.0f to blob files), %.0f MiB compacted (%.0f to blob files; %.1f per flushed MiB), %.0f MiB ingested (all nodes)", d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15], d[16], d[17], fl, d[21], co, d[22], (fl > 0 ? co / fl : 0), d[20] }'
}

# split points: the prefix of every resource, sorted.
SPLITS=$(tr ',' '\n' <<<"$RESOURCES" | sort | sed 's|.*|/registry/&/|' | paste -sd, -)

# start_cluster KIND N [EXTRA_FLAGS]: start N containers; sets EPS (their
# client endpoints, comma separated).
start_cluster() {
	local kind=$1 n=$2 extra=${3:-} i initial="" eps=() name
	# node_addr I: node I's "client-address peer-address" (NETWORK=host:
	# loopback ports, PORT_OFFSET apart for clusters side by side).
	node_addr() {
		if [[ $NETWORK == host ]]; then
			local port=$((40000 + ${PORT_OFFSET:-0} + 10 * $1))
			echo "127.0.0.1:$port 127.0.0.1:$((port + 1))"
		else
			echo "$PREFIX-$kind$1:2379 $PREFIX-$kind$1:2380"
		fi
	}
	for ((i = 1; i <= n; i++)); do
		read -r _ peer < <(node_addr "$i")
		initial+="${initial:+,}n$i=http://$peer"
	done
	local netargs=(--network "$NET")
	[[ $NETWORK == host ]] && netargs=(--network host)
	for ((i = 1; i <= n; i++)); do
		name=$PREFIX-$kind$i
		local client peer listenc=0.0.0.0:2379 listenp=0.0.0.0:2380 nodeargs=("${netargs[@]}")
		read -r client peer < <(node_addr "$i")
		if [[ $NETWORK == host ]]; then
			listenc=$client listenp=$peer
		else
			nodeargs+=(--hostname "$name")
		fi
		local args=(--name "n$i" --data-dir /data --listen-client-urls "http://$listenc"
			--advertise-client-urls "http://$client" --listen-peer-urls "http://$listenp"
			--initial-advertise-peer-urls "http://$peer" --initial-cluster "$initial")
		if [[ $kind == brain* ]]; then
			# shellcheck disable=SC2206 # BRAIN_FLAGS is a list of flags
			args+=(--initial-split-points "$SPLITS" $BRAIN_FLAGS $extra)
			# The data directory is a tmpfs charged to the container's
			# memory: no emergency ballast (a binary built --against an
			# older commit has no such flag).
			if [[ $kind == brain ]]; then args+=(--emergency-ballast-bytes 0); fi
			if ((PROFILE > 0)); then args+=(--enable-pprof); fi
		fi
		[[ -n $GOMAXPROCS_NODES ]] && nodeargs+=(--env "GOMAXPROCS=$GOMAXPROCS_NODES")
		docker run -d --name "$name" "${nodeargs[@]}" \
			--cpu-period "$CPU_PERIOD" --cpu-quota "$QUOTA" --memory "$MEMORY" --tmpfs /tmp \
			--mount type=tmpfs,destination=/data,tmpfs-size=4g \
			"brainscale-$kind:dev" "${args[@]}" >/dev/null
	done
	for ((i = 1; i <= n; i++)); do
		if [[ $NETWORK == host ]]; then
			read -r client _ < <(node_addr "$i")
			eps+=("$client")
		else
			eps+=("$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$PREFIX-$kind$i"):2379")
		fi
	done
	EPS=$(IFS=,; echo "${eps[*]}")
	for ((i = 1; i <= n; i++)); do
		if ! "$BIN/brainbench" wait --endpoints "${eps[i - 1]}" --timeout 90s; then
			say "$kind ($n nodes) did not become ready on ${eps[i - 1]}; its log:"
			docker logs --tail 30 "$PREFIX-$kind$i" >&2 || true
			return 1
		fi
	done
}

stop_cluster() {
	local kind=$1 n=$2 tag=${3:-} i
	for ((i = 1; i <= n; i++)); do
		docker logs "$PREFIX-$kind$i" >>"$OUT/$kind-$n$tag-n$i.log" 2>&1 || true
		docker rm -f "$PREFIX-$kind$i" >/dev/null 2>&1 || true
	done
}

# clients_for N SHARE: the workers for an N-node cluster that takes 1/SHARE
# of the load (2 for each of the side-by-side clusters).
clients_for() {
	if ((CLIENTS_PER_NODE > 0)); then
		echo $((CLIENTS_PER_NODE * $1))
	else
		echo $((CLIENTS / $2))
	fi
}

# bench_args ENDPOINTS CLIENTS CONNS: sets BENCH_ARGS to brainbench's
# flags for a load on ENDPOINTS.
bench_args() {
	BENCH_ARGS=(--endpoints "$1" --clients "$2" --conns "$3" --value-size "$VALUE_SIZE" --seed "$SEED")
	[[ $HASHED == 1 ]] && BENCH_ARGS+=(--hashed-names)
	((RESOURCE_WATCHERS == 0)) || BENCH_ARGS+=(--resource-watchers "$RESOURCE_WATCHERS")
	return 0
}

# record LABEL NODES CREATES_PER_S: one measurement of this round.
record() {
	printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$ROUND" "$3" >>"$OUT/rounds.tsv"
}

# idle_report KIND N LABEL: under --idle, the CPU every node of the
# cluster uses in IDLE seconds without load (under --profile, each brain
# node's CPU profile of those seconds too: OUT/KIND-N-idle*-nI.pprof).
idle_report() {
	((IDLE > 0)) || return 0
	local c0 c1 t0 t1
	c0=$(node_cpu "$1" "$2")
	t0=$(date +%s.%N)
	local profs=()
	PROFILE=$((PROFILE > 0 ? IDLE : 0)) start_profiles "$1" "$1-$2-idle$TAG" "$EPS"
	sleep "$IDLE"
	((${#profs[@]} == 0)) || wait "${profs[@]}" || true
	c1=$(node_cpu "$1" "$2")
	t1=$(date +%s.%N)
	say "$3: idle for ${IDLE}s after the warm-up: $(cpu_report "$c0" "$c1" "$t0" "$t1" 3)"
}

# measure KIND N WORKLOAD RESOURCES: one create run; appends to results.
measure() {
	local kind=$1 n=$2 workload=$3 res=$4 json=$OUT/$1-$2-$3$TAG.json
	local common
	bench_args "$EPS" "$(clients_for "$n" 1)" "$CONNS"
	common=("${BENCH_ARGS[@]}")
	local warmup=$WARMUP
	[[ $workload == hot && $kind == brain* ]] && warmup=$HOT_WARMUP
	say "$kind, $n node(s), $workload: $warmup warm-up puts, then $TOTAL creates"
	"$BIN/brainbench" put "${common[@]}" --total "$warmup" --keys "$warmup" --resources "$res" --quiet >/dev/null 2>&1 || true
	if [[ $workload == hot && $kind == brain* ]]; then
		say "waiting ${HOT_SETTLE}s for replicas and leaders to move after the splits"
		sleep "$HOT_SETTLE"
		settle_placement "$kind, $n node(s), $workload" "$EPS"
		if ((HOT_MEASURE == 0)); then
			# Creates, as measured: puts ran at about half the creates'
			# rate, so partitions the puts left below --split-write-rate
			# crossed it once the creates began, and the measurement paid
			# for those splits and their replicas' moves (a snapshot each).
			say "$kind, $n node(s), $workload: $HOT_BALANCE creates for the load splits and the leader balancer"
			"$BIN/brainbench" create "${common[@]}" --total "$HOT_BALANCE" --resources "$res" --quiet >/dev/null 2>&1 || true
			settle_placement "$kind, $n node(s), $workload" "$EPS"
		fi
	fi
	[[ $kind == brain* ]] && settle_leaders "$kind, $n node(s), $workload" "$EPS"
	idle_report "$kind" "$n" "$kind, $n node(s), $workload"
	# steady: this run's creates are measured over the last HOT_MEASURE
	# seconds of a longer run (see HOT_MEASURE); the node counters are
	# sampled when that window begins and ends.
	local steady=0 run=(--total "$TOTAL") win="" bpid
	if [[ $workload == hot && $kind == brain* ]] && ((HOT_MEASURE > 0)); then
		steady=1 win=$OUT/window.$kind.$n
		rm -f "$win"
		# Failed creates are counted and reported, not a reason to stop:
		# the run must last its duration to reach its window.
		run=(--total 0 --duration "$((HOT_RAMP + HOT_MEASURE))s" --measure-last "${HOT_MEASURE}s" --window-file "$win" --max-errors 1000000000)
		say "$kind, $n node(s), $workload: creates for $((HOT_RAMP + HOT_MEASURE))s, the last ${HOT_MEASURE}s measured"
	fi
	# The watches' node, chosen as the run starts (WATCH_APART).
	local weps
	weps=$(watch_endpoints "$kind" "$EPS")
	if [[ $weps != "$EPS" ]]; then
		bench_args "$weps" "$(clients_for "$n" 1)" "$CONNS"
		common=("${BENCH_ARGS[@]}")
		say "$kind, $n node(s), $workload: resource watches from n$(($(tr , '\n' <<<"$EPS" | grep -nxF "${weps%%,*}" | cut -d: -f1))), which leads no central group"
	fi
	barrier "$kind, $n node(s), $workload"
	"$BIN/brainbench" create "${common[@]}" "${run[@]}" --resources "$res" --json-out "$json" &
	bpid=$!
	if ((steady)); then
		while [[ ! -e $win ]] && kill -0 "$bpid" 2>/dev/null; do sleep 0.1; done
	fi
	local b0 b1 c0 c1 t0 t1 io0 io1 bc0 bc1 w0="" w1
	[[ $kind == brain* ]] && w0=$(brain_work "$OUT/$kind-$n-$workload$TAG.metrics-before")
	local sd0=""
	[[ -n $w0 ]] && sd0=$(stepdowns "$kind" "$n")
	b0=$(host_busy)
	c0=$(node_cpu "$kind" "$n")
	io0=$(node_io "$kind" "$n")
	# A steady run's brainbench still runs when the window ends, so its
	# CPU (counted once it is waited for) is not sampled.
	bc0="" bc1=""
	((steady)) || bench_cpu bc0
	t0=$(date +%s.%N)
	local profs=()
	start_profiles "$kind" "$kind-$n-$workload$TAG" "$EPS"
	if ((steady)); then
		# HOT_MEASURE seconds of node counters from t0 (which follows
		# the window's start by the samples' time, under a second).
		sleep "$(awk -v t0="$t0" -v now="$(date +%s.%N)" -v m="$HOT_MEASURE" 'BEGIN { d = m - (now - t0); print (d > 0 ? d : 0) }')"
	else
		wait "$bpid" || true
	fi
	((${#profs[@]} == 0)) || wait "${profs[@]}" || true
	[[ -n $w0 ]] && w1=$(brain_work "$OUT/$kind-$n-$workload$TAG.metrics-after")
	# Each node's LSM (levels, sizes, bytes compacted) as the window ends.
	[[ -n $w0 ]] && node_metrics "$EPS" /brain/v1/lsm >"$OUT/$kind-$n-$workload$TAG.lsm"
	b1=$(host_busy)
	c1=$(node_cpu "$kind" "$n")
	io1=$(node_io "$kind" "$n")
	((steady)) || bench_cpu bc1
	t1=$(date +%s.%N)
	((steady == 0)) || wait "$bpid" || true
	rm -f "$win"
	if ((steady)); then
		run_steady "$kind, $n node(s), $workload" "$json" || return 0
	elif ! run_complete "$kind, $n node(s), $workload" "$TOTAL" "$json"; then
		# What went on inside (leaders deposed, connections broken) is
		# what a stopped run needs explained; per create of TOTAL.
		[[ -n $w0 ]] && say "$kind, $n node(s), $workload: stopped early; per create of $TOTAL: $(work_per_create "$w0" "$w1" "$TOTAL")"
		return 0
	fi
	watch_report "$kind, $n node(s), $workload" "$json"
	# Per create of the measured ones (a steady run's window).
	local ops=$TOTAL
	((steady == 0)) || ops=$(json_field ops "$json")
	say "$kind, $n node(s), $workload: nodes: $(cpu_report "$c0" "$c1" "$t0" "$t1")"
	[[ -n $w0 ]] && say "$kind, $n node(s), $workload: duties: $(duties_report "$OUT/$kind-$n-$workload$TAG.metrics-before" "$OUT/$kind-$n-$workload$TAG.metrics-after")"
	[[ -n $w0 ]] && say "$kind, $n node(s), $workload: writes applied: $(applied_report "$OUT/$kind-$n-$workload$TAG.metrics-before" "$OUT/$kind-$n-$workload$TAG.metrics-after")"
	say "$kind, $n node(s), $workload: per create: $(per_create "$c0" "$c1" "$io0" "$io1" "$ops")"
	say "$kind, $n node(s), $workload: per create: $(host_report "$b0" "$b1" "$c0" "$c1" "$bc0" "$bc1" "$ops")"
	if [[ -n $w0 ]]; then
		say "$kind, $n node(s), $workload: per create: $(work_per_create "$w0" "$w1" "$ops")"
		say "$kind, $n node(s), $workload: raft batches between nodes waited: $(raft_waits "$OUT/$kind-$n-$workload$TAG.metrics-before" "$OUT/$kind-$n-$workload$TAG.metrics-after"); $(($(stepdowns "$kind" "$n") - sd0)) CheckQuorum step-downs"
	fi
	# Past ~90% the host, not the nodes' shares, limits the measurement.
	local busy
	busy=$(awk -v a="$b0" -v b="$b1" 'BEGIN { split(a, x, " "); split(b, y, " "); printf "%.0f", 100 * (y[1] - x[1]) / (y[2] - x[2]) }')
	say "$kind, $n node(s), $workload: host CPU busy $busy% during the creates"
	if ((busy >= 90)); then
		say "WARNING: the host was saturated: this result is bounded by the machine ($(nproc) CPUs for $n x $CPUS CPU of nodes plus brainbench), not by the nodes' shares; use a smaller --cpus"
	fi
	local thru
	thru=$(sed -n 's/.*"throughput":\([0-9.e+]*\).*/\1/p' "$json" | tail -1)
	local label=$kind
	[[ $kind == brainb ]] && label="brain at $AGAINST"
	[[ $workload == hot ]] && label="$label (one prefix)"
	record "$label" "$n" "$thru"
}

# barrier LABEL: for clusters measured at the same time (--against,
# --together), the measured create run starts when every cluster is
# ready for its own: each touches its file (BARRIER_NAME) in BARRIER and
# waits for all of BARRIER_ALL's, at most 300 s. Elsewhere at once.
barrier() {
	[[ -n ${BARRIER:-} ]] || return 0
	touch "$BARRIER/$BARRIER_NAME"
	local start=$SECONDS name
	for name in $BARRIER_ALL; do
		until [[ -e $BARRIER/$name ]]; do
			if ((SECONDS - start >= 300)); then
				say "$1: WARNING: the other clusters were not ready in 300 s; measuring without them"
				return 0
			fi
			sleep 0.2
		done
	done
}

# measure_together WORKLOAD RESOURCES FLAGS KIND:N...: clusters of KIND
# and N nodes each, all measured at the same time (barrier), each in a
# subshell of its own with its own container names and ports, which
# reports a failure in OUT/failed.KINDN and recorded errors in
# OUT/errors.KINDN.
measure_together() {
	local workload=$1 res=$2 extra=$3 side kind n i=0 pids=()
	shift 3
	BARRIER=$OUT/barrier.$ROUND.$workload.$(echo "$*" | tr ' :' '-_')
	BARRIER_ALL=$(echo "$*" | tr -d ':')
	mkdir -p "$BARRIER"
	for side in "$@"; do
		kind=${side%%:*} n=${side##*:}
		(
			FAILED=0 ERRORS=() BARRIER_NAME=$kind$n PREFIX=$PREFIX-$kind$n
			if PORT_OFFSET=$((500 * i)) start_cluster "$kind" "$n" "$extra"; then
				measure "$kind" "$n" "$workload" "$res"
			else
				FAILED=1
				touch "$BARRIER/$BARRIER_NAME" # the others need not wait
			fi
			stop_cluster "$kind" "$n"
			((FAILED == 0)) || echo "$kind, $n node(s), $workload failed" >>"$OUT/failed.$kind$n"
			for e in "${ERRORS[@]}"; do echo "$e" >>"$OUT/errors.$kind$n"; done
		) &
		pids+=($!)
		i=$((i + 1))
	done
	wait "${pids[@]}" || true
	unset BARRIER BARRIER_ALL
}

# json_field NAME JSON: the last number NAME holds in the brainbench
# results in JSON (0 when absent).
json_field() {
	local v
	v=$(sed -n 's/.*"'"$1"'":\([0-9.e+]*\).*/\1/p' "$2" 2>/dev/null | tail -1)
	echo "${v:-0}"
}

# run_steady LABEL JSON: whether a steady hot run (HOT_MEASURE) measured
# its whole window: a run that stopped early (too many errors) measured
# less of it, and is FAILED; errors are reported as run_complete does.
run_steady() {
	local label=$1 json=$2 secs ops errs first
	secs=$(json_field seconds "$json")
	ops=$(json_field ops "$json")
	errs=$(($(json_field errors "$json") + $(json_field unmeasured_errors "$json")))
	if ((ops == 0)) || awk -v s="$secs" -v m="$HOT_MEASURE" 'BEGIN { exit !(s < m) }'; then
		say "$label: FAILED (measured ${secs}s of ${HOT_MEASURE}s, $ops creates)"
		FAILED=1
		return 1
	fi
	say "$label: $ops creates in the last ${HOT_MEASURE}s, $(json_field unmeasured_ops "$json") before and after"
	if ((errs > 0)); then
		first=$(sed -n 's/.*"first_error":"\([^"]*\)".*/\1/p' "$json" | tail -1)
		say "$label: WARNING: $errs creates failed${first:+ ($first)}"
		ERRORS+=("$label: $errs failed creates")
	fi
}

# run_complete LABEL TOTAL JSON...: whether the brainbench runs that wrote
# JSON did TOTAL creates between them. brainbench exits non-zero when any
# create failed; a run that did all its creates with a few etcd errors (a
# leader lost on a starved node: "leader changed") is still a
# measurement: it is recorded, and the errors are reported next to it and
# in the summary. A run that stopped early is not (FAILED).
run_complete() {
	local label=$1 total=$2 ops=0 errs=0 o e j first=""
	shift 2
	for j in "$@"; do
		o=$(sed -n 's/.*"ops":\([0-9]*\).*/\1/p' "$j" 2>/dev/null | tail -1)
		e=$(sed -n 's/.*"errors":\([0-9]*\).*/\1/p' "$j" 2>/dev/null | tail -1)
		if [[ -z $o || -z $e ]]; then
			say "$label: FAILED"
			FAILED=1
			return 1
		fi
		ops=$((ops + o)) errs=$((errs + e))
		[[ -n $first ]] || first=$(sed -n 's/.*"first_error":"\([^"]*\)".*/\1/p' "$j" | tail -1)
	done
	if ((ops + errs < total)); then
		say "$label: FAILED"
		FAILED=1
		return 1
	fi
	if ((errs > 0)); then
		say "$label: WARNING: $errs of $total creates failed ($first); creates/s counts the $ops that succeeded"
		ERRORS+=("$label: $errs failed creates")
	fi
}

# watch_report LABEL JSON...: under --resource-watchers, the events the
# brainbench runs' resource watches received against the expected ones
# (one per successful create and watch); fewer, or a watch's error (an
# event out of order or repeated, a watch cancelled), is a WARNING.
watch_report() {
	((RESOURCE_WATCHERS > 0)) || return 0
	local label=$1 got=0 want=0 g w j err=""
	shift
	for j in "$@"; do
		g=$(sed -n 's/.*"resource_watches":{[^}]*"events":\([0-9]*\).*/\1/p' "$j" | tail -1)
		w=$(sed -n 's/.*"resource_watches":{[^}]*"want":\([0-9]*\).*/\1/p' "$j" | tail -1)
		[[ -n $err ]] || err=$(sed -n 's/.*"resource_watches":{[^}]*"first_error":"\([^"]*\)".*/\1/p' "$j" | tail -1)
		got=$((got + ${g:-0})) want=$((want + ${w:-0}))
	done
	say "$label: resource watches received $got of $want events${err:+ (first error: $err)}"
	if ((got < want)); then
		say "$label: WARNING: resource watches missed events"
		ERRORS+=("$label: resource watches received $got of $want events")
	fi
	if [[ -n $err ]]; then
		say "$label: WARNING: a resource watch failed: $err"
		ERRORS+=("$label: a resource watch failed: $err")
	fi
}

# start_profiles KIND NAME EPS: under --profile, starts a CPU profile of
# every brain node of EPS (comma-separated) in the background into
# OUT/NAME-nI.pprof and adds the curl processes to the caller's profs.
start_profiles() {
	((PROFILE > 0)) && [[ $1 == brain* ]] || return 0
	local ep i=0
	for ep in ${3//,/ }; do
		i=$((i + 1))
		curl -s -o "$OUT/$2-n$i.pprof" "http://$ep/debug/pprof/profile?seconds=$PROFILE" &
		profs+=($!)
	done
}

# measure_pair KIND N: two N-node clusters of KIND side by side (see the
# header), each loaded by its own brainbench with half the clients,
# connections and creates; records their summed ops over the longer run's
# time as "KIND (2 x N side by side)" at 2N nodes.
measure_pair() {
	local kind=$1 n=$2 label="$1 (2 x $2 side by side)" base=$PREFIX side eps=()
	for side in a b; do
		local offset=0
		[[ $side == b ]] && offset=500
		if ! PORT_OFFSET=$offset PREFIX=$base-$side start_cluster "$kind" "$n"; then
			FAILED=1
			return 0
		fi
		eps+=("$EPS")
	done
	say "$label: $WARMUP warm-up puts each, then $((TOTAL / 2)) creates each, at the same time"
	local i pids=() jsons=() b0 b1 c0 c1 io0 io1 bc0 bc1 t0 t1
	for i in 0 1; do
		bench_args "${eps[i]}" "$(clients_for "$n" 2)" "$((CONNS / 2))"
		"$BIN/brainbench" put "${BENCH_ARGS[@]}" --total "$WARMUP" --keys "$WARMUP" --resources "$RESOURCES" --quiet >/dev/null 2>&1 || true
	done
	if [[ $kind == brain ]]; then
		for i in 0 1; do settle_leaders "$label, cluster $((i + 1))" "${eps[i]}"; done
	fi
	b0=$(host_busy)
	c0=$(for side in a b; do PREFIX=$base-$side node_cpu "$kind" "$n" | sed "s/^/$side/"; done)
	io0=$(for side in a b; do PREFIX=$base-$side node_io "$kind" "$n"; done | awk '{ r += $1; w += $2; f += $3 } END { print r, w, f }')
	bench_cpu bc0
	t0=$(date +%s.%N)
	local profs=()
	for i in 0 1; do start_profiles "$kind" "$kind-2x$n$TAG-$((i + 1))" "${eps[i]}"; done
	for i in 0 1; do
		bench_args "${eps[i]}" "$(clients_for "$n" 2)" "$((CONNS / 2))"
		jsons+=("$OUT/$kind-2x$n$TAG-$i.json")
		"$BIN/brainbench" create "${BENCH_ARGS[@]}" --total "$((TOTAL / 2))" --resources "$RESOURCES" --json-out "${jsons[i]}" --quiet &
		pids+=($!)
	done
	for i in 0 1; do wait "${pids[i]}" || true; done
	((${#profs[@]} == 0)) || wait "${profs[@]}" || true
	b1=$(host_busy)
	c1=$(for side in a b; do PREFIX=$base-$side node_cpu "$kind" "$n" | sed "s/^/$side/"; done)
	io1=$(for side in a b; do PREFIX=$base-$side node_io "$kind" "$n"; done | awk '{ r += $1; w += $2; f += $3 } END { print r, w, f }')
	bench_cpu bc1
	t1=$(date +%s.%N)
	for side in a b; do PREFIX=$base-$side stop_cluster "$kind" "$n" "-$side"; done
	run_complete "$label" "$((TOTAL / 2 * 2))" "${jsons[@]}" || return 0
	watch_report "$label" "${jsons[@]}"
	local thru
	thru=$(for i in 0 1; do sed -n 's/.*"ops":\([0-9]*\).*"seconds":\([0-9.e+]*\).*/\1 \2/p' "${jsons[i]}" | tail -1; done | awk '{ o += $1; if ($2 > m) m = $2 } END { printf "%.1f", (m > 0 ? o / m : 0) }')
	say "$label: $thru creates/s together"
	say "$label: nodes: $(cpu_report "$c0" "$c1" "$t0" "$t1")"
	say "$label: per create: $(per_create "$c0" "$c1" "$io0" "$io1" "$TOTAL")"
	say "$label: per create: $(host_report "$b0" "$b1" "$c0" "$c1" "$bc0" "$bc1" "$TOTAL")"
	say "$label: host CPU busy $(awk -v a="$b0" -v b="$b1" 'BEGIN { split(a, x, " "); split(b, y, " "); printf "%.0f", 100 * (y[1] - x[1]) / (y[2] - x[2]) }')% during the creates"
	record "$label" "$((2 * n))" "$thru"
}

CLIENTS_DESC="$CLIENTS clients"
((CLIENTS_PER_NODE > 0)) && CLIENTS_DESC="$CLIENTS_PER_NODE clients per node"
ROUNDS_DESC=""
((REPEAT > 1)) && ROUNDS_DESC=", median of $REPEAT rounds"
printf '# system\tnodes\tcreates/s (%s CPU per node, %s, %s B values%s)\n' "$CPUS" "$CLIENTS_DESC" "$VALUE_SIZE" "$ROUNDS_DESC" >"$OUT/results.tsv"
printf '# system\tnodes\tround\tcreates/s (%s CPU per node, %s, %s B values)\n' "$CPUS" "$CLIENTS_DESC" "$VALUE_SIZE" >"$OUT/rounds.tsv"
say "sizes: $SIZES; $CLIENTS_DESC; $REPEAT round(s); $CPUS CPU, GOMAXPROCS ${GOMAXPROCS_NODES:-as Go defaults} and $MEMORY per node; $(nproc) CPUs on this machine; $RESOURCE_WATCHERS watch(es) per resource; results in $OUT"
for ((ROUND = 1; ROUND <= REPEAT; ROUND++)); do
	TAG="" # file name suffix of this round's JSON, metrics and profiles
	if ((REPEAT > 1)); then
		TAG=-r$ROUND
		say "round $ROUND of $REPEAT"
	fi
	if ((TOGETHER)) && [[ -z $AGAINST ]]; then
		for kind in $SYSTEMS; do
			sides=()
			for n in $SIZES; do sides+=("$kind:$n"); done
			[[ $SPREAD == 1 || $kind != brain ]] && measure_together spread "$RESOURCES" "" "${sides[@]}"
			[[ $HOT == 1 && $kind == brain ]] && measure_together hot pods "$HOT_FLAGS" "${sides[@]}"
		done
		continue
	fi
	for n in $SIZES; do
		if [[ -n $AGAINST ]]; then
			[[ $SPREAD == 1 ]] && measure_together spread "$RESOURCES" "" "brain:$n" "brainb:$n"
			[[ $HOT == 1 ]] && measure_together hot pods "$HOT_FLAGS" "brain:$n" "brainb:$n"
			continue
		fi
		for kind in $SYSTEMS; do
			if [[ $SPREAD == 1 || $kind != brain ]]; then
				if ! start_cluster "$kind" "$n"; then
					FAILED=1
					stop_cluster "$kind" "$n"
					continue
				fi
				measure "$kind" "$n" spread "$RESOURCES"
				stop_cluster "$kind" "$n"
			fi
			if [[ $HOT == 1 && $kind == brain ]]; then
				# A fresh cluster, so the creates find no keys of the first run.
				if start_cluster "$kind" "$n" "$HOT_FLAGS"; then
					measure "$kind" "$n" hot pods
				else
					FAILED=1
				fi
				stop_cluster "$kind" "$n"
			fi
			if [[ " $SIDE_BY_SIDE " == *" $n "* ]]; then
				measure_pair "$kind" "$n"
			fi
		done
	done
done

if [[ -n $AGAINST ]] || ((TOGETHER)); then
	for f in "$OUT"/failed.* "$OUT"/errors.*; do
		[[ -e $f ]] || continue
		[[ $f == */failed.* ]] && FAILED=1
		[[ $f == */errors.* ]] && mapfile -t -O "${#ERRORS[@]}" ERRORS <"$f"
	done
fi

# Measured at the same time (--together, --against), the clusters of a
# round recorded in the order they finished: the summaries read the
# rounds by size (a stable sort keeps each size's order).
BY_SIZE=$OUT/.rounds-by-size
sort -t "$(printf '\t')" -k2,2n -s "$OUT/rounds.tsv" >"$BY_SIZE"

# median(a, n): the median of a[1..n] (the mean of the middle two for an
# even n), for the awk programs below; sorts a.
MEDIAN_AWK='function median(a, n,   i, j, t) {
	for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}'

# results.tsv: each measurement's median over the rounds, in the order
# first measured.
awk -F'\t' "$MEDIAN_AWK"'
!/^#/ { k = $1 FS $2; if (!(k in c)) order[++m] = k; v[k, ++c[k]] = $4 + 0 }
END {
	for (i = 1; i <= m; i++) {
		k = order[i]; n = c[k]
		for (a = 1; a <= n; a++) x[a] = v[k, a]
		printf "%s\t%.1f\n", k, median(x, n)
	}
}' "$BY_SIZE" >>"$OUT/results.tsv"

echo
echo "creates/s by cluster size ($CPUS CPU per node$ROUNDS_DESC)"
awk -F'\t' '!/^#/ { v[$1 FS $2] = $3; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } ; if (!($2 in sz)) { sz[$2] = 1; sizes[++m] = $2 } }
END {
	printf "%-30s", "system"; for (j = 1; j <= m; j++) printf "%12s", sizes[j] " nodes"; printf "\n"
	for (i = 1; i <= k; i++) { printf "%-30s", order[i]; for (j = 1; j <= m; j++) { x = v[order[i] FS sizes[j]]; printf "%12s", x == "" ? "-" : sprintf("%.0f", x) } ; printf "\n" }
}' "$OUT/results.tsv"
# Against the side-by-side pairs: N-node throughput over that of two
# N/2-node clusters sharing the host the same way (1.00: perfect scaling
# on this host), and the ratio to N/2 nodes that implies at equal host
# contention (2 x that).
awk -F'\t' '!/^#/ { v[$1 FS $2] = $3 }
END {
	for (key in v) {
		split(key, f, FS)
		if (f[1] !~ / side by side\)$/) continue
		sys = f[1]; sub(/ \(2 x [0-9]+ side by side\)$/, "", sys)
		if ((sys FS f[2]) in v && v[key] > 0)
			printf "%s: %s nodes / 2 x %d side by side = %.2f (at equal host load and writes in flight per node %s / %d nodes = %.2fx)\n", sys, f[2], f[2] / 2, v[sys FS f[2]] / v[key], f[2], f[2] / 2, 2 * v[sys FS f[2]] / v[key]
	}
}' "$OUT/results.tsv"
if ((REPEAT > 1)); then
	# Every round, and each round's ratio between two sizes of one system:
	# the two were measured minutes apart, so their ratio is steadier than
	# either throughput.
	echo
	echo "by round (creates/s; ratios between sizes per round, then their median)"
	awk -F'\t' "$MEDIAN_AWK"'
	# ratios(NL, NS, DL, DS): the ratios, round by round, of label NL at size NS to
	# label DL at size DS into q[1..], as text into line; returns how many.
	function ratios(nl, ns, dl, ds,   r, n) {
		line = ""; n = 0; delete q
		for (r = 1; r <= rounds; r++) {
			if (((nl, ns, r) in v) && ((dl, ds, r) in v) && v[dl, ds, r] > 0) {
				q[++n] = v[nl, ns, r] / v[dl, ds, r]; line = line sprintf(" %.2f", q[n])
			} else line = line " -"
		}
		return n
	}
	!/^#/ {
		if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 }
		if (!(($1, $2) in hasSize)) { hasSize[$1, $2] = 1; sizes[$1] = sizes[$1] " " $2 }
		v[$1, $2, $3] = $4 + 0; if ($3 > rounds) rounds = $3
	}
	END {
		for (i = 1; i <= k; i++) {
			l = order[i]; ns = split(sizes[l], sz, " ")
			for (a = 1; a <= ns; a++) {
				line = ""
				for (r = 1; r <= rounds; r++) line = line sprintf(" %7s", ((l, sz[a], r) in v) ? sprintf("%.0f", v[l, sz[a], r]) : "-")
				printf "%-30s %2s nodes:%s\n", l, sz[a], line
			}
			for (a = 1; a <= ns; a++) for (b = a + 1; b <= ns; b++) {
				if ((n = ratios(l, sz[b], l, sz[a])) > 0) printf "%-30s %s / %s nodes:%s; median %.2fx of %d rounds\n", l, sz[b], sz[a], line, median(q, n), n
			}
		}
		# N nodes against the two N/2-node clusters side by side.
		for (i = 1; i <= k; i++) {
			l = order[i]; if (l !~ / side by side\)$/) continue
			sys = l; sub(/ \(2 x [0-9]+ side by side\)$/, "", sys)
			ns = split(sizes[l], sz, " ")
			for (a = 1; a <= ns; a++) {
				if ((n = ratios(sys, sz[a], l, sz[a])) > 0) printf "%-30s %s nodes / 2 x %d side by side:%s; median %.2f of %d rounds\n", sys, sz[a], sz[a] / 2, line, median(q, n), n
			}
		}
	}' "$BY_SIZE"
fi
if [[ -n $AGAINST ]]; then
	# Each round's ratio of the other build to this tree's, size by size:
	# the two were measured at the same time.
	echo
	echo "brain at $AGAINST / brain (this tree), measured at the same time (creates/s ratio by round, then the median)"
	awk -F'\t' -v rev="$AGAINST" "$MEDIAN_AWK"'
	!/^#/ {
		l = $1; b = (index(l, "brain at " rev) == 1); w = (l ~ /one prefix/) ? "one prefix" : "spread"
		v[b, w, $2, $3] = $4 + 0; if ($3 > rounds) rounds = $3
		if (!((w, $2) in seen)) { seen[w, $2] = 1; keys[++k] = w SUBSEP $2 }
	}
	END {
		for (i = 1; i <= k; i++) {
			split(keys[i], kw, SUBSEP); n = 0; line = ""
			for (r = 1; r <= rounds; r++) {
				if (((1, kw[1], kw[2], r) in v) && ((0, kw[1], kw[2], r) in v) && v[0, kw[1], kw[2], r] > 0) {
					q[++n] = v[1, kw[1], kw[2], r] / v[0, kw[1], kw[2], r]; line = line sprintf(" %.2f", q[n])
				} else line = line " -"
			}
			if (n > 0) printf "%-12s %2s nodes:%s; median %.2fx of %d rounds\n", kw[1], kw[2], line, median(q, n), n
		}
	}' "$BY_SIZE"
fi
(cd "$ROOT/tools/benchplot" && GOWORK=off go run . --in "$OUT/results.tsv" --out "$OUT/scaling.png" \
	--title "creates/s vs nodes, $CPUS CPU per node, $CLIENTS_DESC$ROUNDS_DESC" --ylabel "creates/s") || FAILED=1
say "results: $OUT/results.tsv, plot: $OUT/scaling.png, logs and JSON in $OUT"
for e in "${ERRORS[@]}"; do
	say "WARNING: recorded with errors: $e"
done
if [[ $FAILED -ne 0 ]]; then
	say "FAILED: see the messages above"
	exit 1
fi
