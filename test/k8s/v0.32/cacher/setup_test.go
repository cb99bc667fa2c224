// Package cacher runs the storage conformance tests of k8s.io/apiserver
// v0.32's pkg/storage/testing through kube-apiserver's watch cache
// (k8s.io/apiserver/pkg/storage/cacher) on top of the etcd3 storage,
// against brainnode.
//
// It mirrors v0.32's k8s.io/apiserver/pkg/storage/cacher/{cacher_test.go,
// cacher_testing_utils_test.go}: the helpers are reproduced here with the
// embedded etcd replaced by a fresh brainnode process per test. Helpers that
// reach into the cacher's unexported state are replaced by equivalents using
// the exported API, or the test is skipped and listed in ../../README.md.
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

	"k8s.io/apimachinery/pkg/api/apitesting"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	example2v1 "k8s.io/apiserver/pkg/apis/example2/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/brainkv/brain/test/k8s/brainproc"
	"github.com/brainkv/brain/test/k8s/v0.32/internal/brainclient"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))
	utilruntime.Must(example2v1.AddToScheme(scheme))
}

func TestMain(m *testing.M) {
	cleanup, err := brainproc.Setup()
	if err != nil {
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
// (k8s.io/apiserver/pkg/storage/etcd3/testing is not imported: it pulls in
// the embedded etcd server.)
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

// compactStorage is upstream's compactStorage (cacher_testing_utils_test.go)
// without the part that needs the cacher's unexported state. Upstream:
//
//  1. waits until the watch cache has caught up to the revision
//     (c.watchCache.waitUntilFreshAndBlock);
//  2. under the cacher's locks, drops the watch cache's event history up to
//     the revision (c.watchCache.startIndex) and sets its
//     listResourceVersion to it;
//  3. puts compact_rev_key (one more revision in etcd) and compacts etcd at
//     the revision.
//
// Here 1 is done by polling the watch cache's revision (waitCacheAt), and
// 3 as upstream. 2 has no exported
// equivalent and is left out: it only changes which old resourceVersions a
// watch on the cacher may start from. The list tests that use this
// (RunTestList, RunTestConsistentList, RunTestGetListNonRecursive) use the
// compaction for the revision bump and never watch; TestWatchFromZero,
// whose second half checks exactly that a watch from a truncated history
// fails, runs without it (see cacher_test.go and README.md).
func compactStorage(c *cacher.Cacher, client *clientv3.Client) storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		versioner := storage.APIObjectVersioner{}
		rv, err := versioner.ParseResourceVersion(resourceVersion)
		if err != nil {
			t.Fatal(err)
		}

		if err := waitCacheAt(ctx, c, rv); err != nil {
			t.Fatalf("WatchCache didn't caught up to RV: %v: %v", rv, err)
		}

		if _, err = client.KV.Put(ctx, "compact_rev_key", resourceVersion); err != nil {
			t.Fatalf("Could not update compact_rev_key: %v", err)
		}
		if _, err = client.Compact(ctx, int64(rv)); err != nil {
			t.Fatalf("Could not compact: %v", err)
		}
	}
}

// waitCacheAt waits, as upstream's waitUntilFreshAndBlock does, until the
// watch cache has caught up to rv, by listing from the cache (RV "0": the
// cache's own revision, no wait) until it reports rv or later. It must not
// ask the store for progress the way a Get at rv does with
// ConsistentListFromCache on: a RequestProgress still in flight when the
// test writes compact_rev_key would be answered at that newer revision,
// and "Non-consistent list before sync" (RunTestConsistentList) would see
// it in the cache, where upstream's passive wait leaves the cache at rv.
func waitCacheAt(ctx context.Context, c *cacher.Cacher, rv uint64) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	versioner := storage.APIObjectVersioner{}
	for {
		list := &example.PodList{}
		if err := c.GetList(ctx, "/pods/compaction-wait/", storage.ListOptions{ResourceVersion: "0", Predicate: storage.Everything, Recursive: true}, list); err != nil {
			return err
		}
		at, err := versioner.ParseResourceVersion(list.ResourceVersion)
		if err != nil {
			return err
		}
		if at >= rv {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("watch cache at %d: %w", at, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// ===================================================
// Test-setup related function are following.
// ===================================================

type tearDownFunc func()

type setupOptions struct {
	resourcePrefix string
	keyFunc        func(runtime.Object) (string, error)
	indexerFuncs   map[string]storage.IndexerFunc
	indexers       cache.Indexers
	clock          clock.WithTicker
}

type setupOption func(*setupOptions)

func withDefaults(options *setupOptions) {
	prefix := "/pods"

	options.resourcePrefix = prefix
	options.keyFunc = func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc(prefix, obj) }
	options.clock = clock.RealClock{}
}

func withClusterScopedKeyFunc(options *setupOptions) {
	options.keyFunc = func(obj runtime.Object) (string, error) {
		return storage.NoNamespaceKeyFunc(options.resourcePrefix, obj)
	}
}

func withSpecNodeNameIndexerFuncs(options *setupOptions) {
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
	}
}

// newEtcdTestStorage is upstream's, on brainnode. It returns the client
// (upstream: the EtcdTestServer, whose only field is the client).
func newEtcdTestStorage(t testing.TB, prefix string) (*kubernetes.Client, storage.Interface) {
	client := brainclient.RunBrain(t, brainproc.Options{})
	versioner := storage.APIObjectVersioner{}
	codec := apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)
	storage := etcd3.New(
		client,
		codec,
		newPod,
		newPodList,
		prefix,
		"/pods",
		schema.GroupResource{Resource: "pods"},
		identity.NewEncryptCheckTransformer(),
		etcd3.NewDefaultLeaseManagerConfig(),
		etcd3.NewDefaultDecoder(codec, versioner),
		versioner)
	brainclient.WaitForRequestWatchProgressSupport(t)
	return client, storage
}

func testSetup(t *testing.T, opts ...setupOption) (context.Context, *cacher.Cacher, tearDownFunc) {
	ctx, cacher, _, tearDown := testSetupWithEtcdServer(t, opts...)
	return ctx, cacher, tearDown
}

func testSetupWithEtcdServer(t testing.TB, opts ...setupOption) (context.Context, *cacher.Cacher, *kubernetes.Client, tearDownFunc) {
	setupOpts := setupOptions{}
	opts = append([]setupOption{withDefaults}, opts...)
	for _, opt := range opts {
		opt(&setupOpts)
	}

	client, etcdStorage := newEtcdTestStorage(t, pathPrefix())
	// Inject one list error to make sure we test the relist case.
	wrappedStorage := &storagetesting.StorageInjectingListErrors{
		Interface: etcdStorage,
		Errors:    1,
	}

	config := cacher.Config{
		Storage:        wrappedStorage,
		Versioner:      storage.APIObjectVersioner{},
		GroupResource:  schema.GroupResource{Resource: "pods"},
		ResourcePrefix: setupOpts.resourcePrefix,
		KeyFunc:        setupOpts.keyFunc,
		GetAttrsFunc:   GetPodAttrs,
		NewFunc:        newPod,
		NewListFunc:    newPodList,
		IndexerFuncs:   setupOpts.indexerFuncs,
		Indexers:       &setupOpts.indexers,
		Codec:          codecs.LegacyCodec(examplev1.SchemeGroupVersion),
		Clock:          setupOpts.clock,
	}
	c, err := cacher.NewCacherFromConfig(config)
	if err != nil {
		t.Fatalf("Failed to initialize cacher: %v", err)
	}
	ctx := context.Background()
	// Upstream: cacher.Stop(); server.Terminate(t) (a no-op).
	terminate := func() {
		c.Stop()
	}
	// Upstream leaves calling terminate to the test (and one test forgets);
	// stopping twice is safe, so always stop before the node goes away.
	t.Cleanup(terminate)

	// Since some tests depend on the fact that GetList shouldn't fail,
	// we wait until the error from the underlying storage is consumed.
	if err := wait.PollInfinite(100*time.Millisecond, wrappedStorage.ErrorsConsumed); err != nil {
		t.Fatalf("Failed to inject list errors: %v", err)
	}

	if utilfeature.DefaultFeatureGate.Enabled(features.ResilientWatchCacheInitialization) {
		// The tests assume that Get/GetList/Watch calls shouldn't fail.
		// However, 429 error can now be returned if watchcache is under initialization.
		// To avoid rewriting all tests, we wait for watchcache to initialize.
		if err := c.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}

	return ctx, c, client, terminate
}

func testSetupWithEtcdAndCreateWrapper(t *testing.T, opts ...setupOption) (storage.Interface, tearDownFunc) {
	_, c, _, tearDown := testSetupWithEtcdServer(t, opts...)

	if !utilfeature.DefaultFeatureGate.Enabled(features.ResilientWatchCacheInitialization) {
		// upstream: cacher.ready.wait, which is what Cacher.Wait does.
		if err := c.Wait(context.TODO()); err != nil {
			t.Fatalf("unexpected error waiting for the cache to be ready")
		}
	}
	return &createWrapper{Cacher: c}, tearDown
}

type createWrapper struct {
	*cacher.Cacher
}

func (c *createWrapper) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	if err := c.Cacher.Create(ctx, key, obj, out, ttl); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, wait.ForeverTestTimeout, true, func(ctx context.Context) (bool, error) {
		currentObj := newPod() // upstream: c.Cacher.newFunc()
		err := c.Cacher.Get(ctx, key, storage.GetOptions{ResourceVersion: "0"}, currentObj)
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
