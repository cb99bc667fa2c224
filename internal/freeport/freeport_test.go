package freeport

import (
	"fmt"
	"net"
	"testing"
)

// TestPortsDistinctBindableOutsideEphemeral: ports are never handed out
// twice, lie below the ephemeral range, and can be bound.
func TestPortsDistinctBindableOutsideEphemeral(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		p, err := Pair()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []int{p, p + 1} {
			if seen[q] {
				t.Fatalf("port %d handed out twice", q)
			}
			seen[q] = true
			if q < low || q >= high() {
				t.Fatalf("port %d outside [%d, %d)", q, low, high())
			}
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
	}
}
