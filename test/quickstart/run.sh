#!/usr/bin/env bash
# Follows the README literally: runs the commands of its sections
# "Set-up: two commands" (the first one: the single node), "Using it with
# etcdctl", "As processes" and "Growing a single node", extracted from
# README.md (its indented code blocks), in a copy of the repository, in
# order. Then checks what a user would see: the data written in the
# quickstart is on the grown cluster, and every node answers.
#
#   test/quickstart/run.sh            (about 3 minutes; KEEP=1 keeps the work dir)
#
# How commands run: a command that starts a node (brainnode without a
# subcommand, in the foreground) runs in the background, after the node
# started before on the same client port is stopped (as a user would press
# Ctrl-C); any other command must succeed, and is retried for up to 240 s
# while the nodes it talks to start; an "etcdctl watch" runs for 5 s.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export PATH="/usr/local/go/bin:$PATH" GOTOOLCHAIN=local
work=$(mktemp -d /tmp/brain-quickstart.XXXXXX)
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
die() { log "FAIL: $*"; for f in "$work"/node-*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }

# The repository as a user's clone has it (tracked files only).
(cd "$root" && git ls-files -z | tar --null -T - -cf -) | tar -C "$work" -xf - || die "copying the repository"
cd "$work" || exit 1

# extract SECTION...: the code blocks of those sections, one logical
# command per output record (continuation lines joined; a for..done loop
# kept whole), records separated by NUL.
extract() {
  awk -v want="$(printf '%s\n' "$@")" '
    BEGIN { n = split(want, w, "\n"); for (i = 1; i <= n; i++) if (w[i] != "") sections[w[i]] = 1 }
    /^#+ / { title = $0; sub(/^#+ /, "", title); active = (title in sections); next }
    !active { next }
    /^    / {
      line = substr($0, 5)
      if (cmd != "") cmd = cmd "\n" line; else cmd = line
      if (line ~ /^for /) loop = 1
      if (line ~ /\\$/) next
      if (loop && line !~ /^done/) next
      printf "%s%c", cmd, 0; cmd = ""; loop = 0
    }
  ' README.md
}

declare -A portpgid # client port -> process group of the node started on it
pgids=()
cleanup() {
  for g in "${pgids[@]}"; do kill -TERM -- "-$g" 2>/dev/null; done
  sleep 1
  for g in "${pgids[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
  if [ "${KEEP:-}" = 1 ] || [ "${failed:-1}" = 1 ]; then log "work dir kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
shopt -s expand_aliases

is_node_start() { # a brainnode without a subcommand, in the foreground
  local c=$1
  [[ $c != *'&' ]] || return 1
  [[ $c =~ ^(go\ run\ \./cmd/brainnode|\./brainnode)($|\ --) ]]
}

client_port() {
  local c=$1
  if [[ $c =~ --listen-client-urls\ http://127\.0\.0\.1:([0-9]+) ]]; then echo "${BASH_REMATCH[1]}"; else echo 2379; fi
}

run_cmd() {
  local c=$1 n=$2
  log "\$ ${c//$'\n'/$'\n    '}"
  if is_node_start "$c"; then
    local port; port=$(client_port "$c")
    if [ -n "${portpgid[$port]:-}" ]; then
      log "  (stopping the node started before on port $port)"
      kill -TERM -- "-${portpgid[$port]}" 2>/dev/null
      for _ in $(seq 100); do kill -0 -- "-${portpgid[$port]}" 2>/dev/null || break; sleep 0.1; done
    fi
    setsid bash -c "$c" >"node-$n.log" 2>&1 &
    portpgid[$port]=$! pgids+=($!)
    disown $!
    return
  fi
  if [[ $c == for\ * ]]; then # a loop that starts nodes in the background
    setsid bash -c "$c" >"node-$n.log" 2>&1 &
    pgids+=($!)
    wait $! || die "command failed: $c"
    return
  fi
  if [[ $c =~ ^alias\ ([A-Za-z0-9_-]+)=\'([^\']*)\'$ ]]; then
    eval "$c"
    # The same for commands run under timeout, where aliases do not apply.
    mkdir -p .quickstart-bin
    printf '#!/usr/bin/env bash\nexec %s "$@"\n' "${BASH_REMATCH[2]}" >".quickstart-bin/${BASH_REMATCH[1]}"
    chmod +x ".quickstart-bin/${BASH_REMATCH[1]}"
    export PATH="$work/.quickstart-bin:$PATH"
    return
  fi
  local deadline=$((SECONDS + 240)) out rc
  while :; do
    if [[ $c == *"etcdctl watch"* ]]; then
      out=$(eval "timeout 5 $c" 2>&1); rc=$?
      [ $rc -eq 124 ] && rc=0
    else
      out=$(eval "$c" 2>&1); rc=$?
    fi
    [ $rc -eq 0 ] && break
    [ $SECONDS -lt $deadline ] || die "command failed (exit $rc): $c"$'\n'"$out"
    sleep 1
  done
  [ -n "$out" ] && printf '%s\n' "$out" | head -12 | sed 's/^/    /'
}

n=0
while IFS= read -r -d '' c; do
  n=$((n + 1))
  run_cmd "$c" "$n"
done < <(extract "Set-up: two commands" | head -z -n 1; extract "Using it with etcdctl" "As processes" "Growing a single node")
[ $n -gt 10 ] || die "only $n commands extracted from README.md"

log "== what the user should see"
ec() { go tool etcdctl "$@"; }
expect() { # DESCRIPTION COMMAND...: retried for 60 s (nodes may still be joining)
  local d=$1 deadline=$((SECONDS + 60)) out; shift
  until out=$("$@" 2>&1); do
    [ $SECONDS -lt $deadline ] || die "$d: $out"
    sleep 1
  done
  log "ok   $d"
}
read_hello() { [ "$(ec --endpoints 127.0.0.1:52379 get /registry/configmaps/default/x --print-value-only)" = hello ]; }
started() { [ "$(ec --endpoints "$1" member list | grep -c started)" = "$2" ]; }
put_all() { for ep in 127.0.0.1:12379 127.0.0.1:22379 127.0.0.1:32379 127.0.0.1:42379; do ec --endpoints "$ep" put "/check/$ep" v || return 1; done; }
expect "the key written in the quickstart is read through the node that joined the single node" read_hello
expect "the grown single node lists 2 started members" started 127.0.0.1:2379 2
expect "the 3-node cluster and the node that joined it list 4 started members" started 127.0.0.1:12379 4
expect "every node of the process cluster takes writes" put_all
failed=0
log "quickstart passed ($n README commands)"
