// Package etcd3 runs the storage conformance tests of
// k8s.io/apiserver v0.32's pkg/storage/testing through the etcd3 storage of
// k8s.io/apiserver/pkg/storage/etcd3 against brainnode.
//
// It mirrors v0.32's k8s.io/apiserver/pkg/storage/etcd3/{store,watcher,
// linearized_read}_test.go: the test helpers are reproduced here (test files
// cannot be imported) with the embedded etcd replaced by a fresh brainnode
// process per test.
package etcd3

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"google.golang.org/grpc/grpclog"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/etcd3"
	storagetesting "k8s.io/apiserver/pkg/storage/testing"
	"k8s.io/apiserver/pkg/storage/value"

	"github.com/brainkv/brain/test/k8s/brainproc"
	"github.com/brainkv/brain/test/k8s/v0.32/internal/brainclient"
)

var scheme = runtime.NewScheme()
var codecs = serializer.NewCodecFactory(scheme)

const defaultTestPrefix = "test!"

func init() {
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
	utilruntime.Must(example.AddToScheme(scheme))
	utilruntime.Must(examplev1.AddToScheme(scheme))

	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
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

func newPod() runtime.Object {
	return &example.Pod{}
}

func newPodList() runtime.Object {
	return &example.PodList{}
}

// testStore is the store under test (etcd3.New's storage.Interface; its
// *store type is unexported) with the parts of upstream's *store that
// upstream tests read directly.
type testStore struct {
	storage.Interface
	codec       runtime.Codec
	transformer *swapTransformer
}

// swapTransformer is the transformer given to etcd3.New. Upstream tests
// replace the store's (and its watcher's) transformer field; from outside
// the package the same effect is had by swapping what this delegates to.
type swapTransformer struct {
	mu  sync.RWMutex
	cur value.Transformer
}

func (s *swapTransformer) get() value.Transformer {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur
}

func (s *swapTransformer) set(t value.Transformer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = t
}

func (s *swapTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return s.get().TransformFromStorage(ctx, data, dataCtx)
}

func (s *swapTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return s.get().TransformToStorage(ctx, data, dataCtx)
}

// prefixTransformer returns the storagetesting.PrefixTransformer the store
// was set up with (upstream: store.transformer.(*PrefixTransformer)).
func (s *testStore) prefixTransformer() *storagetesting.PrefixTransformer {
	return s.transformer.get().(*storagetesting.PrefixTransformer)
}

type storeWithPrefixTransformer struct {
	*testStore
}

func (s *storeWithPrefixTransformer) UpdatePrefixTransformer(modifier storagetesting.PrefixTransformerModifier) func() {
	originalTransformer := s.transformer.get().(*storagetesting.PrefixTransformer)
	transformer := *originalTransformer
	s.transformer.set(modifier(&transformer))
	return func() {
		s.transformer.set(originalTransformer)
	}
}

// corruptedTransformer fails every read with "bits flipped". Upstream's
// returns &corruptObjectError{err: fmt.Errorf("bits flipped"), errType:
// untransformable} (an unexported type). The store here comes from
// etcd3.New, which, with AllowUnsafeMalformedObjectDeletion on (as in the
// only test using it), wraps its transformer in
// etcd3.WithCorruptObjErrorHandlingTransformer: that turns this error into
// exactly upstream's value.
type corruptedTransformer struct {
	value.Transformer
}

func (f *corruptedTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) (out []byte, stale bool, err error) {
	return nil, true, fmt.Errorf("bits flipped")
}

type storeWithCorruptedTransformer struct {
	*testStore
}

func (s *storeWithCorruptedTransformer) CorruptTransformer() func() {
	ct := &corruptedTransformer{Transformer: s.transformer.get()}
	s.transformer.set(ct)
	return func() {
		s.transformer.set(ct.Transformer)
	}
}

func checkStorageInvariants(etcdClient *clientv3.Client, codec runtime.Codec) storagetesting.KeyValidation {
	return func(ctx context.Context, t *testing.T, key string) {
		getResp, err := etcdClient.KV.Get(ctx, key)
		if err != nil {
			t.Fatalf("etcdClient.KV.Get failed: %v", err)
		}
		if len(getResp.Kvs) == 0 {
			t.Fatalf("expecting non empty result on key: %s", key)
		}
		decoded, err := runtime.Decode(codec, getResp.Kvs[0].Value[len(defaultTestPrefix):])
		if err != nil {
			t.Fatalf("expecting successful decode of object from %v\n%v", err, string(getResp.Kvs[0].Value))
		}
		obj := decoded.(*example.Pod)
		if obj.ResourceVersion != "" {
			t.Errorf("stored object should have empty resource version")
		}
		if obj.SelfLink != "" {
			t.Errorf("stored output should have empty selfLink")
		}
	}
}

func checkStorageCallsInvariants(transformer *storagetesting.PrefixTransformer, recorder *clientRecorder) storagetesting.CallsValidation {
	// maxLimit is etcd3's unexported maxLimit.
	const maxLimit = 10000
	return func(t *testing.T, pageSize, estimatedProcessedObjects uint64) {
		if reads := transformer.GetReadsAndReset(); reads != estimatedProcessedObjects {
			t.Errorf("unexpected reads: %d, expected: %d", reads, estimatedProcessedObjects)
		}
		estimatedGetCalls := uint64(1)
		if pageSize != 0 {
			// We expect that kube-apiserver will be increasing page sizes
			// if not full pages are received, so we should see significantly less
			// than 1000 pages (which would be result of talking to etcd with page size
			// copied from pred.Limit).
			// The expected number of calls is n+1 where n is the smallest n so that:
			// pageSize + pageSize * 2 + pageSize * 4 + ... + pageSize * 2^n >= podCount.
			// For pageSize = 1, podCount = 1000, we get n+1 = 10, 2 ^ 10 = 1024.
			currLimit := pageSize
			for sum := uint64(1); sum < estimatedProcessedObjects; {
				currLimit *= 2
				if currLimit > maxLimit {
					currLimit = maxLimit
				}
				sum += currLimit
				estimatedGetCalls++
			}
		}
		if reads := recorder.GetReadsAndReset(); reads != estimatedGetCalls {
			t.Fatalf("unexpected reads: %d, want: %d", reads, estimatedGetCalls)
		}
	}
}

func compactStorage(etcdClient *clientv3.Client) storagetesting.Compaction {
	return func(ctx context.Context, t *testing.T, resourceVersion string) {
		versioner := storage.APIObjectVersioner{}
		rv, err := versioner.ParseResourceVersion(resourceVersion)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err = compact(ctx, etcdClient, 0, int64(rv)); err != nil {
			t.Fatalf("Unable to compact, %v", err)
		}
	}
}

// compactRevKey is etcd3's unexported compactRevKey.
const compactRevKey = "compact_rev_key"

// compact is a copy of v0.32 etcd3's unexported compact (compact.go),
// which upstream's compactStorage calls: it compacts etcd store and
// returns current rev. It will return the current compact time and global
// revision if no error occurred. Note that CAS fail will not incur any
// error.
func compact(ctx context.Context, client *clientv3.Client, t, rev int64) (int64, int64, error) {
	resp, err := client.KV.Txn(ctx).If(
		clientv3.Compare(clientv3.Version(compactRevKey), "=", t),
	).Then(
		clientv3.OpPut(compactRevKey, strconv.FormatInt(rev, 10)), // Expect side effect: increment Version
	).Else(
		clientv3.OpGet(compactRevKey),
	).Commit()
	if err != nil {
		return t, rev, err
	}

	curRev := resp.Header.Revision

	if !resp.Succeeded {
		curTime := resp.Responses[0].GetResponseRange().Kvs[0].Version
		return curTime, curRev, nil
	}
	curTime := t + 1

	if rev == 0 {
		// We don't compact on bootstrap.
		return curTime, curRev, nil
	}
	if _, err = client.Compact(ctx, rev); err != nil {
		return curTime, curRev, err
	}
	return curTime, curRev, nil
}

// ===================================================
// Test-setup related function are following.
// ===================================================

func newTestLeaseManagerConfig() etcd3.LeaseManagerConfig {
	cfg := etcd3.NewDefaultLeaseManagerConfig()
	// As 30s is the default timeout for testing in global configuration,
	// we cannot wait longer than that in a single time: change it to 1s
	// for testing purposes. See wait.ForeverTestTimeout
	cfg.ReuseDurationSeconds = 1
	return cfg
}

func newTestTransformer() value.Transformer {
	return storagetesting.NewPrefixTransformer([]byte(defaultTestPrefix), false)
}

type clientRecorder struct {
	reads uint64
	clientv3.KV
}

func (r *clientRecorder) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	atomic.AddUint64(&r.reads, 1)
	return r.KV.Get(ctx, key, opts...)
}

func (r *clientRecorder) GetReadsAndReset() uint64 {
	return atomic.SwapUint64(&r.reads, 0)
}

type setupOptions struct {
	brain          brainproc.Options
	codec          runtime.Codec
	newFunc        func() runtime.Object
	newListFunc    func() runtime.Object
	prefix         string
	resourcePrefix string
	groupResource  schema.GroupResource
	transformer    value.Transformer
	leaseConfig    etcd3.LeaseManagerConfig

	recorderEnabled bool
}

type setupOption func(*setupOptions)

// withWatchProgressNotifyInterval replaces upstream's
// withClientConfig(clusterConfig) with
// clusterConfig.ExperimentalWatchProgressNotifyInterval set.
func withWatchProgressNotifyInterval(d time.Duration) setupOption {
	return func(options *setupOptions) {
		options.brain.WatchProgressNotifyInterval = d
	}
}

func withRecorder() setupOption {
	return func(options *setupOptions) {
		options.recorderEnabled = true
	}
}

func withDefaults(options *setupOptions) {
	options.codec = apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion)
	options.newFunc = newPod
	options.newListFunc = newPodList
	options.prefix = ""
	options.resourcePrefix = "/pods"
	options.groupResource = schema.GroupResource{Resource: "pods"}
	options.transformer = newTestTransformer()
	options.leaseConfig = newTestLeaseManagerConfig()
}

var _ setupOption = withDefaults

// testSetup is upstream's, with etcd3.New (the exported constructor; upstream
// calls the unexported newStore it wraps) on a fresh brainnode. With the
// AllowUnsafeMalformedObjectDeletion gate off (its 1.32 default) etcd3.New
// returns exactly newStore's store.
func testSetup(t testing.TB, opts ...setupOption) (context.Context, *testStore, *kubernetes.Client) {
	setupOpts := setupOptions{}
	opts = append([]setupOption{withDefaults}, opts...)
	for _, opt := range opts {
		opt(&setupOpts)
	}
	client := brainclient.RunBrain(t, setupOpts.brain)
	if setupOpts.recorderEnabled {
		client.KV = &clientRecorder{KV: client.KV}
	}
	versioner := storage.APIObjectVersioner{}
	transformer := &swapTransformer{cur: setupOpts.transformer}
	s := etcd3.New(
		client,
		setupOpts.codec,
		setupOpts.newFunc,
		setupOpts.newListFunc,
		setupOpts.prefix,
		setupOpts.resourcePrefix,
		setupOpts.groupResource,
		transformer,
		setupOpts.leaseConfig,
		etcd3.NewDefaultDecoder(setupOpts.codec, versioner),
		versioner,
	)
	brainclient.WaitForRequestWatchProgressSupport(t)
	ts := &testStore{
		Interface:   s,
		codec:       setupOpts.codec,
		transformer: transformer,
	}
	ctx := context.Background()
	return ctx, ts, client
}
