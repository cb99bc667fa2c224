package partition

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"
)

// dedupSink is what a watch hub does with a subscription: it keeps the
// events above the closed revision it holds, dropping duplicates, and
// checks that the closed promise holds (no new event at or below it).
type dedupSink struct {
	t      *testing.T
	mu     sync.Mutex
	closed int64
	got    map[int64]RevEvents
	late   []int64 // events that arrived at or below closed and were new
}

func newDedupSink(t *testing.T) *dedupSink {
	return &dedupSink{t: t, got: make(map[int64]RevEvents)}
}

func (d *dedupSink) Publish(_ uint64, evs RevEvents, closed int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if evs.Rev != 0 {
		if _, dup := d.got[evs.Rev]; !dup {
			if evs.Rev <= d.closed {
				d.late = append(d.late, evs.Rev)
			}
			d.got[evs.Rev] = evs
		}
	}
	d.closed = max(d.closed, closed)
}

// TestSubscriptionsGetExactlyTheSuffix starts subscriptions from random
// revisions while writers run, and checks each got every event at or above
// its start exactly as the partition applied it, and that no event arrived
// below a closed revision already delivered.
func TestSubscriptionsGetExactlyTheSuffix(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	const writers, perWriter = 8, 150
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				if _, err := h.p.Txn(ctx, put(fmt.Sprintf("k%d", (w*7+i)%20), fmt.Sprintf("v%d-%d", w, i))); err != nil {
					t.Error(err)
					return
				}
			}
		}(w)
	}
	type subscriber struct {
		from int64
		sink *dedupSink
		sub  *Subscription
	}
	var subs []*subscriber
	rng := rand.New(rand.NewSource(1))
	go func() { wg.Wait(); close(stop) }()
	for done := false; !done; {
		select {
		case <-stop:
			done = true
		case <-time.After(time.Duration(rng.Intn(3)) * time.Millisecond):
		}
		from := rng.Int63n(h.revs.Current() + 2)
		s := &subscriber{from: from, sink: newDedupSink(t)}
		sub, err := h.p.Subscribe(from)
		if err != nil {
			t.Fatal(err)
		}
		for {
			evs, done, err := sub.CatchUp(7)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range evs {
				s.sink.Publish(100, e, 0)
			}
			if done {
				break
			}
		}
		s.sink.Publish(100, RevEvents{}, sub.Closed())
		sub.Live(s.sink)
		s.sub = sub
		subs = append(subs, s)
	}
	// Close past the last write so every subscriber's closed covers it.
	last := h.revs.Current()
	if err := h.p.WaitClosed(ctx, last); err != nil {
		t.Fatal(err)
	}
	h.feed.mu.Lock()
	all := append([]RevEvents(nil), h.feed.evs...)
	h.feed.mu.Unlock()
	if len(all) != writers*perWriter {
		t.Fatalf("the partition published %d revisions, want %d", len(all), writers*perWriter)
	}
	for _, s := range subs {
		s.sub.Cancel()
		s.sink.mu.Lock()
		if len(s.sink.late) > 0 {
			t.Errorf("subscriber from %d got revisions %v after a closed revision covering them", s.from, s.sink.late)
		}
		want := 0
		for _, e := range all {
			if e.Rev < s.from {
				continue
			}
			want++
			got, ok := s.sink.got[e.Rev]
			if !ok {
				t.Errorf("subscriber from %d missed revision %d", s.from, e.Rev)
				continue
			}
			if len(got.Events) != len(e.Events) || string(got.Events[0].Kv.Key) != string(e.Events[0].Kv.Key) ||
				string(got.Events[0].Kv.Value) != string(e.Events[0].Kv.Value) || got.Events[0].Kv.Version != e.Events[0].Kv.Version {
				t.Errorf("subscriber from %d: revision %d is %v, want %v", s.from, e.Rev, got.Events, e.Events)
			}
		}
		if len(s.sink.got) != want {
			t.Errorf("subscriber from %d got %d revisions, want %d", s.from, len(s.sink.got), want)
		}
		s.sink.mu.Unlock()
	}
	if len(subs) < 5 {
		t.Fatalf("only %d subscriptions started during the load", len(subs))
	}
	t.Logf("%d subscriptions checked against %d revisions", len(subs), len(all))
}

// TestSubscriptionEnds: compaction refuses old starts; Close ends live
// subscriptions and refuses new ones.
func TestSubscriptionEnds(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		if _, err := h.p.Txn(ctx, put("k", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	cur := h.revs.Current()
	if err := h.p.Compact(ctx, cur-3); err != nil {
		t.Fatal(err)
	}
	var ce *CompactedError
	if _, err := h.p.Subscribe(cur - 5); !errors.As(err, &ce) || ce.Rev != cur-3 {
		t.Fatalf("Subscribe below the compaction revision: %v, want CompactedError{%d}", err, cur-3)
	}
	sub, err := h.p.Subscribe(cur - 3)
	if err != nil {
		t.Fatal(err)
	}
	evs, done, err := sub.CatchUp(0)
	if err != nil || !done || len(evs) != 4 {
		t.Fatalf("catch-up from the compaction revision: %d revisions, done %v, err %v; want 4", len(evs), done, err)
	}
	sub.Live(newDedupSink(t))
	h.p.Close()
	select {
	case <-sub.Done():
	case <-time.After(time.Second):
		t.Fatal("Close did not end the subscription")
	}
	if !errors.Is(sub.Err(), ErrSubscriptionEnded) {
		t.Fatalf("ended with %v", sub.Err())
	}
	if _, err := h.p.Subscribe(1); !errors.Is(err, ErrSubscriptionEnded) {
		t.Fatalf("Subscribe after Close: %v", err)
	}
}
