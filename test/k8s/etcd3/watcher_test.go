package etcd3

// The tests below mirror k8s.io/apiserver/pkg/storage/etcd3/watcher_test.go
// (TestWatch and its subtests) with the embedded etcd replaced by brainnode.

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/sharding"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
)

func TestWatch(t *testing.T) {
	t.Run("Watch", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestWatch(ctx, t, store)
	})
	t.Run("ClusterScopedWatch", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestClusterScopedWatch(ctx, t, store)
	})
	t.Run("NamespaceScopedWatch", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestNamespaceScopedWatch(ctx, t, store)
	})
	t.Run("DeleteTriggerWatch", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestDeleteTriggerWatch(ctx, t, store)
	})
	t.Run("WatchFromZero", func(t *testing.T) {
		ctx, store, client := testSetup(t)
		storagetesting.RunTestWatchFromZero(ctx, t, store, compactStorage(store, client.Client))
	})
	t.Run("WatchFromNonZero", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestWatchFromNonZero(ctx, t, store)
	})
	t.Run("DelayedWatchDelivery", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestDelayedWatchDelivery(ctx, t, store)
	})
	t.Run("WatchError", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestWatchError(ctx, t, &storeWithPrefixTransformer{store})
	})
	t.Run("WatchContextCancel", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestWatchContextCancel(ctx, t, store)
	})
	t.Run("WatcherTimeout", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestWatcherTimeout(ctx, t, store)
	})
	t.Run("WatchDeleteEventObjectHaveLatestRV", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestWatchDeleteEventObjectHaveLatestRV(ctx, t, store)
	})
	t.Run("WatchInitializationSignal", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunTestWatchInitializationSignal(ctx, t, store)
	})
	t.Run("ProgressNotify", func(t *testing.T) {
		// upstream: clusterConfig.WatchProgressNotifyInterval = time.Second
		ctx, store, client := testSetup(t, withWatchProgressNotifyInterval(time.Second))

		storagetesting.RunOptionalTestProgressNotify(ctx, t, store, increaseRVFunc(client.Client))
	})
	t.Run("WatchWithUnsafeDelete", func(t *testing.T) {
		featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.AllowUnsafeMalformedObjectDeletion, true)
		ctx, store, _ := testSetup(t)
		corruptErr := newCorruptObjectError()
		storagetesting.RunTestWatchWithUnsafeDelete(ctx, t, &storeWithTransformerOverride{Interface: store, store: store}, corruptErr)
	})
	t.Run("WatchDispatchBookmarkEvents", func(t *testing.T) {
		// upstream: clusterConfig.WatchProgressNotifyInterval = time.Second
		ctx, store, _ := testSetup(t, withWatchProgressNotifyInterval(time.Second))

		storagetesting.RunTestWatchDispatchBookmarkEvents(ctx, t, store, false)
	})
	t.Run("SendInitialEventsBackwardCompatibility", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunSendInitialEventsBackwardCompatibility(ctx, t, store)
	})
	for _, rangeStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("RangeStream=%v", rangeStream), func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.EtcdRangeStream, rangeStream)
			t.Run("WatchSemantics", func(t *testing.T) {
				ctx, store, _ := testSetup(t)
				storagetesting.RunWatchSemantics(ctx, t, store)
			})
			t.Run("WatchSemanticsWithConcurrentDecode", func(t *testing.T) {
				featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ConcurrentWatchObjectDecode, true)
				ctx, store, _ := testSetup(t)
				storagetesting.RunWatchSemantics(ctx, t, store)
			})
			t.Run("WatchSemanticInitialEventsExtended", func(t *testing.T) {
				ctx, store, _ := testSetup(t)
				storagetesting.RunWatchSemanticInitialEventsExtended(ctx, t, store)
			})
			t.Run("WatchListMatchSingle", func(t *testing.T) {
				ctx, store, _ := testSetup(t)
				storagetesting.RunWatchListMatchSingle(ctx, t, store)
			})
		})
	}
	t.Run("WatchErrorEventIsBlockingFurtherEvent", func(t *testing.T) {
		ctx, store, _ := testSetup(t)
		storagetesting.RunWatchErrorIsBlockingFurtherEvents(ctx, t, &storeWithPrefixTransformer{store})
	})
}

func TestWatchWithShardSelector(t *testing.T) {
	// The shard [boundary, 2^64) contains exactly the higher of the two UID hashes.
	uidA, uidB := "uid-a", "uid-b"
	hashA, hashB := "0x"+sharding.HashField(uidA), "0x"+sharding.HashField(uidB)
	inShardUID, outOfShardUID, boundary := uidA, uidB, hashA
	if sharding.HexLess(hashA, hashB) {
		inShardUID, outOfShardUID, boundary = uidB, uidA, hashB
	}
	shardSelector := sharding.NewSelector(sharding.ShardRangeRequirement{
		Key:   "object.metadata.uid",
		Start: boundary,
		End:   "0x10000000000000000",
	})

	newPod := func(name, uid string) *example.Pod {
		return &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "test-ns", UID: types.UID(uid)}}
	}
	expectAddedEvent := func(t *testing.T, w watch.Interface, name string) {
		t.Helper()
		select {
		case event := <-w.ResultChan():
			if event.Type != watch.Added {
				t.Fatalf("expected %s event, got %s", watch.Added, event.Type)
			}
			pod, ok := event.Object.(*example.Pod)
			if !ok {
				t.Fatalf("expected *example.Pod, got %T", event.Object)
			}
			if pod.Name != name {
				t.Fatalf("expected event for pod %q, got %q", name, pod.Name)
			}
		case <-time.After(wait.ForeverTestTimeout):
			t.Fatalf("timed out waiting for event for pod %q", name)
		}
	}

	testCases := []struct {
		name                  string
		gateEnabled           bool
		expectOutOfShardEvent bool
	}{
		{
			name:                  "gate enabled filters out-of-shard events",
			gateEnabled:           true,
			expectOutOfShardEvent: false,
		},
		{
			name:                  "gate disabled ignores the shard selector",
			gateEnabled:           false,
			expectOutOfShardEvent: true,
		},
	}
	for _, tc := range testCases {
		t.Run(tc.name, func(t *testing.T) {
			featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.ShardedListAndWatch, tc.gateEnabled)
			ctx, store, _ := testSetup(t)

			marker := &example.Pod{}
			if err := store.Create(ctx, "/pods/test-ns/marker", newPod("marker", "uid-marker"), marker, 0); err != nil {
				t.Fatalf("Create marker failed: %v", err)
			}

			w, err := store.Watch(ctx, "/pods", storage.ListOptions{
				ResourceVersion: marker.ResourceVersion,
				Recursive:       true,
				Predicate: storage.SelectionPredicate{
					Label:         labels.Everything(),
					Field:         fields.Everything(),
					GetAttrs:      storage.DefaultNamespaceScopedAttr,
					ShardSelector: shardSelector,
				},
			})
			if err != nil {
				t.Fatalf("Watch failed: %v", err)
			}
			defer w.Stop()

			// pod-out is created first so that receiving pod-in's event first
			// proves pod-out's event was filtered rather than still in flight.
			if err := store.Create(ctx, "/pods/test-ns/pod-out", newPod("pod-out", outOfShardUID), &example.Pod{}, 0); err != nil {
				t.Fatalf("Create pod-out failed: %v", err)
			}
			if err := store.Create(ctx, "/pods/test-ns/pod-in", newPod("pod-in", inShardUID), &example.Pod{}, 0); err != nil {
				t.Fatalf("Create pod-in failed: %v", err)
			}

			if tc.expectOutOfShardEvent {
				expectAddedEvent(t, w, "pod-out")
			}
			expectAddedEvent(t, w, "pod-in")
		})
	}
}
