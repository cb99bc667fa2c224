package etcd3

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

// TestRangeStreamFallback is upstream's TestGetListStreamFallsBackToPaginated
// without the fake KV: with EtcdRangeStream on (the 1.37 default) the
// store's first list tries RangeStream, brainnode must answer
// codes.Unimplemented (as etcd < 3.7 does), and the store must serve the
// list with paginated Range calls and stop trying RangeStream.
func TestRangeStreamFallback(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, true)
	resetFeatureSupportCheckerDuringTest(t)

	ctx, store, client := testSetup(t)
	kvRecorder := client.KV.(*storagetesting.KVRecorder)
	const n = 25
	for i := range n {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("pod-%02d", i)}}
		if err := store.Create(ctx, computePodKey(pod), pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	kvRecorder.GetReadsAndReset()
	kvRecorder.GetStreamReadsAndReset()

	out := &example.PodList{}
	if err := store.GetList(ctx, "/pods/", storage.ListOptions{Predicate: storage.Everything, Recursive: true}, out); err != nil {
		t.Fatalf("GetList failed: %v", err)
	}
	if len(out.Items) != n {
		t.Errorf("returned %d items, want %d", len(out.Items), n)
	}
	if got := kvRecorder.GetStreamReadsAndReset(); got != 1 {
		t.Errorf("expected one RangeStream attempt, got %d", got)
	}
	if got := kvRecorder.GetReadsAndReset(); got == 0 {
		t.Error("expected the paginated Range path to serve the list after the fallback")
	}
	if etcdfeature.DefaultFeatureSupportChecker.Supports(storage.RangeStream) {
		t.Error("expected RangeStream to be marked unsupported after brainnode's answer (want codes.Unimplemented)")
	}

	// The feature is marked unsupported, so later lists do not retry it.
	out = &example.PodList{}
	if err := store.GetList(ctx, "/pods/", storage.ListOptions{Predicate: storage.Everything, Recursive: true}, out); err != nil {
		t.Fatalf("GetList failed: %v", err)
	}
	if len(out.Items) != n {
		t.Errorf("returned %d items, want %d", len(out.Items), n)
	}
	if got := kvRecorder.GetStreamReadsAndReset(); got != 0 {
		t.Errorf("expected no further RangeStream attempts after the fallback, got %d", got)
	}
}
