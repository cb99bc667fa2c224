# Shared by run.sh and bench.sh: logging, builds of kube-apiserver and
# kubectl, process helpers and the kube-apiserver start. Sourced; expects
# $here (this directory) and $bin (the binary cache).

ts() { date -u +%H:%M:%S; }
log() { echo "[$(ts)] $*"; }
die() { log "FATAL: $*"; exit 1; }

# build_kube DIR: kube-apiserver and kubectl of the version DIR/go.mod pins,
# cached under $bin/<version>/.
build_kube() {
  local dir=$here/$1 ver out
  [ -f "$dir/go.mod" ] || die "no $dir/go.mod (write it with gen-gomod.sh VERSION $1)"
  ver=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$dir/go.mod")
  [ -n "$ver" ] || die "$dir/go.mod does not require k8s.io/kubernetes"
  out=$bin/$ver
  KVER=$ver KBIN=$out
  if [ -x "$out/kube-apiserver" ] && [ -x "$out/kubectl" ]; then
    log "kube-apiserver and kubectl $ver: cached in $out"
    return
  fi
  local minor=${ver#v1.}; minor=${minor%%.*}
  log "building kube-apiserver and kubectl $ver (many minutes on 2 cores; output in $out)"
  mkdir -p "$out"
  local start=$SECONDS
  (cd "$dir" && GOFLAGS=-mod=mod GONOSUMDB=k8s.io go build \
      -ldflags "-X k8s.io/component-base/version.gitVersion=$ver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
      -o "$out/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl) ||
    die "building kube-apiserver/kubectl $ver failed"
  log "built $ver in $((SECONDS - start))s"
}

# build_kube_tool DIR TOOL: one of build_kube's binaries alone (kubectl
# for a given kube-apiserver), cached the same way.
build_kube_tool() {
  local dir=$here/$1 tool=$2 ver out
  ver=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$dir/go.mod")
  out=$bin/$ver KBIN=$bin/$ver
  [ -x "$out/$tool" ] && return
  log "building $tool $ver (minutes on 2 cores)"
  mkdir -p "$out"
  (cd "$dir" && GOFLAGS=-mod=mod GONOSUMDB=k8s.io go build -o "$out/" "k8s.io/kubernetes/cmd/$tool") || die "building $tool $ver failed"
}

port_free() { ! ss -ltnH "sport = :$1" | grep -q .; }

stop_pid() { # PID NAME: SIGTERM, 20s, then SIGKILL
  local p=$1 i
  [ -n "$p" ] && kill -0 "$p" 2>/dev/null || return 0
  kill "$p" 2>/dev/null
  for i in $(seq 40); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.5; done
  log "$2 (pid $p) ignored SIGTERM for 20s; SIGKILL"
  kill -9 "$p" 2>/dev/null
}

# start_apiserver: kube-apiserver $KBIN against $ENDPOINTS on $APIPORT, with
# a service-account key, a token ($TOKEN, in system:masters) and
# $work/kubeconfig, plus the flags in the array APIFLAGS (etcd TLS); waits
# for /readyz and sets APIPID and APIREADY (seconds).
start_apiserver() {
  openssl genrsa -out "$work/sa.key" 2048 2>/dev/null && openssl rsa -in "$work/sa.key" -pubout -out "$work/sa.pub" 2>/dev/null ||
    die "openssl could not make the service-account key"
  TOKEN=e2e-$RANDOM$RANDOM
  local token=$TOKEN
  echo "$token,admin,admin,system:masters" >"$work/tokens.csv"
  cat >"$work/kubeconfig" <<EOK
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster: {server: "https://127.0.0.1:$APIPORT", insecure-skip-tls-verify: true}
users:
- name: admin
  user: {token: "$token"}
contexts:
- name: e2e
  context: {cluster: e2e, user: admin}
current-context: e2e
EOK
  log "starting kube-apiserver $KVER (--etcd-compaction-interval=$compaction_interval --event-ttl=$event_ttl)"
  "$KBIN/kube-apiserver" \
    --etcd-servers="$ENDPOINTS" "${APIFLAGS[@]}" \
    --etcd-compaction-interval="$compaction_interval" \
    --event-ttl="$event_ttl" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port=$APIPORT \
    --cert-dir="$work/certs" \
    --token-auth-file="$work/tokens.csv" \
    --authorization-mode=AlwaysAllow \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$work/sa.pub" \
    --service-account-signing-key-file="$work/sa.key" \
    --service-cluster-ip-range=10.96.0.0/24 \
    --v=2 >"$work/kube-apiserver.log" 2>&1 &
  APIPID=$!
  local deadline=$((SECONDS + 300)) start=$SECONDS
  until curl -skf -m 5 -H "Authorization: Bearer $token" "https://127.0.0.1:$APIPORT/readyz" >/dev/null 2>&1; do
    if ! kill -0 "$APIPID" 2>/dev/null; then tail -40 "$work/kube-apiserver.log"; die "kube-apiserver exited"; fi
    if [ $SECONDS -ge $deadline ]; then
      curl -sk -m 5 -H "Authorization: Bearer $token" "https://127.0.0.1:$APIPORT/readyz?verbose" | grep -v '\[+\]'
      die "kube-apiserver not ready after 300s (log: $work/kube-apiserver.log)"
    fi
    sleep 1
  done
  APIREADY=$((SECONDS - start))
}
