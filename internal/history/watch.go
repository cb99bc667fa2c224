package history

import (
	"bytes"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Event is one watch event as received.
type Event struct {
	Delete bool
	Key    string
	Value  string
	Rev    int64
	Create int64
	Ver    int64
	// Prev is the prev_kv (nil if none or not requested).
	Prev *PrevKV
}

// PrevKV is an event's previous key-value.
type PrevKV struct {
	Value string
	Mod   int64
}

// Response is one watch response as received.
type Response struct {
	Events   []Event
	Progress bool  // a progress notification
	Header   int64 // its header revision
}

// Watch is one watch's recorded stream. RecordWatch fills it; read it only
// after RecordWatch returns, except through CompleteAt.
type Watch struct {
	mu       sync.Mutex
	Name     string
	Key, End string // range; End "" means the single key, "\x00" means to the end
	Start    int64  // first revision it asked for
	PrevKV   bool
	Resps    []Response
	Complete int64 // the stream is known complete up to this revision
	// Resumed lists the start revisions of the stream's segments after a
	// break (RecordResumingWatch); Start is then the first segment's.
	Resumed []int64
	// Ended lists the segments that the server ended with an error (not
	// the recorder's own cancellation), in order.
	Ended []StreamEnd
}

// StreamEnd is a watch stream that ended with an error: when, through
// which of the recording's clients, and the error.
type StreamEnd struct {
	At     time.Time
	Client int
	Err    string
}

// Ends returns the segments ended so far.
func (w *Watch) Ends() []StreamEnd {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]StreamEnd(nil), w.Ended...)
}

// CompleteAt returns the revision the stream is complete up to so far.
func (w *Watch) CompleteAt() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.Complete
}

func (w *Watch) contains(key string) bool {
	switch w.End {
	case "":
		return key == w.Key
	case "\x00":
		return key >= w.Key
	}
	return key >= w.Key && key < w.End
}

// CheckHistory checks the reference stream (a watch over every key from
// the first revision) against the operations: it has every acknowledged
// write, each with the value written, and only values that were attempted.
func CheckHistory(ref *Watch, ops []Op) []error {
	var errs []error
	attempted := map[string]bool{}
	for _, op := range ops {
		if op.In.Kind == Put || op.In.Kind == CAS {
			attempted[op.In.Value] = true
		}
	}
	got := map[int64][]Event{}
	for _, r := range ref.Resps {
		for _, ev := range r.Events {
			got[ev.Rev] = append(got[ev.Rev], ev)
			if !ev.Delete && !attempted[ev.Value] {
				errs = append(errs, fmt.Errorf("history has %q=%q at %d, a value never written", ev.Key, ev.Value, ev.Rev))
			}
		}
	}
	for _, op := range ops {
		if !op.IsWrite() || op.Out.Rev > ref.Complete {
			continue
		}
		evs := got[op.Out.Rev]
		found := false
		for _, ev := range evs {
			if ev.Key == op.In.Key && ev.Delete == (op.In.Kind == Delete) && (ev.Delete || ev.Value == op.In.Value) {
				found = true
			}
		}
		if !found {
			errs = append(errs, fmt.Errorf("acknowledged %v at revision %d is missing from the history (events there: %v)", op.In, op.Out.Rev, evs))
		}
	}
	return errs
}

// CheckWatch checks w against the reference stream: ordered, unique,
// atomic, progress notifications that come after the events they cover, and
// event for event equal to the reference restricted to w's range and start,
// up to what both cover. prev_kv must be the key's previous event in the
// reference.
func CheckWatch(w, ref *Watch) []error {
	var errs []error
	errf := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf(w.Name+": "+format, args...))
		}
	}
	// The reference's per-key previous event, for prev_kv.
	prevOf := map[string]map[int64]*PrevKV{}
	last := map[string]*Event{}
	var refEvents []Event
	for _, r := range ref.Resps {
		for i := range r.Events {
			ev := r.Events[i]
			refEvents = append(refEvents, ev)
			if prevOf[ev.Key] == nil {
				prevOf[ev.Key] = map[int64]*PrevKV{}
			}
			if p := last[ev.Key]; p != nil && !p.Delete {
				prevOf[ev.Key][ev.Rev] = &PrevKV{Value: p.Value, Mod: p.Rev}
			}
			e := ev
			last[ev.Key] = &e
		}
	}
	upTo := min(w.Complete, ref.Complete)
	var want []Event
	for _, ev := range refEvents {
		if ev.Rev >= w.Start && ev.Rev <= upTo && w.contains(ev.Key) {
			want = append(want, ev)
		}
	}
	var got []Event
	lastRev := int64(0)
	respOf := map[int64]int{}
	for i, r := range w.Resps {
		if r.Progress {
			// Every reference event at or below the bookmark must already
			// have been delivered.
			n := 0
			for _, ev := range want {
				if ev.Rev <= r.Header {
					n++
				}
			}
			if len(got) < n {
				errf("progress notification at %d after %d events, but %d events at or below it exist", r.Header, len(got), n)
			}
			continue
		}
		for _, ev := range r.Events {
			if ev.Rev < lastRev {
				errf("event at %d after an event at %d", ev.Rev, lastRev)
			}
			if j, ok := respOf[ev.Rev]; ok && j != i {
				errf("revision %d split over responses %d and %d", ev.Rev, j, i)
			}
			respOf[ev.Rev] = i
			lastRev = ev.Rev
			if ev.Rev <= upTo {
				got = append(got, ev)
			}
		}
	}
	for i := 0; i < len(want) || i < len(got); i++ {
		switch {
		case i >= len(got):
			errf("missing event %s (and %d more)", fmtEvent(want[i]), len(want)-i-1)
			return errs
		case i >= len(want):
			errf("unexpected event %s", fmtEvent(got[i]))
			return errs
		}
		g, r := got[i], want[i]
		gp := g.Prev
		g.Prev, r.Prev = nil, nil
		if g != r {
			errf("event %d is %s, the history has %s", i, fmtEvent(got[i]), fmtEvent(want[i]))
			return errs
		}
		if w.PrevKV {
			wp := prevOf[g.Key][g.Rev]
			if (gp == nil) != (wp == nil) || gp != nil && *gp != *wp {
				errf("event %s has prev_kv %v, the history says %v", fmtEvent(got[i]), gp, wp)
			}
		} else if gp != nil {
			errf("event %s has a prev_kv it did not ask for", fmtEvent(got[i]))
		}
	}
	return errs
}

func fmtEvent(e Event) string {
	if e.Delete {
		return fmt.Sprintf("DELETE %q@%d", e.Key, e.Rev)
	}
	return fmt.Sprintf("PUT %q=%q@%d(c%d v%d)", e.Key, e.Value, e.Rev, e.Create, e.Ver)
}

// SortKeys sorts strings as etcd orders keys (bytewise).
func SortKeys(keys []string) {
	sort.Slice(keys, func(i, j int) bool { return bytes.Compare([]byte(keys[i]), []byte(keys[j])) < 0 })
}
