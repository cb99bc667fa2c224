# Sourced by bench/compare.sh and bench/cpu.sh: start and stop brain and
# etcd (etcdref) clusters on free loopback ports, one process per member.
# Expects NODES, QUOTA, BIN (brainnode, etcdref, brainbench), WORK (data and
# logs), KEEP, optionally PROFILE (non-empty: servers serve /debug/pprof),
# and declares PID (name -> pid) and FAILED.
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
	local extra=()
	[[ -n ${PROFILE:-} ]] && extra=(--enable-pprof)
	for ((i = 0; i < NODES; i++)); do
		local ep=${eps[i]} peer=http://127.0.0.1:${ports[2 * i + 1]}
		local name=$kind$i
		[[ $NODES -eq 1 ]] && name=$kind
		if [[ $kind == brain ]]; then
			start_server "$name" "$ep" "$BIN/brainnode" --name "$kind$i" --data-dir "$WORK/$name.data" \
				--listen-client-urls "http://$ep" --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
				--initial-cluster "$initial" --quota-backend-bytes "$QUOTA" --log-level warn "${extra[@]}"
		else
			start_server "$name" "$ep" "$BIN/etcdref" --name "$kind$i" --data-dir "$WORK/$name.data" \
				--listen-client-urls "http://$ep" --listen-peer-urls "$peer" \
				--initial-cluster "$initial" --quota-backend-bytes "$QUOTA" "${extra[@]}"
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

