package peerconn

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// recordingConn records the socket writes a lingerConn makes; fail, when
// set, makes them fail.
type recordingConn struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
	fail   error
	closed bool
}

func (r *recordingConn) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return 0, r.fail
	}
	r.writes = append(r.writes, append([]byte(nil), p...))
	return len(p), nil
}

func (r *recordingConn) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	return nil
}

func (r *recordingConn) SetWriteDeadline(time.Time) error { return nil }

func (r *recordingConn) recorded() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.writes...)
}

// TestLingerConnCoalesces checks that writes made within the linger leave
// in one socket write, in order, once the linger has passed, and that a
// write reaching maxLingerBytes goes out at once with what preceded it.
func TestLingerConnCoalesces(t *testing.T) {
	rec := &recordingConn{}
	l := newLingerConn(rec, 20*time.Millisecond)
	for _, s := range []string{"raft ", "call ", "answer"} {
		if n, err := l.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if w := rec.recorded(); len(w) != 0 {
		t.Fatalf("socket written before the linger passed: %q", w)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(rec.recorded()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if w := rec.recorded(); len(w) != 1 || string(w[0]) != "raft call answer" {
		t.Fatalf("socket writes %q, want one of \"raft call answer\"", w)
	}

	// A later write arms the timer again.
	l.Write([]byte("again"))
	for len(rec.recorded()) < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if w := rec.recorded(); len(w) != 2 || string(w[1]) != "again" {
		t.Fatalf("socket writes %q, want a second of \"again\"", w)
	}

	// Reaching maxLingerBytes writes at once, without waiting.
	slow := &recordingConn{}
	l = newLingerConn(slow, time.Hour)
	l.Write([]byte("head"))
	big := bytes.Repeat([]byte{'x'}, maxLingerBytes)
	if n, err := l.Write(big); n != len(big) || err != nil {
		t.Fatalf("big Write = %d, %v", n, err)
	}
	w := slow.recorded()
	if len(w) != 1 || !bytes.Equal(w[0], append([]byte("head"), big...)) {
		t.Fatalf("after a write of maxLingerBytes: %d socket writes, want 1 with the buffered head", len(w))
	}
	l.Write([]byte("tail"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if w := slow.recorded(); len(w) != 2 || string(w[1]) != "tail" || !slow.closed {
		t.Fatalf("Close did not write the buffered tail and close: %d writes, closed %v", len(w), slow.closed)
	}
	if _, err := l.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v, want net.ErrClosed", err)
	}
}

// TestLingerConnReportsFailedWrites checks that a socket write that fails
// after Write returned is reported by the next Write, not lost.
func TestLingerConnReportsFailedWrites(t *testing.T) {
	broken := errors.New("connection reset")
	rec := &recordingConn{fail: broken}
	l := newLingerConn(rec, time.Millisecond)
	if _, err := l.Write([]byte("lost")); err != nil {
		t.Fatalf("first Write: %v (it only buffers)", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := l.Write([]byte("next"))
		if errors.Is(err, broken) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Write after a failed flush: %v, want %v", err, broken)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLingerConnCloseDoesNotWaitForBlockedWrite checks that Close returns
// while a socket write is blocked on a peer that does not read, and that
// the blocked write then fails: gRPC closes a connection to end exactly
// such a write.
func TestLingerConnCloseDoesNotWaitForBlockedWrite(t *testing.T) {
	a, b := net.Pipe() // nothing reads b: a's writes block
	defer b.Close()
	l := newLingerConn(a, time.Hour)
	done := make(chan error, 1)
	go func() {
		_, err := l.Write(make([]byte, maxLingerBytes))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond) // let the write block in the pipe
	closed := make(chan struct{})
	go func() {
		l.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for a blocked write")
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the blocked write succeeded after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the blocked write did not end when the connection closed")
	}
}

// TestLingerStreamIntact sends a stream of writes of many sizes, some
// together and some apart, through LingerDialer to LingerListener, and
// checks the other side reads exactly the bytes sent, in order.
func TestLingerStreamIntact(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LingerListener(raw, 200*time.Microsecond, 3*time.Second)
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	c, err := LingerDialer(200*time.Microsecond, 3*time.Second)(context.Background(), raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	checkUserTimeout(t, c, 3*time.Second)
	rng := rand.New(rand.NewSource(1))
	var sent []byte
	for i := 0; i < 2000; i++ {
		n := rng.Intn(200) // a raft message or a call
		if i%3 == 0 {
			n = rng.Intn(3 * maxLingerBytes / 2) // up to past the limit
		}
		p := make([]byte, n)
		rng.Read(p)
		if _, err := c.Write(p); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		sent = append(sent, p...)
		if i%50 == 0 {
			time.Sleep(time.Millisecond) // past the linger: the timer flushes
		}
	}
	c.Close()
	b := <-got
	if !bytes.Equal(b, sent) {
		t.Fatalf("read %d bytes, sent %d; equal prefix %d", len(b), len(sent), commonPrefix(b, sent))
	}
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// TestLingerGRPC checks gRPC works over lingering connections on both
// sides: concurrent calls are answered, as the peer connections' are.
func TestLingerGRPC(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(LingerListener(raw, time.Millisecond, 3*time.Second))
	defer srv.Stop()
	conn, err := grpc.NewClient(raw.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(LingerDialer(time.Millisecond, 3*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				r, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
				if err != nil {
					errs <- err
					return
				}
				if r.Status != healthpb.HealthCheckResponse_SERVING {
					errs <- errors.New(r.Status.String())
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
