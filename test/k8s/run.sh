#!/usr/bin/env bash
# Runs kube-apiserver's storage conformance tests (k8s.io/apiserver
# pkg/storage/testing, through the etcd3 store and the watch cache) against
# brainnode. Builds brainnode from this checkout first.
#
#   test/k8s/run.sh                  # everything
#   test/k8s/run.sh -run 'TestWatch' # extra args go to "go test"
#
# Environment:
#   TEST_TIMEOUT  per-package "go test -timeout" (default 15m)
#   BRAINNODE     use this brainnode binary instead of building one
#   LOG           also write the full test output here
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export GOWORK=off

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

if [[ -z "${BRAINNODE:-}" ]]; then
	echo "==> building brainnode"
	(cd "$root" && go build -o "$tmp/brainnode" ./cmd/brainnode)
	export BRAINNODE="$tmp/brainnode"
fi

echo "==> go test (BRAINNODE=$BRAINNODE)"
log="${LOG:-$tmp/test.log}"
start=$(date +%s)
cd "$here"
set +e
go test -count=1 -v -timeout "${TEST_TIMEOUT:-15m}" ./... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
end=$(date +%s)

echo
echo "==> summary ($((end - start))s)"
for state in PASS FAIL SKIP; do
	printf '%s: %s\n' "$state" "$(grep -a -c -E -- "^\s*--- $state:" "$log" || true)"
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
exit "$rc"
