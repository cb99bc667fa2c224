#!/usr/bin/env bash
# Kubernetes-shaped workload benchmark: a real kube-apiserver (built from
# k8s.io/kubernetes, as run.sh does) in front of a 3-node brain cluster and
# then in front of a 3-node etcd 3.6 cluster (cmd/etcdref, etcd's own server
# code), in the same run on the same machine. kubeload creates COUNT objects
# of each kind with CLIENTS concurrent clients through the apiserver; the
# script reports objects/s, the latency kubeload saw, and kube-apiserver's
# own request and storage latency (from its /metrics histograms; the
# storage histogram's buckets are coarse, 5/25/50/100 ms..., so its
# quantiles are interpolated estimates).
#
#   test/e2e/kube/bench.sh [current|v1.32]         (default: current)
#
# Environment: COUNT (default 5000), CLIENTS (16), KINDS ("configmaps pods"),
# BACKENDS ("brain etcd"), ROUNDS (1: rounds alternate the backends),
# PAYLOAD (bytes per object, 1024), E2E_BIN / E2E_WORK as for run.sh.
# Results go to stdout and $E2E_WORK/bench-<version>.txt.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
bin=${E2E_BIN:-$here/.bin}
workroot=${E2E_WORK:-$here/.work}
count=${COUNT:-5000}
clients=${CLIENTS:-16}
kinds=${KINDS:-configmaps pods}
backends=${BACKENDS:-brain etcd}
rounds=${ROUNDS:-1}
payload=${PAYLOAD:-1024}
event_ttl=1h
compaction_interval=5m
version=${1:-current}

export GOTOOLCHAIN=local
# shellcheck source=lib.sh
. "$here/lib.sh"

NODES=(n1 n2 n3)
declare -A CPORT=([n1]=21379 [n2]=22379 [n3]=23379) PPORT=([n1]=21380 [n2]=22380 [n3]=23380)
declare -A PID=()
APIPORT=26443
ENDPOINTS=http://127.0.0.1:21379,http://127.0.0.1:22379,http://127.0.0.1:23379
INITIAL=n1=http://127.0.0.1:21380,n2=http://127.0.0.1:22380,n3=http://127.0.0.1:23380
APIPID=
APIFLAGS=()

teardown() {
  stop_pid "$APIPID" kube-apiserver; APIPID=
  local n
  for n in "${NODES[@]}"; do stop_pid "${PID[$n]:-}" "$n"; PID[$n]=; done
}
trap 'teardown' EXIT
trap 'log "interrupted"; exit 130' INT TERM

# start_cluster BACKEND: three brainnode or etcdref members on loopback.
start_cluster() {
  local b=$1 n
  for n in "${NODES[@]}"; do
    local cmd=("$bin/brainnode" --name "$n" --data-dir "$work/$n.data" --initial-advertise-peer-urls "http://127.0.0.1:${PPORT[$n]}")
    [ "$b" = etcd ] && cmd=("$bin/etcdref" --name "$n" --data-dir "$work/$n.data")
    "${cmd[@]}" --listen-client-urls "http://127.0.0.1:${CPORT[$n]}" --listen-peer-urls "http://127.0.0.1:${PPORT[$n]}" \
      --initial-cluster "$INITIAL" >>"$work/$n.log" 2>&1 &
    PID[$n]=$!
  done
  local deadline=$((SECONDS + 90))
  for n in "${NODES[@]}"; do
    until "$bin/etcdcheck" -endpoints "http://127.0.0.1:${CPORT[$n]}" put /bench/ready-$n x >/dev/null 2>&1; do
      kill -0 "${PID[$n]}" 2>/dev/null || { tail -20 "$work/$n.log"; die "$b $n exited"; }
      [ $SECONDS -ge $deadline ] && die "$b $n does not take writes after 90s"
      sleep 0.5
    done
  done
  log "$b: 3 members up"
}

# quantile Q METRIC SELECTOR: the Q quantile (seconds) of a Prometheus
# histogram in $work/metrics.txt, summed over the series matching SELECTOR
# (a regexp on the label set), interpolated linearly in the bucket as
# Prometheus' histogram_quantile does.
quantile() {
  grep -E "^$2_bucket\{" "$work/metrics.txt" | grep -E "$3" |
    sed -E 's/.*le="([^"]+)".* ([0-9.e+-]+)$/\1 \2/' |
    awk '{c[$1]+=$2} END {for (le in c) print le, c[le]}' | sed 's/^+Inf/inf/' | sort -g |
    awk -v q="$1" '{le[NR]=$1; c[NR]=$2} END {
      if (NR == 0 || c[NR] == 0) { print "nan"; exit }
      rank=q*c[NR]; pl=0; pc=0
      for (i=1; i<=NR; i++) {
        if (c[i] >= rank) {
          if (le[i] == "inf") { printf "%.1f\n", 1000*pl; exit }
          printf "%.1f\n", 1000*(pl+(le[i]-pl)*(rank-pc)/(c[i]>pc ? c[i]-pc : 1)); exit
        }
        pl=le[i]; pc=c[i]
      }
    }'
}

declare -a ROWS=()
bench_backend() { # BACKEND ROUND
  local b=$1 r=$2 kind out line
  work=$workroot/bench-$KVER-$b-$r
  rm -rf "$work"; mkdir -p "$work/certs"
  for p in 21379 21380 22379 22380 23379 23380 $APIPORT; do port_free "$p" || die "port $p is in use"; done
  start_cluster "$b"
  start_apiserver
  log "kube-apiserver $KVER ready on $b after ${APIREADY}s"
  for kind in $kinds; do
    log "$b round $r: creating $count $kind with $clients clients"
    out=$("$bin/kubeload" --server "https://127.0.0.1:$APIPORT" --token "$TOKEN" --namespace "bench-$kind" \
      --kind "$kind" --count "$count" --clients "$clients" --size "$payload" --prefix "r$r") || die "kubeload against $b failed: $out"
    line=$(grep '^RESULT' <<<"$out")
    curl -sk -m 30 -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$APIPORT/metrics" >"$work/metrics.txt"
    local sel="verb=\"POST\".*resource=\"$kind\"|resource=\"$kind\".*verb=\"POST\""
    local api50 api99 st50 st99 obj
    api50=$(quantile 0.5 apiserver_request_duration_seconds "$sel")
    api99=$(quantile 0.99 apiserver_request_duration_seconds "$sel")
    obj=$([ "$kind" = pods ] && echo pods || echo configmaps)
    # 1.32 labels the storage histogram type="/configmaps"-like, later
    # releases resource="configmaps"
    local ssel="operation=\"create\".*(type|resource)=\"/?$obj\"|(type|resource)=\"/?$obj\".*operation=\"create\""
    st50=$(quantile 0.5 etcd_request_duration_seconds "$ssel")
    st99=$(quantile 0.99 etcd_request_duration_seconds "$ssel")
    log "$b $kind: $line apiserver_p50_ms=$api50 apiserver_p99_ms=$api99 storage_p50_ms=$st50 storage_p99_ms=$st99"
    ROWS+=("$b $r $kind $(sed -E 's/.*objects_per_s=([0-9.]+).*p50_ms=([0-9.]+).*p99_ms=([0-9.]+).*errors=([0-9]+).*/\1 \2 \3 \4/' <<<"$line") $api50 $api99 $st50 $st99")
  done
  teardown
  [ "${KEEP:-}" = 1 ] || rm -rf "$work"
}

mkdir -p "$bin" "$workroot"
log "building brainnode, etcdref, etcdcheck and kubeload"
(cd "$root" && go build -o "$bin/brainnode" ./cmd/brainnode && (cd cmd/etcdref && GOWORK=off go build -o "$bin/etcdref" .) &&
  go build -o "$bin/etcdcheck" ./test/e2e/kube/etcdcheck && go build -o "$bin/kubeload" ./test/e2e/kube/kubeload) ||
  die "build failed"
build_kube "$version"
for r in $(seq 1 "$rounds"); do
  for b in $backends; do bench_backend "$b" "$r"; done
done

report=$workroot/bench-$KVER.txt
{
  echo "kube-apiserver $KVER, 3 members each, $count objects per kind, $clients clients, ${payload}B payload, $(nproc) CPUs, $(date -u +%FT%TZ)"
  printf '%-6s %-5s %-11s %10s %9s %9s %8s %10s %10s %10s %10s\n' backend round kind objects/s p50_ms p99_ms errors api_p50 api_p99 store_p50 store_p99
  for row in "${ROWS[@]}"; do
    # shellcheck disable=SC2086
    printf '%-6s %-5s %-11s %10s %9s %9s %8s %10s %10s %10s %10s\n' $row
  done
  for kind in $kinds; do
    for b in $backends; do
      printf '%s\n' "${ROWS[@]}" | awk -v b="$b" -v k="$kind" '$1==b && $3==k {s+=$4; n++} END {if (n) printf "mean %s %s %.0f objects/s over %d rounds\n", b, k, s/n, n}'
    done
  done
  if [[ " $backends " == *" brain "* && " $backends " == *" etcd "* ]]; then
    for kind in $kinds; do
      printf '%s\n' "${ROWS[@]}" | awk -v k="$kind" '$3==k && $1=="brain" {bs+=$4; bn++} $3==k && $1=="etcd" {es+=$4; en++}
        END {if (bn && en && es) printf "ratio %s brain/etcd objects/s: %.2fx\n", k, (bs/bn)/(es/en)}'
    done
  fi
} | tee "$report"
log "report: $report"
