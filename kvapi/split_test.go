package kvapi

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brainkv/brain/engine"
	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"github.com/brainkv/brain/raftgroup"
	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// counterRevs issues revisions from a counter (a TSO for one node).
type counterRevs struct{ cur atomic.Int64 }

func (r *counterRevs) Current() int64 { return r.cur.Load() }

func (r *counterRevs) Observe(rev int64) {
	for c := r.cur.Load(); rev > c && !r.cur.CompareAndSwap(c, rev); c = r.cur.Load() {
	}
}

func (r *counterRevs) Fresh(context.Context) (int64, error) { return r.cur.Load(), nil }

func (r *counterRevs) Next(_ context.Context, n int64) (int64, error) {
	return r.cur.Add(n) - n + 1, nil
}

type usableLeases struct{}

func (usableLeases) LeaseUsable(int64) bool        { return true }
func (usableLeases) Refresh(context.Context) error { return nil }

// TestAppliedSplitSucceedsUnrecorded checks that a split the partition
// applied is reported as done even when recording it in the partition map
// fails (here the meta group has no leader). The leader's periodic
// ReportSplits records it later; an error would have the caller retry a
// split that is already there, which the partition refuses.
func TestAppliedSplitSucceedsUnrecorded(t *testing.T) {
	db, p := startSoloPartition(t)
	// A meta replica of no raft group: it never leads, so recording fails.
	m, err := meta.New(meta.Config{}, db, MetaGroup)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewStore(Config{Self: 1, Routes: []Route{{ID: FirstPartition, Local: p}}, Meta: m})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()

	const child = 1000
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.splitLocal(ctx, p, []byte("m"), child); err != nil {
		t.Fatalf("a split that applied failed: %v", err)
	}
	if sp := p.Splits(); len(sp) != 1 || sp[0].Child != child || string(sp[0].Key) != "m" {
		t.Fatalf("the partition's splits: %+v, want one at \"m\" to %d", sp, child)
	}
	if p.Contains([]byte("m")) || !p.Contains([]byte("a")) {
		t.Fatal("the partition's span did not end at the split key")
	}
	// The split is still unrecorded, and ReportSplits says so: the
	// periodic report retries it.
	if len(m.Splits()) != 0 {
		t.Fatalf("the partition map holds %+v without a meta leader", m.Splits())
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer rcancel()
	if err := s.ReportSplits(rctx, p); err == nil {
		t.Fatal("recording the split without a meta leader succeeded")
	}
}

// startSoloPartition starts partition FirstPartition as the leader of a
// one-voter raft group over an in-memory engine; the test's cleanup stops
// it.
func startSoloPartition(t *testing.T) (*pebble.DB, *partition.Partition) {
	t.Helper()
	db, err := engine.Open(engine.Config{Dir: "db", FS: vfs.NewMem(), CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	p, err := partition.New(partition.Config{ID: FirstPartition, DB: db, Revisions: &counterRevs{}, Leases: usableLeases{}})
	if err != nil {
		t.Fatal(err)
	}
	host, err := raftgroup.NewHost(raftgroup.Config{NodeID: 1, TickInterval: 10 * time.Millisecond}, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := host.CreateGroup(FirstPartition, []uint64{1}, p)
	if err != nil {
		t.Fatal(err)
	}
	p.Bind(g)
	host.Start()
	t.Cleanup(func() { p.Close(); host.Stop() })
	for deadline := time.Now().Add(5 * time.Second); !p.IsLeader(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the partition elected no leader")
		}
	}
	return db, p
}
