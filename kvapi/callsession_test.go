package kvapi

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/brainkv/brain/internal/peerconn"
	"github.com/brainkv/brain/internal/rpccodec"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
)

// cutProxy forwards TCP connections to a backend; it can swallow what
// callers send (held: a node that stopped reading, as a paused one) and
// cut every connection (the node's keepalive giving up on the caller).
type cutProxy struct {
	l       net.Listener
	backend atomic.Value // string
	held    atomic.Bool
	dropped atomic.Int64 // bytes swallowed while held

	mu    sync.Mutex
	conns []net.Conn // protected by mu
}

func newCutProxy(t *testing.T, backend string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l}
	p.backend.Store(backend)
	t.Cleanup(func() { l.Close(); p.cut() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b, err := net.Dial("tcp", p.backend.Load().(string))
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, b)
			p.mu.Unlock()
			go p.pipe(b, c, true)
			go p.pipe(c, b, false)
		}
	}()
	return p
}

// pipe copies from src to dst; fromCaller: src is the caller's side.
func (p *cutProxy) pipe(dst, src net.Conn, fromCaller bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if fromCaller && p.held.Load() {
				p.dropped.Add(int64(n))
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				dst.Close()
			}
			return
		}
	}
}

// cut closes every connection through the proxy, and lets callers' bytes
// through again.
func (p *cutProxy) cut() {
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.held.Store(false)
}

// serveBehindProxy serves is on a loopback port behind a cutProxy and
// returns a client to it (node 1).
func serveBehindProxy(t *testing.T, is *internalServer) (*Client, *cutProxy) {
	t.Helper()
	p := newCutProxy(t, serveOn(t, is))
	conns := peerconn.New(func(uint64) (string, bool) { return p.l.Addr().String(), true })
	t.Cleanup(conns.Close)
	return NewClient(conns, nil), p
}

// serveOn serves is on a loopback port and returns its address.
func serveOn(t *testing.T, is *internalServer) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(rpccodec.PeerServerOptions()...)
	srv.RegisterService(&internalServiceDesc, is)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return l.Addr().String()
}

// countingGate is a gateHandler that also counts the calls it began.
type countingGate struct {
	gateHandler
	began atomic.Int64
}

func (h *countingGate) HandleCall(ctx context.Context, req *CallRequest) ([]byte, error) {
	h.began.Add(1)
	return h.gateHandler.HandleCall(ctx, req)
}

// TestLostCallsAreResent checks a write whose Calls stream broke after it
// was sent gets its real outcome instead of "it may have executed": one
// the node never received (sent into a connection the node had already
// given up on, as after the caller's node was paused) is executed once on
// the next stream; one that was running when the stream broke is answered
// on the next stream when it finishes, and is not executed again.
func TestLostCallsAreResent(t *testing.T) {
	h := &countingGate{gateHandler: gateHandler{started: make(chan struct{}, 4), release: make(chan struct{})}}
	is := newInternalServer(h)
	c, p := serveBehindProxy(t, is)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Open the stream.
	go func() { <-h.started; h.release <- struct{}{} }()
	if res, err := c.Call(ctx, 1, &CallRequest{Op: OpPut, Args: []byte("a")}); err != nil || string(res) != "done:a" {
		t.Fatalf("first call: %q, %v", res, err)
	}

	// Never received: the node reads nothing more, then the connection
	// is cut.
	p.held.Store(true)
	answer := make(chan string, 1)
	go func() {
		res, err := c.Call(ctx, 1, &CallRequest{Op: OpPut, Args: []byte("b")})
		answer <- string(res) + " " + errString(err)
	}()
	for p.dropped.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	p.cut()
	select {
	case <-h.started: // executed on the next stream
	case got := <-answer:
		t.Fatalf("call the node never received: %q, want it executed on the next stream", got)
	}
	h.release <- struct{}{}
	if got := <-answer; got != "done:b <nil>" {
		t.Fatalf("call the node never received: %q, want it executed on the next stream", got)
	}
	if n := h.began.Load(); n != 2 {
		t.Fatalf("%d calls executed, want 2", n)
	}

	// Running when the stream broke: answered on the next stream.
	go func() {
		res, err := c.Call(ctx, 1, &CallRequest{Op: OpPut, Args: []byte("c")})
		answer <- string(res) + " " + errString(err)
	}()
	<-h.started
	p.cut()
	// The call runs on as an orphan; the caller opens a new stream.
	waitFor(t, func() bool { return orphanWithLiveStream(is) })
	h.release <- struct{}{}
	if got := <-answer; got != "done:c <nil>" {
		t.Fatalf("call running when its stream broke: %q, want its answer", got)
	}
	if got := promtest.ToFloat64(c.resent.WithLabelValues("answered")); got != 2 {
		t.Fatalf("brain_internal_calls_resent_total{outcome=\"answered\"} = %v, want 2", got)
	}
	if n := h.began.Load(); n != 3 {
		t.Fatalf("%d calls executed, want 3 (none twice)", n)
	}
	if got := promtest.ToFloat64(c.broken.WithLabelValues("true")); got != 0 {
		t.Fatalf("brain_internal_calls_broken_total{sent=\"true\"} = %v, want 0", got)
	}
	// The answers to re-sent calls count as owed like any call's: a drain
	// after them still waits for a call under way and ends the stream only
	// once it is answered (a clean end says the unanswered were not run).
	go func() {
		res, err := c.Call(ctx, 1, &CallRequest{Op: OpPut, Args: []byte("d")})
		answer <- string(res) + " " + errString(err)
	}()
	<-h.started
	drained := make(chan error, 1)
	go func() { drained <- is.drain(ctx) }()
	h.release <- struct{}{}
	if got := <-answer; got != "done:d <nil>" {
		t.Fatalf("call under way when the drain began: %q, want its answer", got)
	}
	if err := <-drained; err != nil {
		t.Fatalf("drain: %v", err)
	}
}

// TestResendToRestartedNode checks a call lost with its stream is not
// executed again by a node that restarted meanwhile (it cannot know what
// its previous run did): the caller gets "sent, may have executed".
func TestResendToRestartedNode(t *testing.T) {
	h := &countingGate{gateHandler: gateHandler{started: make(chan struct{}, 4), release: make(chan struct{})}}
	c, p := serveBehindProxy(t, newInternalServer(h))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() { <-h.started; h.release <- struct{}{} }()
	if _, err := c.Call(ctx, 1, &CallRequest{Op: OpPut}); err != nil {
		t.Fatal(err)
	}
	// The node restarts: the proxy leads to a new one.
	h2 := &countingGate{gateHandler: gateHandler{started: make(chan struct{}, 4), release: make(chan struct{})}}
	restarted := serveOn(t, newInternalServer(h2))
	p.held.Store(true)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Call(ctx, 1, &CallRequest{Op: OpPut})
		errc <- err
	}()
	for p.dropped.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	p.backend.Store(restarted)
	p.cut()
	err := <-errc
	var un *unavailableError
	if !errors.As(err, &un) || un.notSent || ctx.Err() != nil {
		t.Fatalf("call lost to a node that restarted: %v, want unavailable (sent)", err)
	}
	if n := h2.began.Load(); n != 0 {
		t.Fatalf("the restarted node executed %d re-sent calls, want none", n)
	}
	if got := promtest.ToFloat64(c.resent.WithLabelValues("unknown")); got != 1 {
		t.Fatalf("brain_internal_calls_resent_total{outcome=\"unknown\"} = %v, want 1", got)
	}
}

// TestCallSessionFates checks what a node says of a re-sent call: the
// orphan's answer, "received" for a call an ended stream received (in
// its span, or re-sent on it) or forgotten, and "never received" for the
// rest; and that it forgets after sessionMemory.
func TestCallSessionFates(t *testing.T) {
	cs := newCallSessions()
	st1 := &callsStream{}
	s := cs.attach(7, st1)
	now := time.Now()
	cs.detach(s, st1, receivedSpan{lo: 10, hi: 20, resent: []uint64{4}, ended: now},
		map[uint64]*orphan{15: answeredOrphan([]byte("x"), now)})
	for _, tc := range []struct {
		id            uint64
		orphan, recvd bool
	}{{15, true, true}, {10, false, true}, {20, false, true}, {4, false, true}, {5, false, false}, {21, false, false}, {9, false, false}} {
		o, received := cs.fateOf(s, tc.id)
		if (o != nil) != tc.orphan || received != tc.recvd {
			t.Errorf("call %d: orphan %v received %v, want %v %v", tc.id, o != nil, received, tc.orphan, tc.recvd)
		}
	}
	// A new stream of the session ends the one still serving it.
	st2 := &callsStream{is: &internalServer{sessions: cs}, running: map[uint64]*runningCall{30: {cancel: func() {}, timed: true}}}
	st2.sess = cs.attach(7, st2)
	st2.span = receivedSpan{lo: 30, hi: 30}
	cs.attach(7, &callsStream{})
	if o, _ := cs.fateOf(s, 30); o == nil {
		t.Fatal("the call running on a stream a newer one took over is not an orphan")
	}
	// Forgotten: the spans are gone, but what they held is not executed.
	cs.mu.Lock()
	cs.gcLocked(now.Add(sessionMemory + time.Second))
	cs.mu.Unlock()
	if _, received := cs.fateOf(s, 12); !received {
		t.Fatal("a call of a forgotten span may be executed again")
	}
	if o, _ := cs.fateOf(s, 15); o != nil {
		t.Fatal("an answered orphan outlived sessionMemory")
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// orphanWithLiveStream reports whether some session of is has an orphan
// and a new stream.
func orphanWithLiveStream(is *internalServer) bool {
	is.sessions.mu.Lock()
	defer is.sessions.mu.Unlock()
	for _, s := range is.sessions.m {
		if s.live != nil && len(s.orphans) > 0 {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds (10 s at most).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}
