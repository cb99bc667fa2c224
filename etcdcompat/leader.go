package etcdcompat

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// maxNoLeaderTimeouts is etcd's maxNoLeaderCnt: how many election
// timeouts a member goes without a leader before it cancels the streams
// opened with the "hasleader" metadata (v3rpc's monitorLeader).
const maxNoLeaderTimeouts = 3

// streams is the set of the node's open client streams (watches, lease
// keep-alives). Its owner can end them all with an error of its choosing:
// leaderWatch ends the require-leader ones with "no leader", and Close
// ends every one with "server stopped" so that a stopping node's gRPC
// server is not held open by streams that never end by themselves (its
// clients resume elsewhere, or here after the restart).
type streams struct {
	mu     sync.Mutex
	m      map[*stream]struct{} // protected by mu
	closed error                // set by closeAll; protected by mu
}

// stream is an open client stream: its handler sees a context that the
// set cancels with the cause the stream must end with.
type stream struct {
	grpc.ServerStream
	ctx           context.Context
	cancel        context.CancelCauseFunc
	requireLeader bool
}

func (s *stream) Context() context.Context { return s.ctx }

func newStreams() *streams { return &streams{m: make(map[*stream]struct{})} }

// add registers ss; the caller must call the returned done when the
// stream ends. It fails once the set is closed.
func (set *streams) add(ss grpc.ServerStream, requireLeader bool) (*stream, func(), error) {
	ctx, cancel := context.WithCancelCause(ss.Context())
	s := &stream{ServerStream: ss, ctx: ctx, cancel: cancel, requireLeader: requireLeader}
	set.mu.Lock()
	if set.closed != nil {
		set.mu.Unlock()
		cancel(nil)
		return nil, nil, set.closed
	}
	set.m[s] = struct{}{}
	set.mu.Unlock()
	return s, func() {
		set.mu.Lock()
		delete(set.m, s)
		set.mu.Unlock()
		cancel(context.Canceled)
	}, nil
}

// cancel ends the streams that match with cause, and returns how many.
func (set *streams) cancel(match func(*stream) bool, cause error) int {
	set.mu.Lock()
	var ended []*stream
	for s := range set.m {
		if match(s) {
			ended = append(ended, s)
			delete(set.m, s)
		}
	}
	set.mu.Unlock()
	for _, s := range ended {
		s.cancel(cause)
	}
	return len(ended)
}

// closeAll ends every stream with cause and refuses new ones with it.
func (set *streams) closeAll(cause error) {
	set.mu.Lock()
	set.closed = cause
	set.mu.Unlock()
	set.cancel(func(*stream) bool { return true }, cause)
}

// streamCause is the error a stream handler whose context ended returns:
// the cause the stream set cancelled it with (a gRPC status: "no leader",
// "server stopped"), else err (the context's own).
func streamCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		if _, ok := status.FromError(cause); ok {
			return cause
		}
	}
	return err
}

// leaderWatch applies etcd's rule for requests and streams that carry the
// "hasleader" metadata (clientv3.WithRequireLeader, which kube-apiserver
// puts on every watch): they are refused, and open streams cancelled with
// "etcdserver: no leader", only once the node has gone without a leader
// for maxNoLeaderTimeouts election timeouts. Reconnecting a stream costs a
// client far more than waiting out an election: etcd's Go client ends a
// require-leader watch for good on "no leader", and kube-apiserver then
// re-watches and, failing that, re-lists. So a leadership change, a
// planned transfer or another node's restart never ends such a stream;
// a node cut off from its cluster does, and its clients move to another
// member.
//
// etcd refuses a new stream at once while its member has no leader; it can
// afford to, because its client listener serves only once the member is
// ready (it has a leader). brain's node serves clients only once it is
// ready too (server.serveWhenReady), and a node's "leader" is its meta
// group's (or, on a node without a meta replica, the one gossip names),
// whose elections are no rarer than etcd's: new streams get the same
// grace as open ones.
type leaderWatch struct {
	has     func() bool   // the node knows a leader now
	grace   time.Duration // maxNoLeaderTimeouts election timeouts
	streams *streams

	mu       sync.Mutex
	lastSeen time.Time // when has() last answered true, or the watch started; protected by mu
}

func newLeaderWatch(has func() bool, electionTimeout time.Duration, set *streams, now time.Time) *leaderWatch {
	return &leaderWatch{has: has, grace: maxNoLeaderTimeouts * electionTimeout, streams: set, lastSeen: now}
}

// leaderless reports whether the node has had no leader for the grace
// period as of now; a node that has a leader records that it saw one.
func (lw *leaderWatch) leaderless(now time.Time) bool {
	has := lw.has()
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if has {
		lw.lastSeen = now
		return false
	}
	return now.Sub(lw.lastSeen) >= lw.grace
}

// check cancels every open require-leader stream if the node is leaderless
// as of now, and returns how many. It runs every sampleEvery (run), and
// in tests directly.
func (lw *leaderWatch) check(now time.Time) int {
	if !lw.leaderless(now) {
		return 0
	}
	return lw.streams.cancel(func(s *stream) bool { return s.requireLeader }, rpctypes.ErrGRPCNoLeader)
}

// sampleEvery is how often run checks for a leader: a tenth of the grace
// keeps the measured leaderless time within 10% of etcd's rule.
func (lw *leaderWatch) sampleEvery() time.Duration { return max(lw.grace/10, time.Millisecond) }

// run checks for a leader until stop closes, and reports through onCancel
// how many streams each leaderless check cancelled.
func (lw *leaderWatch) run(stop <-chan struct{}, onCancel func(n int)) {
	t := time.NewTicker(lw.sampleEvery())
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			if n := lw.check(now); n > 0 && onCancel != nil {
				onCancel(n)
			}
		}
	}
}

// open registers a stream, refusing a require-leader one if the node is
// leaderless. The caller must call the returned done when the stream ends.
func (lw *leaderWatch) open(ss grpc.ServerStream, requireLeader bool, now time.Time) (*stream, func(), error) {
	if requireLeader && lw.leaderless(now) {
		return nil, nil, rpctypes.ErrGRPCNoLeader
	}
	return lw.streams.add(ss, requireLeader)
}
