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
//
// Held latches are indexed so that a single-key request (nearly every
// Kubernetes write) finds its conflicts without looking at every request
// in flight: point spans (one key or one lease) by key, spans covering
// more than one key in a list. A point span conflicts with the point spans
// of the same key and with the range spans that cover it; a range span is
// checked against every held span.
type latchManager struct {
	mu     sync.Mutex
	points map[string][]heldLatch // point spans by start; protected by mu
	ranges []heldLatch            // spans of more than one key; protected by mu
}

type heldLatch struct {
	g    *latchGuard
	span latchSpan
}

type latchGuard struct {
	spans []latchSpan
	done  chan struct{}
}

func newLatchManager() *latchManager {
	return &latchManager{points: make(map[string][]heldLatch)}
}

// isPoint reports whether s covers exactly one key: [k, k+"\x00").
func (s latchSpan) isPoint() bool {
	n := len(s.start)
	return len(s.end) == n+1 && s.end[n] == 0 && bytes.Equal(s.end[:n], s.start)
}

// conflictsWith reports whether a request holding x must wait for one
// holding y (or the other way round): they overlap and one writes.
func (x latchSpan) conflictsWith(y latchSpan) bool {
	return (x.write || y.write) && x.overlaps(y)
}

// acquire waits for every earlier conflicting request to release.
func (m *latchManager) acquire(ctx context.Context, spans []latchSpan) (*latchGuard, error) {
	g, wait := m.register(spans)
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

// register records spans as held and returns their guard and the held
// guards they conflict with (a guard may appear more than once).
func (m *latchManager) register(spans []latchSpan) (*latchGuard, []*latchGuard) {
	g := &latchGuard{spans: spans, done: make(chan struct{})}
	m.mu.Lock()
	defer m.mu.Unlock()
	var wait []*latchGuard
	addIf := func(x latchSpan, h heldLatch) {
		if x.conflictsWith(h.span) {
			wait = append(wait, h.g)
		}
	}
	for _, x := range spans {
		if x.isPoint() {
			for _, h := range m.points[string(x.start)] {
				addIf(x, h)
			}
		} else {
			for _, hs := range m.points {
				for _, h := range hs {
					addIf(x, h)
				}
			}
		}
		for _, h := range m.ranges {
			addIf(x, h)
		}
	}
	for _, x := range spans {
		if x.isPoint() {
			m.points[string(x.start)] = append(m.points[string(x.start)], heldLatch{g, x})
		} else {
			m.ranges = append(m.ranges, heldLatch{g, x})
		}
	}
	return g, wait
}

func (m *latchManager) release(g *latchGuard) {
	m.mu.Lock()
	for _, x := range g.spans {
		if !x.isPoint() {
			continue
		}
		k := string(x.start)
		if hs := dropGuard(m.points[k], g); len(hs) == 0 {
			delete(m.points, k)
		} else {
			m.points[k] = hs
		}
	}
	m.ranges = dropGuard(m.ranges, g)
	m.mu.Unlock()
	close(g.done)
}

// dropGuard removes g's latches from hs, in place.
func dropGuard(hs []heldLatch, g *latchGuard) []heldLatch {
	out := hs[:0]
	for _, h := range hs {
		if h.g != g {
			out = append(out, h)
		}
	}
	clear(hs[len(out):])
	return out
}
