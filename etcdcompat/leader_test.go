package etcdcompat

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
)

type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f fakeStream) Context() context.Context { return f.ctx }

// TestLeaderWatchGrace checks etcd's rule on a synthetic clock: a node
// without a leader keeps its require-leader streams, and takes new ones,
// for 3 election timeouts; past them it cancels the open ones with "no
// leader" and refuses new ones, until it hears a leader again.
func TestLeaderWatchGrace(t *testing.T) {
	var has atomic.Bool
	has.Store(true)
	t0 := time.Unix(1000, 0)
	const election = time.Second
	lw := newLeaderWatch(has.Load, election, newStreams(), t0)

	ls, done, err := lw.open(fakeStream{ctx: context.Background()}, true, t0)
	if err != nil {
		t.Fatalf("a stream opened with a leader was refused: %v", err)
	}
	defer done()

	// The leader goes away (an election, a transfer, its node restarts).
	has.Store(false)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	if n := lw.check(at(election)); n != 0 {
		t.Fatalf("1 election timeout without a leader cancelled %d streams", n)
	}
	if n := lw.check(at(3*election - time.Millisecond)); n != 0 {
		t.Fatalf("just under 3 election timeouts without a leader cancelled %d streams", n)
	}
	if ls.Context().Err() != nil {
		t.Fatal("the stream's context ended within the grace")
	}
	// A new stream within the grace is taken (etcd would refuse it, but
	// its clients never reach a member before it has a leader).
	ls2, done2, err := lw.open(fakeStream{ctx: context.Background()}, true, at(2*election))
	if err != nil {
		t.Fatalf("a stream opened 2 election timeouts into an election was refused: %v", err)
	}
	defer done2()
	if lw.leaderless(at(2 * election)) {
		t.Fatal("leaderless within the grace")
	}

	// Past the grace: both streams end with "no leader", new ones are
	// refused, and unary requests too (leaderless).
	if n := lw.check(at(3 * election)); n != 2 {
		t.Fatalf("3 election timeouts without a leader cancelled %d streams, want 2", n)
	}
	for i, s := range []*stream{ls, ls2} {
		if s.Context().Err() == nil {
			t.Fatalf("stream %d still open", i)
		}
		if err := streamCause(s.Context(), s.Context().Err()); !errors.Is(err, rpctypes.ErrGRPCNoLeader) {
			t.Fatalf("stream %d ended with %v, want %v", i, err, rpctypes.ErrGRPCNoLeader)
		}
	}
	if _, _, err := lw.open(fakeStream{ctx: context.Background()}, true, at(3*election)); !errors.Is(err, rpctypes.ErrGRPCNoLeader) {
		t.Fatalf("a stream opened when leaderless: %v, want %v", err, rpctypes.ErrGRPCNoLeader)
	}

	// A leader again: streams are taken and last.
	has.Store(true)
	ls3, done3, err := lw.open(fakeStream{ctx: context.Background()}, true, at(10*election))
	if err != nil {
		t.Fatalf("a stream opened after a leader came back was refused: %v", err)
	}
	defer done3()
	has.Store(false)
	if n := lw.check(at(12 * election)); n != 0 || ls3.Context().Err() != nil {
		t.Fatalf("the grace did not restart when the leader came back: %d cancelled", n)
	}
}

// TestLeaderWatchStreamEnds checks that a stream that ended is no longer
// cancelled, and that a stream whose client went away ends with its own
// error, not "no leader".
func TestLeaderWatchStreamEnds(t *testing.T) {
	lw := newLeaderWatch(func() bool { return false }, time.Second, newStreams(), time.Unix(0, 0))
	parent, cancel := context.WithCancel(context.Background())
	ls, done, err := lw.open(fakeStream{ctx: parent}, true, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	cancel() // the client went away
	if err := streamCause(ls.Context(), ls.Context().Err()); !errors.Is(err, context.Canceled) {
		t.Fatalf("a stream whose client left ended with %v", err)
	}
	done()
	if n := lw.check(time.Unix(10, 0)); n != 0 {
		t.Fatalf("a finished stream was cancelled again (%d)", n)
	}
}

// TestStreamsCloseAll checks that closing the set ends every stream, with
// or without the "hasleader" metadata, with "server stopped", and refuses
// new ones; and that a leaderless check ends only require-leader streams.
func TestStreamsCloseAll(t *testing.T) {
	set := newStreams()
	lw := newLeaderWatch(func() bool { return false }, time.Second, set, time.Unix(0, 0))
	plain, done1, err := lw.open(fakeStream{ctx: context.Background()}, false, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer done1()
	rl, done2, err := lw.open(fakeStream{ctx: context.Background()}, true, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer done2()
	if n := lw.check(time.Unix(5, 0)); n != 1 || rl.Context().Err() == nil || plain.Context().Err() != nil {
		t.Fatalf("a leaderless check cancelled %d streams (require-leader ended: %v, plain ended: %v), want only the require-leader one",
			n, rl.Context().Err() != nil, plain.Context().Err() != nil)
	}
	// A plain stream is taken while leaderless (etcd's rule is for the
	// metadata only).
	p2, done3, err := lw.open(fakeStream{ctx: context.Background()}, false, time.Unix(5, 0))
	if err != nil {
		t.Fatalf("a stream without the metadata was refused while leaderless: %v", err)
	}
	defer done3()
	set.closeAll(rpctypes.ErrGRPCStopped)
	for i, s := range []*stream{plain, p2} {
		if err := streamCause(s.Context(), s.Context().Err()); !errors.Is(err, rpctypes.ErrGRPCStopped) {
			t.Fatalf("stream %d ended with %v, want %v", i, err, rpctypes.ErrGRPCStopped)
		}
	}
	if _, _, err := lw.open(fakeStream{ctx: context.Background()}, false, time.Unix(5, 0)); !errors.Is(err, rpctypes.ErrGRPCStopped) {
		t.Fatalf("a stream opened after close: %v, want %v", err, rpctypes.ErrGRPCStopped)
	}
}
