package kvapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/peerconn"
	"github.com/brainkv/brain/internal/rpccodec"
	"github.com/brainkv/brain/meta"
	"github.com/brainkv/brain/partition"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCallToDeadNodeIsNeverSent checks a call to a node nobody listens on
// is known not to have been sent (so a forwarded write may be retried on
// the next leader instead of failing with "leader changed"), while a call
// that broke after it was sent is not.
func TestCallToDeadNodeIsNeverSent(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // a dead node: connection refused
	conns := peerconn.New(func(uint64) (string, bool) { return addr, true })
	defer conns.Close()
	c := NewClient(conns, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Call(ctx, 7, &CallRequest{Op: OpClusterInfo})
	var un *unavailableError
	if !errors.As(err, &un) || !un.notSent {
		t.Fatalf("call to a dead node: %v (unavailable: %v)", err, un)
	}
	if neverSent(status.Error(codes.Unavailable, "error reading from server: EOF")) ||
		neverSent(status.Error(codes.Unavailable, "transport is closing")) ||
		neverSent(status.Error(codes.DeadlineExceeded, "context deadline exceeded")) {
		t.Fatal("a call that broke after it was sent counted as never sent")
	}
}

// TestErrorCodesRoundTrip checks the errors callers match on survive the
// trip between nodes (an unknown one arrives as plain text, which the
// gateway can only answer as etcd's code Unknown).
func TestErrorCodesRoundTrip(t *testing.T) {
	for _, want := range []error{ErrNoLeader, partition.ErrRetriesExhausted, ErrNoReplica, partition.ErrLeaderChanged, partition.ErrCompacted} {
		code, msg := toCode(fmt.Errorf("wrapped: %w", want))
		got := fromCode(&CallResponse{Code: code, Msg: msg})
		if !errors.Is(got, want) {
			t.Errorf("%v came back as %v (code %d)", want, got, code)
		}
	}
	// A meta command refused for its stale term was not executed: the
	// caller retries it at the leader, as for "not leader".
	if code, _ := toCode(fmt.Errorf("wrapped: %w", meta.ErrStaleTerm)); code != codeNotLeader || !isNotLeader(meta.ErrStaleTerm) {
		t.Errorf("meta.ErrStaleTerm has code %d, want not leader (%d)", code, codeNotLeader)
	}
}

// TestSentWriteTimeoutIsNotNoLeader checks a forwarded write whose
// request ran out of time after it reached the leader's node is answered
// as timed out (it may have executed), never as "no leader": etcd clients
// retry a write on "no leader" by themselves, as etcd answers it only for
// writes it did not execute, so a retry could apply it twice.
func TestSentWriteTimeoutIsNotNoLeader(t *testing.T) {
	h := &echoHandler{ended: make(chan error, 4), deadlines: make(chan time.Time, 4)}
	c, _ := serveInternal(t, h, &internalServiceDesc)
	s, err := NewStore(Config{Self: 2, RPC: c, LeaderHint: func(uint64) uint64 { return 1 }, Routes: []Route{{ID: FirstPartition}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	args := func() ([]byte, error) { return nil, nil }
	// The handler of OpRequestClose answers only once its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = s.call(ctx, FirstPartition, OpRequestClose, false, nil, args, nil)
	if errors.Is(err, ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a sent write past its deadline: %v, want the deadline exceeded (etcd's request timed out)", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := s.call(ctx, FirstPartition, OpRequestClose, true, nil, args, nil); !errors.Is(err, ErrNoLeader) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an idempotent call past its deadline: %v, want no leader or the deadline exceeded", err)
	}
}

// roleHandler answers as one node's replica of a group: the leader (it
// serves, and names itself in OpGroupInfo), a follower (NotLeader, naming
// leader) or a node without a replica (ErrNoReplica). It counts the
// writes it got.
type roleHandler struct {
	self, leader uint64 // leader 0: no replica here
	// deposed: a replica that knows no leader (it stepped down) and
	// whose "not leader" answers name itself, as gossip still says.
	deposed bool
	puts    atomic.Int64
	infos   atomic.Int64 // OpGroupInfo calls
}

func (h *roleHandler) HandleCall(ctx context.Context, req *CallRequest) ([]byte, error) {
	if req.Op == OpGroupInfo {
		h.infos.Add(1)
	}
	switch {
	case h.deposed:
		return nil, partition.ErrNotLeader
	case h.leader == 0:
		return nil, ErrNoReplica
	case h.leader != h.self:
		return nil, partition.ErrNotLeader
	case req.Op == OpGroupInfo:
		return encodeGroupInfo(GroupInfo{Leader: h.self, Voters: []uint64{1, 2, 3}}), nil
	}
	h.puts.Add(1)
	return []byte("ok"), nil
}

func (h *roleHandler) LeaderOf(uint64) uint64 {
	if h.deposed {
		return h.self
	}
	return h.leader
}
func (h *roleHandler) ServeFeed(grpc.ServerStream) error { return nil }

// TestCallFindsLeaderNoHintNames checks a node that has no replica of a
// group and no hint of its leader (gossip missed the leader's update: CI
// failed a put that way after 7 s of "no leader" while the group had a
// leader throughout) asks its peers, and sends the write to the leader
// they name, and only there.
func TestCallFindsLeaderNoHintNames(t *testing.T) {
	handlers := map[uint64]*roleHandler{
		1: {self: 1},            // no replica
		2: {self: 2, leader: 3}, // follower
		3: {self: 3, leader: 3}, // leader
		5: {self: 5},            // no replica
		6: {self: 6, leader: 3}, // follower
	}
	s := roleStore(t, handlers, 0)
	if got, err := rolePut(s, 3*time.Second); err != nil || got != "ok" {
		t.Fatalf("a write no hint routes: %q, %v; want the leader's answer", got, err)
	}
	for id, h := range handlers {
		want := int64(0)
		if id == 3 {
			want = 1
		}
		if n := h.puts.Load(); n != want {
			t.Errorf("node %d got %d writes, want %d", id, n, want)
		}
	}
	if l := s.hints.get(FirstPartition); l != 3 {
		t.Errorf("the store's hint for the group is %d after the call, want 3", l)
	}
}

// TestCallsShareLeaderProbes checks that many calls for a group that no
// node leads share the rounds of asking the peers for its leader: each
// peer is asked about once per probeInterval, not once per call.
func TestCallsShareLeaderProbes(t *testing.T) {
	handlers := map[uint64]*roleHandler{1: {self: 1}, 2: {self: 2}, 3: {self: 3}}
	s := roleStore(t, handlers, 0)
	const calls = 40
	const wait = 600 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.call(ctx, FirstPartition, OpPut, false, nil,
				func() ([]byte, error) { return []byte("put"), nil }, nil)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		// The caller's deadline passed first: its error, not "no leader".
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a call for a group without a leader, past its caller's deadline: %v, want %v", err, context.DeadlineExceeded)
		}
	}
	// Rounds start at most every probeInterval; one more for the round
	// under way as the calls gave up.
	most := int64(time.Since(start)/probeInterval) + 2
	for id, h := range handlers {
		if n := h.infos.Load(); n < 1 || n > most {
			t.Errorf("node %d was asked for the group's info %d times by %d calls in %v, want 1 to %d",
				id, n, calls, time.Since(start).Round(time.Millisecond), most)
		}
		if n := h.puts.Load(); n != 0 {
			t.Errorf("node %d got %d writes, want none", id, n)
		}
	}
}

// TestCallLeavesDeposedLeader checks a call whose hint names a node that
// no longer leads the group (gossip still carries its claim after it
// stepped down, and it names itself as it refuses) asks the replicas
// which node leads instead of going back there until it gives up: calls
// failed with "no leader" after 7 s that way in a 6-node benchmark.
func TestCallLeavesDeposedLeader(t *testing.T) {
	handlers := map[uint64]*roleHandler{
		1: {self: 1, leader: 2},     // follower of the new leader
		2: {self: 2, leader: 2},     // the new leader
		3: {self: 3, deposed: true}, // stepped down
	}
	s := roleStore(t, handlers, 3)
	if got, err := rolePut(s, 2*time.Second); err != nil || got != "ok" {
		t.Fatalf("a write routed to a deposed leader: %q, %v; want the new leader's answer", got, err)
	}
	if n := handlers[2].puts.Load(); n != 1 {
		t.Errorf("the new leader got %d writes, want 1", n)
	}
}

// TestNotLeaderNamesAnotherNode checks a node's "not leader" answer never
// names the node itself, even when gossip still says it leads the group.
func TestNotLeaderNamesAnotherNode(t *testing.T) {
	for _, tc := range []struct{ hint, want uint64 }{{4, 0}, {2, 2}, {0, 0}} {
		s, err := NewStore(Config{Self: 4, Routes: []Route{{ID: FirstPartition}},
			LeaderHint: func(uint64) uint64 { return tc.hint }})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.LeaderOf(FirstPartition); got != tc.want {
			t.Errorf("node 4 with a hint naming %d: its not-leader answer names %d, want %d", tc.hint, got, tc.want)
		}
		s.Stop()
	}
}

// rolePut sends a write to the store's partition, waiting at most wait,
// and returns the answer.
func rolePut(s *Store, wait time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var got string
	err := s.call(ctx, FirstPartition, OpPut, false, nil,
		func() ([]byte, error) { return []byte("put"), nil },
		func(b []byte) error { got = string(b); return nil })
	return got, err
}

// roleStore returns a store on node 4 with one partition whose leader
// hint (gossip's) is hint, and the handlers as its peers, each behind its
// own gRPC server.
func roleStore(t *testing.T, handlers map[uint64]*roleHandler, hint uint64) *Store {
	t.Helper()
	addrs := map[uint64]string{}
	var peers []uint64
	for id, h := range handlers {
		peers = append(peers, id)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(rpccodec.PeerServerOptions()...)
		srv.RegisterService(&internalServiceDesc, newInternalServer(h))
		go srv.Serve(l)
		t.Cleanup(srv.Stop)
		addrs[id] = l.Addr().String()
	}
	conns := peerconn.New(func(id uint64) (string, bool) { a, ok := addrs[id]; return a, ok })
	t.Cleanup(conns.Close)
	s, err := NewStore(Config{Self: 4, RPC: NewClient(conns, nil), Routes: []Route{{ID: FirstPartition}},
		LeaderHint: func(uint64) uint64 { return hint },
		Peers:      func() []uint64 { return peers }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}
