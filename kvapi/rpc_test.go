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
