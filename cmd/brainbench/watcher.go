package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxProblems is how many problem descriptions a watcher keeps.
const maxProblems = 3

// watcher consumes one watch stream and checks every event as it arrives.
type watcher struct {
	id      int
	plan    *watchPlan
	created chan struct{} // closed on the created response
	done    chan struct{} // closed when run returns
	events  atomic.Int64  // events accepted so far
	failed  atomic.Bool   // set with the first problem

	// Owned by run until done is closed.
	lastRev  int64
	keyRev   []int64  // mod revision of the last event of each key
	seen     []uint64 // bit set of the sequence numbers delivered
	sum      uint64   // checksum of the (seq, revision) pairs delivered
	lag      Histogram
	lastRecv time.Time
	problems int
	notes    []string
}

func newWatcher(id int, plan *watchPlan) *watcher {
	return &watcher{
		id:      id,
		plan:    plan,
		created: make(chan struct{}),
		done:    make(chan struct{}),
		keyRev:  make([]int64, len(plan.keys)),
		seen:    make([]uint64, (plan.writes+63)/64),
	}
}

// run reads the watch channel until it closes. A channel that closes or
// fails before ctx ends is a problem.
func (w *watcher) run(ctx context.Context, wch clientv3.WatchChan) {
	defer close(w.done)
	isCreated := false
	markCreated := func() {
		if !isCreated {
			isCreated = true
			close(w.created)
		}
	}
	for resp := range wch {
		if ctx.Err() != nil {
			return
		}
		if err := resp.Err(); err != nil {
			w.problem("watch failed: %v", err)
			return
		}
		if resp.Created {
			markCreated()
		}
		now := time.Now()
		for _, ev := range resp.Events {
			w.check(ev, now)
		}
		if len(resp.Events) > 0 {
			w.lastRecv = now
		}
	}
	if ctx.Err() == nil {
		w.problem("watch channel closed before the benchmark ended")
	}
}

func (w *watcher) finished() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// problem records a verification failure.
func (w *watcher) problem(format string, args ...any) {
	w.problems++
	w.failed.Store(true)
	if len(w.notes) < maxProblems {
		w.notes = append(w.notes, fmt.Sprintf("watcher %d: ", w.id)+fmt.Sprintf(format, args...))
	}
}

// firstProblem describes the first problem; only call it after done.
func (w *watcher) firstProblem() string {
	if len(w.notes) == 0 {
		return "no error reported"
	}
	return w.notes[0]
}

// check verifies one event against what was written and what this
// watcher saw before, and records its delivery lag.
func (w *watcher) check(ev *clientv3.Event, now time.Time) {
	if ev.Type != mvccpb.PUT {
		w.problem("unexpected %s event for %q at revision %d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
		return
	}
	rev := ev.Kv.ModRevision
	if rev <= w.lastRev {
		w.problem("event at revision %d after one at revision %d: out of order or duplicate", rev, w.lastRev)
	}
	w.lastRev = max(w.lastRev, rev)
	v := ev.Kv.Value
	if len(v) < watchValueHeader {
		w.problem("event value for %q at revision %d has %d bytes, too short", ev.Kv.Key, rev, len(v))
		return
	}
	sent := int64(binary.BigEndian.Uint64(v[0:8]))
	seq := int64(binary.BigEndian.Uint64(v[8:16]))
	if seq < 0 || seq >= w.plan.writes {
		w.problem("event at revision %d carries sequence number %d, not one written", rev, seq)
		return
	}
	k := w.plan.key(seq)
	if string(ev.Kv.Key) != w.plan.keys[k] {
		w.problem("event for write %d has key %q, want %q", seq, ev.Kv.Key, w.plan.keys[k])
		return
	}
	if w.seen[seq/64]&(1<<(seq%64)) != 0 {
		w.problem("write %d delivered twice (again at revision %d)", seq, rev)
		return
	}
	w.seen[seq/64] |= 1 << (seq % 64)
	if put := w.plan.revs[seq].Load(); put != 0 && put != rev {
		w.problem("write %d: event revision %d, but the put returned revision %d", seq, rev, put)
	}
	w.checkPrevKV(ev, k)
	w.keyRev[k] = rev
	w.sum += pairHash(seq, rev)
	w.lag.Record(now.Sub(time.Unix(0, sent)))
	w.events.Add(1)
	w.plan.delivered.Add(1)
}

// checkPrevKV checks that the event's prev_kv is the key's previous
// version, as this watcher saw it, or absent for a new key.
func (w *watcher) checkPrevKV(ev *clientv3.Event, k int) {
	prev := w.keyRev[k]
	switch {
	case prev == 0 && ev.PrevKv != nil:
		w.problem("event for new key %q at revision %d has a prev_kv (mod revision %d)", ev.Kv.Key, ev.Kv.ModRevision, ev.PrevKv.ModRevision)
	case prev != 0 && ev.PrevKv == nil:
		w.problem("event for %q at revision %d has no prev_kv; previous version is at revision %d", ev.Kv.Key, ev.Kv.ModRevision, prev)
	case prev != 0 && ev.PrevKv.ModRevision != prev:
		w.problem("event for %q at revision %d has prev_kv at revision %d, want %d", ev.Kv.Key, ev.Kv.ModRevision, ev.PrevKv.ModRevision, prev)
	}
}

// pairHash mixes a (seq, revision) pair (splitmix64), so that the sum over
// a set of pairs identifies the set with high probability.
func pairHash(seq, rev int64) uint64 {
	z := uint64(seq)*0x9e3779b97f4a7c15 ^ uint64(rev)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// verify checks, after the watchers have stopped, that each one got
// exactly the successful writes, and fills the verdict into s.
func verify(plan *watchPlan, ws []*watcher, s *WatchStats) {
	var want uint64
	for seq := range plan.writes {
		if rev := plan.revs[seq].Load(); rev != 0 {
			want += pairHash(seq, rev)
		}
	}
	for _, w := range ws {
		w.verifyComplete(want)
		if w.problems > 0 {
			s.BadWatchers++
			for _, n := range w.notes {
				if len(s.VerifyErrors) < 10 {
					s.VerifyErrors = append(s.VerifyErrors, n)
				}
			}
		}
	}
	s.Verified = s.BadWatchers == 0
}

// verifyComplete compares the writes the watcher saw with the successful
// ones.
func (w *watcher) verifyComplete(wantSum uint64) {
	var missing, extra int64
	firstMissing, firstExtra := int64(-1), int64(-1)
	for seq := range w.plan.writes {
		ok := w.plan.revs[seq].Load() != 0
		got := w.seen[seq/64]&(1<<(seq%64)) != 0
		switch {
		case ok && !got:
			missing++
			if firstMissing < 0 {
				firstMissing = seq
			}
		case !ok && got:
			extra++
			if firstExtra < 0 {
				firstExtra = seq
			}
		}
	}
	if missing > 0 {
		w.problem("%d writes never delivered (first: write %d at revision %d)", missing, firstMissing, w.plan.revs[firstMissing].Load())
	}
	if extra > 0 {
		w.problem("%d events for writes that failed on the client (first: write %d)", extra, firstExtra)
	}
	if missing == 0 && extra == 0 && w.sum != wantSum {
		w.problem("event revisions differ from the revisions the puts returned")
	}
}
