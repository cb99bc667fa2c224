package partition

import (
	"bytes"
	"context"
	"encoding/binary"
	"sync"
)

// latchSpan is a span of the latch keyspace: user keys are prefixed with
// 'k', leases are 'l' + BE64(id), so a lease can be latched like a key.
type latchSpan struct {
	start, end []byte // end is exclusive; empty means "to infinity"
	write      bool
}

func keySpan(key, rangeEnd []byte, write bool) latchSpan {
	start := append([]byte{'k'}, key...)
	var end []byte
	switch {
	case len(rangeEnd) == 0:
		end = append(append([]byte(nil), start...), 0)
	case len(rangeEnd) == 1 && rangeEnd[0] == 0:
		end = []byte{'k' + 1}
	default:
		end = append([]byte{'k'}, rangeEnd...)
	}
	return latchSpan{start: start, end: end, write: write}
}

func leaseSpan(id int64, write bool) latchSpan {
	start := binary.BigEndian.AppendUint64([]byte{'l'}, uint64(id))
	return latchSpan{start: start, end: append(append([]byte(nil), start...), 0), write: write}
}

func (a latchSpan) overlaps(b latchSpan) bool {
	return bytes.Compare(a.start, b.end) < 0 && bytes.Compare(b.start, a.end) < 0
}

// latchManager serializes conflicting requests on a partition's leader: a
// write latches what it reads and writes from before evaluation until its
// command applies, so evaluation always sees every earlier write to those
// keys applied and no later one. Requests wait only for conflicting
// requests that arrived earlier, so there is no deadlock.
type latchManager struct {
	mu   sync.Mutex
	held map[*latchGuard]struct{} // protected by mu
}

type latchGuard struct {
	spans []latchSpan
	done  chan struct{}
}

func newLatchManager() *latchManager {
	return &latchManager{held: make(map[*latchGuard]struct{})}
}

func conflicts(a, b []latchSpan) bool {
	for _, x := range a {
		for _, y := range b {
			if (x.write || y.write) && x.overlaps(y) {
				return true
			}
		}
	}
	return false
}

// acquire waits for every earlier conflicting request to release.
func (m *latchManager) acquire(ctx context.Context, spans []latchSpan) (*latchGuard, error) {
	g := &latchGuard{spans: spans, done: make(chan struct{})}
	m.mu.Lock()
	var wait []*latchGuard
	for h := range m.held {
		if conflicts(spans, h.spans) {
			wait = append(wait, h)
		}
	}
	m.held[g] = struct{}{}
	m.mu.Unlock()
	for _, h := range wait {
		select {
		case <-h.done:
		case <-ctx.Done():
			m.release(g)
			return nil, ctx.Err()
		}
	}
	return g, nil
}

func (m *latchManager) release(g *latchGuard) {
	m.mu.Lock()
	delete(m.held, g)
	m.mu.Unlock()
	close(g.done)
}
