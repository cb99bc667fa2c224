package partition

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestLatchIndexMatchesScan drives the latch manager with random requests
// (single keys, ranges, whole-keyspace ranges, leases; reads and writes;
// several spans per request) and releases, and checks that every request
// is told to wait for exactly the held requests a scan of all of them
// finds conflicting (the definition the index must keep), and that the
// index is empty once everything is released.
func TestLatchIndexMatchesScan(t *testing.T) {
	keys := []string{"a", "a\x00", "ab", "b", "ba", "c", ""}
	randomSpan := func(r *rand.Rand) latchSpan {
		write := r.IntN(2) == 0
		switch r.IntN(10) {
		case 0:
			return leaseSpan(int64(r.IntN(3)), write)
		case 1:
			return keySpan([]byte(keys[r.IntN(len(keys))]), []byte{0}, write) // from key to the end
		case 2, 3:
			lo, hi := keys[r.IntN(len(keys))], keys[r.IntN(len(keys))]
			if hi <= lo {
				hi = lo + "z"
			}
			return keySpan([]byte(lo), []byte(hi), write)
		default:
			return keySpan([]byte(keys[r.IntN(len(keys))]), nil, write)
		}
	}
	for seed := uint64(1); seed <= 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 0))
		m := newLatchManager()
		var held []*latchGuard
		for step := 0; step < 300; step++ {
			if len(held) > 0 && r.IntN(5) < 2 {
				i := r.IntN(len(held))
				m.release(held[i])
				held = slices.Delete(held, i, i+1)
				continue
			}
			spans := make([]latchSpan, 1+r.IntN(3))
			for i := range spans {
				spans[i] = randomSpan(r)
			}
			var want []*latchGuard
			for _, h := range held {
				if conflicts(spans, h.spans) {
					want = append(want, h)
				}
			}
			g, wait := m.register(spans)
			if got := uniqueGuards(wait); !sameGuards(got, want) {
				t.Fatalf("seed %d step %d: spans %s wait for %d held requests, a scan finds %d: %s",
					seed, step, describeSpans(spans), len(got), len(want), describeHeld(want))
			}
			held = append(held, g)
		}
		for _, g := range held {
			m.release(g)
		}
		if len(m.points) != 0 || len(m.ranges) != 0 {
			t.Fatalf("seed %d: %d keys and %d ranges still latched after every release", seed, len(m.points), len(m.ranges))
		}
	}
}

// TestLatchWaitsForConflicts: a request waits until the earlier
// conflicting request releases, not for a non-conflicting one, and gives
// up (holding nothing) when its context ends.
func TestLatchWaitsForConflicts(t *testing.T) {
	m := newLatchManager()
	ctx := context.Background()
	w, err := m.acquire(ctx, []latchSpan{keySpan([]byte("k"), nil, true)})
	if err != nil {
		t.Fatal(err)
	}
	other, err := m.acquire(ctx, []latchSpan{keySpan([]byte("other"), nil, true), keySpan([]byte("k\x00"), nil, false)})
	if err != nil {
		t.Fatal(err)
	}
	m.release(other)

	got := make(chan *latchGuard)
	go func() {
		g, _ := m.acquire(ctx, []latchSpan{keySpan([]byte("a"), []byte("l"), false)})
		got <- g
	}()
	select {
	case <-got:
		t.Fatal("a read of [a, l) did not wait for a held write of k")
	case <-time.After(50 * time.Millisecond):
	}
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := m.acquire(short, []latchSpan{keySpan([]byte("k"), nil, false)}); err != context.DeadlineExceeded {
		t.Fatalf("a read of k behind a held write ended with %v, want a deadline", err)
	}
	m.release(w)
	select {
	case g := <-got:
		m.release(g)
	case <-time.After(5 * time.Second):
		t.Fatal("the read of [a, l) still waits after the write released")
	}
	if len(m.points) != 0 || len(m.ranges) != 0 {
		t.Fatalf("%d keys and %d ranges still latched", len(m.points), len(m.ranges))
	}
}

// conflicts is the definition the index keeps: some span of a conflicts
// with some span of b.
func conflicts(a, b []latchSpan) bool {
	for _, x := range a {
		for _, y := range b {
			if x.conflictsWith(y) {
				return true
			}
		}
	}
	return false
}

func uniqueGuards(gs []*latchGuard) []*latchGuard {
	var out []*latchGuard
	for _, g := range gs {
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}

func sameGuards(a, b []*latchGuard) bool {
	if len(a) != len(b) {
		return false
	}
	for _, g := range a {
		if !slices.Contains(b, g) {
			return false
		}
	}
	return true
}

func describeSpans(spans []latchSpan) string {
	var s string
	for _, x := range spans {
		s += fmt.Sprintf("[%q, %q write=%v] ", x.start, x.end, x.write)
	}
	return s
}

func describeHeld(gs []*latchGuard) string {
	var s string
	for _, g := range gs {
		s += describeSpans(g.spans) + "; "
	}
	return s
}
