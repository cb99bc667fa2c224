package kvapi

import (
	"context"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/brainkv/brain/partition"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
)

// feedStream is the server side of a Feed stream: it receives req and
// hands every sent message to sent.
type feedStream struct {
	grpc.ServerStream // headers and trailers: unused by ServeFeed
	ctx               context.Context
	req               *FeedRequest
	sent              chan *FeedMessage
}

func (f *feedStream) Context() context.Context { return f.ctx }

func (f *feedStream) RecvMsg(m any) error {
	*m.(*FeedRequest) = *f.req
	return nil
}

func (f *feedStream) SendMsg(m any) error {
	select {
	case f.sent <- m.(*FeedMessage):
		return nil
	case <-f.ctx.Done():
		return f.ctx.Err()
	}
}

// TestServedFeedCarriesPrevValues checks that live events a feed serves
// to another node carry their prev_kv values and say so. The receiving
// node's replica of the partition may lag behind the stream (it is why the
// node streams the feed): were the events still marked as lacking the
// values, its watch hub would look them up in that replica, miss, and send
// watchers events without the prev_kv they asked for.
func TestServedFeedCarriesPrevValues(t *testing.T) {
	ctx, p, s, _ := soloStoreWithPut(t)

	st := &feedStream{ctx: ctx, req: &FeedRequest{Group: FirstPartition, From: -1}, sent: make(chan *FeedMessage, 16)}
	served := make(chan error, 1)
	go func() { served <- s.ServeFeed(st) }()
	// The feed is live once it sends its catch-up's closed revision.
	for live := false; !live; {
		select {
		case m := <-st.sent:
			live = m.Closed != 0
		case err := <-served:
			t.Fatalf("the feed ended: %v", err)
		case <-ctx.Done():
			t.Fatal("the feed did not go live")
		}
	}
	put, err := p.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte("v2")})
	if err != nil {
		t.Fatal(err)
	}
	for {
		var m *FeedMessage
		select {
		case m = <-st.sent:
		case err := <-served:
			t.Fatalf("the feed ended: %v", err)
		case <-ctx.Done():
			t.Fatal("the feed did not deliver the put")
		}
		for _, r := range m.Events {
			if r.Rev != put.Header.Revision {
				continue
			}
			if r.PrevValuesMissing {
				t.Error("the served events are marked as lacking prev_kv values")
			}
			if len(r.Events) != 1 {
				t.Fatalf("revision %d has %d events, want 1", r.Rev, len(r.Events))
			}
			if pk := r.Events[0].PrevKv; pk == nil || string(pk.Value) != "v1" {
				t.Errorf("the put's prev_kv is %v, want the value v1", pk)
			}
			return
		}
	}
}

// TestFeedBufferMergesQueuedPublishes checks that what a live feed queues
// between two sends goes out in as few messages as the revision cap
// allows, in publish order, with the highest closed revision.
func TestFeedBufferMergesQueuedPublishes(t *testing.T) {
	b := &feedBuffer{wake: make(chan struct{}, 1)}
	ev := func(rev int64) partition.RevEvents {
		return partition.RevEvents{Rev: rev, Events: []*mvccpb.Event{{Kv: &mvccpb.KeyValue{Key: []byte("k"), ModRevision: rev}}}}
	}
	b.Publish(1, partition.RevEvents{}, 5)
	b.Publish(1, ev(6), 0)
	b.Publish(1, ev(7), 7)
	b.Publish(1, partition.RevEvents{}, 7)
	b.Publish(1, ev(9), 8)
	msgs, overflow := b.take()
	if overflow {
		t.Fatal("a few events overflowed the buffer")
	}
	if len(msgs) != 1 {
		t.Fatalf("%d messages, want 1", len(msgs))
	}
	var revs []int64
	for _, r := range msgs[0].Events {
		revs = append(revs, r.Rev)
	}
	if fmt.Sprint(revs) != "[6 7 9]" || msgs[0].Closed != 8 {
		t.Fatalf("message with revisions %v, closed %d; want [6 7 9], closed 8", revs, msgs[0].Closed)
	}

	for rev := int64(10); rev < 10+feedCatchUpRevs+1; rev++ {
		b.Publish(1, ev(rev), rev)
	}
	msgs, _ = b.take()
	if len(msgs) != 2 || len(msgs[0].Events) != feedCatchUpRevs || len(msgs[1].Events) != 1 {
		t.Fatalf("%d messages for %d revisions, want %d and 1", len(msgs), feedCatchUpRevs+1, feedCatchUpRevs)
	}
	if msgs[0].Closed != 9+feedCatchUpRevs || msgs[1].Closed != 10+feedCatchUpRevs || msgs[1].Events[0].Rev != 10+feedCatchUpRevs {
		t.Fatalf("closed %d and %d, last revision %d", msgs[0].Closed, msgs[1].Closed, msgs[1].Events[0].Rev)
	}
}

// TestPrevValueOnOneNode checks that a node without peers answers a
// prev_kv lookup from its replica: the value of a version it has, and at
// once an error for one it does not have (there is no leader elsewhere to
// ask; waiting for one would stall the watch hub for the call's timeout).
func TestPrevValueOnOneNode(t *testing.T) {
	_, _, s, rev := soloStoreWithPut(t)
	if v, err := s.PrevValue([]byte("k"), rev); err != nil || string(v) != "v1" {
		t.Fatalf("PrevValue at %d: %q, %v; want v1", rev, v, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.PrevValue([]byte("k"), rev+1000)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("PrevValue of a version that does not exist succeeded")
		}
	case <-time.After(3 * time.Second):
		t.Fatal("PrevValue of a version this node lacks did not return (it waits for a leader elsewhere)")
	}
}

// soloStoreWithPut starts a store of one node with startSoloPartition's
// partition and puts k=v1 there; it returns a context for the test (10 s),
// the partition, the store and the put's revision.
func soloStoreWithPut(t *testing.T) (context.Context, *partition.Partition, *Store, int64) {
	t.Helper()
	_, p := startSoloPartition(t)
	s, err := NewStore(Config{Self: 1, Routes: []Route{{ID: FirstPartition, Local: p}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	put, err := p.Put(ctx, &pb.PutRequest{Key: []byte("k"), Value: []byte("v1")})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, p, s, put.Header.Revision
}

// TestFeedMessageEncoding: a FeedMessage survives Marshal and Unmarshal,
// and its events are encoded as each event's own Marshal with its length
// before it (the format nodes of earlier builds read).
func TestFeedMessageEncoding(t *testing.T) {
	kv := func(k string, rev int64, v string) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(k), CreateRevision: rev, ModRevision: rev, Version: 1, Value: []byte(v), Lease: 7}
	}
	m := &FeedMessage{
		Closed:    42,
		Compacted: 3,
		Events: []partition.RevEvents{
			{Rev: 40, Events: []*mvccpb.Event{{Type: mvccpb.PUT, Kv: kv("/a", 40, "x")}, {Type: mvccpb.PUT, Kv: kv("/b", 40, string(make([]byte, 300)))}}},
			{Rev: 41, PrevValuesMissing: true, Events: []*mvccpb.Event{{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte("/a"), ModRevision: 41}, PrevKv: kv("/a", 40, "")}}},
			{Rev: 42},
		},
	}
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var got FeedMessage
	if err := got.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if got.Closed != m.Closed || got.Compacted != m.Compacted || len(got.Events) != len(m.Events) {
		t.Fatalf("decoded %+v, want %+v", got, *m)
	}
	for i, r := range m.Events {
		g := got.Events[i]
		if g.Rev != r.Rev || g.PrevValuesMissing != r.PrevValuesMissing || len(g.Events) != len(r.Events) {
			t.Fatalf("revision %d decoded as %+v, want %+v", i, g, r)
		}
		for j, ev := range r.Events {
			if g.Events[j].String() != ev.String() {
				t.Fatalf("revision %d event %d decoded as %v, want %v", i, j, g.Events[j], ev)
			}
		}
	}
	// The events' encoding, fixed: nodes of earlier builds read it (these
	// bytes are what the encoder before 6114317, one Marshal per event,
	// wrote for these events).
	golden := []partition.RevEvents{
		{Rev: 5, Events: []*mvccpb.Event{{Type: mvccpb.PUT, Kv: kv("/a", 5, "x")}}},
		{Rev: 6, PrevValuesMissing: true, Events: []*mvccpb.Event{{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte("/a"), ModRevision: 6}, PrevKv: kv("/a", 5, "")}}},
		{Rev: 7},
	}
	const want = "030a000111120f0a022f611005180520012a017830070c010118080112060a022f6118061a0c0a022f6110051805200130070e0000"
	enc, err := appendRevEvents(nil, golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(enc); got != want {
		t.Fatalf("events encoded as\n%s\nwant (as earlier builds)\n%s", got, want)
	}
	if n := revEventsSize(golden); n < len(enc) {
		t.Fatalf("revEventsSize = %d, less than the %d bytes written", n, len(enc))
	}
}

// BenchmarkFeedMessageMarshal encodes a message of 16 revisions of one
// 1 KiB create each, as a feed sends under a create load.
func BenchmarkFeedMessageMarshal(b *testing.B) {
	m := &FeedMessage{Closed: 100}
	for i := 0; i < 16; i++ {
		rev := int64(100 + i)
		m.Events = append(m.Events, partition.RevEvents{Rev: rev, Events: []*mvccpb.Event{{Type: mvccpb.PUT,
			Kv: &mvccpb.KeyValue{Key: []byte(fmt.Sprintf("/registry/pods/default/pod-%d", i)), CreateRevision: rev, ModRevision: rev, Version: 1, Value: make([]byte, 1024)}}}})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Marshal(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReadsWaitForSplitChildReplica checks the reads the watch hub and
// the gateway make of a partition this node routes to before its replica
// here is open: a split's child is in the partition map (the parent's
// split record says so) a moment before createSplitChild has opened it.
// A node without peers has nobody else to ask, so each read must find the
// replica once it is there, not wait for a leader elsewhere until it times
// out (the hub sent events without their prev_kv when it did).
func TestReadsWaitForSplitChildReplica(t *testing.T) {
	ctx, p, s, rev := soloStoreWithPut(t)
	s.SetLocal(FirstPartition, nil)
	time.AfterFunc(200*time.Millisecond, func() { s.SetLocal(FirstPartition, p) })
	rt := s.table().routeFor([]byte("k"))
	type result struct {
		what string
		err  error
	}
	results := make(chan result, 3)
	go func() {
		v, err := s.PrevValue([]byte("k"), rev)
		if err == nil && string(v) != "v1" {
			err = fmt.Errorf("value %q, want v1", v)
		}
		results <- result{"PrevValue", err}
	}()
	go func() {
		kvs, n, err := s.scan(ctx, rt, []byte("k"), nil, rev, partition.ScanOptions{})
		if err == nil && (n != 1 || len(kvs) != 1 || string(kvs[0].Value) != "v1") {
			err = fmt.Errorf("%d kvs, count %d; want k=v1", len(kvs), n)
		}
		results <- result{"scan", err}
	}()
	go func() {
		keys, err := s.leaseKeys(ctx, rt, 7)
		if err == nil && len(keys) != 0 {
			err = fmt.Errorf("keys %q, want none", keys)
		}
		results <- result{"leaseKeys", err}
	}()
	for range 3 {
		select {
		case r := <-results:
			if r.err != nil {
				t.Errorf("%s: %v", r.what, r.err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("a read did not find the replica opened after it started (it waits for a leader elsewhere)")
		}
	}
}
