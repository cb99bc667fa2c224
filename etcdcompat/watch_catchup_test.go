package etcdcompat

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/rpccodec"
	"github.com/brainkv/brain/kvapi"
	"github.com/brainkv/brain/partition"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// flakySource serves event-log reads of revisions 1..last (one event per
// revision, at most chunk revisions per read) and fails the reads listed
// in fail (by call number, from 1) with err. A revision's event is
// event's (nil: a put of "k").
type flakySource struct {
	nopSource
	last, chunk int64
	err         error
	event       func(rev int64) *mvccpb.Event

	mu    sync.Mutex
	fail  map[int]bool
	calls int
}

func (s *flakySource) CompactRevision() int64 { return 0 }

func (s *flakySource) Events(from, to int64, _, _ []byte, _ int) ([]partition.RevEvents, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.fail[s.calls] {
		return nil, 0, s.err
	}
	var out []partition.RevEvents
	rev := from
	for ; rev <= min(to, s.last) && rev < from+s.chunk; rev++ {
		if s.event == nil {
			out = append(out, evs(rev, "k"))
		} else {
			out = append(out, partition.RevEvents{Rev: rev, Events: []*mvccpb.Event{s.event(rev)}})
		}
	}
	return out, rev, nil
}

// recordingStream is a watch stream that keeps the responses sent on it.
type recordingStream struct {
	grpc.ServerStream
	ctx     context.Context
	discard bool // send nothing anywhere (benchmarks)

	mu    sync.Mutex
	resps []*pb.WatchResponse
}

func (s *recordingStream) Context() context.Context { return s.ctx }
func (s *recordingStream) Recv() (*pb.WatchRequest, error) {
	<-s.ctx.Done()
	return nil, s.ctx.Err()
}
func (s *recordingStream) Send(r *pb.WatchResponse) error { return s.record(r) }
func (s *recordingStream) SendMsg(m any) error {
	if s.discard {
		return nil
	}
	var b []byte
	switch m := m.(type) {
	case *rpccodec.Raw:
		b = m.B
	case *rpccodec.Pooled:
		b = m.Bytes()
	}
	var r pb.WatchResponse
	if err := r.Unmarshal(b); err != nil {
		return err
	}
	return s.record(&r)
}
func (s *recordingStream) record(r *pb.WatchResponse) error {
	s.mu.Lock()
	s.resps = append(s.resps, r)
	s.mu.Unlock()
	return nil
}

// revs returns the revisions of the events sent so far, in order.
func (s *recordingStream) revs() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for _, r := range s.resps {
		for _, e := range r.Events {
			out = append(out, e.Kv.ModRevision)
		}
	}
	return out
}

// catchupStream is a watch stream with one watcher of every key from
// revision 1, over a hub whose ring starts after last (so every event is
// read from the event logs of src).
func catchupStream(t testing.TB, src *flakySource) (*watchStream, *watcher, *recordingStream) {
	t.Helper()
	h := NewHub(HubConfig{}, src)
	h.SetSource(src)
	h.AddPartition(1, nil, nil, src.last)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rs := &recordingStream{ctx: ctx}
	s := &Server{cfg: Config{MaxRequestBytes: DefaultMaxRequestBytes, ProgressNotifyInterval: time.Hour}, hub: h}
	w := &watcher{id: 1, key: []byte{0}, end: []byte{}, next: 1, start: 1}
	w.shape = shape{key: "\x00"}
	sws := &watchStream{s: s, stream: rs, watchers: map[int64]*watcher{1: w}}
	return sws, w, rs
}

func wantRevs(t *testing.T, got []int64, last int64) {
	t.Helper()
	if int64(len(got)) != last {
		t.Fatalf("sent revisions %v, want 1..%d once each", got, last)
	}
	for i, r := range got {
		if r != int64(i+1) {
			t.Fatalf("sent revisions %v, want 1..%d once each", got, last)
		}
	}
}

// TestCatchupRetriesWithoutLeader: an event-log read that fails for want
// of a leader leaves the watcher where it was, after sending what it had
// read; the next attempt continues from there, so every event is sent
// once, in order. Another error ends the stream.
func TestCatchupRetriesWithoutLeader(t *testing.T) {
	src := &flakySource{last: 10, chunk: 4, err: kvapi.ErrNoLeader, fail: map[int]bool{2: true, 3: true}}
	sws, w, rs := catchupStream(t, src)
	if err := sws.deliver(w, 10); !errors.Is(err, errCatchupLater) {
		t.Fatalf("deliver with a failing read: %v, want errCatchupLater", err)
	}
	if w.next != 5 {
		t.Fatalf("after the first chunk and a failed read the watcher is at %d, want 5", w.next)
	}
	wantRevs(t, rs.revs(), 4) // the first chunk went out before the failure
	if err := sws.deliver(w, 10); !errors.Is(err, errCatchupLater) {
		t.Fatalf("second attempt: %v, want errCatchupLater", err)
	}
	if err := sws.deliver(w, 10); err != nil {
		t.Fatal(err)
	}
	wantRevs(t, rs.revs(), 10)
	if w.next != 11 {
		t.Fatalf("watcher at %d after delivering 1..10", w.next)
	}
	if got := promtest.ToFloat64(sws.s.hub.catchupRetries); got != 2 {
		t.Fatalf("brain_watch_storage_catchup_retries_total %v, want 2", got)
	}

	// A read error that is not a passing one is the stream's end.
	broken := &flakySource{last: 10, chunk: 4, err: errors.New("disk on fire"), fail: map[int]bool{1: true}}
	sws, w, _ = catchupStream(t, broken)
	if err := sws.deliver(w, 10); err == nil || errors.Is(err, errCatchupLater) {
		t.Fatalf("deliver with a broken read: %v, want the read's error", err)
	}
}

// TestCatchupRetriedByTheSendLoop: the send loop attempts a failed
// delivery again by itself (no new event, request or tick wakes it), and
// the stream stays open meanwhile.
func TestCatchupRetriedByTheSendLoop(t *testing.T) {
	src := &flakySource{last: 10, chunk: 100, err: kvapi.ErrNoLeader, fail: map[int]bool{1: true, 2: true, 3: true}}
	sws, _, rs := catchupStream(t, src)
	done := make(chan error, 1)
	go func() { done <- sws.sendLoop(make(chan error)) }()
	deadline := time.Now().Add(10 * time.Second)
	for len(rs.revs()) < 10 {
		select {
		case err := <-done:
			t.Fatalf("the send loop ended: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sent %v 10s after the reads started failing", rs.revs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	wantRevs(t, rs.revs(), 10)
}

// TestCatchupErrorsClassified: the read errors a catch-up waits out are
// the ones etcd answers with Unavailable (which clients retry), and they
// reach clients so if they end a stream; an unknown error is not waited
// out.
func TestCatchupErrorsClassified(t *testing.T) {
	for _, err := range []error{kvapi.ErrNoLeader, partition.ErrReplicaClosed, context.DeadlineExceeded} {
		if !transient(err) {
			t.Errorf("%v is not retried by watch catch-ups", err)
		}
		if c := status.Code(toGRPCError(err)); c != codes.Unavailable {
			t.Errorf("%v reaches clients with code %v, want Unavailable", err, c)
		}
	}
	if transient(errors.New("disk on fire")) {
		t.Error("an unknown error is retried")
	}
}
