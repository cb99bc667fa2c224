package cacher

// The tests below mirror k8s.io/apiserver/pkg/storage/cacher/cacher_test.go
// (same names, same arguments) with the embedded etcd replaced by brainnode.

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"

	"github.com/brainkv/brain/test/k8s/internal/failing"
)

// disabledUpstream marks tests that upstream's cacher_test.go declares but
// leaves empty ("TODO(#109831): Enable use of this test and run it."):
// kube-apiserver does not run them against the watch cache either. They
// run against the plain etcd3 store in ../etcd3.
func disabledUpstream(t *testing.T) {
	t.Helper()
	t.Skip("SKIP(disabled upstream): empty in k8s.io/apiserver/pkg/storage/cacher/cacher_test.go (TODO(#109831)); runs against the etcd3 store in ../etcd3")
}

func TestCreate(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestCreate(ctx, t, cacher, checkStorageInvariants)
}

func TestCreateWithTTL(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestCreateWithTTL(ctx, t, cacher)
}

func TestCreateWithKeyExist(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestCreateWithKeyExist(ctx, t, cacher)
}

func TestGet(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestGet(ctx, t, cacher)
}

func TestUnconditionalDelete(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestUnconditionalDelete(ctx, t, cacher)
}

func TestConditionalDelete(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestConditionalDelete(ctx, t, cacher)
}

func TestDeleteWithSuggestion(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestDeleteWithSuggestion(ctx, t, cacher)
}

func TestDeleteWithSuggestionAndConflict(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestDeleteWithSuggestionAndConflict(ctx, t, cacher)
}

func TestDeleteWithSuggestionOfDeletedObject(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestDeleteWithSuggestionOfDeletedObject(ctx, t, cacher)
}

func TestValidateDeletionWithSuggestion(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestValidateDeletionWithSuggestion(ctx, t, cacher)
}

func TestValidateDeletionWithOnlySuggestionValid(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestValidateDeletionWithOnlySuggestionValid(ctx, t, cacher)
}

func TestDeleteWithConflict(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestDeleteWithConflict(ctx, t, cacher)
}

func TestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)

	transformer := &failing.Transformer{Transformer: identity.NewEncryptCheckTransformer()}
	ctx, s, _ := testSetup(t, withTransformer(transformer))

	storagetesting.RunTestDeleteWithConflictAndMissingExpectedTransformOrDecodeError(ctx, t, s, transformer.SetFailing)
}

func TestDeleteWithConflictAndExpectedTransformError(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)

	transformer := &failing.Transformer{Transformer: identity.NewEncryptCheckTransformer()}
	ctx, cacher, terminate := testSetup(t, withTransformer(transformer))
	t.Cleanup(terminate)

	storagetesting.RunTestDeleteExpectedTransformOrDecodeError(ctx, t, cacher, transformer.SetFailing)
}

func TestDeleteWithConflictAndExpectedDecodeError(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)

	// Decode errors cause a panic when they occur during tests. Disable for this particular
	// test since it is deliberately exercising a case where the stored bytes cannot be decoded.
	etcd3.TestOnlySetFatalOnDecodeError(t, false)

	codec := &failing.Codec{Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)}
	ctx, cacher, terminate := testSetup(t, withCodec(codec))
	t.Cleanup(terminate)

	storagetesting.RunTestDeleteExpectedTransformOrDecodeError(ctx, t, cacher, codec.SetFailing)
}

func TestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)

	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestDeleteWithSuggestionAndMissingExpectedTransformOrDecodeError(ctx, t, cacher)
}

func TestPreconditionalDeleteWithSuggestion(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestPreconditionalDeleteWithSuggestion(ctx, t, cacher)
}

func TestPreconditionalDeleteWithSuggestionPass(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestPreconditionalDeleteWithOnlySuggestionPass(ctx, t, cacher)
}

func TestListPaging(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestListPaging(ctx, t, cacher)
}

func TestLists(t *testing.T) {
	for _, listFromCacheSnapshot := range []bool{true, false} {
		t.Run(fmt.Sprintf("ListFromCacheSnapshot=%v", listFromCacheSnapshot), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, listFromCacheSnapshot)
			t.Run("List", func(t *testing.T) {
				t.Parallel()
				ctx, e, terminate := testSetupWithEtcdServer(t)
				t.Cleanup(terminate)
				storagetesting.RunTestList(ctx, t, e.delegator, compactStore(e), true, e.client.Kubernetes.(*storagetesting.KubernetesRecorder))
			})

			t.Run("ConsistentList", func(t *testing.T) {
				t.Parallel()
				ctx, e, terminate := testSetupWithEtcdServer(t)
				t.Cleanup(terminate)
				storagetesting.RunTestConsistentList(ctx, t, e.delegator, increaseRVFunc(e.client.Client), true, true, listFromCacheSnapshot)
			})

			t.Run("GetListNonRecursive", func(t *testing.T) {
				t.Parallel()
				ctx, e, terminate := testSetupWithEtcdServer(t)
				t.Cleanup(terminate)
				storagetesting.RunTestGetListNonRecursive(ctx, t, increaseRVFunc(e.client.Client), e.delegator)
			})
		})
	}
}

func TestCompactRevision(t *testing.T) {
	// Test requires store to observe extenal changes to compaction revision, requiring dedicated watch on compact key which is enabled by ListFromCacheSnapshot.
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
	ctx, e, terminate := testSetupWithEtcdServer(t)
	t.Cleanup(terminate)
	storagetesting.RunTestCompactRevision(ctx, t, e.delegator, increaseRVFunc(e.client.Client), compactStore(e))
}

// TestMarkConsistent is upstream's (implementation-specific, but it only
// needs the exported API): which lists the watch cache sends to etcd.
func TestMarkConsistent(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ListFromCacheSnapshot, true)
	ctx, e, terminate := testSetupWithEtcdServer(t)
	t.Cleanup(terminate)
	cacher := e.delegator
	recorder := e.client.Kubernetes.(*storagetesting.KubernetesRecorder)

	t.Log("New cache collects snapshots, list skips etcd")
	resourceVersion1 := createObject(t, ctx, cacher)
	etcdRequests := etcdListRequests(t, ctx, cacher, recorder, storage.ListOptions{
		Predicate:            storage.Everything,
		ResourceVersionMatch: metav1.ResourceVersionMatchExact,
		ResourceVersion:      resourceVersion1,
		Recursive:            true,
	})
	if len(etcdRequests) != 0 {
		t.Errorf("Expected no requests to etcd, got: %+v", etcdRequests)
	}

	t.Log("Inconsistent cache clears old snapshots, list hits etcd")
	e.cacher.MarkConsistent(false)
	etcdRequests = etcdListRequests(t, ctx, cacher, recorder, storage.ListOptions{
		Predicate:            storage.Everything,
		ResourceVersionMatch: metav1.ResourceVersionMatchExact,
		ResourceVersion:      resourceVersion1,
		Recursive:            true,
	})
	if len(etcdRequests) != 1 {
		t.Errorf("Expected request to etcd, got: %+v", etcdRequests)
	}

	t.Log("Inconsistent cache doesn't collect new snapshot, list hits etcd")
	resourceVersion2 := createObject(t, ctx, cacher)
	etcdRequests = etcdListRequests(t, ctx, cacher, recorder, storage.ListOptions{
		Predicate:            storage.Everything,
		ResourceVersionMatch: metav1.ResourceVersionMatchExact,
		ResourceVersion:      resourceVersion2,
		Recursive:            true,
	})
	if len(etcdRequests) != 1 {
		t.Errorf("Expected request to etcd, got: %+v", etcdRequests)
	}

	t.Log("Marking cache consistent allows it to collect new snapshots, list skips etcd")
	e.cacher.MarkConsistent(true)
	resourceVersion3 := createObject(t, ctx, cacher)
	etcdRequests = etcdListRequests(t, ctx, cacher, recorder, storage.ListOptions{
		Predicate:            storage.Everything,
		ResourceVersionMatch: metav1.ResourceVersionMatchExact,
		ResourceVersion:      resourceVersion3,
		Recursive:            true,
	})
	if len(etcdRequests) != 0 {
		t.Errorf("Expected no requests to etcd, got: %+v", etcdRequests)
	}
}

func createObject(t *testing.T, ctx context.Context, store storage.Interface) string {
	var out example.Pod
	pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: rand.String(10)}}
	err := store.Create(ctx, computePodKey(pod), pod, &out, 0)
	if err != nil {
		t.Fatal(err)
	}
	return out.ResourceVersion
}

func etcdListRequests(t *testing.T, ctx context.Context, store storage.Interface, recorder *storagetesting.KubernetesRecorder, opts storage.ListOptions) []storagetesting.RecordedList {
	key := rand.String(10)
	listCtx := context.WithValue(ctx, storagetesting.RecorderContextKey, key)
	listOut := &example.PodList{}
	if err := store.GetList(listCtx, "/pods/", opts, listOut); err != nil {
		t.Fatalf("Unexpected error: %v", err)
	}
	return recorder.ListRequestForKey(key)
}

func TestGetListRecursivePrefix(t *testing.T) {
	ctx, store, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestGetListRecursivePrefix(ctx, t, store)
}

func TestListContinuation(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestListContinuation(ctx, t, cacher, checkStorageCalls)
}

func TestListPaginationRareObject(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestListPaginationRareObject(ctx, t, cacher, checkStorageCalls)
}

func TestListContinuationWithFilter(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestListContinuationWithFilter(ctx, t, cacher, checkStorageCalls)
}

func TestListInconsistentContinuation(t *testing.T) {
	// TODO(#109831): Enable use of this by setting compaction.
	disabledUpstream(t)
}

func TestListResourceVersionMatch(t *testing.T) {
	// TODO(#109831): Enable use of this test and run it.
	disabledUpstream(t)
}

func TestNamespaceScopedList(t *testing.T) {
	ctx, cacher, terminate := testSetup(t, withNodeNameAndNamespaceIndex)
	t.Cleanup(terminate)
	storagetesting.RunTestNamespaceScopedList(ctx, t, cacher)
}

func TestGuaranteedUpdate(t *testing.T) {
	// TODO(#109831): Enable use of this test and run it.
	disabledUpstream(t)
}

func TestGuaranteedUpdateWithTTL(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestGuaranteedUpdateWithTTL(ctx, t, cacher)
}

func TestGuaranteedUpdateChecksStoredData(t *testing.T) {
	// TODO(#109831): Enable use of this test and run it.
	disabledUpstream(t)
}

func TestGuaranteedUpdateWithConflict(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestGuaranteedUpdateWithConflict(ctx, t, cacher)
}

func TestGuaranteedUpdateWithSuggestionAndConflict(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestGuaranteedUpdateWithSuggestionAndConflict(ctx, t, cacher)
}

func TestTransformationFailure(t *testing.T) {
	// TODO(#109831): Enable use of this test and run it.
	disabledUpstream(t)
}

func TestStats(t *testing.T) {
	for _, sizeBasedListCostEstimate := range []bool{true, false} {
		t.Run(fmt.Sprintf("SizeBasedListCostEstimate=%v", sizeBasedListCostEstimate), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.SizeBasedListCostEstimate, sizeBasedListCostEstimate)
			ctx, cacher, terminate := testSetup(t)
			t.Cleanup(terminate)
			storagetesting.RunTestStats(ctx, t, cacher, examplev1ProtoCodec, identity.NewEncryptCheckTransformer(), sizeBasedListCostEstimate)
		})
	}
}

func TestKeySchema(t *testing.T) {
	ctx, cacher, terminate := testSetup(t)
	t.Cleanup(terminate)
	storagetesting.RunTestKeySchema(ctx, t, cacher)
}

func TestWatch(t *testing.T) {
	t.Run("Watch", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunTestWatch(ctx, t, cacher)
	})
	t.Run("WatchFromZero", func(t *testing.T) {
		// Upstream passes compactWatch, which truncates the watch cache's
		// event history by writing the cacher's unexported fields
		// (watchCache.history.startIndex, watchCache.storage) under its
		// locks; the exported API has no way to drop history. Without a
		// compaction callback the RunTest runs everything up to the
		// compaction step against brainnode and then skips the rest.
		t.Log("SKIP(needs cacher internals) after the first half: compactWatch truncates the watch cache's unexported history; the compaction half runs against the etcd3 store in ../etcd3 (TestWatch/WatchFromZero)")
		ctx, cacher, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunTestWatchFromZero(ctx, t, cacher, nil)
	})
	t.Run("DeleteTriggerWatch", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunTestDeleteTriggerWatch(ctx, t, cacher)
	})
	t.Run("WatchFromNonZero", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunTestWatchFromNonZero(ctx, t, cacher)
	})
	t.Run("DelayedWatchDelivery", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunTestDelayedWatchDelivery(ctx, t, cacher)
	})
	t.Run("WatchError", func(t *testing.T) {
		// TODO(#109831): Enable use of this test and run it.
		disabledUpstream(t)
	})
	t.Run("WatchContextCancel", func(t *testing.T) {
		// TODO(#109831): Enable use of this test and run it.
		disabledUpstream(t)
	})
	t.Run("WatcherTimeout", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunTestWatcherTimeout(ctx, t, cacher)
	})
	t.Run("WatchDeleteEventObjectHaveLatestRV", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV(ctx, t, cacher)
	})
	t.Run("WatchInitializationSignal", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunTestWatchInitializationSignal(ctx, t, cacher)
	})
	t.Run("ClusterScopedWatch", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t, withClusterScopedKeyFunc, withNodeNameAndNamespaceIndex)
		t.Cleanup(terminate)
		storagetesting.RunTestClusterScopedWatch(ctx, t, cacher)
	})
	t.Run("NamespaceScopedWatch", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t, withNodeNameAndNamespaceIndex)
		t.Cleanup(terminate)
		storagetesting.RunTestNamespaceScopedWatch(ctx, t, cacher)
	})
	t.Run("WatchDispatchBookmarkEvents", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunTestWatchDispatchBookmarkEvents(ctx, t, cacher, true)
	})
	t.Run("WatchBookmarksWithCorrectResourceVersion", func(t *testing.T) {
		ctx, cacher, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunTestOptionalWatchBookmarksWithCorrectResourceVersion(ctx, t, cacher)
	})
	t.Run("SendInitialEventsBackwardCompatibility", func(t *testing.T) {
		ctx, store, terminate := testSetup(t)
		t.Cleanup(terminate)
		storagetesting.RunSendInitialEventsBackwardCompatibility(ctx, t, store)
	})
	t.Run("WatchSemantics", func(t *testing.T) {
		store, terminate := testSetupWithEtcdAndCreateWrapper(t)
		t.Cleanup(terminate)
		storagetesting.RunWatchSemantics(context.TODO(), t, store)
	})
	t.Run("WatchSemanticInitialEventsExtended", func(t *testing.T) {
		store, terminate := testSetupWithEtcdAndCreateWrapper(t)
		t.Cleanup(terminate)
		storagetesting.RunWatchSemanticInitialEventsExtended(context.TODO(), t, store)
	})
	t.Run("WatchListMatchSingle", func(t *testing.T) {
		store, terminate := testSetupWithEtcdAndCreateWrapper(t)
		t.Cleanup(terminate)
		storagetesting.RunWatchListMatchSingle(context.TODO(), t, store)
	})
}
