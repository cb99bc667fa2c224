package partition

import (
	"testing"
	"time"
)

// TestCloseSoon checks when a node that does not lead a partition asks
// its leader to close a revision for the watch frontier: not while the
// leader closes it by itself, once (the highest revision wanted) when the
// closed revision stops short, at once after a wait in which the closed
// revision did not move at all ended in asking, and patiently again after
// the probe interval.
func TestCloseSoon(t *testing.T) {
	asked := make(chan int64, 16)
	c := NewCloseSoon(func(rev int64) { asked <- rev })
	// Longer than the defaults, so that a loaded machine's scheduling
	// delays between the steps below stay well inside them.
	grace := 200 * time.Millisecond
	c.grace, c.probe = grace, 3*grace
	expect := func(want int64, within time.Duration) {
		t.Helper()
		select {
		case got := <-asked:
			if got != want {
				t.Fatalf("asked to close %d, want %d", got, want)
			}
		case <-time.After(within):
			t.Fatalf("not asked to close %d within %v", want, within)
		}
	}
	expectNone := func(d time.Duration) {
		t.Helper()
		select {
		case got := <-asked:
			t.Fatalf("asked to close %d, want no request", got)
		case <-time.After(d):
		}
	}

	// The leader closes what was wanted by itself: nothing asked.
	c.Closed(3)
	c.Request(5)
	c.Request(6)
	time.Sleep(grace / 4)
	c.Closed(6)
	expectNone(2 * grace)

	// Already closed: nothing to ask.
	c.Request(4)
	expectNone(grace / 2)

	// Moving in steps below what was wanted: it waits while the closed
	// revision moves, then asks once, for the highest revision wanted.
	c.Request(20)
	c.Request(30)
	for r := int64(7); r < 10; r++ {
		time.Sleep(grace / 2)
		c.Closed(r)
	}
	expectNone(grace / 4)
	expect(30, 5*grace)
	expectNone(grace)
	c.Closed(30)

	// The closed revision moved during that wait (a slow leader, not an
	// idle one): the next request waits again.
	c.Request(31)
	expectNone(grace / 2)
	expect(31, 5*grace)

	// That wait saw no move at all (the leader does not close by
	// itself): from now on asked at once.
	c.Request(32)
	expect(32, grace/2)
	c.Closed(32)

	// After the probe interval it waits again, and finding the leader
	// closing by itself it stays patient.
	time.Sleep(c.probe)
	c.Request(33)
	expectNone(grace / 2)
	c.Closed(33)
	expectNone(grace)
	c.Request(34)
	expectNone(grace / 2)
	c.Closed(34)
	expectNone(grace)

	// The wait follows the pace of the closed revision: four times the
	// average time between moves, between the grace and maxCloseWait.
	c.mu.Lock()
	for _, tc := range []struct{ pace, want time.Duration }{
		{0, grace}, {10 * time.Millisecond, grace}, {100 * time.Millisecond, 400 * time.Millisecond}, {time.Second, maxCloseWait},
	} {
		c.pace = tc.pace
		if got := c.waitLocked(); got != tc.want {
			t.Errorf("pace %v: wait %v, want %v", tc.pace, got, tc.want)
		}
	}
	c.mu.Unlock()
}
