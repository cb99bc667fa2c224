package partition

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/brainkv/brain/raftgroup"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// TestSplit splits a partition with events in its log and checks both
// sides: spans, the moved event records, the child's state and raft
// bootstrap, writes and reads refused by the parent for the child's keys,
// the split record carried by a new subscription, and persistence.
func TestSplit(t *testing.T) {
	db := openDB(t)
	revs := newFakeRevs()
	var splits []SplitRecord
	splitDone := make(chan struct{}, 1)
	p := leadingPartition(t, Config{ID: 100, Start: []byte{}, DB: db, Revisions: revs, Leases: allLeases{},
		OnSplit: func(r SplitRecord) { splits = append(splits, r); splitDone <- struct{}{} }})
	ctx := context.Background()
	// One txn writes keys on both sides of the split key.
	both := &pb.TxnRequest{Success: []*pb.RequestOp{
		{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("a1"), Value: []byte("x")}}},
		{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("m1"), Value: []byte("y")}}},
	}}
	for _, rt := range []*pb.TxnRequest{put("a", "1"), put("m", "1"), both, put("z", "1"), put("m", "2")} {
		if _, err := p.Txn(ctx, rt); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Split(ctx, []byte{}, 200); !errors.Is(err, ErrBadSplitKey) {
		t.Fatalf("split at the start key: %v, want ErrBadSplitKey", err)
	}
	if err := p.Split(ctx, []byte("m"), 200); err != nil {
		t.Fatal(err)
	}
	<-splitDone
	if start, end := p.Span(); string(start) != "" || string(end) != "m" {
		t.Fatalf("parent span [%q, %q), want [\"\", \"m\")", start, end)
	}
	if len(splits) != 1 || splits[0].Child != 200 || string(splits[0].Key) != "m" || len(splits[0].End) != 0 || splits[0].Closed < revs.Current() {
		t.Fatalf("split records %+v", splits)
	}
	if err := p.Split(ctx, []byte("q"), 201); !errors.Is(err, ErrOutsideRange) {
		t.Fatalf("split outside the span: %v, want ErrOutsideRange", err)
	}
	// The parent refuses the child's keys.
	if _, err := p.Txn(ctx, put("n", "1")); !errors.Is(err, ErrOutsideRange) {
		t.Fatalf("write of a moved key: %v, want ErrOutsideRange", err)
	}
	if _, _, err := p.Scan(ctx, []byte("a"), []byte("z"), revs.Current(), ScanOptions{}); !errors.Is(err, ErrOutsideRange) {
		t.Fatalf("scan across the split: %v, want ErrOutsideRange", err)
	}
	if _, _, _, err := p.Events(1, p.Closed(), []byte("m"), []byte{}, 0); !errors.Is(err, ErrOutsideRange) {
		t.Fatalf("events of moved keys: %v, want ErrOutsideRange", err)
	}
	kvs, _, err := p.Scan(ctx, []byte("a"), []byte("m"), revs.Current(), ScanOptions{})
	if err != nil || len(kvs) != 2 {
		t.Fatalf("scan of the parent's keys: %v %v", kvs, err)
	}
	// Each event log holds its keys' events; the parent's keeps the
	// child's older ones for its own feed (subscriptions resumed from
	// below the split), and reads by range filter them.
	evs, _, _, err := p.Events(1, p.Closed(), []byte(""), []byte("m"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := eventKeys(evs); got != "a a1" {
		t.Fatalf("parent's events: %s", got)
	}
	c, err := New(Config{ID: 200, DB: db, Revisions: revs, Leases: allLeases{}})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Initialized() || c.Closed() != splits[0].Closed || c.CompactRevision() != p.CompactRevision() {
		t.Fatalf("child: initialized %v closed %d (split closed %d)", c.Initialized(), c.Closed(), splits[0].Closed)
	}
	if start, end := c.Span(); string(start) != "m" || len(end) != 0 {
		t.Fatalf("child span [%q, %q)", start, end)
	}
	cevs, _, _, err := c.Events(1, c.Closed(), []byte("m"), []byte{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := eventKeys(cevs); got != "m m1 z m" {
		t.Fatalf("child's events: %s", got)
	}
	ckvs, _, err := c.Scan(ctx, []byte("m"), []byte{}, c.Closed(), ScanOptions{})
	if err != nil || len(ckvs) != 3 || string(ckvs[0].Value) != "2" {
		t.Fatalf("child's keys: %v %v", ckvs, err)
	}
	if has, err := raftgroup.HasState(db, 200); err != nil || !has {
		t.Fatalf("child's raft bootstrap state: %v %v", has, err)
	}
	// A subscription carries the split, and from below it every event the
	// parent published before it.
	sub, err := p.Subscribe(1)
	if err != nil {
		t.Fatal(err)
	}
	if s := sub.Splits(); len(s) != 1 || s[0].Child != 200 {
		t.Fatalf("subscription splits %+v", s)
	}
	cu, done, err := sub.CatchUp(0)
	if err != nil || !done {
		t.Fatalf("catch-up: %v %v", done, err)
	}
	if got := eventKeys(cu); got != "a m a1 m1 z m" {
		t.Fatalf("parent's feed from before the split: %s", got)
	}
	sub.Cancel()
	// The split survives a restart of the replica.
	p2, err := New(Config{ID: 100, Start: []byte{}, DB: db, Revisions: revs, Leases: allLeases{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, end := p2.Span(); string(end) != "m" || len(p2.Splits()) != 1 {
		t.Fatalf("after reopening: span end %q, splits %+v", end, p2.Splits())
	}
}

func eventKeys(evs []RevEvents) string {
	var s string
	for _, e := range evs {
		for _, ev := range e.Events {
			if s != "" {
				s += " "
			}
			s += string(ev.Kv.Key)
		}
	}
	return fmt.Sprint(s)
}

// TestCheckSnapshotRefusesOverlap: a snapshot whose span overlaps another
// partition's replica on the node (one from before a split whose child is
// here) is refused; others are taken.
func TestCheckSnapshotRefusesOverlap(t *testing.T) {
	db := openDB(t)
	src, err := New(Config{ID: 100, Start: []byte("a"), End: []byte("z"), DB: db, Revisions: newFakeRevs(), Leases: allLeases{}})
	if err != nil {
		t.Fatal(err)
	}
	var data []byte
	if err := src.WriteSnapshot(db, func(k, v []byte) error {
		data = binary.AppendUvarint(data, uint64(len(k)))
		data = append(data, k...)
		data = binary.AppendUvarint(data, uint64(len(v)))
		data = append(data, v...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var asked [2]string
	for _, overlap := range []bool{false, true} {
		p, err := New(Config{ID: 100, DB: openDB(t), Revisions: newFakeRevs(), Leases: allLeases{},
			Overlaps: func(id uint64, start, end []byte) bool { asked = [2]string{string(start), string(end)}; return overlap }})
		if err != nil {
			t.Fatal(err)
		}
		err = p.CheckSnapshot(data)
		if asked != [2]string{"a", "z"} {
			t.Fatalf("asked about [%q, %q), want the snapshot's span [a, z)", asked[0], asked[1])
		}
		if overlap != errors.Is(err, ErrOverlappingReplica) {
			t.Fatalf("overlap %v: CheckSnapshot = %v", overlap, err)
		}
	}
}

// TestAddedReplicaIndexesNothingUntilItsSnapshot: a replica a leader adds
// to this node (no span until its first snapshot) must not index the
// node's keys. Its unset span reads as the whole key space, and the node
// creates it under its raft host's lock: indexing every key of every
// partition there stalled all of the node's groups (at 0.1 CPU, seconds;
// its leaderships went to elections). A replica reopened with its
// persisted span indexes its keys as before.
func TestAddedReplicaIndexesNothingUntilItsSnapshot(t *testing.T) {
	db := openDB(t)
	p := leadingPartition(t, Config{ID: 100, Start: []byte{}, End: []byte("n"), DB: db, Revisions: newFakeRevs(), Leases: allLeases{}})
	for _, k := range []string{"a", "b", "c", "m"} {
		if _, err := p.Txn(context.Background(), put(k, "v")); err != nil {
			t.Fatal(err)
		}
	}
	if n := p.Keys(); n != 4 {
		t.Fatalf("leader indexes %d keys, want 4", n)
	}

	added, err := New(Config{ID: 200, DB: db, Revisions: newFakeRevs(), Leases: allLeases{}})
	if err != nil {
		t.Fatal(err)
	}
	if added.Initialized() {
		t.Fatal("a replica without a span is initialized")
	}
	if n := added.Keys(); n != 0 {
		t.Fatalf("a replica without a span indexes %d keys (another partition's), want 0", n)
	}

	reopened, err := New(Config{ID: 100, DB: db, Revisions: newFakeRevs(), Leases: allLeases{}})
	if err != nil {
		t.Fatal(err)
	}
	if !reopened.Initialized() {
		t.Fatal("a replica with a persisted span is not initialized")
	}
	if n := reopened.Keys(); n != 4 {
		t.Fatalf("a replica reopened with its span indexes %d keys, want 4", n)
	}
}

// leadingPartition opens partition cfg.ID in cfg.DB as the one voter of
// its raft group on a host of its own, and waits until it leads.
func leadingPartition(t *testing.T, cfg Config) *Partition {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	host, err := raftgroup.NewHost(raftgroup.Config{NodeID: 1, TickInterval: 10 * time.Millisecond}, cfg.DB, nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := host.CreateGroup(cfg.ID, []uint64{1}, p)
	if err != nil {
		t.Fatal(err)
	}
	p.Bind(g)
	host.Start()
	t.Cleanup(func() { p.Close(); host.Stop() })
	for deadline := time.Now().Add(5 * time.Second); !p.IsLeader(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
	}
	return p
}
