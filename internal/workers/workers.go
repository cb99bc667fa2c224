package workers

import (
	"sync/atomic"
	"time"
)

// Pool runs functions on at most max kept goroutines; a function that
// finds them all busy gets a goroutine of its own. A kept goroutine that
// has waited idle for the Pool's idle time exits. The zero Pool is not
// usable; use New.
type Pool struct {
	work chan func()
	max  int32
	idle time.Duration
	n    atomic.Int32 // kept goroutines
}

// New returns a Pool keeping at most max goroutines, each for as long as
// it gets work at least once per idle.
func New(max int, idle time.Duration) *Pool {
	return &Pool{work: make(chan func()), max: int32(max), idle: idle}
}

// Go runs f on a goroutine: an idle kept one, a new kept one if there are
// fewer than max, or else a goroutine of its own. It never blocks.
func (p *Pool) Go(f func()) {
	select {
	case p.work <- f:
		return
	default:
	}
	if p.n.Add(1) <= p.max {
		go p.keep(f)
		return
	}
	p.n.Add(-1)
	go f()
}

// Kept reports how many goroutines the Pool keeps now.
func (p *Pool) Kept() int { return int(p.n.Load()) }

func (p *Pool) keep(f func()) {
	t := time.NewTimer(p.idle)
	defer t.Stop()
	for {
		f()
		t.Reset(p.idle)
		select {
		case f = <-p.work:
		case <-t.C:
			p.n.Add(-1)
			// A Go that saw this goroutine idle has handed its function
			// over already (the channel is unbuffered), so nothing is lost.
			return
		}
	}
}
