package kvapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/peerconn"
	"github.com/brainkv/brain/internal/rpccodec"
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
	puts         atomic.Int64
}

func (h *roleHandler) HandleCall(ctx context.Context, req *CallRequest) ([]byte, error) {
	switch {
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

func (h *roleHandler) LeaderOf(uint64) uint64            { return h.leader }
func (h *roleHandler) ServeFeed(grpc.ServerStream) error { return nil }

// TestCallFindsLeaderNoHintNames checks a node that has no replica of a
// group and no hint of its leader (gossip missed the leader's update: CI
// failed a put that way after 7 s of "no leader" while the group had a
// leader throughout) asks its peers, and sends the write to the leader
// they name, and only there.
func TestCallFindsLeaderNoHintNames(t *testing.T) {
	addrs := map[uint64]string{}
	handlers := map[uint64]*roleHandler{
		1: {self: 1},            // no replica
		2: {self: 2, leader: 3}, // follower
		3: {self: 3, leader: 3}, // leader
		5: {self: 5},            // no replica
		6: {self: 6, leader: 3}, // follower
	}
	for id, h := range handlers {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(rpccodec.PeerServerOptions()...)
		srv.RegisterService(&internalServiceDesc, h)
		go srv.Serve(l)
		t.Cleanup(srv.Stop)
		addrs[id] = l.Addr().String()
	}
	conns := peerconn.New(func(id uint64) (string, bool) { a, ok := addrs[id]; return a, ok })
	t.Cleanup(conns.Close)
	s, err := NewStore(Config{Self: 4, RPC: NewClient(conns, nil), Routes: []Route{{ID: FirstPartition}},
		LeaderHint: func(uint64) uint64 { return 0 },
		Peers:      func() []uint64 { return []uint64{1, 2, 3, 5, 6} }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var got string
	err = s.call(ctx, FirstPartition, OpPut, false, nil,
		func() ([]byte, error) { return []byte("put"), nil },
		func(b []byte) error { got = string(b); return nil })
	if err != nil || got != "ok" {
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
