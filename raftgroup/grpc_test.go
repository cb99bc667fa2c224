package raftgroup

import (
	"bytes"
	"fmt"
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

// grpcNode is a host whose transport is gRPC on loopback.
type grpcNode struct {
	*testNode
	srv *grpc.Server
	tr  *GRPCTransport
}

// grpcNodes starts hosts on loopback gRPC connections, each with its own
// in-memory Pebble; change, if set, adjusts every host's configuration.
// The hosts stop when the test ends.
type grpcNodes struct {
	t      *testing.T
	change func(*Config)
	mu     sync.Mutex
	addrs  map[uint64]string
	nodes  []*grpcNode
}

func newGRPCNodes(t *testing.T, change func(*Config)) *grpcNodes {
	c := &grpcNodes{t: t, change: change, addrs: map[uint64]string{}}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			n.srv.Stop()
			n.tr.Close()
			n.host.Stop()
		}
	})
	return c
}

func (c *grpcNodes) resolve(id uint64) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.addrs[id]
	return a, ok
}

// start starts node id; with voters it hosts a replica of testGroup.
func (c *grpcNodes) start(id uint64, voters []uint64) *grpcNode {
	t := c.t
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.addrs[id] = l.Addr().String()
	c.mu.Unlock()
	db := openMem(t, vfs.NewMem())
	cfg := testConfig(id)
	cfg.MaxFollowerLag = 40
	if c.change != nil {
		c.change(&cfg)
	}
	cfg.NewReplica = func(group uint64) (StateMachine, error) {
		return &snapCounter{counterSM: newCounterSM(t, db, group), db: db}, nil
	}
	conns := peerconn.New(c.resolve)
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
	n := &grpcNode{testNode: &testNode{id: id, db: db, host: h}, srv: srv, tr: tr}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	return n
}

// TestGRPCTransport runs a group over real gRPC connections on loopback:
// replication, then a new replica caught up by a snapshot stream.
func TestGRPCTransport(t *testing.T) {
	c := newGRPCNodes(t, nil)
	var nodes []*grpcNode
	for id := uint64(1); id <= 3; id++ {
		nodes = append(nodes, c.start(id, []uint64{1, 2, 3}))
	}
	n4 := c.start(4, nil)
	nodes = append(nodes, n4)
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
	// The leader sends to every other node, and they answer it; the
	// learner never campaigns, so it sends to the leader only. Every
	// counted batch carries a message.
	leaderID := leader.Status().Lead
	sent := func(from *grpcNode, to uint64) (batches, msgs float64) {
		l := fmt.Sprintf("%x", to)
		return counterValue(from.host.metrics.batchesSent.WithLabelValues(l)), counterValue(from.host.metrics.messagesSent.WithLabelValues(l))
	}
	for _, n := range nodes {
		for _, to := range []uint64{1, 2, 3, 4} {
			if to == n.id {
				continue
			}
			b, msgs := sent(n, to)
			switch {
			case (n.id == leaderID || to == leaderID) && (b == 0 || msgs < b):
				t.Errorf("node %d to %d: %v batches, %v messages sent; want batches of at least one message", n.id, to, b, msgs)
			case n.id == 4 && to != leaderID && b != 0:
				t.Errorf("the learner sent %v batches to %d, not the leader (%d)", b, to, leaderID)
			}
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

// TestStarvedHostKeepsLeadership: on a node with more runnable goroutines
// than CPU, Go runs a goroutine the network readied only after those
// already runnable, while a timer's goroutine runs at once. The raft
// clock must not outrun the peers' messages waiting that way: a group
// whose replicas answer every message keeps its leader while every
// replica's node is starved (here the three share one starved process).
func TestStarvedHostKeepsLeadership(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	c := newGRPCNodes(t, func(cfg *Config) {
		cfg.TickInterval = 20 * time.Millisecond
		cfg.ElectionTicks = 10
	})
	var nodes []*grpcNode
	for id := uint64(1); id <= 3; id++ {
		nodes = append(nodes, c.start(id, []uint64{1, 2, 3}))
	}
	nodes[0].host.Group(testGroup).Campaign()
	var gs []*Group
	for _, n := range nodes {
		gs = append(gs, n.host.Group(testGroup))
	}
	leader := waitLeader(t, gs...)
	propose(t, leader, 10)
	term := leader.Status().Term

	// The load: a ring of goroutines passing tokens, each holding the
	// thread for 100 µs per pass, so that about as many goroutines as
	// tokens are runnable at any time (the handlers of a node's client
	// requests, in production).
	const ring, tokens, load = 400, 200, 3 * time.Second
	stop := make(chan struct{})
	var wg sync.WaitGroup
	chans := make([]chan struct{}, ring)
	for i := range chans {
		chans[i] = make(chan struct{}, tokens)
	}
	for i := range ring {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-chans[i]:
				case <-stop:
					return
				}
				for start := time.Now(); time.Since(start) < 100*time.Microsecond; {
				}
				chans[(i+1)%ring] <- struct{}{}
			}
		}()
	}
	for k := range tokens {
		chans[k*ring/tokens] <- struct{}{}
	}
	time.Sleep(load)
	close(stop)
	wg.Wait()

	if st := leader.Status(); !st.IsLeader || st.Term != term {
		t.Fatalf("the leader of term %d lost its leadership while every node was starved: now term %d, leader %d", term, st.Term, st.Lead)
	}
	for _, n := range nodes {
		if d := histogramCount(n.host.metrics.tickDelay); d == 0 {
			t.Errorf("node %d: brain_raft_tick_delay_seconds has no samples", n.id)
		}
	}
}
