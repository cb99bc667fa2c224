package rpccodec

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// gate stalls a connection's reads and writes while it is shut, as a
// process that is stopped or starved of CPU neither reads nor writes.
type gate struct {
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
	shut bool
}

func newGate() *gate {
	g := &gate{open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.shut {
		g.shut = true
		g.open = make(chan struct{})
	}
}

func (g *gate) reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut {
		g.shut = false
		close(g.open)
	}
}

func (g *gate) wait() {
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	<-ch
}

type gatedConn struct {
	net.Conn
	g *gate
}

func (c gatedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.g.wait() // what arrived waits in the stalled process
	return n, err
}

func (c gatedConn) Write(b []byte) (int, error) {
	c.g.wait()
	return c.Conn.Write(b)
}

// closeNotice closes closed (once) when the connection is closed.
type closeNotice struct {
	net.Conn
	closed chan struct{}
	once   *sync.Once
}

func (c closeNotice) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// stallPeer serves echo calls with PeerServerOptions, dials it with
// PeerDialOptions through a gate, makes one call, and returns the gate,
// the connection, a channel closed when the server closes its side, and
// the number of connections dialled so far.
func stallPeer(t *testing.T) (*gate, *grpc.ClientConn, <-chan struct{}, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	srv := grpc.NewServer(PeerServerOptions()...)
	srv.RegisterService(&echoDesc, nil)
	once := new(sync.Once)
	go srv.Serve(wrapListener{l, func(c net.Conn) net.Conn { return closeNotice{c, closed, once} }})
	t.Cleanup(srv.Stop)
	g := newGate()
	var dials atomic.Int32
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		dials.Add(1)
		return gatedConn{c, g}, nil
	}
	conn, err := grpc.NewClient(l.Addr().String(), append(PeerDialOptions(), grpc.WithContextDialer(dial))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.reopen()
		conn.Close()
	})
	echo(t, conn)
	return g, conn, closed, &dials
}

func echo(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out blob
	if err := conn.Invoke(ctx, "/brain.Test/Echo", &blob{b: []byte("x")}, &out); err != nil {
		t.Fatal(err)
	}
}

// TestPeerConnectionSurvivesAStall: a node that neither reads nor writes
// for 3 s (a node starved of CPU under its cgroup quota, or a test process
// under -race on a loaded machine) keeps its connections. With a 1 s
// keepalive time and timeout the server closed them after 2 s, failing
// every call in flight on them.
func TestPeerConnectionSurvivesAStall(t *testing.T) {
	g, conn, closed, dials := stallPeer(t)
	g.close()
	select {
	case <-closed:
		t.Fatal("the server closed the connection of a peer stalled for less than 3 s")
	case <-time.After(3 * time.Second):
	}
	g.reopen()
	echo(t, conn)
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections dialled, want 1: the stall broke the first", n)
	}
}

// TestPeerConnectionOfASilentPeerCloses: a node that stays silent (stopped,
// partitioned) loses its connections to the server after the keepalive
// time and timeout, so the streams and calls it held are released.
func TestPeerConnectionOfASilentPeerCloses(t *testing.T) {
	g, _, closed, _ := stallPeer(t)
	g.close()
	start := time.Now()
	select {
	case <-closed:
		if d := time.Since(start); d < PeerKeepaliveTime {
			t.Fatalf("the server closed the connection after %v, before its keepalive time %v", d, PeerKeepaliveTime)
		}
	case <-time.After(PeerKeepaliveTime + PeerKeepaliveTimeout + 5*time.Second):
		t.Fatal("the server kept the connection of a silent peer")
	}
	g.reopen()
}
