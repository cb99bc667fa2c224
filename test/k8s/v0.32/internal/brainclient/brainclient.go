// Package brainclient connects kube-apiserver 1.32's etcd client to
// brainnodes started by the shared brainproc module, the way
// k8s.io/apiserver v0.32's tests connect it to an embedded etcd.
package brainclient

import (
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/kubernetes"

	"k8s.io/apiserver/pkg/storage"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"

	"github.com/brainkv/brain/test/k8s/brainproc"
)

// RunBrain starts a brainnode (a cluster of $BRAIN_K8S_NODES) for t and
// returns kube-apiserver's etcd client for it, like v0.32's
// k8s.io/apiserver/pkg/storage/etcd3/testserver.RunEtcd does for an
// embedded etcd (v0.32 wraps the client in no request recorders; the tests
// that count requests wrap client.KV themselves).
func RunBrain(t testing.TB, opts brainproc.Options) *kubernetes.Client {
	t.Helper()
	return brainproc.Start(t, opts).NewClient(t)
}

// WaitForRequestWatchProgressSupport waits (up to 10s) for kube-apiserver's
// process-wide etcd feature checker to decide that the endpoints support
// RequestWatchProgress. etcd3.New starts that check in the background (with
// ConsistentListFromCache or WatchList on, both default in 1.32) from the
// version brainnode reports in Status; the watch cache serves consistent
// reads and watch-list streams only once it is known. Upstream tests race
// with the check; waiting makes the first test of a process deterministic.
// If the check does not come out positive the test is not failed here: the
// tests that depend on it report it.
func WaitForRequestWatchProgressSupport(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RequestWatchProgress) {
		if time.Now().After(deadline) {
			t.Logf("RequestWatchProgress still not reported as supported after 10s (brainnode's Status version must be >= 3.4.31 and not 3.5.0-3.5.12)")
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
