package partition

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// Feed subscriptions.
//
// A subscription delivers what a replica applies from a revision on: first
// what its event log already holds (the catch-up, read from a Pebble
// snapshot), then what it applies (live), each revision's events with the
// closed revision after them. Every node's watch hub consumes one
// subscription per partition - on its own replica, or on another node's
// through kvapi's feed stream.
//
// Nothing falls between the phases: the subscription is registered with
// the apply path before the snapshot is taken, so an event committed after
// the snapshot is delivered live; and the catch-up's closed revision is
// read before the snapshot, so every event at or below it is in the
// snapshot. An event committed before the snapshot but published after the
// registration arrives twice; consumers drop duplicates (an event at or
// below the closed revision they hold, or a revision they already have).

// ErrSubscriptionEnded: the replica ended the subscription (it installed a
// snapshot, was removed, or closed); resubscribe from the last closed
// revision received.
var ErrSubscriptionEnded = errors.New("partition: feed subscription ended; resubscribe")

// ErrSlowSubscriber: live events piled up while the subscriber was still
// catching up; resubscribe.
var ErrSlowSubscriber = errors.New("partition: feed subscriber fell behind; resubscribe")

// CompactedError: a subscription asked for events below the compaction
// revision, which may be gone; events from Rev on are available.
type CompactedError struct{ Rev int64 }

func (e *CompactedError) Error() string {
	return fmt.Sprintf("partition: events below revision %d are compacted", e.Rev)
}

// maxQueuedPublishes bounds the live publishes held for a subscriber that
// is still catching up.
const maxQueuedPublishes = 1 << 16

// Subscription is one subscriber of a replica's applied events. The
// subscriber reads the catch-up with CatchUp until it reports done, then
// calls Live; Cancel releases the subscription and must always be called.
type Subscription struct {
	p      *Partition
	snap   *pebble.Snapshot // owned by the subscriber's goroutine
	from   int64            // the first revision delivered
	next   int64            // catch-up cursor
	closed int64            // the closed revision the catch-up ends at
	splits []SplitRecord    // the partition's splits when it started

	mu    sync.Mutex
	live  Feed            // nil while catching up; protected by mu
	queue []queuedPublish // live publishes held during the catch-up; protected by mu
	err   error           // why it ended; protected by mu
	done  chan struct{}
}

type queuedPublish struct {
	evs    RevEvents
	closed int64
}

// Subscribe starts a subscription to the events with revisions >= from.
// It fails with *CompactedError if from is below the compaction revision
// and with ErrSubscriptionEnded if the replica is closed.
func (p *Partition) Subscribe(from int64) (*Subscription, error) {
	s := &Subscription{p: p, from: max(from, 1), next: max(from, 1), done: make(chan struct{})}
	p.subs.Lock()
	if p.subs.closed {
		p.subs.Unlock()
		return nil, ErrSubscriptionEnded
	}
	list := append(append([]*Subscription(nil), p.subs.list...), s)
	p.subs.list = list
	p.subs.ptr.Store(&list)
	p.subs.Unlock()
	// A split after the registration ends the subscription, so these
	// are all the splits below what it delivers.
	s.splits = p.Splits()
	s.closed = p.closed.Load()
	s.snap = p.db.NewSnapshot()
	// The event log keeps every event at or above the compaction revision
	// (read after the snapshot, it bounds every purge the snapshot saw).
	if c := p.compact.Load(); s.next < c {
		s.Cancel()
		return nil, &CompactedError{Rev: c}
	}
	return s, nil
}

// Splits returns the partition's splits as of the subscription's start:
// the subscriber must register each child (from its Closed revision on)
// before delivering anything of the subscription, whose closed revisions
// may be above the splits. A later split ends the subscription.
func (s *Subscription) Splits() []SplitRecord { return s.splits }

// Closed is the closed revision the catch-up ends at: once CatchUp is done,
// every event at or below it has been returned.
func (s *Subscription) Closed() int64 { return s.closed }

// CatchUp returns up to maxRevs revisions of the catch-up; done reports
// that it is complete.
func (s *Subscription) CatchUp(maxRevs int) (evs []RevEvents, done bool, err error) {
	if s.snap == nil {
		return nil, true, nil
	}
	select {
	case <-s.done:
		return nil, false, s.Err()
	default:
	}
	evs, next, more, err := s.p.eventsFrom(s.snap, s.next, math.MaxInt64-1, nil, []byte{}, maxRevs)
	if err != nil {
		return nil, false, err
	}
	s.next = next
	return evs, !more, nil
}

// Live switches to live delivery into sink: the publishes held during the
// catch-up first, then each apply's as it happens (on a raft worker; sink
// must not block). Call it once CatchUp is done.
func (s *Subscription) Live(sink Feed) {
	s.releaseSnapshot()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return
	}
	for _, q := range s.queue {
		sink.Publish(s.p.id, q.evs, q.closed)
	}
	s.queue = nil
	s.live = sink
}

// Done is closed when the subscription ends; Err says why.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err returns why the subscription ended (nil while it runs).
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Cancel ends the subscription. Call it from the subscriber's goroutine.
func (s *Subscription) Cancel() {
	s.end(ErrSubscriptionEnded)
	s.releaseSnapshot()
}

func (s *Subscription) releaseSnapshot() {
	if s.snap != nil {
		_ = s.snap.Close()
		s.snap = nil
	}
}

// deliver runs on the apply path.
func (s *Subscription) deliver(evs RevEvents, closed int64) {
	if evs.Rev != 0 && evs.Rev < s.from {
		evs = RevEvents{}
	}
	s.mu.Lock()
	switch {
	case s.err != nil:
	case s.live != nil:
		s.live.Publish(s.p.id, evs, closed)
	case evs.Rev == 0 && len(s.queue) > 0 && s.queue[len(s.queue)-1].evs.Rev == 0:
		s.queue[len(s.queue)-1].closed = closed // coalesce closes
	case len(s.queue) >= maxQueuedPublishes:
		s.mu.Unlock()
		s.end(ErrSlowSubscriber)
		return
	default:
		s.queue = append(s.queue, queuedPublish{evs: evs, closed: closed})
	}
	s.mu.Unlock()
}

// end ends the subscription with err (once) and unregisters it.
func (s *Subscription) end(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	s.live, s.queue = nil, nil
	close(s.done)
	s.mu.Unlock()
	p := s.p
	p.subs.Lock()
	list := make([]*Subscription, 0, len(p.subs.list))
	for _, x := range p.subs.list {
		if x != s {
			list = append(list, x)
		}
	}
	p.subs.list = list
	p.subs.ptr.Store(&list)
	p.subs.Unlock()
}

// publishToSubscribers runs after an apply commits.
func (p *Partition) publishToSubscribers(evs RevEvents, closed int64) {
	if l := p.subs.ptr.Load(); l != nil {
		for _, s := range *l {
			s.deliver(evs, closed)
		}
	}
}

// endSubscriptions ends every subscription (the replica's state changed
// under them, or it closes); closing also refuses new ones.
func (p *Partition) endSubscriptions(closing bool) {
	p.subs.Lock()
	list := p.subs.list
	p.subs.closed = p.subs.closed || closing
	p.subs.Unlock()
	for _, s := range list {
		s.end(ErrSubscriptionEnded)
	}
}
