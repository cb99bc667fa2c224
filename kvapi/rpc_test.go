package kvapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/peerconn"
	"github.com/brainkv/brain/partition"
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
