package partition

import (
	"sync"
	"sync/atomic"
	"time"
)

// closeGrace is the shortest time a node that does not lead a partition
// waits for a revision the watch frontier needs to close by itself before
// it asks the partition's leader (CloseSoon); the wait is longer when the
// partition's closed revision has been moving more slowly (a loaded
// cluster) and starts again each time the closed revision moves without
// reaching the revision. A partition's leader closes the revisions its
// own node's watch hub sees (locally, through the log), and writes carry
// closed revisions too; so when the leader's node watches, as every node
// behind a kube-apiserver does, the closed revisions every other node
// wants arrive without any of them asking. Forwarding every request from
// every other node instead cost about a quarter of a 3-node cluster's CPU
// per create, and on 6 nodes, where every node reads half the partitions
// through remote feeds, about five internal calls per create; with a
// fixed 10 ms wait, slowed closes on a loaded 6-node cluster still made
// most waits end in asking (see BenchmarkCreate in ./server).
const closeGrace = 50 * time.Millisecond

// maxCloseWait bounds a CloseSoon's wait.
const maxCloseWait = 500 * time.Millisecond

// closeProbeEvery is how often a CloseSoon whose last wait ended in asking
// (the leader's node did not close the revision by itself: its hub is
// idle) waits again to find out whether it still has to; in between it
// asks at once, so a node whose partitions' leaders do not watch delays
// its watches by a wait only once per closeProbeEvery.
const closeProbeEvery = time.Second

// CloseSoon decides when a node that does not lead a partition asks the
// leader to close a revision for the watch frontier. While the leader
// closes the wanted revisions by itself, a request waits for the closed
// revision to reach it (waitLocked, again each time it moves) and asks
// the leader only if it stops short; requests meanwhile are coalesced
// into one, of the highest revision. Once a wait in which the closed
// revision did not move at all ended in asking, requests ask at once, but
// for one wait every closeProbeEvery. A
// follower replica uses one with its applied closed revision
// (Partition.RequestCloseSoon), a node without a replica with the closed
// revisions its remote feed delivers (kvapi). Progress requests and
// readers waiting on a revision ask at once instead.
type CloseSoon struct {
	grace time.Duration
	probe time.Duration
	ask   func(rev int64)

	closed atomic.Int64 // the closed revision seen last

	mu        sync.Mutex
	movedAt   time.Time     // when closed last rose; protected by mu
	pace      time.Duration // moving average of the time between rises; protected by mu
	want      int64         // highest revision wanted; protected by mu
	seen      int64         // closed revision at the last check; protected by mu
	start     int64         // closed revision when the wait began; protected by mu
	armed     bool          // a check is pending; protected by mu
	impatient bool          // the last wait ended in asking; protected by mu
	probedAt  time.Time     // when it became impatient; protected by mu
}

// NewCloseSoon returns a CloseSoon that asks the leader with ask (which
// must not block for long).
func NewCloseSoon(ask func(rev int64)) *CloseSoon {
	return &CloseSoon{grace: closeGrace, probe: closeProbeEvery, ask: ask}
}

// Closed records that the partition's closed revision is rev.
func (c *CloseSoon) Closed(rev int64) {
	if rev <= c.closed.Load() {
		return
	}
	now := time.Now()
	c.mu.Lock()
	if rev > c.closed.Load() {
		c.closed.Store(rev)
		if !c.movedAt.IsZero() {
			c.pace += (min(now.Sub(c.movedAt), maxCloseWait) - c.pace) / 8
		}
		c.movedAt = now
	}
	c.mu.Unlock()
}

// waitLocked is how long a wait lasts without the closed revision moving:
// closeGrace, or four times the time the closed revision has been taking
// to move if longer (a loaded cluster closes less often, and asking would
// not close sooner), at most maxCloseWait.
func (c *CloseSoon) waitLocked() time.Duration {
	return min(max(c.grace, 4*c.pace), maxCloseWait)
}

// Request wants rev closed.
func (c *CloseSoon) Request(rev int64) {
	if c.closed.Load() >= rev {
		return
	}
	c.mu.Lock()
	if c.impatient && time.Since(c.probedAt) < c.probe {
		c.mu.Unlock()
		c.ask(rev)
		return
	}
	defer c.mu.Unlock()
	c.want = max(c.want, rev)
	if !c.armed {
		c.armed = true
		c.seen = c.closed.Load()
		c.start = c.seen
		time.AfterFunc(c.waitLocked(), c.check)
	}
}

// check runs a grace period after Request armed it: done if the wanted
// revision closed, again later if the closed revision moved, otherwise it
// asks the leader.
func (c *CloseSoon) check() {
	c.mu.Lock()
	want, closed := c.want, c.closed.Load()
	switch {
	case closed >= want:
		c.armed = false
		c.impatient = false
	case closed > c.seen:
		c.seen = closed
		time.AfterFunc(c.waitLocked(), c.check)
	default:
		// The leader did not close what was wanted by itself. If the
		// closed revision did not move at all meanwhile, it does not
		// close by itself (its node's hub is idle): ask at once from now
		// on. If it moved, the leader only was slow (a stall, a burst):
		// keep waiting next time.
		c.armed = false
		if closed == c.start {
			c.impatient = true
			c.probedAt = time.Now()
		}
		c.mu.Unlock()
		c.ask(want)
		return
	}
	c.mu.Unlock()
}
