#!/usr/bin/env bash
# Runs kube-apiserver's storage conformance tests (k8s.io/apiserver
# pkg/storage/testing, through the etcd3 store and the watch cache) against
# brainnode, for the newest and the oldest supported kube-apiserver release:
# the module in this directory (k8s.io/apiserver v0.37) and the one in
# ./v0.32 (k8s.io/apiserver v0.32). Builds brainnode from this checkout first.
#
#   test/k8s/run.sh                  # both releases, on 1 node and on 3-node clusters
#   test/k8s/run.sh -run 'TestWatch' # extra args go to "go test" (in every module)
#
# Environment:
#   TOPOLOGIES    cluster sizes to run the suite on (default "1 3"); each
#                 test starts its own cluster of that many brainnodes
#   VERSIONS      kube-apiserver releases to run (default "v0.37 v0.32")
#   TEST_TIMEOUT  per-package "go test -timeout" (default 30m)
#   BRAINNODE     use this brainnode binary instead of building one
#   LOG           also write the full test output here (one file per
#                 release and topology: LOG.v0.37.1, LOG.v0.32.1, LOG.v0.37.3, ...)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# Every module here is built on its own (go.mod, go.sum and replace
# directives); a go.work above the repository must not merge them.
export GOWORK=off

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# module_dir VERSION: the module that runs kube-apiserver VERSION's suite.
module_dir() {
	case "$1" in
	v0.37) echo "$here" ;;
	v0.32) echo "$here/v0.32" ;;
	*)
		echo "unknown version $1 (known: v0.37 v0.32)" >&2
		return 1
		;;
	esac
}

versions=(${VERSIONS:-v0.37 v0.32})
for v in "${versions[@]}"; do
	module_dir "$v" >/dev/null
done

if [[ -z "${BRAINNODE:-}" ]]; then
	echo "==> building brainnode"
	(cd "$root" && go build -o "$tmp/brainnode" ./cmd/brainnode)
	export BRAINNODE="$tmp/brainnode"
fi

status=0
recap=()
run_module() {
	local version=$1 nodes=$2
	shift 2
	local dir log apiserver rc start end counts count state
	dir="$(module_dir "$version")"
	log="${LOG:-$tmp/test.log}.$version.$nodes"
	apiserver="$(cd "$dir" && go list -m -f '{{.Version}}' k8s.io/apiserver)"
	echo "==> k8s.io/apiserver $apiserver: go test on $nodes node(s) per test (BRAINNODE=$BRAINNODE)"
	start=$(date +%s)
	cd "$dir"
	set +e
	BRAIN_K8S_NODES=$nodes go test -count=1 -v -timeout "${TEST_TIMEOUT:-30m}" ./... "$@" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
	set -e
	end=$(date +%s)

	echo
	echo "==> summary, k8s.io/apiserver $apiserver, $nodes node(s) per test ($((end - start))s)"
	counts=""
	for state in PASS FAIL SKIP; do
		count=$(grep -a -c -E -- "^\s*--- $state:" "$log" || true)
		printf '%s: %s\n' "$state" "$count"
		counts+="$state: $count  "
	done
	# With several packages "go test -v" prints each package's output in one
	# block ending with its "ok"/"FAIL" line: attribute results to packages.
	results() {
		awk -v want="$1" '
			$0 ~ "^[ \t]*--- " want ":" { sub(/^[ \t]*--- [A-Z]+: /, ""); buf[n++] = $0; next }
			/^(ok|FAIL)[ \t]+github\.com\// { pkg = $2; sub(/.*\/test\/k8s\//, "", pkg); for (i = 0; i < n; i++) print "  " pkg ": " buf[i]; n = 0 }
			END { for (i = 0; i < n; i++) print "  ?: " buf[i] }
		' "$log"
	}
	if grep -a -q -E -- "^\s*--- SKIP:" "$log"; then
		echo "skipped (reasons in README.md):"
		results SKIP
	fi
	if grep -a -q -E -- "^\s*--- FAIL:" "$log"; then
		echo "failed:"
		results FAIL
	fi
	if [[ $rc -ne 0 ]]; then
		status=$rc
		counts+="(go test exit status $rc)"
	fi
	recap+=("k8s.io/apiserver $apiserver, $nodes node(s): $counts($((end - start))s)")
	echo
}
for n in ${TOPOLOGIES:-1 3}; do
	for v in "${versions[@]}"; do
		run_module "$v" "$n" "$@"
	done
done
echo "==> all runs"
printf '%s\n' "${recap[@]}"
exit "$status"
