package raftgroup

import (
	"sync"
	"time"
)

// scheduler is a queue of groups with work, taken by a fixed pool of
// workers (CockroachDB's raftScheduler). A group is on the queue at most
// once and is processed by at most one worker at a time; work that arrives
// while a group is being processed re-queues it when the worker is done.
type scheduler struct {
	mu struct {
		sync.Mutex
		cond    *sync.Cond
		queue   []*Group // FIFO; protected by mu
		state   map[*Group]schedState
		stopped bool
	}
}

type schedState uint8

const (
	stateQueued     schedState = 1 << iota // on the queue
	stateProcessing                        // a worker holds it
	stateDirty                             // more work arrived while processing
)

func newScheduler() *scheduler {
	s := &scheduler{}
	s.mu.cond = sync.NewCond(&s.mu.Mutex)
	s.mu.state = make(map[*Group]schedState)
	return s
}

// enqueue marks g as having work.
func (s *scheduler) enqueue(g *Group) {
	s.mu.Lock()
	st := s.mu.state[g]
	switch {
	case st&stateProcessing != 0:
		s.mu.state[g] = st | stateDirty
	case st&stateQueued == 0:
		s.mu.state[g] = st | stateQueued
		s.mu.queue = append(s.mu.queue, g)
		s.mu.cond.Signal()
	}
	s.mu.Unlock()
}

// take blocks until groups are queued and returns up to max of them, now
// marked processing. It returns nil once the scheduler is stopped.
func (s *scheduler) take(max int, buf []*Group) []*Group {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.mu.queue) == 0 && !s.mu.stopped {
		s.mu.cond.Wait()
	}
	if s.mu.stopped {
		return nil
	}
	n := min(max, len(s.mu.queue))
	buf = append(buf[:0], s.mu.queue[:n]...)
	s.mu.queue = s.mu.queue[n:]
	if len(s.mu.queue) == 0 {
		s.mu.queue = nil
	} else {
		// Another worker can take the rest now.
		s.mu.cond.Signal()
	}
	for _, g := range buf {
		s.mu.state[g] = stateProcessing
	}
	return buf
}

// done releases groups after processing; those marked dirty (or for which
// requeue is true) go back on the queue.
func (s *scheduler) done(g *Group, requeue bool) {
	s.mu.Lock()
	st := s.mu.state[g]
	if st&stateDirty != 0 || requeue {
		s.mu.state[g] = stateQueued
		s.mu.queue = append(s.mu.queue, g)
		s.mu.cond.Signal()
	} else {
		delete(s.mu.state, g)
	}
	s.mu.Unlock()
}

// waitIdle waits until no worker processes g and removes it from the
// queue (it must no longer be enqueued by anyone).
func (s *scheduler) waitIdle(g *Group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.mu.state[g]&stateProcessing != 0 {
		s.mu.Unlock()
		time.Sleep(time.Millisecond)
		s.mu.Lock()
	}
	if s.mu.state[g]&stateQueued != 0 {
		for i, q := range s.mu.queue {
			if q == g {
				s.mu.queue = append(s.mu.queue[:i], s.mu.queue[i+1:]...)
				break
			}
		}
	}
	delete(s.mu.state, g)
}

func (s *scheduler) stop() {
	s.mu.Lock()
	s.mu.stopped = true
	s.mu.cond.Broadcast()
	s.mu.Unlock()
}
