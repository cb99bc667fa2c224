#!/usr/bin/env bash
# End-to-end run of a real kube-apiserver (built from k8s.io/kubernetes) and
# kubectl against a 3-node brain cluster on loopback. See README.md.
#
#   test/e2e/kube/run.sh [current|v1.32 ...]     (default: current)
#   test/e2e/kube/run.sh --kube-apiserver PATH [--kubectl PATH]
#
# The first builds kube-apiserver and kubectl of each version directory
# (cached); the second runs a kube-apiserver binary you have (as downloaded
# from the Kubernetes releases) and kubectl from --kubectl, PATH, or built.
#
# Environment: KEEP=1 keeps the work directory (logs, data) after a pass;
# E2E_BIN (default test/e2e/kube/.bin) caches the binaries; E2E_WORK (default
# test/e2e/kube/.work) holds data and logs; EVENT_TTL (default 20s),
# COMPACTION_INTERVAL (default 10s); BRAIN_NODES (default 3, at most 6) is
# the cluster size; TLS=1 runs brain with client and peer
# TLS and --client-cert-auth/--peer-client-cert-auth (certificates from
# openssl) and etcd's auth on, kube-apiserver connecting with
# --etcd-cafile/--etcd-certfile/--etcd-keyfile as a user whose role covers
# /registry/ only.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
bin=${E2E_BIN:-$here/.bin}
workroot=${E2E_WORK:-$here/.work}
event_ttl=${EVENT_TTL:-20s}
compaction_interval=${COMPACTION_INTERVAL:-10s}
# --kube-apiserver PATH (and --kubectl PATH): run against binaries you
# have, as downloaded from the Kubernetes releases, instead of building
# them; kubectl defaults to the one on PATH, else one built from current/.
given_apiserver= given_kubectl=
versions=()
while [ $# -gt 0 ]; do
  case $1 in
  --kube-apiserver) given_apiserver=${2:?--kube-apiserver needs a path}; shift 2 ;;
  --kube-apiserver=*) given_apiserver=${1#*=}; shift ;;
  --kubectl) given_kubectl=${2:?--kubectl needs a path}; shift 2 ;;
  --kubectl=*) given_kubectl=${1#*=}; shift ;;
  -h|--help) sed -n '2,/^$/p' "$0"; exit 0 ;;
  -*) echo "unknown option $1 (see $0 --help)" >&2; exit 2 ;;
  *) versions+=("$1"); shift ;;
  esac
done
if [ -n "$given_apiserver" ]; then
  [ ${#versions[@]} -eq 0 ] || { echo "--kube-apiserver runs one given binary: name no version directories" >&2; exit 2; }
  versions=(given)
fi
[ ${#versions[@]} -eq 0 ] && versions=(current)

export GOTOOLCHAIN=local
# shellcheck source=lib.sh
. "$here/lib.sh"

# ---------------------------------------------------------------- builds
build_brain() {
  mkdir -p "$bin"
  log "building brainnode and etcdcheck"
  (cd "$root" && go build -o "$bin/brainnode" ./cmd/brainnode && go build -o "$bin/etcdcheck" ./test/e2e/kube/etcdcheck &&
    go build -o "$bin/mvccscan" ./test/e2e/kube/mvccscan && go build -o "$bin/etcdctl" go.etcd.io/etcd/etcdctl/v3) ||
    die "building brainnode/etcdcheck/mvccscan/etcdctl failed"
}


# ---------------------------------------------------------------- processes
# BRAIN_NODES (default 3, at most 6) brain nodes: n1 on 21379 (peer 21380,
# gossip 21381), n2 on 22379 and so on.
NODES=() ALLPORTS=()
declare -A CPORT=() PPORT=()
for ((i = 1; i <= ${BRAIN_NODES:-3}; i++)); do
  NODES+=("n$i"); CPORT[n$i]=2${i}379; PPORT[n$i]=2${i}380; ALLPORTS+=(2${i}379 2${i}380 2${i}381)
done
declare -A PID=()
APIPORT=26443
SCHEME=http
[ "${TLS:-}" = 1 ] && SCHEME=https
ENDPOINTS=$(for n in "${NODES[@]}"; do printf '%s://127.0.0.1:%s,' "$SCHEME" "${CPORT[$n]}"; done); ENDPOINTS=${ENDPOINTS%,}
TLSNODE=() ECTLS= CURLTLS=()
INITIAL=$(for n in "${NODES[@]}"; do printf '%s=%s://127.0.0.1:%s,' "$n" "$SCHEME" "${PPORT[$n]}"; done); INITIAL=${INITIAL%,}
APIPID=
APIFLAGS=()


start_node() {
  local n=$1
  "$bin/brainnode" --name "$n" --data-dir "$work/$n.brain" \
    --listen-client-urls "$SCHEME://127.0.0.1:${CPORT[$n]}" "${TLSNODE[@]}" \
    --listen-peer-urls "$SCHEME://127.0.0.1:${PPORT[$n]}" --initial-advertise-peer-urls "$SCHEME://127.0.0.1:${PPORT[$n]}" \
    --initial-cluster "$INITIAL" >>"$work/$n.log" 2>&1 &
  PID[$n]=$!
  log "started brain $n (pid ${PID[$n]}, client port ${CPORT[$n]})"
}

wait_health() { # NODE TIMEOUT_SECONDS
  local n=$1 deadline=$((SECONDS + $2))
  while [ $SECONDS -lt $deadline ]; do
    curl "${CURLTLS[@]}" -sf -m 2 "$SCHEME://127.0.0.1:${CPORT[$n]}/health" >/dev/null 2>&1 && return 0
    kill -0 "${PID[$n]}" 2>/dev/null || { log "brain $n exited; tail of its log:"; tail -20 "$work/$n.log"; return 1; }
    sleep 0.5
  done
  log "brain $n not healthy after $2s: $(curl "${CURLTLS[@]}" -s -m 2 "$SCHEME://127.0.0.1:${CPORT[$n]}/health")"
  return 1
}


teardown() {
  [ -n "${WATCHPID:-}" ] && kill "$WATCHPID" 2>/dev/null
  [ -n "${BWATCHPID:-}" ] && kill "$BWATCHPID" 2>/dev/null
  stop_pid "$APIPID" kube-apiserver; APIPID=
  local n
  for n in "${NODES[@]}"; do stop_pid "${PID[$n]:-}" "brain $n"; PID[$n]=; done
}
trap 'teardown' EXIT
trap 'log "interrupted"; exit 130' INT TERM

# make_pki: a CA, a server certificate for 127.0.0.1 and a client
# certificate (openssl), and the flags that use them.
make_pki() {
  local p=$work/pki
  mkdir -p "$p"
  (cd "$p" &&
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=brain-e2e-ca &&
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=brainnode &&
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' >server.ext &&
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 -extfile server.ext &&
    openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=kube-apiserver &&
    printf 'extendedKeyUsage=clientAuth\n' >client.ext &&
    openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 2 -extfile client.ext &&
    openssl req -newkey rsa:2048 -nodes -keyout root.key -out root.csr -subj /CN=root &&
    openssl x509 -req -in root.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out root.crt -days 2 -extfile client.ext) \
    >"$p/openssl.log" 2>&1 || die "openssl could not make the certificates (see $p/openssl.log)"
  TLSNODE=(--cert-file "$p/server.crt" --key-file "$p/server.key" --trusted-ca-file "$p/ca.crt" --client-cert-auth
    --peer-cert-file "$p/server.crt" --peer-key-file "$p/server.key" --peer-trusted-ca-file "$p/ca.crt" --peer-client-cert-auth)
  ECTLS="-cacert $p/ca.crt -cert $p/client.crt -key $p/client.key"
  CURLTLS=(--http1.1 --cacert "$p/ca.crt" --cert "$p/client.crt" --key "$p/client.key")
  APIFLAGS=(--etcd-cafile="$p/ca.crt" --etcd-certfile="$p/client.crt" --etcd-keyfile="$p/client.key")
  log "TLS on: brain's clients and peers need certificates from $p/ca.crt"
}

# enable_auth (TLS=1): etcd's auth on, kube-apiserver's certificate (CN
# kube-apiserver) a user with readwrite on /registry/ and on the key its
# compactor keeps (compact_rev_key) and nothing else; root is the CN=root
# certificate. The commands are etcdctl 3.6's, unchanged.
enable_auth() {
  local p=$work/pki ep=$SCHEME://127.0.0.1:${CPORT[n1]} step
  local -a ctl=("$bin/etcdctl" --endpoints "$ep" --cacert "$p/ca.crt" --cert "$p/root.crt" --key "$p/root.key" --command-timeout 10s)
  for step in "user add root --no-password" "user grant-role root root" "role add kube" \
    "role grant-permission kube --prefix=true readwrite /registry/" "role grant-permission kube readwrite compact_rev_key" \
    "user add kube-apiserver --no-password" "user grant-role kube-apiserver kube" "auth enable"; do
    # shellcheck disable=SC2086
    "${ctl[@]}" $step >>"$work/auth.log" 2>&1 || die "etcdctl $step failed (see $work/auth.log)"
  done
  check_fails "with auth on, kube-apiserver's user cannot read outside /registry/" "permission denied" \
    "$bin/etcdctl" --endpoints "$ep" --cacert "$p/ca.crt" --cert "$p/client.crt" --key "$p/client.key" get /outside
  check "root reads anything" "${ctl[@]}" get /outside
  log "auth on: kube-apiserver connects as the user kube-apiserver (role kube: /registry/ and compact_rev_key)"
}

# ---------------------------------------------------------------- assertions
FAILS=()
PASSES=0
pass() { PASSES=$((PASSES + 1)); log "ok   $*"; }
fail() { FAILS+=("[$KVER] $*"); log "FAIL $*"; }
k() { timeout 90 "$KBIN/kubectl" --kubeconfig "$work/kubeconfig" --request-timeout=60s "$@"; }
# shellcheck disable=SC2086
ec() { "$bin/etcdcheck" $ECTLS -endpoints "$ENDPOINTS" "$@"; }
# check DESC CMD...: CMD must succeed
check() { local d=$1 out; shift; if out=$("$@" 2>&1); then pass "$d"; else fail "$d: \`$*\` exited $?: $out"; fi; }
# check_eq DESC WANT CMD...: CMD must succeed and print WANT
check_eq() {
  local d=$1 want=$2 out rc; shift 2
  out=$("$@" 2>&1); rc=$?
  if [ $rc -eq 0 ] && [ "$out" = "$want" ]; then pass "$d"; else fail "$d: \`$*\` exited $rc, want \"$want\", got \"$out\""; fi
}
# check_fails DESC PATTERN CMD...: CMD must fail with output matching PATTERN
check_fails() {
  local d=$1 pat=$2 out rc; shift 2
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -Eq "$pat" <<<"$out"; then pass "$d"; else fail "$d: \`$*\` exited $rc, want failure matching /$pat/, got \"$out\""; fi
}
metric() { k get --raw /metrics 2>/dev/null | grep -E "$1"; }
# raw_pages URL: follows continue tokens, prints "N items in P pages"
raw_pages() {
  local url=$1 cont= items=0 pages=0 page
  while :; do
    # continue pages carry neither resourceVersion nor resourceVersionMatch
    [ -n "$cont" ] && url=$(sed -E 's/&resourceVersion(Match)?=[^&]*//g' <<<"$url")
    page=$(k get --raw "$url${cont:+&continue=$cont}" 2>&1) || { echo "page $((pages + 1)) failed: $page"; return 1; }
    pages=$((pages + 1)); items=$((items + $(jq '.items|length' <<<"$page")))
    cont=$(jq -r '.metadata.continue // empty' <<<"$page")
    [ -z "$cont" ] && break
    [ $pages -ge 100 ] && { echo "more than 100 pages"; return 1; }
  done
  echo "$items items in $pages pages"
}

# ---------------------------------------------------------------- setup
setup() {
  work=$workroot/$KVER
  rm -rf "$work"; mkdir -p "$work/certs"
  local p n
  for p in "${ALLPORTS[@]}" $APIPORT; do
    port_free "$p" || die "port $p is in use"
  done
  [ "$SCHEME" = https ] && make_pki
  for n in "${NODES[@]}"; do start_node "$n"; done
  for n in "${NODES[@]}"; do wait_health "$n" 60 || die "brain cluster did not start"; done
  ec status | sed 's/^/    /'
  [ "$SCHEME" = https ] && enable_auth

  start_apiserver
  pass "kube-apiserver /readyz after ${APIREADY}s"
}

# ---------------------------------------------------------------- scenario
scenario() {
  local ns=e2e-a i out
  check_eq "server version" "$KVER" bash -c "'$KBIN/kubectl' --kubeconfig '$work/kubeconfig' version -o json | jq -r .serverVersion.gitVersion"
  check "livez" k get --raw /livez
  check_eq "default namespace exists" "default" k get ns default -o jsonpath='{.metadata.name}'

  log "== namespaces"
  check "create namespace" k create namespace $ns
  check "label namespace (patch)" k patch namespace $ns --type=merge -p '{"metadata":{"labels":{"e2e":"yes"}}}'
  check_eq "namespace label" "yes" k get ns $ns -o jsonpath='{.metadata.labels.e2e}'
  check "namespace stored in brain" ec get /registry/namespaces/$ns

  log "== configmaps"
  check "create configmap" k -n $ns create configmap c1 --from-literal=a=1
  check_eq "get configmap" "1" k -n $ns get cm c1 -o jsonpath='{.data.a}'
  check "patch configmap (merge)" k -n $ns patch cm c1 --type=merge -p '{"data":{"b":"2"}}'
  check "patch configmap (json)" k -n $ns patch cm c1 --type=json -p '[{"op":"replace","path":"/data/a","value":"10"}]'
  check_eq "configmap after patches" "10 2" k -n $ns get cm c1 -o jsonpath='{.data.a} {.data.b}'
  check "apply configmap (client-side, create)" bash -c "printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c2, namespace: $ns}\ndata: {x: one}\n' | '$KBIN/kubectl' --kubeconfig '$work/kubeconfig' apply -f -"
  check "apply configmap (client-side, update)" bash -c "printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c2, namespace: $ns}\ndata: {x: two}\n' | '$KBIN/kubectl' --kubeconfig '$work/kubeconfig' apply -f -"
  check "apply configmap (server-side)" bash -c "printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c2, namespace: $ns}\ndata: {x: three, z: ssa}\n' | '$KBIN/kubectl' --kubeconfig '$work/kubeconfig' apply --server-side --force-conflicts -f -"
  check_eq "configmap after applies" '{"x":"three","z":"ssa"}' k -n $ns get cm c2 -o jsonpath='{.data}'
  check_fails "create existing configmap conflicts" "AlreadyExists|already exists" k -n $ns create configmap c1
  check_fails "update with stale resourceVersion conflicts" "Conflict|modified" bash -c "'$KBIN/kubectl' --kubeconfig '$work/kubeconfig' -n $ns get cm c1 -o json | jq '.metadata.resourceVersion=\"1\"' | '$KBIN/kubectl' --kubeconfig '$work/kubeconfig' replace -f -"
  check "delete configmap" k -n $ns delete cm c2 --wait=false
  check_fails "deleted configmap is gone" "NotFound" k -n $ns get cm c2

  log "== secrets"
  check "create secret" k -n $ns create secret generic s1 --from-literal=password=hunter2
  check_eq "secret data" "hunter2" bash -c "'$KBIN/kubectl' --kubeconfig '$work/kubeconfig' -n $ns get secret s1 -o jsonpath='{.data.password}' | base64 -d"
  check "secret stored in brain" ec get /registry/secrets/$ns/s1
  check "patch secret" k -n $ns patch secret s1 --type=merge -p '{"stringData":{"user":"root"}}'
  check_eq "patched secret" "root" bash -c "'$KBIN/kubectl' --kubeconfig '$work/kubeconfig' -n $ns get secret s1 -o jsonpath='{.data.user}' | base64 -d"
  check "delete secret" k -n $ns delete secret s1

  log "== deployments"
  check "create deployment" k -n $ns create deployment web --image=registry.k8s.io/pause:3.10 --replicas=2
  check "scale deployment (patch)" k -n $ns patch deployment web --type=merge -p '{"spec":{"replicas":3}}'
  check_eq "deployment replicas" "3" k -n $ns get deploy web -o jsonpath='{.spec.replicas}'
  check "set image (strategic merge patch)" k -n $ns set image deployment/web pause=registry.k8s.io/pause:3.9
  check_eq "deployment image" "registry.k8s.io/pause:3.9" k -n $ns get deploy web -o jsonpath='{.spec.template.spec.containers[0].image}'
  check_eq "deployment generation" "3" k -n $ns get deploy web -o jsonpath='{.metadata.generation}'
  check "delete deployment" k -n $ns delete deployment web

  log "== custom resource definition"
  check "apply CRD" bash -c "'$KBIN/kubectl' --kubeconfig '$work/kubeconfig' apply -f - <<'EOC'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.e2e.brain.io}
spec:
  group: e2e.brain.io
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
              color: {type: string}
EOC"
  check "CRD established" k wait --for=condition=Established crd/widgets.e2e.brain.io --timeout=60s
  # discovery of a new group can lag a moment behind Established
  for i in $(seq 30); do k get widgets -n $ns >/dev/null 2>&1 && break; sleep 1; done
  check "create custom resource" bash -c "printf 'apiVersion: e2e.brain.io/v1\nkind: Widget\nmetadata: {name: w1, namespace: $ns}\nspec: {size: 1, color: red}\n' | '$KBIN/kubectl' --kubeconfig '$work/kubeconfig' create -f -"
  check "patch custom resource" k -n $ns patch widget w1 --type=merge -p '{"spec":{"size":5}}'
  check_eq "custom resource after patch" "5 red" k -n $ns get widget w1 -o jsonpath='{.spec.size} {.spec.color}'
  check "custom resource stored in brain" ec get /registry/e2e.brain.io/widgets/$ns/w1
  check "create second custom resource" bash -c "printf 'apiVersion: e2e.brain.io/v1\nkind: Widget\nmetadata: {name: w2, namespace: $ns}\nspec: {size: 2}\n' | '$KBIN/kubectl' --kubeconfig '$work/kubeconfig' apply --server-side -f -"
  check_eq "list custom resources" "w1 w2" k -n $ns get widgets -o jsonpath='{.items[*].metadata.name}'
  check "delete custom resource" k -n $ns delete widget w1

  log "== paginated lists"
  local pns=e2e-page
  check "create namespace $pns" k create namespace $pns
  check "create 50 configmaps" bash -c "for i in \$(seq -w 1 50); do printf -- '---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: p%s, namespace: $pns}\ndata: {i: \"%s\"}\n' \$i \$i; done | '$KBIN/kubectl' --kubeconfig '$work/kubeconfig' create -f -"
  out=$(k -n $pns get cm --chunk-size=7 -o name -v=6 2>"$work/chunk.log")
  local got pages
  got=$(grep -c '^configmap/p' <<<"$out"); pages=$(grep -c 'limit=7' "$work/chunk.log")
  if [ "$got" = 50 ] && [ "$pages" = 8 ]; then pass "chunked list: 50 items in $pages pages of 7"; else fail "chunked list: got $got items (want 50) in $pages requests with limit=7 (want 8); see $work/chunk.log"; fi
  check_eq "chunked list order" "$(seq -w 1 50 | sed 's/^/configmap\/p/')" k -n $pns get cm --chunk-size=7 -o name
  # a list served from etcd at an exact resourceVersion, paginated
  local rv
  rv=$(k get --raw /api/v1/namespaces/$pns/configmaps | jq -r .metadata.resourceVersion)
  out=$(raw_pages "/api/v1/namespaces/$pns/configmaps?limit=20&resourceVersion=$rv&resourceVersionMatch=Exact")
  if [ "$out" = "50 items in 3 pages" ]; then pass "paginated list at resourceVersion $rv (Exact, from brain): $out"; else fail "paginated list at resourceVersion $rv (Exact): $out"; fi

  log "== watch (kept open through the brain node kill)"
  local wns=e2e-watch
  check "create namespace $wns" k create namespace $wns
  timeout 400 "$KBIN/kubectl" --kubeconfig "$work/kubeconfig" -n $wns get cm --watch --output-watch-events -o json >"$work/watch.json" 2>"$work/watch.err" &
  WATCHPID=$!
  # the same changes seen directly by a brain watch on n2 (not through kube-apiserver)
  "$bin/etcdcheck" $ECTLS -endpoints $SCHEME://127.0.0.1:22379 watch /registry/configmaps/$wns/ 400s >"$work/brainwatch.txt" 2>&1 &
  BWATCHPID=$!
  sleep 3
  check "watched: create w-before" k -n $wns create configmap w-before --from-literal=v=1
  check "watched: patch w-before" k -n $wns patch cm w-before --type=merge -p '{"data":{"v":"2"}}'

  log "== Event with --event-ttl=$event_ttl"
  check "create Event" bash -c "'$KBIN/kubectl' --kubeconfig '$work/kubeconfig' create -f - <<EOE
apiVersion: v1
kind: Event
metadata: {name: ev1, namespace: $ns}
involvedObject: {kind: ConfigMap, name: c1, namespace: $ns, apiVersion: v1}
reason: E2E
message: expires through a lease
type: Normal
EOE"
  check_eq "get Event" "E2E" k -n $ns get event ev1 -o jsonpath='{.reason}'
  out=$(ec get /registry/events/$ns/ev1 2>&1)
  if grep -q 'lease=[1-9a-f]' <<<"$out"; then pass "Event key has a lease: $out"; else fail "Event key has no lease in brain: $out"; fi
  local ev_created=$SECONDS

  log "== kill -9 brain n1 mid-scenario"
  ec status | sed 's/^/    /'
  kill -9 "${PID[n1]}"; wait "${PID[n1]}" 2>/dev/null
  local killed=$SECONDS; KILLED_AT=$(date +%s)
  log "killed n1 (pid ${PID[n1]})"
  for i in $(seq 1 15); do
    check "node down: create k$i" k -n $wns create configmap k$i --from-literal=i=$i
    check_eq "node down: get k$i" "$i" k -n $wns get cm k$i -o jsonpath='{.data.i}'
    check "node down: patch k$i" k -n $wns patch cm k$i --type=merge -p "{\"data\":{\"p\":\"$i\"}}"
    [ $((i % 3)) = 0 ] && check "node down: delete k$i" k -n $wns delete cm k$i
    check "node down: list" k get cm -A -o name
  done
  check "node down: create namespace" k create namespace e2e-down
  check "node down: create deployment" k -n e2e-down create deployment d --image=registry.k8s.io/pause:3.10
  check_eq "node down: chunked list" 50 bash -c "'$KBIN/kubectl' --kubeconfig '$work/kubeconfig' -n $pns get cm --chunk-size=9 -o name | wc -l"
  log "restarting n1 after $((SECONDS - killed))s down"
  start_node n1
  if wait_health n1 90; then pass "n1 healthy again after restart"; else fail "n1 not healthy 90s after restart"; fi
  ec status | sed 's/^/    /'
  check "n1 serves a key written while it was down" "$bin/etcdcheck" $ECTLS -endpoints $SCHEME://127.0.0.1:21379 get /registry/configmaps/$wns/k14
  check_eq "n1 sees a delete made while it was down" 3 bash -c "'$bin/etcdcheck' $ECTLS -endpoints $SCHEME://127.0.0.1:21379 get /registry/configmaps/$wns/k15 >/dev/null; echo \$?"
  for i in $(seq 1 5); do
    check "after restart: create a$i" k -n $wns create configmap a$i --from-literal=i=$i
    check_eq "after restart: get a$i" "$i" k -n $wns get cm a$i -o jsonpath='{.data.i}'
  done
  check "after restart: delete w-before" k -n $wns delete cm w-before
  local wstart=$SECONDS bw_done= kw_done=
  while [ $((SECONDS - wstart)) -lt 90 ]; do
    [ -z "$bw_done" ] && grep -q "^DELETE /registry/configmaps/$wns/w-before " "$work/brainwatch.txt" && bw_done=$((SECONDS - wstart))
    [ -z "$kw_done" ] && jq -r '"\(.type) \(.object.metadata.name)"' <"$work/watch.json" 2>/dev/null | grep -q '^DELETED w-before$' && kw_done=$((SECONDS - wstart))
    [ -n "$bw_done" ] && [ -n "$kw_done" ] && break
    sleep 1
  done
  if [ -n "$bw_done" ] && [ "$bw_done" -le 5 ]; then pass "brain watch on n2 delivered the last delete within ${bw_done}s"; else fail "brain watch on n2 delivered the last delete after ${bw_done:-more than 90}s (write acknowledged at $(date -u -d @$(( $(date +%s) - SECONDS + wstart )) +%T)); tail: $(tail -4 "$work/brainwatch.txt" | tr '\n' ';')"; fi
  if [ -n "$kw_done" ] && [ "$kw_done" -le 5 ]; then pass "kubectl watch delivered the last delete within ${kw_done}s"; else fail "kubectl watch delivered the last delete after ${kw_done:-more than 90}s"; fi
  kill "$WATCHPID" "$BWATCHPID" 2>/dev/null; wait "$WATCHPID" "$BWATCHPID" 2>/dev/null; WATCHPID= BWATCHPID=
  ev=$(grep -E '^(PUT|DELETE) ' "$work/brainwatch.txt" | awk '{print $1, $2}' | sed 's|/registry/configmaps/'$wns'/||')
  if grep -q 'a5$' <<<"$ev" && grep -q 'DELETE w-before' <<<"$ev"; then pass "brain watch on n2 saw the changes after the restart ($(grep -c . <<<"$ev") events)"; else fail "brain watch on n2 missed changes after the restart (within 90s): $(tail -5 "$work/brainwatch.txt" | tr '\n' ';')"; fi
  local want_events ev
  want_events=$(printf '%s\n' "ADDED w-before" "MODIFIED w-before" $(for i in $(seq 1 15); do echo "ADDED_k$i MODIFIED_k$i"; [ $((i % 3)) = 0 ] && echo "DELETED_k$i"; done) $(for i in $(seq 1 5); do echo "ADDED_a$i"; done) "DELETED w-before" | tr _ ' ')
  ev=$(jq -r '"\(.type) \(.object.metadata.name)"' <"$work/watch.json" 2>&1)
  if [ "$ev" = "$want_events" ]; then
    pass "watch saw all $(wc -l <<<"$ev") events in order across the kill and restart"
  else
    fail "watch events differ (want | got):
$(diff <(echo "$want_events") <(echo "$ev") | head -40)
watch stderr: $(head -5 "$work/watch.err")"
  fi
  for n in "${NODES[@]}"; do
    log "    $n: $(curl "${CURLTLS[@]}" -s -m 5 "$SCHEME://127.0.0.1:${CPORT[$n]}/metrics" | grep -E '^brain_watchers ' | tr '\n' ' ')"
  done
  local rvs
  rvs=$(jq -r '.object.metadata.resourceVersion' <"$work/watch.json" | awk 'NR>1 && $1+0<=prev {print "not increasing at line " NR ": " prev " then " $1} {prev=$1+0}')
  if [ -z "$rvs" ]; then pass "watch resourceVersions strictly increase"; else fail "watch resourceVersions: $rvs"; fi

  log "== Event expiry (created $((SECONDS - ev_created))s ago)"
  out=$(ec wait-gone /registry/events/$ns/ev1 120s 2>&1)
  if [ $? -eq 0 ]; then pass "Event expired: $out"; else fail "Event did not expire: $out"; fi
  check_fails "expired Event is NotFound" "NotFound" k -n $ns get event ev1

  log "== compaction by kube-apiserver's compactor (interval $compaction_interval)"
  local deadline=$((SECONDS + 90))
  while :; do
    out=$(ec compaction 2>&1) && break
    [ $SECONDS -ge $deadline ] && break
    sleep 3
  done
  if grep -q 'compacted revision: ' <<<"$out" && ! grep -q 'compacted revision: 1$' <<<"$out"; then pass "brain compacted: $(tr '\n' ' ' <<<"$out")"; else fail "no compaction seen: $out"; fi
  if grep -qE 'compact failed' "$work/kube-apiserver.log"; then
    log "note: kube-apiserver's compactor saw errors (it retries at the next interval):"
    grep -E 'compact failed' "$work/kube-apiserver.log" | head -5 | cut -c1-300 | sed 's/^/    /'
  fi
  check_fails "list at a compacted resourceVersion is 410 Gone" "Expired|too old|410|Gone" k get --raw "/api/v1/namespaces/$pns/configmaps?limit=5&resourceVersion=2&resourceVersionMatch=Exact"

  log "== consistent reads from cache"
  if grep -q 'RequestWatchProgress feature is not supported' "$work/kube-apiserver.log"; then
    fail "kube-apiserver says brain does not support RequestWatchProgress: $(grep 'RequestWatchProgress' "$work/kube-apiserver.log" | head -3)"
  else
    pass "no 'RequestWatchProgress feature is not supported' in the kube-apiserver log"
  fi
  out=$(metric '^kubernetes_feature_enabled\{name="ConsistentListFromCache"')
  if grep -q ' 1$' <<<"$out"; then pass "feature gate on: $out"; else fail "ConsistentListFromCache gate not on: '$out'"; fi
  out=$(grep -E 'RequestWatchProgress|ConsistentListFromCache' "$work/kube-apiserver.log" | head -5)
  [ -n "$out" ] && { log "kube-apiserver log lines on the feature:"; echo "$out" | sed 's/^/    /'; }
  for i in 1 2 3; do k -n $pns get cm >/dev/null 2>&1; done
  out=$(metric '^apiserver_watch_cache_consistent_read_total')
  echo "$out" | sed 's/^/    /'
  if grep -E 'resource="/?configmaps"' <<<"$out" | grep -E 'fallback="false"' | grep -E 'success="true"' | grep -vq ' 0$'; then
    pass "configmap lists were served by consistent reads from the watch cache"
  else
    fail "no successful consistent read from cache for configmaps in apiserver_watch_cache_consistent_read_total"
  fi
  if grep -E 'fallback="true"' <<<"$out" | grep -vq ' 0$'; then
    log "note: some consistent reads fell back to etcd (see above)"
  fi

  rolling_restart

  log "== namespace deletion (no namespace controller runs: finalize by hand)"
  check "delete namespace $ns" k delete namespace $ns --wait=false
  check_eq "namespace terminating" "Terminating" k get ns $ns -o jsonpath='{.status.phase}'
  check "finalize namespace" bash -c "'$KBIN/kubectl' --kubeconfig '$work/kubeconfig' get ns $ns -o json | jq '.spec.finalizers=[]' | '$KBIN/kubectl' --kubeconfig '$work/kubeconfig' replace --raw /api/v1/namespaces/$ns/finalize -f - >/dev/null"
  check_fails "namespace gone" "NotFound" k get ns $ns

  log "== brain log checks"
  for n in "${NODES[@]}"; do
    out=$(grep '"level":"ERROR"' "$work/$n.log" | head -3)
    if [ -z "$out" ]; then pass "no ERROR in brain $n's log"; else fail "brain $n logged $(grep -c '"level":"ERROR"' "$work/$n.log") ERROR lines (kill at $(date -u -d @$KILLED_AT +%T)), first: $out"; fi
  done
  log "== kube-apiserver log checks"
  out=$(grep -E 'too_many_pings' "$work/kube-apiserver.log" | head -3)
  if [ -z "$out" ]; then pass "no GOAWAY too_many_pings from brain"; else fail "brain closed kube-apiserver's gRPC connection with GOAWAY ENHANCE_YOUR_CALM too_many_pings ($(grep -c too_many_pings "$work/kube-apiserver.log") times): $out"; fi
  # Up to the pauses: while a node is paused (SIGSTOP), the watch cache
  # whose stream it serves stalls until it resumes, with etcd too.
  out=$(head -n "${PAUSE_LINE:-999999999}" "$work/kube-apiserver.log" | grep -E 'Too large resource version' | head -5)
  if [ -z "$out" ]; then pass "watch cache never waited in vain for a fresh resourceVersion (before the pauses)"; else fail "watch cache fell behind brain ($(grep -c 'Too large resource version' "$work/kube-apiserver.log") 'Too large resource version' timeouts): $out"; fi
  out=$(tail -n +$((${PAUSE_LINE:-999999999} + 1)) "$work/kube-apiserver.log" | grep -c 'Too large resource version')
  [ "$out" != 0 ] && log "note: $out 'Too large resource version' waits from the pauses on (a paused node stalls the watch streams it serves)"
  out=$(grep -E 'etcd|rpc error' "$work/kube-apiserver.log" | grep -E '^E' | head -20)
  if [ -n "$out" ]; then log "kube-apiserver logged storage errors (first 20):"; echo "$out" | sed 's/^/    /'; fi
}

# rolling_restart: every brain node in turn is stopped (SIGTERM), started
# again and waited for, then every node in turn is paused (SIGSTOP) for 3-6
# s, while kubectl creates and reads ConfigMaps in a loop. An operator's
# rolling upgrade, and VMs paused: kubectl must keep succeeding, and
# kube-apiserver must neither see "no leader" on a watch nor re-list (its
# watch caches are not initialized again: apiserver_watch_cache_initializations_total).
rolling_restart() {
  log "== rolling restart: each brain node stopped, started and healthy in turn, then each paused, under kubectl load"
  local rns=e2e-roll n i before after apiline out ops failures started
  check "create namespace $rns" k create namespace $rns
  before=$(metric '^apiserver_watch_cache_initializations_total' | awk '{s+=$2} END {print s+0}')
  apiline=$(wc -l <"$work/kube-apiserver.log")
  rm -f "$work/roll.stop"
  (
    i=0
    while [ ! -f "$work/roll.stop" ] && [ $i -lt 2000 ]; do
      i=$((i + 1))
      if out=$(k -n $rns create configmap r$i --from-literal=i=$i 2>&1) && out=$(k -n $rns get cm r$i -o name 2>&1); then
        echo "ok r$i"
      else
        echo "FAIL r$i at $(ts): $out"
      fi
    done
  ) >"$work/roll.txt" 2>&1 &
  local loadpid=$!
  # Every second, each node whose watch frontier has held events back for
  # over 2 s (brain_watch_oldest_held_seconds): the diagnostics show them.
  (
    while [ ! -f "$work/roll.stop" ]; do
      for n in "${NODES[@]}"; do
        v=$(curl "${CURLTLS[@]}" -s -m 1 "$SCHEME://127.0.0.1:${CPORT[$n]}/metrics" 2>/dev/null | awk '/^brain_watch_oldest_held_seconds/ {print $2}')
        if [ -n "$v" ] && awk -v v="$v" 'BEGIN {exit !(v > 2)}'; then echo "[$(ts)] $n frontier holding events for ${v}s" >>"$work/phases.txt"; fi
      done
      sleep 1
    done
  ) &
  local samplerpid=$!
  sleep 2
  for n in "${NODES[@]}"; do
    started=$SECONDS
    stop_pid "${PID[$n]}" "brain $n"; wait "${PID[$n]}" 2>/dev/null
    log "stopped brain $n in $((SECONDS - started))s"; echo "[$(ts)] $n stopped" >>"$work/phases.txt"
    start_node "$n"
    started=$SECONDS
    echo "[$(ts)] $n started" >>"$work/phases.txt"
    if wait_health "$n" 30; then pass "rolling restart: $n healthy again within $((SECONDS - started))s"; else fail "rolling restart: $n not healthy 30s after its start"; fi
    sleep 3 # the node takes its leaderships back; the load runs on
  done
  # A VM paused for a live migration: each node stopped (SIGSTOP) for 3-6 s
  # in turn. Requests kube-apiserver had sent it wait, and complete when
  # it resumes, unless their deadline passed meanwhile (kube-apiserver's
  # request to a paused etcd member times out the same way).
  PAUSE_LINE=$(wc -l <"$work/kube-apiserver.log")
  local paused_from
  paused_from=$(wc -l <"$work/roll.txt")
  i=0
  for n in "${NODES[@]}"; do
    i=$((i + 1))
    log "pausing brain $n for $((3 + i % 4))s"; echo "[$(ts)] $n paused for $((3 + i % 4))s" >>"$work/phases.txt"
    kill -STOP "${PID[$n]}"; sleep $((3 + i % 4)); kill -CONT "${PID[$n]}"
    sleep 3
  done
  touch "$work/roll.stop"; wait "$loadpid" "$samplerpid"
  ops=$(grep -c '^ok ' "$work/roll.txt")
  failures=$(head -n "$paused_from" "$work/roll.txt" | grep -c '^FAIL ')
  if [ "$failures" = 0 ] && [ "$ops" -gt 10 ]; then pass "kubectl kept succeeding through the rolling restart ($ops create+get rounds in all)"; else fail "kubectl failed $failures rounds during the rolling restart: $(head -n "$paused_from" "$work/roll.txt" | grep -m3 '^FAIL ' | tr '\n' ';')"; fi
  out=$(tail -n +$((paused_from + 1)) "$work/roll.txt" | grep '^FAIL ' | grep -viE 'timed out|deadline|timeout' | head -3)
  if [ -z "$out" ]; then pass "kubectl failed nothing during the pauses but requests that timed out on the paused node ($(tail -n +$((paused_from + 1)) "$work/roll.txt" | grep -c '^FAIL ') timed out)"; else fail "kubectl during the pauses: $(tr '\n' ';' <<<"$out")"; fi
  after=$(metric '^apiserver_watch_cache_initializations_total' | awk '{s+=$2} END {print s+0}')
  if [ "$before" = "$after" ]; then pass "no watch cache re-listed during the rolling restart (apiserver_watch_cache_initializations_total $after)"; else
    fail "kube-apiserver's watch caches were initialized again (re-listed) during the rolling restart: apiserver_watch_cache_initializations_total $before -> $after"
    roll_diagnostics "$apiline"
  fi
  out=$(tail -n +$((apiline + 1)) "$work/kube-apiserver.log" | grep -E 'no leader|watch ended with error|watch of .* ended with:|watch chan error' | head -5)
  if [ -z "$out" ]; then pass "kube-apiserver logged no 'no leader' and no watch that ended with an error during the rolling restart"; else fail "kube-apiserver during the rolling restart: $out"; fi
  local nl=0 v
  for n in "${NODES[@]}"; do
    v=$(curl "${CURLTLS[@]}" -s -m 5 "$SCHEME://127.0.0.1:${CPORT[$n]}/metrics" | awk '/^brain_no_leader_total/ {s+=$2} END {print s+0}')
    nl=$((nl + ${v%.*}))
  done
  if [ "$nl" = 0 ]; then pass "no brain node refused or cancelled a request or stream for want of a leader (brain_no_leader_total)"; else fail "brain answered 'no leader' $nl times during the rolling restart (brain_no_leader_total)"; fi
}

# roll_diagnostics APILINE: what explains watches that ended during the
# rolling restart (CI shows only the output): the phase log, each brain
# node's watch counters, and the first kube-apiserver and brain warnings.
roll_diagnostics() {
  local n
  log "diagnostics: phases"; sed 's/^/    /' "$work/phases.txt"
  for n in "${NODES[@]}"; do
    log "diagnostics: brain $n watch counters"
    curl "${CURLTLS[@]}" -s -m 5 "$SCHEME://127.0.0.1:${CPORT[$n]}/metrics" |
      grep -E '^brain_(watch_slow_cancellations|watch_storage_catchup|watch_storage_catchups|watch_feed_paused_drops|watch_frontier_revision|watch_oldest_held|watch_partition_closed|no_leader|internal_calls_(broken|resent))' | sed 's/^/    /'
    log "diagnostics: brain $n warnings (first 15)"
    grep -E '"level":"(WARN|ERROR)"' "$work/$n.log" | head -15 | cut -c1-400 | sed 's/^/    /'
  done
  log "diagnostics: kube-apiserver watch errors (first 10)"
  tail -n +$(($1 + 1)) "$work/kube-apiserver.log" | grep -E 'watch|compacted' | head -10 | cut -c1-300 | sed 's/^/    /'
}

# use_given_kube: KBIN and KVER from --kube-apiserver (and --kubectl).
use_given_kube() {
  [ -x "$given_apiserver" ] || die "--kube-apiserver $given_apiserver: not an executable"
  local kubectl=$given_kubectl
  [ -n "$kubectl" ] || kubectl=$(command -v kubectl || true)
  if [ -z "$kubectl" ]; then
    log "no --kubectl and no kubectl on PATH: building kubectl from current/"
    build_kube_tool current kubectl
    kubectl=$KBIN/kubectl
  fi
  [ -x "$kubectl" ] || die "--kubectl $kubectl: not an executable"
  KVER=$("$given_apiserver" --version 2>/dev/null | awk '{print $2}')
  [ -n "$KVER" ] || die "$given_apiserver --version printed no version"
  KBIN=$(mktemp -d)
  ln -s "$(cd "$(dirname "$given_apiserver")" && pwd)/$(basename "$given_apiserver")" "$KBIN/kube-apiserver"
  ln -s "$(cd "$(dirname "$kubectl")" && pwd)/$(basename "$kubectl")" "$KBIN/kubectl"
  log "kube-apiserver $KVER from $given_apiserver, kubectl from $kubectl"
}

# ---------------------------------------------------------------- main
build_brain
rc=0
for v in "${versions[@]}"; do
  if [ "$v" = given ]; then use_given_kube; else build_kube "$v"; fi
  log "===== kube-apiserver $KVER against ${#NODES[@]} brain nodes"
  setup
  scenario
  teardown
  log "== brain storage after the run (mvccscan: version keys without their index key)"
  for n in "${NODES[@]}"; do
    out=$("$bin/mvccscan" "$work/$n.brain/pebble" 2>/dev/null)
    if grep -q ', 0 bad$' <<<"$out"; then pass "$n storage: $(tail -1 <<<"$out")"; else fail "$n storage: $(tail -1 <<<"$out"), e.g. $(grep -m3 ORPHAN <<<"$out" | tr '\n' ';')"; fi
  done
  if [ ${#FAILS[@]} -eq 0 ] && [ "${KEEP:-}" != 1 ]; then rm -rf "$work"; else log "logs and data kept in $work"; fi
done
log "===== $PASSES checks passed, ${#FAILS[@]} failed"
for f in "${FAILS[@]}"; do echo "FAILED: $f"; done
[ ${#FAILS[@]} -eq 0 ]
