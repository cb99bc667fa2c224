package tso

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Backend reaches the TSO leader on another node.
type Backend interface {
	// Next returns n consecutive revisions issued by the leader (the first)
	// and the leader's current revision.
	Next(ctx context.Context, n int64) (first, current int64, err error)
	// Current returns the leader's confirmed current revision.
	Current(ctx context.Context) (int64, error)
}

// Client gives a node revisions: from its own replica when it leads the
// TSO, otherwise from the leader through remote, with concurrent requests
// batched into one round trip. A request joins only a batch that has not
// been sent yet, so what it gets was issued after it began.
type Client struct {
	local  *Oracle
	remote Backend
	// known is the highest revision this node has seen issued.
	known atomic.Int64

	next struct {
		sync.Mutex
		waiting  []*nextReq // protected by next
		inflight bool       // protected by next
	}
	cur struct {
		sync.Mutex
		waiting  []chan curResult // protected by cur
		inflight bool             // protected by cur
	}
	// confirmed holds recent revisions the TSO's leader confirmed, each
	// with when the call that learned it began (ConfirmedSince).
	confirmed struct {
		sync.Mutex
		ring [confirmedSamples]confirmation // protected by confirmed
		n    int                            // samples taken; protected by confirmed
	}
}

// confirmation is a revision the TSO's leader answered with to a call that
// began at (Unix nanoseconds): every write acknowledged before then is at
// or below it.
type confirmation struct {
	rev int64
	at  int64
}

// confirmedSamples and confirmedSpacing: a sample is kept at most every
// 5 ms, so the ring covers the last 320 ms at least.
const (
	confirmedSamples = 64
	confirmedSpacing = 5 * time.Millisecond
)

// confirm records that the TSO's leader answered rev to a call that began
// at start.
func (c *Client) confirm(rev int64, start time.Time) {
	at := start.UnixNano()
	c.confirmed.Lock()
	defer c.confirmed.Unlock()
	if c.confirmed.n > 0 {
		last := &c.confirmed.ring[(c.confirmed.n-1)%confirmedSamples]
		if at-last.at < int64(confirmedSpacing) {
			last.rev = max(last.rev, rev) // the same slot: the later answer
			return
		}
	}
	c.confirmed.ring[c.confirmed.n%confirmedSamples] = confirmation{rev: rev, at: at}
	c.confirmed.n++
}

// ConfirmedSince returns the lowest revision the TSO's leader confirmed to
// a call that began at or after t: every write acknowledged before t is at
// or below it, and a read at it misses nothing acknowledged before t (a
// bounded-staleness read). ok is false if no such call is remembered.
func (c *Client) ConfirmedSince(t time.Time) (rev int64, ok bool) {
	since := t.UnixNano()
	c.confirmed.Lock()
	defer c.confirmed.Unlock()
	n := min(c.confirmed.n, confirmedSamples)
	for i := 1; i <= n; i++ {
		s := c.confirmed.ring[(c.confirmed.n-i)%confirmedSamples]
		if s.at < since {
			break
		}
		rev, ok = s.rev, true
	}
	return rev, ok
}

type nextReq struct {
	n     int64
	first int64
	err   error
	done  chan struct{}
}

// remoteTimeout bounds one remote TSO round trip (it waits through a TSO
// leader election).
const remoteTimeout = 5e9 // 5s

type curResult struct {
	rev int64
	err error
}

// NewClient returns a client over the local replica (which may be nil)
// and the remote backend (nil for a single node).
func NewClient(local *Oracle, remote Backend) *Client {
	return &Client{local: local, remote: remote}
}

// Observe records that rev was issued (by the TSO, learned elsewhere).
func (c *Client) Observe(rev int64) { c.observe(rev) }

func (c *Client) observe(rev int64) {
	for {
		k := c.known.Load()
		if rev <= k || c.known.CompareAndSwap(k, rev) {
			return
		}
	}
}

// Known returns the highest revision this node has seen issued: a lower
// bound of the TSO's current revision, safe for closing revisions.
func (c *Client) Known() int64 {
	if c.local != nil && c.local.Serving() {
		c.observe(c.local.Current())
	}
	return c.known.Load()
}

// Current implements partition.Revisions: Known.
func (c *Client) Current() int64 { return c.Known() }

// Next issues n revisions and returns the first.
func (c *Client) Next(ctx context.Context, n int64) (int64, error) {
	if c.local != nil && c.local.Serving() {
		start := time.Now()
		first, err := c.local.Next(ctx, n)
		if err == nil {
			c.observe(first + n - 1)
			c.confirm(first+n-1, start)
			return first, nil
		}
		if !errors.Is(err, ErrNotLeader) || c.remote == nil {
			return 0, err
		}
	}
	if c.remote == nil {
		return 0, ErrNotLeader
	}
	r := &nextReq{n: n, done: make(chan struct{})}
	c.next.Lock()
	c.next.waiting = append(c.next.waiting, r)
	if !c.next.inflight {
		c.next.inflight = true
		go c.nextRounds()
	}
	c.next.Unlock()
	select {
	case <-r.done:
		return r.first, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (c *Client) nextRounds() {
	for {
		c.next.Lock()
		batch := c.next.waiting
		c.next.waiting = nil
		if len(batch) == 0 {
			c.next.inflight = false
			c.next.Unlock()
			return
		}
		c.next.Unlock()
		var total int64
		for _, r := range batch {
			total += r.n
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
		first, cur, err := c.remote.Next(ctx, total)
		cancel()
		if err == nil {
			c.observe(cur)
			c.confirm(cur, start)
		}
		for _, r := range batch {
			r.first, r.err = first, err
			first += r.n
			close(r.done)
		}
	}
}

// Fresh returns the TSO's current revision, confirmed by its leader after
// the call began: every write acknowledged before is at or below it.
func (c *Client) Fresh(ctx context.Context) (int64, error) {
	if c.local != nil && c.local.Serving() {
		start := time.Now()
		rev, err := c.local.ConfirmedCurrent(ctx)
		if err == nil {
			c.observe(rev)
			c.confirm(rev, start)
			return rev, nil
		}
		if !errors.Is(err, ErrNotLeader) || c.remote == nil {
			return 0, err
		}
	}
	if c.remote == nil {
		return 0, ErrNotLeader
	}
	ch := make(chan curResult, 1)
	c.cur.Lock()
	c.cur.waiting = append(c.cur.waiting, ch)
	if !c.cur.inflight {
		c.cur.inflight = true
		go c.curRounds()
	}
	c.cur.Unlock()
	select {
	case r := <-ch:
		return r.rev, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (c *Client) curRounds() {
	for {
		c.cur.Lock()
		batch := c.cur.waiting
		c.cur.waiting = nil
		if len(batch) == 0 {
			c.cur.inflight = false
			c.cur.Unlock()
			return
		}
		c.cur.Unlock()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
		rev, err := c.remote.Current(ctx)
		cancel()
		if err == nil {
			c.observe(rev)
			c.confirm(rev, start)
		}
		for _, ch := range batch {
			ch <- curResult{rev, err}
		}
	}
}
