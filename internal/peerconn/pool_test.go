package peerconn

import (
	"errors"
	"sync"
	"testing"
)

// TestPoolSharesAndRedials checks a node's connection is shared by every
// caller, replaced (and the old one closed) when the node's address
// changes, and that a closed pool hands out nothing.
func TestPoolSharesAndRedials(t *testing.T) {
	var mu sync.Mutex
	addrs := map[uint64]string{1: "127.0.0.1:1", 2: "127.0.0.1:2"}
	p := New(func(node uint64) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		a, ok := addrs[node]
		return a, ok
	})
	c1, err := p.Conn(1)
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.Conn(1)
	if err != nil || again != c1 {
		t.Fatalf("second Conn(1) = %p, %v; want the shared %p", again, err, c1)
	}
	c2, err := p.Conn(2)
	if err != nil || c2 == c1 {
		t.Fatalf("Conn(2) = %p, %v; want a connection of its own", c2, err)
	}
	if _, err := p.Conn(3); err == nil {
		t.Fatal("Conn of a node without an address succeeded")
	}

	mu.Lock()
	addrs[1] = "127.0.0.1:3"
	mu.Unlock()
	moved, err := p.Conn(1)
	if err != nil || moved == c1 {
		t.Fatalf("Conn(1) after a move = %p, %v; want a new connection", moved, err)
	}
	if moved.Target() != "127.0.0.1:3" {
		t.Fatalf("new connection targets %s", moved.Target())
	}
	if c1.GetState().String() != "SHUTDOWN" {
		t.Fatalf("the moved node's old connection is %s, want SHUTDOWN", c1.GetState())
	}

	p.Close()
	if _, err := p.Conn(2); !errors.Is(err, ErrClosed) {
		t.Fatalf("Conn after Close: %v, want ErrClosed", err)
	}
	if c2.GetState().String() != "SHUTDOWN" {
		t.Fatalf("connection after Close is %s, want SHUTDOWN", c2.GetState())
	}
}
