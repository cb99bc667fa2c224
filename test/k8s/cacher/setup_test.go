// Package cacher runs the storage conformance tests of
// k8s.io/apiserver/pkg/storage/testing through kube-apiserver's watch cache
// (k8s.io/apiserver/pkg/storage/cacher) on top of the etcd3 storage,
// against brainnode.
//
// It mirrors k8s.io/apiserver/pkg/storage/cacher/{cacher_test.go,
// cacher_testing_utils_test.go}: the helpers are reproduced here with the
// embedded etcd replaced by a fresh brainnode process per test. Helpers that
// reach into the cacher's unexported state are replaced by equivalents using
// the exported API, or the test is skipped and listed in README.md.
package cacher

import (
	"context"
	"fmt"
	"os"
	"path"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/brainkv/brain/test/k8s/brainproc"
	"github.com/brainkv/brain/test/k8s/internal/brainclient"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

var examplev1ProtoCodec runtime.Codec

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
	utilruntime.Must(metav1.AddMetaToScheme(scheme))
	pb := protobuf.NewSerializer(scheme, scheme)
	examplev1ProtoCodec = codecs.CodecForVersions(pb, pb, schema.GroupVersions{examplev1.SchemeGroupVersion}, nil)
}

func TestMain(m *testing.M) {
	cleanup, err := brainproc.Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// See the etcd3 package: brainnode (etcd 3.6 API) has no RangeStream,
	// and kube-apiserver's process-wide memory of that would make the
	// first test's requests differ from the rest. Run with the gate off,
	// the state kube-apiserver settles in against brainnode.
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(features.EtcdRangeStream): false}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

func newPod() runtime.Object     { return &example.Pod{} }
func newPodList() runtime.Object { return &example.PodList{} }

// pathPrefix is etcd3testing.PathPrefix(): $ETCD_PREFIX or "/registry".
func pathPrefix() string {
	pref := os.Getenv("ETCD_PREFIX")
	if pref == "" {
		pref = "registry"
	}
	return path.Join("/", pref)
}

func computePodKey(obj *example.Pod) string {
	return fmt.Sprintf("/pods/%s/%s", obj.Namespace, obj.Name)
}

// GetPodAttrs returns labels and fields of a given object for filtering purposes.
func GetPodAttrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	pod, ok := obj.(*example.Pod)
	if !ok {
		return nil, nil, fmt.Errorf("not a pod")
	}
	return labels.Set(pod.ObjectMeta.Labels), PodToSelectableFields(pod), nil
}

// PodToSelectableFields returns a field set that represents the object
func PodToSelectableFields(pod *example.Pod) fields.Set {
	podSpecificFieldsSet := make(fields.Set, 5)
	podSpecificFieldsSet["spec.nodeName"] = pod.Spec.NodeName
	podSpecificFieldsSet["spec.restartPolicy"] = string(pod.Spec.RestartPolicy)
	podSpecificFieldsSet["status.phase"] = string(pod.Status.Phase)
	return AddObjectMetaFieldsSet(podSpecificFieldsSet, &pod.ObjectMeta, true)
}

func AddObjectMetaFieldsSet(source fields.Set, objectMeta *metav1.ObjectMeta, hasNamespaceField bool) fields.Set {
	source["metadata.name"] = objectMeta.Name
	if hasNamespaceField {
		source["metadata.namespace"] = objectMeta.Namespace
	}
	return source
}

func checkStorageInvariants(ctx context.Context, t *testing.T, key string) {
	// No-op function since cacher simply passes object creation to the underlying storage.
}

func checkStorageCalls(t *testing.T, pageSize, estimatedProcessedObjects uint64) {
	// No-op function for now, since cacher passes pagination calls to underlying storage.
}

// env is what upstream reaches through *CacheDelegator's unexported fields
// and the EtcdTestServer.
type env struct {
	client    *kubernetes.Client
	cacher    *cacher.Cacher
	delegator *cacher.CacheDelegator
	// etcdStorage is the etcd3 store under the cacher (upstream:
	// delegator.storage, reached through StorageInjectingListErrors).
	etcdStorage storage.Interface
	// hasCompactor: the cacher runs its compactor (ListFromCacheSnapshot
	// was enabled when it was created).
	hasCompactor bool
}

// compactStore is upstream's compactStore. Upstream ends by calling the
// cacher compactor's unexported compactIfNeeded, which compacts the watch
// cache's snapshot storage and records the revision. Here the same
// snapshot compaction is done with the exported Cacher.Compact, and the
// recorded revision (CacheDelegator.CompactRevision) is awaited from the
// compactor's own 15s poll.
func compactStore(e *env) storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		versioner := storage.APIObjectVersioner{}
		rv, err := versioner.ParseResourceVersion(resourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		var currentVersion int64
		currentVersion, _, _, err = etcd3.Compact(ctx, e.client.Client, currentVersion, int64(rv))
		if err != nil {
			_, _, _, err = etcd3.Compact(ctx, e.client.Client, currentVersion, int64(rv))
		}
		if err != nil {
			t.Fatal(err)
		}
		// Wait for compaction to be observed.
		if e.hasCompactor {
			waitFor(ctx, t, 30*time.Second, func() bool { return e.etcdStorage.CompactRevision() == int64(rv) },
				func() string {
					return fmt.Sprintf("etcd3 store CompactRevision()=%d, want %d", e.etcdStorage.CompactRevision(), rv)
				})
			if err := e.cacher.Compact(resourceVersion); err != nil {
				t.Fatal(err)
			}
			waitFor(ctx, t, 30*time.Second, func() bool { return e.delegator.CompactRevision() == int64(rv) },
				func() string {
					return fmt.Sprintf("cacher CompactRevision()=%d, want %d", e.delegator.CompactRevision(), rv)
				})
		}
	}
}

func waitFor(ctx context.Context, t *testing.T, timeout time.Duration, cond func() bool, msg func() string) {
	t.Helper()
	deadline := time.After(timeout)
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-deadline:
			t.Fatalf("timed out after %v: %s", timeout, msg())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func increaseRVFunc(client *clientv3.Client) storagetesting.IncreaseRVFunc {
	return func(ctx context.Context, t *testing.T) int64 {
		resp, err := client.KV.Put(ctx, "increaseRV", "ok")
		if err != nil {
			t.Fatalf("Could not update increaseRV: %v", err)
		}
		return resp.Header.Revision
	}
}

// ===================================================
// Test-setup related function are following.
// ===================================================

type setupOptions struct {
	resourcePrefix string
	keyFunc        func(runtime.Object) (string, error)
	indexerFuncs   map[string]storage.IndexerFunc
	indexers       cache.Indexers
	clock          clock.WithTicker
	codec          runtime.Codec
	transformer    value.Transformer
}

type setupOption func(*setupOptions)

func withDefaults(options *setupOptions) {
	prefix := "/pods/"

	options.resourcePrefix = prefix
	options.keyFunc = func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc(prefix, obj) }
	options.clock = clock.RealClock{}
	options.codec = examplev1ProtoCodec
	options.transformer = identity.NewEncryptCheckTransformer()
}

func withClusterScopedKeyFunc(options *setupOptions) {
	options.keyFunc = func(obj runtime.Object) (string, error) {
		return storage.NoNamespaceKeyFunc(options.resourcePrefix, obj)
	}
}

// mirror indexer configuration from pkg/registry/core/pod/strategy.go
func withNodeNameAndNamespaceIndex(options *setupOptions) {
	options.indexerFuncs = map[string]storage.IndexerFunc{
		"spec.nodeName": func(obj runtime.Object) string {
			pod, ok := obj.(*example.Pod)
			if !ok {
				return ""
			}
			return pod.Spec.NodeName
		},
	}
	options.indexers = map[string]cache.IndexFunc{
		"f:spec.nodeName": func(obj interface{}) ([]string, error) {
			pod := obj.(*example.Pod)
			return []string{pod.Spec.NodeName}, nil
		},
		"f:metadata.namespace": func(obj interface{}) ([]string, error) {
			pod := obj.(*example.Pod)
			return []string{pod.ObjectMeta.Namespace}, nil
		},
	}
}

func withCodec(codec runtime.Codec) setupOption {
	return func(options *setupOptions) {
		options.codec = codec
	}
}

func withTransformer(transformer value.Transformer) setupOption {
	return func(options *setupOptions) {
		options.transformer = transformer
	}
}

// newEtcdTestStorageWithOptions is upstream's, on brainnode.
func newEtcdTestStorageWithOptions(t testing.TB, prefix string, codec runtime.Codec, transformer value.Transformer) (*kubernetes.Client, storage.Interface) {
	client := brainclient.RunBrain(t, brainproc.Options{})
	versioner := storage.APIObjectVersioner{}
	compactor := etcd3.NewCompactor(client.Client, 0, clock.RealClock{}, nil)
	t.Cleanup(compactor.Stop)
	s, err := etcd3.New(
		client,
		compactor,
		codec,
		newPod,
		newPodList,
		prefix,
		"/pods/",
		schema.GroupResource{Resource: "pods"},
		transformer,
		etcd3.NewDefaultLeaseManagerConfig(),
		etcd3.NewDefaultDecoder(codec, versioner),
		versioner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	brainclient.WaitForRequestWatchProgressSupport(t)
	return client, s
}

func testSetup(t *testing.T, opts ...setupOption) (context.Context, *cacher.CacheDelegator, func()) {
	ctx, e, tearDown := testSetupWithEtcdServer(t, opts...)
	return ctx, e.delegator, tearDown
}

func testSetupWithEtcdServer(t testing.TB, opts ...setupOption) (context.Context, *env, func()) {
	setupOpts := setupOptions{}
	opts = append([]setupOption{withDefaults}, opts...)
	for _, opt := range opts {
		opt(&setupOpts)
	}

	client, etcdStorage := newEtcdTestStorageWithOptions(t, pathPrefix(), setupOpts.codec, setupOpts.transformer)
	// Inject one list error to make sure we test the relist case.
	listErrors := 1
	if clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) {
		// The WatchListClient feature changes the reflector to use WATCH
		// instead of LIST, therefore we don't expect any errors
		listErrors = 0
	}
	wrappedStorage := &storagetesting.StorageInjectingListErrors{
		Interface: etcdStorage,
		Errors:    listErrors,
	}

	config := cacher.Config{
		Storage:             wrappedStorage,
		Versioner:           storage.APIObjectVersioner{},
		GroupResource:       schema.GroupResource{Resource: "pods"},
		EventsHistoryWindow: cacher.DefaultEventFreshDuration,
		ResourcePrefix:      setupOpts.resourcePrefix,
		KeyFunc:             setupOpts.keyFunc,
		GetAttrsFunc:        GetPodAttrs,
		NewFunc:             newPod,
		NewListFunc:         newPodList,
		IndexerFuncs:        setupOpts.indexerFuncs,
		Indexers:            &setupOpts.indexers,
		Codec:               setupOpts.codec,
		Clock:               setupOpts.clock,
	}
	hasCompactor := utilfeature.DefaultFeatureGate.Enabled(features.ListFromCacheSnapshot)
	c, err := cacher.NewCacherFromConfig(config)
	if err != nil {
		t.Fatalf("Failed to initialize cacher: %v", err)
	}
	ctx := context.Background()

	// Since some tests depend on the fact that GetList shouldn't fail,
	// we wait until the error from the underlying storage is consumed.
	if err := wait.PollInfinite(100*time.Millisecond, wrappedStorage.ErrorsConsumed); err != nil {
		t.Fatalf("Failed to inject list errors: %v", err)
	}

	// The tests assume that Get/GetList/Watch calls shouldn't fail.
	// However, 429 error can now be returned if watchcache is under initialization.
	// To avoid rewriting all tests, we wait for watchcache to initialize.
	if err := c.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	delegator := cacher.NewCacheDelegator(c, wrappedStorage)
	terminate := func() {
		delegator.Stop()
		c.Stop()
	}
	// Upstream leaves calling terminate to the test (and one test forgets);
	// stopping twice is safe, so always stop before the node goes away.
	t.Cleanup(terminate)

	return ctx, &env{client: client, cacher: c, delegator: delegator, etcdStorage: etcdStorage, hasCompactor: hasCompactor}, terminate
}

func testSetupWithEtcdAndCreateWrapper(t *testing.T, opts ...setupOption) (storage.Interface, func()) {
	_, e, tearDown := testSetupWithEtcdServer(t, opts...)

	return &createWrapper{CacheDelegator: e.delegator}, tearDown
}

type createWrapper struct {
	*cacher.CacheDelegator
}

func (c *createWrapper) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	if err := c.CacheDelegator.Create(ctx, key, obj, out, ttl); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, wait.ForeverTestTimeout, true, func(ctx context.Context) (bool, error) {
		currentObj := newPod() // upstream: c.CacheDelegator.cacher.newFunc()
		err := c.CacheDelegator.Get(ctx, key, storage.GetOptions{ResourceVersion: "0"}, currentObj)
		if err != nil {
			if storage.IsNotFound(err) {
				return false, nil
			}
			return false, err
		}
		if !apiequality.Semantic.DeepEqual(currentObj, out) {
			return false, nil
		}
		return true, nil
	})
}
