package partition

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/raft/v3/raftpb"
)

// fakeRevs is a TSO: Next can be gated to hold writes in flight.
type fakeRevs struct {
	cur  atomic.Int64
	mu   sync.Mutex
	gate chan struct{} // if set, Next waits on it; protected by mu
}

func newFakeRevs() *fakeRevs { r := &fakeRevs{}; r.cur.Store(1); return r }

func (r *fakeRevs) Current() int64 { return r.cur.Load() }

func (r *fakeRevs) Fresh(context.Context) (int64, error) { return r.cur.Load(), nil }

func (r *fakeRevs) Observe(rev int64) {
	for {
		c := r.cur.Load()
		if rev <= c || r.cur.CompareAndSwap(c, rev) {
			return
		}
	}
}

func (r *fakeRevs) Next(ctx context.Context, n int64) (int64, error) {
	r.mu.Lock()
	g := r.gate
	r.mu.Unlock()
	if g != nil {
		select {
		case <-g:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return r.cur.Add(n) - n + 1, nil
}

type allLeases struct{}

func (allLeases) LeaseUsable(int64) bool { return true }

func (allLeases) Refresh(context.Context) error { return nil }

type feedRecorder struct {
	mu  sync.Mutex
	evs []RevEvents
}

func (f *feedRecorder) Publish(_ uint64, evs RevEvents, _ int64) {
	if evs.Rev != 0 {
		f.mu.Lock()
		f.evs = append(f.evs, evs)
		f.mu.Unlock()
	}
}

// recordingSM records every command a partition applies.
type recordingSM struct {
	*Partition
	mu   sync.Mutex
	ents []raftpb.Entry
	gate chan struct{} // if set, applies wait for it to close; protected by mu
}

func (r *recordingSM) Apply(ac *raftgroup.ApplyContext, e *raftpb.Entry, cmd []byte) any {
	r.mu.Lock()
	r.ents = append(r.ents, raftpb.Entry{Index: e.Index, Term: e.Term, Data: append([]byte(nil), cmd...)})
	gate := r.gate
	r.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return r.Partition.Apply(ac, e, cmd)
}

type harness struct {
	db   *pebble.DB
	host *raftgroup.Host
	p    *Partition
	sm   *recordingSM
	revs *fakeRevs
	feed *feedRecorder
}

func openDB(t *testing.T) *pebble.DB {
	db, err := engine.Open(engine.Config{Dir: "db", FS: vfs.NewMem(), CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := &harness{db: openDB(t), revs: newFakeRevs(), feed: &feedRecorder{}}
	p, err := New(Config{ID: 100, DB: h.db, Revisions: h.revs, Leases: allLeases{}})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := p.Subscribe(1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Cancel)
	sub.Live(h.feed)
	h.p = p
	h.sm = &recordingSM{Partition: p}
	host, err := raftgroup.NewHost(raftgroup.Config{NodeID: 1, TickInterval: 10 * time.Millisecond}, h.db, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.host = host
	g, err := host.CreateGroup(100, []uint64{1}, h.sm)
	if err != nil {
		t.Fatal(err)
	}
	p.Bind(g)
	host.Start()
	t.Cleanup(func() { p.Close(); host.Stop() })
	deadline := time.Now().Add(5 * time.Second)
	for !p.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
		time.Sleep(time.Millisecond)
	}
	return h
}

func put(k, v string) *pb.TxnRequest {
	return &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), Value: []byte(v)}}}}}
}

// dumpState returns every key of the partition's replicated state.
func dumpState(t *testing.T, db *pebble.DB) string {
	var b bytes.Buffer
	for _, prefix := range []byte{engine.MVCCPrefix, engine.EventPrefix, engine.LeasePrefix, engine.GroupPrefix} {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefix}, UpperBound: []byte{prefix + 1}})
		if err != nil {
			t.Fatal(err)
		}
		for it.First(); it.Valid(); it.Next() {
			fmt.Fprintf(&b, "%x=%x\n", it.Key(), it.Value())
		}
		it.Close()
	}
	return b.String()
}

// TestApplyIsDeterministic runs a concurrent random workload through a
// partition, then applies the same committed commands to a fresh replica
// and requires byte-identical state.
func TestApplyIsDeterministic(t *testing.T) {
	h := newHarness(t)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	var wg sync.WaitGroup
	for c := 0; c < 8; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(seed + int64(c)))
			for i := 0; i < 100; i++ {
				k := []byte(fmt.Sprintf("k%d", rng.Intn(10)))
				var rt *pb.TxnRequest
				switch rng.Intn(4) {
				case 0:
					rt = &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: k}}}}}
				case 1:
					rt = &pb.TxnRequest{
						Compare: []*pb.Compare{{Key: k, Target: pb.Compare_VERSION, Result: pb.Compare_LESS, TargetUnion: &pb.Compare_Version{Version: 3}}},
						Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: k, Value: []byte{byte(i)}, Lease: int64(rng.Intn(3))}}}},
						Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("k"), RangeEnd: []byte("l")}}}},
					}
				default:
					rt = put(string(k), fmt.Sprint(c, i))
				}
				if _, err := h.p.Txn(context.Background(), rt); err != nil {
					t.Error(err)
					return
				}
			}
		}(c)
	}
	wg.Wait()
	if err := h.p.WaitClosed(context.Background(), h.revs.Current()); err != nil {
		t.Fatal(err)
	}
	h.host.Stop()

	replica := openDB(t)
	r, err := New(Config{ID: 100, DB: replica, Revisions: newFakeRevs(), Leases: allLeases{}})
	if err != nil {
		t.Fatal(err)
	}
	h.sm.mu.Lock()
	ents := h.sm.ents
	h.sm.mu.Unlock()
	for i := range ents {
		b := replica.NewBatch()
		r.Apply(&raftgroup.ApplyContext{Batch: b}, &ents[i], ents[i].Data)
		if err := b.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if a, b := dumpState(t, h.db), dumpState(t, replica); a != b {
		t.Fatalf("replicas diverge after %d commands", len(ents))
	}
}

// TestApplyRejection checks the deterministic rejections: a write at or
// below the closed revision and a command from another term change
// nothing.
func TestApplyRejection(t *testing.T) {
	db := openDB(t)
	p, err := New(Config{ID: 7, DB: db, Revisions: newFakeRevs(), Leases: allLeases{}})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(term uint64, c *command) applyResult {
		b := db.NewBatch()
		res := p.Apply(&raftgroup.ApplyContext{Batch: b}, &raftpb.Entry{Term: term, Index: 1}, c.encode()[raftgroup.HeaderLen:]).(applyResult)
		if err := b.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
		return res
	}
	w := func(rev, closed int64) *command {
		return &command{kind: cmdWrite, term: 3, rev: rev, closed: closed, muts: []mutation{{kind: mutPut, key: []byte("a"), value: []byte(fmt.Sprint(rev))}}}
	}
	if r := apply(3, w(10, 12)); r.reject != accepted {
		t.Fatalf("first write rejected: %v", r.reject)
	}
	before := dumpState(t, db)
	for _, rev := range []int64{12, 11, 9} {
		if r := apply(3, w(rev, 0)); r.reject != rejectClosed {
			t.Fatalf("write at %d with closed 12: %v, want rejectClosed", rev, r.reject)
		}
	}
	if r := apply(4, w(20, 0)); r.reject != rejectStaleTerm {
		t.Fatalf("command of term 3 in an entry of term 4: %v, want rejectStaleTerm", r.reject)
	}
	if r := apply(3, &command{kind: cmdClose, term: 3, closed: 5}); r.reject != accepted || p.sm.closed != 12 {
		t.Fatalf("a lower close must not lower the closed revision: closed %d", p.sm.closed)
	}
	if after := dumpState(t, db); after != before {
		t.Fatal("rejected commands changed state")
	}
	if r := apply(3, w(13, 0)); r.reject != accepted {
		t.Fatalf("write above closed rejected: %v", r.reject)
	}
}

// TestClosedRevisionWaitsForInflightWrites holds a write between its
// registration and its revision, and checks that nothing is closed at or
// above its revision until it applies, while other writes keep going.
func TestClosedRevisionWaitsForInflightWrites(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.p.Txn(ctx, put("a", "1")); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	h.revs.mu.Lock()
	h.revs.gate = gate
	h.revs.mu.Unlock()
	done := make(chan *pb.TxnResponse)
	go func() {
		resp, err := h.p.Txn(ctx, put("b", "held"))
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	// Wait until the held write is registered.
	for {
		h.p.prop.Lock()
		n := h.p.prop.inflight.Len()
		h.p.prop.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	lower := h.revs.Current()
	// Others advance the TSO meanwhile (other partitions' writes).
	h.revs.cur.Add(5)
	h.p.RequestClose(h.revs.Current())
	time.Sleep(50 * time.Millisecond)
	if c := h.p.Closed(); c > lower {
		t.Fatalf("closed %d while a write registered at %d is in flight", c, lower)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if err := h.p.WaitClosed(wctx, lower+1); err == nil {
		t.Fatal("WaitClosed returned while the write below was in flight")
	}
	cancel()
	h.revs.mu.Lock()
	h.revs.gate = nil
	h.revs.mu.Unlock()
	close(gate)
	resp := <-done
	rev := resp.Header.Revision
	if rev <= lower {
		t.Fatalf("held write got revision %d, not above %d", rev, lower)
	}
	if err := h.p.WaitClosed(ctx, rev); err != nil {
		t.Fatal(err)
	}
	kv, err := h.p.Get(ctx, []byte("b"), rev)
	if err != nil || kv == nil || string(kv.Value) != "held" {
		t.Fatalf("held write not readable at its revision: %v %v", kv, err)
	}
	if n := testutilRejected(h.p, "closed"); n != 0 {
		t.Fatalf("%v writes rejected by the closed revision", n)
	}
}

// TestAbandonedWriteKeepsItsLatches: a write whose caller gives up while
// its command is in the log keeps its latches until the command applies,
// so a later compare-and-swap on the same key sees it. (Releasing them at
// the caller's deadline let both of two creates of one key succeed, and
// let a no-op evaluation answer for a write that never applied.)
func TestAbandonedWriteKeepsItsLatches(t *testing.T) {
	h := newHarness(t)
	create := func(v string) *pb.TxnRequest {
		return &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: []byte("k"), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 0}}},
			Success: put("k", v).Success,
		}
	}
	gate := make(chan struct{})
	h.sm.mu.Lock()
	h.sm.gate = gate
	h.sm.mu.Unlock()
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := h.p.Txn(ctx, create("first"))
		first <- err
	}()
	time.Sleep(150 * time.Millisecond) // the first caller has given up
	second := make(chan *pb.TxnResponse, 1)
	go func() {
		resp, err := h.p.Txn(context.Background(), create("second"))
		if err != nil {
			t.Error(err)
		}
		second <- resp
	}()
	time.Sleep(50 * time.Millisecond)
	h.sm.mu.Lock()
	h.sm.gate = nil
	h.sm.mu.Unlock()
	close(gate)
	if err := <-first; err == nil {
		t.Fatal("the abandoned write reported success to a caller that gave up")
	}
	resp := <-second
	if resp == nil {
		t.Fatal("second create failed")
	}
	if resp.Succeeded {
		t.Fatal("both creates of one key succeeded: the second evaluated without the first's write")
	}
	kv, err := h.p.Get(context.Background(), []byte("k"), resp.Header.Revision)
	if err != nil || kv == nil || string(kv.Value) != "first" || kv.Version != 1 {
		t.Fatalf("key after both creates: %v %v, want the first's value at version 1", kv, err)
	}
}

// TestMVCCReadsAndCompaction writes random versions and checks reads at
// every revision against a model, before and after compaction.
func TestMVCCReadsAndCompaction(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	keys := []string{"a", "a\x00", "b", "b\x00x", "c", "\xff"}
	// model[rev] is the state after rev.
	model := map[int64]map[string]string{1: {}}
	cur := map[string]string{}
	var last int64 = 1
	for i := 0; i < 300; i++ {
		k := keys[rng.Intn(len(keys))]
		var rt *pb.TxnRequest
		if rng.Intn(4) == 0 {
			rt = &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k)}}}}}
		} else {
			rt = put(k, fmt.Sprint(i))
		}
		resp, err := h.p.Txn(ctx, rt)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Revision == last {
			continue // a delete of nothing
		}
		last = resp.Header.Revision
		if rt.Success[0].GetRequestDeleteRange() != nil {
			delete(cur, k)
		} else {
			cur[k] = fmt.Sprint(i)
		}
		snap := map[string]string{}
		for kk, v := range cur {
			snap[kk] = v
		}
		model[last] = snap
	}
	check := func(from int64) {
		for rev := from; rev <= last; rev++ {
			want := model[rev]
			kvs, count, err := h.p.Scan(ctx, []byte{}, []byte{}, rev, ScanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if int(count) != len(want) || len(kvs) != len(want) {
				t.Fatalf("at %d: %d keys (count %d), want %d", rev, len(kvs), count, len(want))
			}
			for _, kv := range kvs {
				if want[string(kv.Key)] != string(kv.Value) {
					t.Fatalf("at %d: %q=%q, want %q", rev, kv.Key, kv.Value, want[string(kv.Key)])
				}
			}
		}
	}
	check(1)
	compact := last / 2
	if err := h.p.Compact(ctx, compact); err != nil {
		t.Fatal(err)
	}
	if err := h.p.WaitCollected(ctx, compact); err != nil {
		t.Fatal(err)
	}
	check(compact)
	// Only versions from the compaction revision on remain (plus the
	// version each live key had then).
	versions := 0
	_ = DumpVersions(h.db, last, func(v *Version) error {
		versions++
		if v.Rev < compact {
			if _, live := model[compact][string(v.Key)]; !live || v.Tombstone {
				t.Errorf("version %q@%d below the compaction revision %d survived", v.Key, v.Rev, compact)
			}
		}
		return nil
	})
	t.Logf("%d versions left after compacting at %d of %d", versions, compact, last)
	// Index keys of keys deleted before the compaction are purged.
	if err := h.p.WaitClosed(ctx, last); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		stale := 0
		for _, k := range keys {
			if _, live := model[last][k]; live {
				continue
			}
			m, ok, _ := getMeta(h.db, []byte(k))
			if ok && m.mod <= compact {
				stale++
			}
		}
		if stale == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d index keys of deleted keys survive compaction", stale)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testutilRejected(p *Partition, reason string) float64 {
	c, err := p.metrics.rejected.GetMetricWithLabelValues(reason)
	if err != nil {
		return -1
	}
	return counterValue(c)
}

// TestIndexedScanMatchesStorageScan compares the in-memory-index scan with
// the storage-only scan at every revision, for every option, on a random
// history.
func TestIndexedScanMatchesStorageScan(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	keys := []string{"", "a", "a\x00", "ab", "b", "b\x00x", "c", "\xff", "\xff\xff"}
	for i := 0; i < 200; i++ {
		k := keys[1+rng.Intn(len(keys)-1)]
		rt := put(k, fmt.Sprint(i))
		if rng.Intn(3) == 0 {
			rt = &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(k)}}}}}
		}
		if _, err := h.p.Txn(ctx, rt); err != nil {
			t.Fatal(err)
		}
	}
	last := h.revs.Current()
	if err := h.p.WaitClosed(ctx, last); err != nil {
		t.Fatal(err)
	}
	str := func(kvs []*mvccpb.KeyValue, n int64) string {
		var b bytes.Buffer
		fmt.Fprintf(&b, "count %d:", n)
		for _, kv := range kvs {
			fmt.Fprintf(&b, " %s", kv.String())
		}
		return b.String()
	}
	for rev := int64(1); rev <= last; rev++ {
		for _, o := range []scanOptions{{}, {limit: 2}, {keysOnly: true}, {countOnly: true}, {limit: 1, keysOnly: true}} {
			o.rev = rev
			start, end := []byte(keys[rng.Intn(len(keys))]), []byte(keys[rng.Intn(len(keys))])
			if rng.Intn(2) == 0 { // one key, as a get or a compare reads it
				end = append(append([]byte(nil), start...), 0)
			}
			a, an, err := scan(h.db, start, end, o)
			if err != nil {
				t.Fatal(err)
			}
			b, bn, err := h.p.index.indexedScan(h.db, start, end, o)
			if err != nil {
				t.Fatal(err)
			}
			if str(a, an) != str(b, bn) {
				t.Fatalf("rev %d [%q, %q) %+v:\nstorage: %s\n  index: %s", rev, start, end, o, str(a, an), str(b, bn))
			}
		}
	}
}

// TestCollectSkipsPurgedKeys: a replica whose garbage collection runs after
// the leader purged a deleted key's index record finds that key's versions
// without an index record. They are garbage, not corruption (collection
// used to fail on them forever, seen on a restarted node behind a real
// kube-apiserver).
func TestCollectSkipsPurgedKeys(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.p.Txn(ctx, put("gone", "v")); err != nil {
		t.Fatal(err)
	}
	if _, err := h.p.Txn(ctx, put("kept", "v")); err != nil {
		t.Fatal(err)
	}
	// Versions of a key whose index record the leader's purge removed.
	b := h.db.NewBatch()
	for _, rev := range []int64{2, 3} {
		if err := b.Set(versionKey([]byte("purged"), rev), []byte{flagTombstone}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(nil); err != nil {
		t.Fatal(err)
	}
	rev := h.revs.Current()
	if err := h.p.collect(rev); err != nil {
		t.Fatalf("collect over a purged key's versions: %v", err)
	}
	for _, r := range []int64{2, 3} {
		if _, closer, err := h.db.Get(versionKey([]byte("purged"), r)); err == nil {
			closer.Close()
			t.Fatalf("version %d of the purged key survived collection", r)
		}
	}
	kv, err := h.p.Get(ctx, []byte("kept"), rev)
	if err != nil || kv == nil {
		t.Fatalf("a live key after collection: %v %v", kv, err)
	}
}

// TestCloseFailsWaitingReaders: a replica that stops (removed from its
// group) applies nothing more, so a reader waiting for a revision to close
// there must be told to read elsewhere instead of waiting forever.
func TestCloseFailsWaitingReaders(t *testing.T) {
	db := openDB(t)
	p, err := New(Config{ID: 100, Start: []byte{}, DB: db, Revisions: newFakeRevs(), Leases: allLeases{}})
	if err != nil {
		t.Fatal(err)
	}
	// Not bound to a raft group: nothing will ever close revision 5.
	errc := make(chan error, 1)
	go func() { errc <- p.WaitClosed(context.Background(), 5) }()
	select {
	case err := <-errc:
		t.Fatalf("WaitClosed returned %v before the revision closed", err)
	case <-time.After(50 * time.Millisecond):
	}
	p.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrReplicaClosed) {
			t.Fatalf("waiting reader got %v, want ErrReplicaClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a reader still waits on a closed replica")
	}
	if err := p.WaitClosed(context.Background(), 5); !errors.Is(err, ErrReplicaClosed) {
		t.Fatalf("reader arriving after Close got %v, want ErrReplicaClosed", err)
	}
	if err := p.WaitClosed(context.Background(), 0); err != nil {
		t.Fatalf("a revision already closed stays readable after Close: %v", err)
	}
}

// TestRequestCloseSoon checks a follower replica's RequestCloseSoon: it
// forwards to the leader what its applied closed revision does not reach
// by itself (CloseSoon, with the closed revisions applied), and nothing
// when the applies reach it.
func TestRequestCloseSoon(t *testing.T) {
	fwd := make(chan int64, 16)
	p, err := New(Config{ID: 100, Start: []byte{}, DB: openDB(t), Revisions: newFakeRevs(), Leases: allLeases{},
		ForwardClose: func(rev int64) { fwd <- rev }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	grace := 200 * time.Millisecond
	p.soon.grace = grace
	// Applied closes reach it: nothing forwarded.
	p.RequestCloseSoon(5)
	time.Sleep(grace / 4)
	p.published(RevEvents{}, 5)
	select {
	case got := <-fwd:
		t.Fatalf("forwarded a close of %d, want none", got)
	case <-time.After(2 * grace):
	}
	// They stop short: the highest revision wanted is forwarded.
	p.RequestCloseSoon(8)
	p.RequestCloseSoon(9)
	p.published(RevEvents{}, 6)
	select {
	case got := <-fwd:
		if got != 9 {
			t.Fatalf("forwarded a close of %d, want 9", got)
		}
	case <-time.After(5 * grace):
		t.Fatal("no close forwarded")
	}
}

// TestWaitClosedAsksAgain: a reader waiting on a follower replica for a
// revision to close asks the leader again while it waits, so a lost
// request (none delivered: no leader yet, or the call failed) does not
// leave it waiting forever on a partition that takes no writes.
func TestWaitClosedAsksAgain(t *testing.T) {
	fwd := make(chan int64, 64)
	p, err := New(Config{ID: 100, Start: []byte{}, DB: openDB(t), Revisions: newFakeRevs(), Leases: allLeases{},
		ForwardClose: func(rev int64) { fwd <- rev }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- p.WaitClosed(ctx, 5) }()
	// The first request is lost; the reader must ask again.
	for i := 0; i < 2; i++ {
		select {
		case got := <-fwd:
			if got != 5 {
				t.Fatalf("forwarded a close of %d, want 5", got)
			}
		case <-time.After(10 * closeRetryInterval):
			t.Fatalf("%d close requests forwarded in %v while a reader waits, want another", i, 10*closeRetryInterval)
		}
	}
	p.published(RevEvents{}, 5) // the leader's close applied here
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("WaitClosed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reader still waits after the close applied")
	}
}

// TestTwoWritesOfAKeyInOneTxnHavePrevKvsBeforeIt: a transaction that puts
// a key and then deletes it (in a nested transaction) publishes both
// events at its revision, and each one's prev_kv is the key before the
// transaction, as etcd's watch reports it (the key at revision - 1), not
// the put the delete follows.
func TestTwoWritesOfAKeyInOneTxnHavePrevKvsBeforeIt(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	first, err := h.p.Txn(ctx, put("k", "v1"))
	if err != nil {
		t.Fatal(err)
	}
	del := &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("k")}}}
	txn := put("k", "v2")
	txn.Success = append(txn.Success, &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{del}}}})
	resp, err := h.p.Txn(ctx, txn)
	if err != nil {
		t.Fatal(err)
	}
	rev := resp.Header.Revision
	deadline := time.Now().Add(5 * time.Second)
	for {
		h.feed.mu.Lock()
		var got []*mvccpb.Event
		for _, r := range h.feed.evs {
			if r.Rev == rev {
				got = r.Events
			}
		}
		h.feed.mu.Unlock()
		if got != nil {
			if len(got) != 2 || got[0].Type != mvccpb.PUT || got[1].Type != mvccpb.DELETE {
				t.Fatalf("events at %d: %v, want a put and a delete of k", rev, got)
			}
			for _, ev := range got {
				if pk := ev.PrevKv; pk == nil || pk.ModRevision != first.Header.Revision || pk.Version != 1 {
					t.Errorf("%v event's prev_kv %v, want k's version 1 at %d (before the transaction)", ev.Type, pk, first.Header.Revision)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no events published at %d", rev)
		}
		time.Sleep(time.Millisecond)
	}
}
