package server_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/brainkv/brain/internal/history"
	"github.com/brainkv/brain/internal/testutil"
	"github.com/brainkv/brain/server"
)

var (
	concSeed    = flag.Int64("conc.seed", 0, "seed of TestConcurrentLinearizableAndWatches (0: random)")
	concClients = flag.Int("conc.clients", 12, "concurrent clients")
	concOps     = flag.Int("conc.ops", 250, "operations per client")
)

// concKeys spread over the four partitions of concSplits.
var (
	concSplits = []string{"/registry/events/", "/registry/leases/", "/registry/pods/"}
	concKeys   = []string{
		"/registry/configmaps/a", "/registry/configmaps/b", "/registry/configmaps/c",
		"/registry/events/a", "/registry/events/b", "/registry/events/c",
		"/registry/leases/a", "/registry/leases/b", "/registry/leases/c",
		"/registry/pods/a", "/registry/pods/b", "/registry/pods/c", "/z",
	}
)

// TestConcurrentLinearizableAndWatches runs many clients against keys in
// every partition while watchers (over all keys, over ranges crossing
// partitions, with and without prev_kv, from now and from past revisions)
// record their streams and ask for progress. It checks:
//   - porcupine finds the history linearizable (per key: get, put, CAS on
//     mod_revision as kube-apiserver updates, delete);
//   - revisions are unique and respect real time across keys; no read's
//     header revision is below a write acknowledged before it started;
//   - the reference watch holds every acknowledged write;
//   - every watcher gets every event of its range exactly once, in revision
//     order, atomic per revision, with correct prev_kv, and progress
//     notifications only after the events they cover;
//   - watches resumed from past revisions after the load yield exactly the
//     suffix.
func TestConcurrentLinearizableAndWatches(t *testing.T) {
	seed := *concSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("seed %d (rerun with -conc.seed=%d)", seed, seed)
	s := testutil.StartBrain(t, server.Config{InitialSplitPoints: concSplits})
	ep := testutil.Endpoint(s)
	rec := history.NewRecorder()

	watchClient := testutil.Client(t, ep)
	ctx, stopWatches := context.WithCancel(context.Background())
	var wwg sync.WaitGroup
	var watches []*history.Watch
	watch := func(w *history.Watch, progress time.Duration) {
		watches = append(watches, w)
		wwg.Add(1)
		go func() {
			defer wwg.Done()
			if err := history.RecordWatch(ctx, watchClient, w, progress); err != nil {
				t.Errorf("%s: %v", w.Name, err)
			}
		}()
	}
	ref := &history.Watch{Name: "reference", Key: "\x00", End: "\x00", Start: 1, PrevKV: true}
	watch(ref, 0)
	watch(&history.Watch{Name: "events..pods", Key: "/registry/events/", End: "/registry/pods/", Start: 1, PrevKV: true}, 20*time.Millisecond)
	watch(&history.Watch{Name: "all-no-prev", Key: "/", End: "\x00", Start: 1}, 7*time.Millisecond)

	var wg sync.WaitGroup
	for c := 0; c < *concClients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			wl := history.NewWorkload(seed+int64(c), concKeys, 30, 20, 40)
			kv := testutil.Client(t, ep)
			for i := 0; i < *concOps; i++ {
				in := wl.Next(fmt.Sprintf("c%d-%d", c, i))
				out := history.Do(rec, kv, c, in, 10*time.Second)
				wl.Observe(in, out)
				if i == *concOps/2 && c == 0 {
					// A watch started mid-load from a past revision.
					watch(&history.Watch{Name: "mid-load-from-past", Key: "\x00", End: "\x00", Start: max(out.Rev-50, 1), PrevKV: true}, 10*time.Millisecond)
				}
			}
		}(c)
	}
	wg.Wait()
	ops := rec.Ops()

	// Let every watcher catch up to the final revision, then stop them.
	final := s.Store().CurrentRevision()
	waitWatches(t, watches, final)
	stopWatches()
	wwg.Wait()

	html := testutil.ArtifactPath(t, "porcupine.html")
	res, err := history.CheckLinearizable(ops, 2*time.Minute, html)
	if err != nil {
		t.Fatal(err)
	}
	if res != porcupine.Ok {
		t.Errorf("porcupine: history of %d operations is %v (seed %d; visualization: %s)", len(ops), res, seed, html)
	}
	for _, err := range history.CheckRevisions(ops) {
		t.Error(err)
	}
	for _, err := range history.CheckHistory(ref, ops) {
		t.Error(err)
	}
	if ref.Complete < final {
		t.Errorf("reference watch stopped at %d, before the final revision %d", ref.Complete, final)
	}
	for _, w := range watches[1:] {
		for _, err := range history.CheckWatch(w, ref) {
			t.Error(err)
		}
	}

	// Resume watches from random past revisions: exactly the suffix.
	rng := rand.New(rand.NewSource(seed))
	for i := 0; i < 8; i++ {
		w := &history.Watch{Name: fmt.Sprintf("resumed-%d", i), Key: "\x00", End: "\x00", Start: 1 + rng.Int63n(final), PrevKV: i%2 == 0}
		if i%3 == 1 {
			w.Key, w.End = "/registry/leases/", "/registry/pods/\xff"
		}
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = history.RecordWatch(rctx, watchClient, w, 10*time.Millisecond)
		}()
		waitWatches(t, []*history.Watch{w}, final)
		cancel()
		<-done
		for _, err := range history.CheckWatch(w, ref) {
			t.Error(err)
		}
	}
	t.Logf("%d operations, final revision %d, %d watches checked", len(ops), final, len(watches)+8)
}

// waitWatches waits until every watch is complete up to rev.
func waitWatches(t *testing.T, ws []*history.Watch, rev int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, w := range ws {
		for w.CompleteAt() < rev {
			if time.Now().After(deadline) {
				t.Fatalf("watch %s is complete only up to %d, want %d", w.Name, w.CompleteAt(), rev)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
