package kvapi

import (
	"context"
	"errors"
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
	"github.com/brainkv/brain/partition"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
)

// echoHandler answers OpGroupInfo with its arguments, OpTxn with
// partition.ErrNotLeader (leader 9), OpRequestClose after its context ends (with
// the context's error), and counts frames the Calls streams carry.
type echoHandler struct {
	calls     atomic.Int64
	ended     chan error     // OpRequestClose contexts' errors
	deadlines chan time.Time // OpRequestClose contexts' deadlines (zero: none)
	frames    atomic.Int64
}

func (h *echoHandler) HandleCall(ctx context.Context, req *CallRequest) ([]byte, error) {
	h.calls.Add(1)
	switch req.Op {
	case OpTxn:
		return nil, partition.ErrNotLeader
	case OpRequestClose:
		if h.deadlines != nil {
			dl, _ := ctx.Deadline()
			h.deadlines <- dl
		}
		<-ctx.Done()
		h.ended <- ctx.Err()
		return nil, ctx.Err()
	}
	return append([]byte("echo:"), req.Args...), nil
}

func (h *echoHandler) LeaderOf(uint64) uint64            { return 9 }
func (h *echoHandler) ServeFeed(grpc.ServerStream) error { return nil }

// frameCounter counts the frames a server receives on Calls streams.
func (h *echoHandler) frameCounter() grpc.ServerOption {
	return grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, countingStream{ss, &h.frames})
	})
}

type countingStream struct {
	grpc.ServerStream
	n *atomic.Int64
}

func (s countingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.n.Add(1)
	}
	return err
}

// serveInternal serves h (as desc describes the internal service) on a
// loopback port and returns a client to it, as node 1.
func serveInternal(t testing.TB, h Handler, desc *grpc.ServiceDesc, opts ...grpc.ServerOption) (*Client, *grpc.Server) {
	t.Helper()
	return serveInternalServer(t, newInternalServer(h), desc, opts...)
}

// serveInternalServer is serveInternal serving is.
func serveInternalServer(t testing.TB, is *internalServer, desc *grpc.ServiceDesc, opts ...grpc.ServerOption) (*Client, *grpc.Server) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(append(rpccodec.PeerServerOptions(), opts...)...)
	srv.RegisterService(desc, is)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	addr := l.Addr().String()
	conns := peerconn.New(func(uint64) (string, bool) { return addr, true })
	t.Cleanup(conns.Close)
	return NewClient(conns, nil), srv
}

// TestCallsShareFrames checks concurrent calls to one node travel on one
// Calls stream, several to a frame, and each caller gets its own answer
// and errors (NotLeader with the leader the node knows). It runs on one
// thread, as a node under a CPU share below one does (GOMAXPROCS 1),
// where a sender that took its queue as soon as it was woken sent about
// one call per frame.
func TestCallsShareFrames(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	h := &echoHandler{}
	c, _ := serveInternal(t, h, &internalServiceDesc, h.frameCounter())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const callers, rounds = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range rounds {
				arg := fmt.Sprintf("%d/%d", i, j)
				res, err := c.Call(ctx, 1, &CallRequest{Op: OpGroupInfo, Group: 5, Args: []byte(arg)})
				if err != nil || string(res) != "echo:"+arg {
					errs <- fmt.Errorf("call %s: %q, %v", arg, res, err)
					return
				}
				if j%5 == 0 {
					_, err := c.Call(ctx, 1, &CallRequest{Op: OpTxn, Group: 5})
					var nl *NotLeaderError
					if !errors.As(err, &nl) || nl.Leader != 9 {
						errs <- fmt.Errorf("txn: %v, want not leader (leader 9)", err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	calls, frames := h.calls.Load(), h.frames.Load()
	if want := int64(callers * (rounds + rounds/5)); calls != want {
		t.Fatalf("%d calls handled, want %d", calls, want)
	}
	if frames*4 > calls {
		t.Fatalf("%d calls came in %d frames: fewer than 4 calls a frame", calls, frames)
	}
	t.Logf("%d calls in %d frames", calls, frames)
}

// TestCallDeadlineAndCancelReachHandler checks the caller's deadline bounds
// the handler's context on the other node and a caller that gives up
// cancels it there.
func TestCallDeadlineAndCancelReachHandler(t *testing.T) {
	h := &echoHandler{ended: make(chan error, 2), deadlines: make(chan time.Time, 2)}
	c, _ := serveInternal(t, h, &internalServiceDesc)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	callerDeadline, _ := ctx.Deadline()
	_, err := c.Call(ctx, 1, &CallRequest{Op: OpRequestClose, Group: 5})
	var un *unavailableError
	if (!errors.As(err, &un) || un.notSent) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call past its deadline: %v, want unavailable (sent) or the node's deadline exceeded", err)
	}
	// The handler's context ends at the deadline (its own, or the
	// caller's cancel arriving first: both are the caller's deadline).
	if dl := <-h.deadlines; dl.IsZero() || dl.After(callerDeadline.Add(50*time.Millisecond)) {
		t.Fatalf("handler's deadline %v, want at most the caller's %v", dl, callerDeadline)
	}
	select {
	case <-h.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the caller's deadline did not end the handler's context")
	}

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for h.calls.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if _, err := c.Call(ctx, 1, &CallRequest{Op: OpRequestClose, Group: 5}); !errors.As(err, &un) {
		t.Fatalf("cancelled call: %v, want unavailable", err)
	}
	if dl := <-h.deadlines; !dl.IsZero() {
		t.Fatalf("a call without a deadline has one (%v) on the node", dl)
	}
	select {
	case err := <-h.ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("handler's context ended with %v, want canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the caller's cancel did not reach the handler")
	}
	// The stream still serves.
	if res, err := c.Call(context.Background(), 1, &CallRequest{Op: OpGroupInfo, Args: []byte("x")}); err != nil || string(res) != "echo:x" {
		t.Fatalf("call after a cancel: %q, %v", res, err)
	}
}

// TestReadsStayUnary checks reads, whose answers can be large, do not
// travel on the Calls stream, and writes do; and that unary calls pass
// the server's interceptors (the cluster check).
func TestReadsStayUnary(t *testing.T) {
	h := &echoHandler{}
	var unary atomic.Int64
	c, _ := serveInternal(t, h, &internalServiceDesc, h.frameCounter(),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			unary.Add(1)
			return handler(ctx, req)
		}))
	for _, op := range []Op{OpScan, OpEvents, OpReadTxn, OpLeaseKeys} {
		if _, err := c.Call(context.Background(), 1, &CallRequest{Op: op}); err != nil {
			t.Fatalf("%v: %v", op, err)
		}
	}
	if _, err := c.Call(context.Background(), 1, &CallRequest{Op: OpPut}); err != nil {
		t.Fatal(err)
	}
	if u, f := unary.Load(), h.frames.Load(); u != 4 || f != 1 {
		t.Fatalf("%d unary calls and %d frames, want 4 reads unary and the put in 1 frame", u, f)
	}
}

// TestCallsFallBackToUnary checks a node that does not serve the Calls
// stream (an older version) is called unary, and its answers arrive.
func TestCallsFallBackToUnary(t *testing.T) {
	old := internalServiceDesc
	old.Streams = old.Streams[:1] // Feed only
	h := &echoHandler{}
	c, _ := serveInternal(t, h, &old)
	for i := range 3 {
		arg := fmt.Sprint(i)
		res, err := c.Call(context.Background(), 1, &CallRequest{Op: OpGroupInfo, Args: []byte(arg)})
		if err != nil || string(res) != "echo:"+arg {
			t.Fatalf("call %d to an old node: %q, %v", i, res, err)
		}
	}
	if n := h.calls.Load(); n != 3 {
		t.Fatalf("old node handled %d calls, want 3 (each once)", n)
	}
}

// TestCallsStreamBreakFailsCalls checks a call under way when the node
// goes away fails as unavailable and sent (it may have executed), and
// calls after that find the node unreachable as never sent.
func TestCallsStreamBreakFailsCalls(t *testing.T) {
	h := &echoHandler{ended: make(chan error, 1)}
	c, srv := serveInternal(t, h, &internalServiceDesc)
	go func() {
		for h.calls.Load() < 1 {
			time.Sleep(time.Millisecond)
		}
		srv.Stop()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Call(ctx, 1, &CallRequest{Op: OpRequestClose, Group: 5})
	var un *unavailableError
	if !errors.As(err, &un) || un.notSent || ctx.Err() != nil {
		t.Fatalf("call when the node stopped: %v, want unavailable (sent) before the deadline", err)
	}
	_, err = c.Call(ctx, 1, &CallRequest{Op: OpGroupInfo})
	if !errors.As(err, &un) || !un.notSent {
		t.Fatalf("call to the stopped node: %v, want unavailable (never sent)", err)
	}
	if got := promtest.ToFloat64(c.broken.WithLabelValues("true")); got != 1 {
		t.Fatalf("brain_internal_calls_broken_total{sent=\"true\"} = %v, want 1", got)
	}
}

// TestCallFrameRoundTrip checks every entry kind survives encoding, and a
// frame with an unknown kind or cut short is refused.
func TestCallFrameRoundTrip(t *testing.T) {
	in := callFrame{entries: []callEntry{
		{kind: callEntryRequest, id: 1, timeout: 1500 * time.Microsecond, body: []byte("req")},
		{kind: callEntryResponse, id: 300, body: []byte("resp")},
		{kind: callEntryCancel, id: 1 << 40},
		{kind: callEntryRequest, id: 2, body: nil},
	}}
	b, _ := in.Marshal()
	var out callFrame
	if err := out.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(out.entries) != fmt.Sprint(in.entries) {
		t.Fatalf("round trip: %v, want %v", out.entries, in.entries)
	}
	if err := out.Unmarshal(append(append([]byte(nil), b...), 9, 1)); err == nil {
		t.Fatal("unknown entry kind accepted")
	}
	if err := out.Unmarshal(b[:len(b)-3]); err == nil {
		t.Fatal("truncated frame accepted")
	}
	q := []callEntry{{body: make([]byte, maxCallFrame)}, {body: []byte("a")}, {body: []byte("b")}}
	if f := take(&q); len(f) != 1 || len(q) != 2 {
		t.Fatalf("a full-size entry shared its frame: %d taken, %d left", len(f), len(q))
	}
	if f := take(&q); len(f) != 2 || len(q) != 0 {
		t.Fatalf("small entries: %d taken, %d left", len(f), len(q))
	}
}

// BenchmarkCall compares 64 concurrent callers' calls to one node on the
// Calls stream with unary gRPC calls (CPU per call: run with -cpu 1, or
// compare ns/op side by side in one run); frames/call is how many calls
// share a frame to the server (1: none).
func BenchmarkCall(b *testing.B) {
	for _, unary := range []bool{false, true} {
		name := "stream"
		if unary {
			name = "unary"
		}
		b.Run(name, func(b *testing.B) {
			h := &echoHandler{}
			c, _ := serveInternal(b, h, &internalServiceDesc, h.frameCounter())
			c.unary = unary
			args := make([]byte, 1024)
			b.SetParallelism(64)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Call(context.Background(), 1, &CallRequest{Op: OpGroupInfo, Args: args}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			if !unary {
				b.ReportMetric(float64(h.frames.Load())/float64(b.N), "frames/call")
			}
		})
	}
}

// gateHandler holds every call until it is released: started gets a value
// as each call begins.
type gateHandler struct {
	started chan struct{}
	release chan struct{}
}

func (h *gateHandler) HandleCall(ctx context.Context, req *CallRequest) ([]byte, error) {
	h.started <- struct{}{}
	select {
	case <-h.release:
		return append([]byte("done:"), req.Args...), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (h *gateHandler) LeaderOf(uint64) uint64            { return 0 }
func (h *gateHandler) ServeFeed(grpc.ServerStream) error { return nil }

// TestDrainWaitsForCallsUnderWay checks the drain a stopping node runs
// before closing its peer connections: it does not return while a call
// (streamed or unary) is under way, returns once each is answered and the
// Calls streams ended, and the callers have their real answers (a
// forwarded write is not failed as "leader changed" because its node
// stopped). A call sent once the drain began is not executed, and its
// caller learns that it was not (it may retry it elsewhere). A stream that
// breaks with calls under way does not hold the drain.
func TestDrainWaitsForCallsUnderWay(t *testing.T) {
	h := &gateHandler{started: make(chan struct{}, 4), release: make(chan struct{})}
	is := newInternalServer(h)
	c, _ := serveInternalServer(t, is, &internalServiceDesc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	answers := make(chan string, 2)
	for _, op := range []Op{OpPut, OpScan} { // streamed, unary
		go func() {
			res, err := c.Call(ctx, 1, &CallRequest{Op: op, Args: []byte(op.String())})
			answers <- fmt.Sprintf("%s %v", res, err)
		}()
		<-h.started
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if err := is.drain(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain with two calls under way: %v, want it to wait until its deadline", err)
	}
	// The drain began: a new call is not executed (its stream ends once
	// the calls under way are answered).
	late := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, 1, &CallRequest{Op: OpPut, Args: []byte("late")})
		late <- err
	}()
	drained := make(chan error, 1)
	go func() { drained <- is.drain(ctx) }()
	close(h.release)
	if err := <-drained; err != nil {
		t.Fatalf("drain after the calls were answered: %v", err)
	}
	var un *unavailableError
	if err := <-late; !errors.As(err, &un) || !un.notSent {
		t.Fatalf("call after the drain began: %v, want unavailable, not sent", err)
	}
	got := []string{<-answers, <-answers}
	slices.Sort(got)
	if want := []string{"done:" + OpPut.String() + " <nil>", "done:" + OpScan.String() + " <nil>"}; !slices.Equal(got, want) {
		t.Fatalf("answers %q, want %q", got, want)
	}
	select {
	case <-h.started:
		t.Fatal("a call sent after the drain began was executed")
	default:
	}

	// A node with nothing under way drains at once, its open stream
	// included.
	h1 := &gateHandler{started: make(chan struct{}, 1), release: make(chan struct{})}
	close(h1.release)
	is1 := newInternalServer(h1)
	c1, _ := serveInternalServer(t, is1, &internalServiceDesc)
	if _, err := c1.Call(ctx, 1, &CallRequest{Op: OpPut}); err != nil {
		t.Fatal(err)
	}
	if err := is1.drain(ctx); err != nil {
		t.Fatalf("drain with nothing under way: %v", err)
	}

	// A call whose stream breaks does not hold the drain.
	h2 := &gateHandler{started: make(chan struct{}, 1), release: make(chan struct{})}
	is2 := newInternalServer(h2)
	c2, srv2 := serveInternalServer(t, is2, &internalServiceDesc)
	go func() { _, _ = c2.Call(ctx, 1, &CallRequest{Op: OpPut}) }()
	<-h2.started
	srv2.Stop()
	if err := is2.drain(ctx); err != nil {
		t.Fatalf("drain after the stream broke: %v", err)
	}
	close(h2.release)
}
