package tso

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
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
		first, err := c.local.Next(ctx, n)
		if err == nil {
			c.observe(first + n - 1)
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
		ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
		first, cur, err := c.remote.Next(ctx, total)
		cancel()
		if err == nil {
			c.observe(cur)
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
		rev, err := c.local.ConfirmedCurrent(ctx)
		if err == nil {
			c.observe(rev)
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
		ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
		rev, err := c.remote.Current(ctx)
		cancel()
		if err == nil {
			c.observe(rev)
		}
		for _, ch := range batch {
			ch <- curResult{rev, err}
		}
	}
}
