package raftgroup

import (
	"bytes"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/peerconn"
	"github.com/brainkv/brain/internal/rpccodec"
	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
)

// TestGRPCTransport runs a group over real gRPC connections on loopback:
// replication, then a new replica caught up by a snapshot stream.
func TestGRPCTransport(t *testing.T) {
	var mu sync.Mutex
	addrs := map[uint64]string{}
	resolve := func(id uint64) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		a, ok := addrs[id]
		return a, ok
	}
	type gnode struct {
		*testNode
		srv *grpc.Server
		tr  *GRPCTransport
	}
	start := func(id uint64, voters []uint64) *gnode {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		addrs[id] = l.Addr().String()
		mu.Unlock()
		db := openMem(t, vfs.NewMem())
		cfg := testConfig(id)
		cfg.MaxFollowerLag = 40
		cfg.NewReplica = func(group uint64) (StateMachine, error) {
			return &snapCounter{counterSM: newCounterSM(t, db, group), db: db}, nil
		}
		conns := peerconn.New(resolve)
		t.Cleanup(conns.Close)
		tr := NewGRPCTransport(id, conns, testLogger())
		h, err := NewHost(cfg, db, tr)
		if err != nil {
			t.Fatal(err)
		}
		tr.Bind(h)
		srv := grpc.NewServer(grpc.ForceServerCodecV2(rpccodec.New()))
		RegisterService(srv, h)
		go srv.Serve(l)
		if voters != nil {
			if _, err := h.CreateGroup(testGroup, voters, &snapCounter{counterSM: newCounterSM(t, db, testGroup), db: db}); err != nil {
				t.Fatal(err)
			}
		}
		h.Start()
		return &gnode{testNode: &testNode{id: id, db: db, host: h}, srv: srv, tr: tr}
	}
	var nodes []*gnode
	for id := uint64(1); id <= 3; id++ {
		nodes = append(nodes, start(id, []uint64{1, 2, 3}))
	}
	n4 := start(4, nil)
	nodes = append(nodes, n4)
	defer func() {
		for _, n := range nodes {
			n.srv.Stop()
			n.tr.Close()
			n.host.Stop()
		}
	}()
	nodes[0].host.Group(testGroup).Campaign()
	var gs []*Group
	for _, n := range nodes[:3] {
		gs = append(gs, n.host.Group(testGroup))
	}
	leader := waitLeader(t, gs...)
	propose(t, leader, 200)
	for _, n := range nodes[:3] {
		waitCount(t, n.testNode, 200)
	}
	changeConf(t, leader, raftpb.ConfChangeAddLearnerNode, 4)
	waitCount(t, n4.testNode, 200)
	propose(t, leader, 10)
	waitCount(t, n4.testNode, 210)

	// Every node sent batches, got batches stamped by their senders and
	// stepped the messages from its groups' inboxes.
	for _, n := range nodes {
		m := n.host.metrics
		if c := histogramCount(m.batchTransit); c == 0 {
			t.Errorf("node %d: brain_raft_batch_transit_seconds has no samples", n.id)
		}
		if c := histogramCount(m.sendQueue); c == 0 {
			t.Errorf("node %d: brain_raft_send_queue_seconds has no samples", n.id)
		}
		if c := histogramCount(m.inboxWait); c == 0 {
			t.Errorf("node %d: brain_raft_inbox_wait_seconds has no samples", n.id)
		}
	}
}

// TestRaftBatchQueuedEncoding: the sender's queue time travels after the
// messages, so the bytes without it are the old encoding (which receivers
// from before the field read, ignoring the rest), and a batch from an old
// sender decodes with no time.
func TestRaftBatchQueuedEncoding(t *testing.T) {
	msgs := []GroupMessage{
		{Group: 7, Msg: raftpb.Message{Type: raftpb.MsgApp, To: 2, From: 1, Term: 3, Index: 9, Entries: []raftpb.Entry{{Term: 3, Index: 10, Data: []byte("x")}}}},
		{Group: 8, Msg: raftpb.Message{Type: raftpb.MsgHeartbeat, To: 2, From: 1, Term: 1}},
	}
	old, err := (&RaftBatch{From: 1, Msgs: msgs}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	queued := time.Date(2026, 12, 3, 9, 0, 0, 123, time.UTC).UnixNano()
	stamped, err := (&RaftBatch{From: 1, Msgs: msgs, Queued: queued}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(stamped, old) || len(stamped) == len(old) {
		t.Fatalf("the stamped encoding (%d bytes) does not extend the old one (%d bytes)", len(stamped), len(old))
	}
	for _, c := range []struct {
		name string
		data []byte
		want int64
	}{{"stamped", stamped, queued}, {"old sender", old, 0}, {"cut trailer", append(slices.Clone(old), 0x80), 0}} {
		var b RaftBatch
		if err := b.Unmarshal(c.data); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if b.Queued != c.want {
			t.Errorf("%s: Queued = %d, want %d", c.name, b.Queued, c.want)
		}
		if b.From != 1 || len(b.Msgs) != 2 || b.Msgs[0].Group != 7 || string(b.Msgs[0].Msg.Entries[0].Data) != "x" || b.Msgs[1].Msg.Type != raftpb.MsgHeartbeat {
			t.Errorf("%s: decoded %+v", c.name, b)
		}
	}
}

// batchCounter serves the raft transport's Messages stream, counting the
// batches and messages it receives.
type batchCounter struct {
	batches, msgs atomic.Int64
}

func (c *batchCounter) messages(s grpc.ServerStream) error {
	for {
		var b RaftBatch
		if err := s.RecvMsg(&b); err != nil {
			return err
		}
		c.batches.Add(1)
		c.msgs.Add(int64(len(b.Msgs)))
	}
}

func (c *batchCounter) snapshot(grpc.ServerStream) error { return nil }

// TestSendBatchesReadySenders: messages that goroutines ready to run hand
// the transport for one peer travel in few batches. On one thread (a node
// under a CPU share below one), eight producers that each send a message
// and let the others run, as raft workers finishing rounds do, used to
// see about one message a batch: the first Send woke the peer's sender
// and made it the next goroutine to run.
func TestSendBatchesReadySenders(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(rpccodec.New()))
	counter := &batchCounter{}
	srv.RegisterService(&raftServiceDesc, counter)
	go srv.Serve(l)
	defer srv.Stop()
	conns := peerconn.New(func(uint64) (string, bool) { return l.Addr().String(), true })
	defer conns.Close()
	tr := NewGRPCTransport(1, conns, testLogger())
	defer tr.Close()

	// The stream is open and the sender waits for messages.
	tr.Send(2, []GroupMessage{{Group: 1, Msg: raftpb.Message{Type: raftpb.MsgHeartbeat, To: 2, From: 1}}})
	waitMsgs := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for counter.msgs.Load() < n {
			if time.Now().After(deadline) {
				t.Fatalf("the peer received %d of %d messages", counter.msgs.Load(), n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitMsgs(1)
	counter.batches.Store(0)
	counter.msgs.Store(0)

	const producers, each = 8, 100
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tr.Send(2, []GroupMessage{{Group: uint64(p), Msg: raftpb.Message{Type: raftpb.MsgApp, To: 2, From: 1, Index: uint64(i)}}})
				runtime.Gosched()
			}
		}()
	}
	wg.Wait()
	waitMsgs(producers * each)
	batches, msgs := counter.batches.Load(), counter.msgs.Load()
	if batches*4 > msgs {
		t.Fatalf("%d messages came in %d batches: fewer than 4 a batch", msgs, batches)
	}
	t.Logf("%d messages in %d batches", msgs, batches)
}
