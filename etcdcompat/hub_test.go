package etcdcompat

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/brainkv/brain/partition"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

type nopSource struct {
	mu     sync.Mutex
	closes []int64 // protected by mu
}

func (s *nopSource) RequestCloseSoon(rev int64, _ func(uint64) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closes = append(s.closes, rev)
}

// asked returns the revisions RequestCloseSoon was called with.
func (s *nopSource) asked() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.closes)
}

func (s *nopSource) CurrentRevision() int64                  { return 0 }
func (s *nopSource) CompactRevision() int64                  { return -1 }
func (s *nopSource) PrevValue([]byte, int64) ([]byte, error) { return nil, nil }
func (s *nopSource) Events(int64, int64, []byte, []byte, int) ([]partition.RevEvents, int64, error) {
	return nil, 0, nil
}

func evs(rev int64, key string) partition.RevEvents {
	return partition.RevEvents{Rev: rev, Events: []*mvccpb.Event{{Kv: &mvccpb.KeyValue{Key: []byte(key), Value: []byte("v"), ModRevision: rev}}}}
}

func revs(es []*entry) []int64 {
	var out []int64
	for _, e := range es {
		out = append(out, e.rev)
	}
	return out
}

// TestHubReleasesInRevisionOrder publishes out of order across two
// partitions and checks events are released only once every partition has
// closed past them, in revision order.
func TestHubReleasesInRevisionOrder(t *testing.T) {
	src := &nopSource{}
	h := NewHub(HubConfig{}, src)
	h.SetSource(src)
	h.AddPartition(1, nil, nil, 1)
	h.AddPartition(2, nil, nil, 1)
	h.Publish(1, evs(5, "a"), 3)
	h.Publish(2, evs(4, "m"), 4)
	if f, _ := h.Frontier(); f != 3 {
		t.Fatalf("frontier %d, want 3", f)
	}
	if es, _ := h.entries(2, 10); len(es) != 0 {
		t.Fatalf("released %v before the frontier passed them", revs(es))
	}
	if len(src.asked()) == 0 {
		t.Fatal("the hub did not ask lagging partitions to close")
	}
	h.Publish(1, partition.RevEvents{}, 6)
	if es, _ := h.entries(2, 10); len(es) != 1 || es[0].rev != 4 {
		t.Fatalf("released %v, want [4]", revs(es))
	}
	h.Publish(2, partition.RevEvents{}, 10)
	es, ok := h.entries(2, 10)
	if !ok || len(es) != 2 || es[1].rev != 5 {
		t.Fatalf("released %v, want [4 5]", revs(es))
	}
	if f, _ := h.Frontier(); f != 6 {
		t.Fatalf("frontier %d, want 6", f)
	}
}

// TestHubEncodesOncePerShape checks that watches of one shape share one
// encoding of a revision, and that a watcher behind the ring is told so.
func TestHubEncodesOncePerShape(t *testing.T) {
	src := &nopSource{}
	h := NewHub(HubConfig{RingEvents: 2}, src)
	h.AddPartition(1, nil, nil, 1)
	for r := int64(2); r <= 6; r++ {
		h.Publish(1, evs(r, "a"), r)
	}
	es, ok := h.entries(5, 6)
	if !ok || len(es) != 2 {
		t.Fatalf("entries 5..6: %v %v", revs(es), ok)
	}
	s1 := &shape{key: "a", single: true, prevKV: true}
	s2 := &shape{key: "a", single: true, prevKV: true}
	a, b := h.encodedFor(es[0], s1), h.encodedFor(es[0], s2)
	if a == nil || a != b {
		t.Fatal("identical shapes did not share the encoding")
	}
	if h.encodedFor(es[0], &shape{key: "b", single: true}) != nil {
		t.Fatal("a non-matching shape got events")
	}
	// Other shapes get encodings of their own, each made once.
	s3 := &shape{key: "a", single: true}
	s4 := &shape{key: "a", end: "b"}
	c, d := h.encodedFor(es[0], s3), h.encodedFor(es[0], s4)
	if c == nil || d == nil || c == a || d == a || c == d {
		t.Fatal("different shapes shared an encoding")
	}
	for i, want := range []*encoded{a, c, d} {
		if got := h.encodedFor(es[0], []*shape{s2, s3, s4}[i]); got != want {
			t.Fatalf("shape %d: a second encodedFor did not return the first encoding", i)
		}
	}
	if got := promtest.ToFloat64(h.encodes); got != 3 {
		t.Fatalf("%v encodings of one entry in three shapes, want 3", got)
	}
	if _, ok := h.entries(2, 6); ok {
		t.Fatal("entries below the ring start reported as complete")
	}
}

// TestHubRingCountsCachedEncodings: the ring's byte bound counts what its
// entries cache to send (encodings), not only the events, so a ring whose
// watchers encoded every entry holds fewer of them; an evicted entry's
// cache leaves the count, and what a watcher still encodes for an evicted
// entry is not counted (the 6-node scaling benchmark's watch node held
// 116 MB of encodings besides its events, uncounted before).
func TestHubRingCountsCachedEncodings(t *testing.T) {
	size := evs(2, "a").Events[0].Size()
	src := &nopSource{}
	h := NewHub(HubConfig{RingBytes: 6 * size}, src)
	h.AddPartition(1, nil, nil, 1)
	for r := int64(2); r <= 7; r++ {
		h.Publish(1, evs(r, "a"), r)
	}
	es, ok := h.entries(2, 7)
	if !ok || len(es) != 6 {
		t.Fatalf("6 events of %d bytes in a ring of %d: entries %v (complete %v)", size, 6*size, revs(es), ok)
	}
	sh := &shape{key: "a", single: true}
	encoded := 0
	for _, e := range es {
		encoded += len(h.encodedFor(e, sh).b)
	}
	if got := h.cached.Load(); got != int64(encoded) {
		t.Fatalf("cached %d bytes, want the %d bytes encoded", got, encoded)
	}
	h.Publish(1, evs(8, "a"), 8)
	h.mu.Lock()
	ring, ringBytes, start := slices.Clone(h.mu.ring), h.mu.ringBytes, h.mu.ringStart
	h.mu.Unlock()
	// Events alone (7 of them) would evict only revision 2.
	if start <= 3 {
		t.Fatalf("ring starts at %d after a 7th event: the encodings were not counted", start)
	}
	var sum int64
	for _, e := range ring {
		sum += e.cached.Load()
	}
	if got := h.cached.Load(); got != sum || len(ring) > 1 && ringBytes+int(got) > 6*size {
		t.Fatalf("after eviction: cached %d (the ring's entries hold %d), events %d bytes, bound %d", got, sum, ringBytes, 6*size)
	}
	// A watcher that took an entry before it was evicted still gets its
	// encoding in another shape; it is not counted.
	before := h.cached.Load()
	if h.encodedFor(es[0], &shape{key: "a", end: "b"}) == nil {
		t.Fatal("no encoding for an evicted entry")
	}
	if got := h.cached.Load(); got != before {
		t.Fatalf("encoding an evicted entry changed cached from %d to %d", before, got)
	}
}

// TestHubCachedCountUnderConcurrentEviction: watchers encode entries while
// publishes evict them; once all is done the hub's count is exactly what
// the ring's entries hold (an encoding that raced its entry's eviction
// left nothing behind) and within the bound.
func TestHubCachedCountUnderConcurrentEviction(t *testing.T) {
	size := evs(2, "a").Events[0].Size()
	h := NewHub(HubConfig{RingBytes: 20 * size}, &nopSource{})
	h.AddPartition(1, nil, nil, 1)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			shapes := []*shape{{key: "a", single: true}, {key: "a", end: "b"}}
			for {
				select {
				case <-stop:
					return
				default:
				}
				f, _ := h.Frontier()
				es, _ := h.entries(max(2, f-30), f)
				for _, e := range es {
					h.encodedFor(e, shapes[(int(e.rev)+w)%2])
				}
			}
		}(w)
	}
	for r := int64(2); r <= 2000; r++ {
		h.Publish(1, evs(r, "a"), r)
	}
	close(stop)
	wg.Wait()
	h.Publish(1, evs(2001, "a"), 2001) // evicts what the last encodings added
	h.mu.Lock()
	ring, ringBytes := slices.Clone(h.mu.ring), h.mu.ringBytes
	h.mu.Unlock()
	var sum int64
	for _, e := range ring {
		sum += e.cached.Load()
	}
	if got := h.cached.Load(); got != sum || len(ring) > 1 && ringBytes+int(got) > 20*size {
		t.Fatalf("cached %d, the ring's %d entries hold %d; events %d bytes, bound %d", got, len(ring), sum, ringBytes, 20*size)
	}
}

// TestHubDropsResubscriptionDuplicates replays a partition's feed the way
// a resumed subscription does (again from the closed revision the hub
// holds, overlapping what it delivered) and checks every revision is
// released exactly once; Truncate skips a compacted gap.
func TestHubDropsResubscriptionDuplicates(t *testing.T) {
	src := &nopSource{}
	h := NewHub(HubConfig{}, src)
	h.AddPartition(1, nil, nil, 0)
	h.AddPartition(2, nil, nil, 0)
	h.SetHistoryStart(3)
	if got := h.ResumeFrom(1); got != 3 {
		t.Fatalf("ResumeFrom before any feed: %d, want the history start 3", got)
	}
	h.Publish(1, evs(4, "a"), 0)
	h.Publish(1, evs(6, "a"), 0)
	h.Publish(1, partition.RevEvents{}, 5)
	if got := h.ResumeFrom(1); got != 6 {
		t.Fatalf("ResumeFrom: %d, want 6", got)
	}
	// The resumed subscription delivers 4 (below closed), 6 (held) and 7.
	h.Publish(1, evs(4, "a"), 0)
	h.Publish(1, evs(6, "a"), 0)
	h.Publish(1, evs(7, "a"), 0)
	h.Publish(1, partition.RevEvents{}, 9)
	h.Publish(2, evs(8, "m"), 9)
	es, ok := h.entries(3, 9)
	if !ok || len(es) != 4 || es[0].rev != 4 || es[1].rev != 6 || es[2].rev != 7 || es[3].rev != 8 {
		t.Fatalf("released %v, want [4 6 7 8]", revs(es))
	}
	// Merged (brain_watch_events_merged_total) counts the events taken,
	// not the duplicates.
	if got := h.Merged(); got != 4 {
		t.Fatalf("Merged: %d, want the 4 events taken (not the 2 duplicates)", got)
	}
	// Partition 2's events below 20 were compacted while its feed was down.
	h.Publish(1, partition.RevEvents{}, 30)
	h.Truncate(2, 20)
	if f, _ := h.Frontier(); f != 19 {
		t.Fatalf("frontier after Truncate: %d, want 19", f)
	}
	if _, ok := h.entries(10, 19); ok {
		t.Fatal("the ring claims revisions below the truncation")
	}
	if got := h.ResumeFrom(2); got != 20 {
		t.Fatalf("ResumeFrom after Truncate: %d, want 20", got)
	}
}

// TestHubStartsAboveEveryRestoredClosed: a restarted node's replicas
// recover different closed revisions, and a partition's feed resumes
// above its own, so its events at or below it are only in its event log.
// The ring must start above every partition's closed revision, even when
// the history start the server passes (the TSO replica's recovered
// revision) lags them and the partition added first, which sets the
// frontier, is the one furthest behind. Before the fix the ring claimed
// 11-14 here, so a watch resumed there was served partition 1's events
// and never partition 2's (chaos seed 514085: "progress notification at
// 24536 after 16897 events, but 16901 events at or below it exist").
func TestHubStartsAboveEveryRestoredClosed(t *testing.T) {
	src := &nopSource{}
	h := NewHub(HubConfig{}, src)
	h.SetSource(src)
	h.AddPartition(1, []byte("a"), []byte("m"), 10) // first: the frontier is 10
	h.AddPartition(2, []byte("m"), nil, 14)         // applied up to 14 before the stop
	h.SetHistoryStart(7)                            // a lagging TSO replica's revision
	if _, ok := h.entries(11, 14); ok {
		t.Fatal("the ring claims revisions 11-14, but partition 2's events there are only in its event log")
	}
	if got := h.ResumeFrom(2); got != 15 {
		t.Fatalf("partition 2 resumes from %d, want 15 (its events up to 14 are applied)", got)
	}
	if got := h.ResumeFrom(1); got != 15 {
		t.Fatalf("partition 1 resumes from %d, want the ring's start 15", got)
	}
	// The feeds publish from where they resume.
	h.Publish(1, evs(15, "b"), 0)
	h.Publish(1, partition.RevEvents{}, 17)
	h.Publish(2, evs(16, "n"), 17)
	if es, ok := h.entries(11, 17); ok {
		t.Fatalf("the ring claims revisions 11-17 with %v, but partition 2's events at 11-14 are only in its event log", revs(es))
	}
	if es, ok := h.entries(15, 17); !ok || !slices.Equal(revs(es), []int64{15, 16}) {
		t.Fatalf("released %v (ok %v), want [15 16]", revs(es), ok)
	}

	// The other order: the partition furthest ahead first.
	h = NewHub(HubConfig{}, src)
	h.SetSource(src)
	h.AddPartition(2, []byte("m"), nil, 14)
	h.AddPartition(1, []byte("a"), []byte("m"), 10)
	h.SetHistoryStart(7)
	if _, ok := h.entries(11, 14); ok {
		t.Fatal("the ring claims revisions 11-14 it never had")
	}
	if got := h.ResumeFrom(1); got != 15 {
		t.Fatalf("partition 1 resumes from %d, want 15", got)
	}
}

// TestHubAsksAgainWhileEventsWait: a close request can be lost (the leader
// it reached loses leadership before closing), so while an event waits for
// the frontier the hub asks again every AskAgainAfter, for the highest
// revision it holds; once the frontier passes every held event, and after
// Stop, it stops asking.
func TestHubAsksAgainWhileEventsWait(t *testing.T) {
	src := &nopSource{}
	h := NewHub(HubConfig{AskAgainAfter: 20 * time.Millisecond}, src)
	h.AddPartition(1, nil, nil, 1)
	h.AddPartition(2, nil, nil, 1)
	h.Publish(1, evs(5, "a"), 5)
	h.Publish(1, evs(7, "a"), 7)
	deadline := time.Now().Add(10 * time.Second)
	for len(src.asked()) < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("asked to close %v while partition 2 held revisions 5 and 7 back for 10s; want the request repeated", src.asked())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := src.asked(); got[0] != 5 || got[1] != 7 || got[len(got)-1] != 7 {
		t.Fatalf("asked to close %v, want 5, then 7 again and again", got)
	}
	h.Publish(2, partition.RevEvents{}, 7)
	if es, _ := h.entries(2, 10); len(es) != 2 {
		t.Fatalf("released %v, want [5 7]", revs(es))
	}
	n := len(src.asked())
	time.Sleep(100 * time.Millisecond)
	if got := src.asked(); len(got) > n+1 {
		t.Fatalf("asked to close %v after the frontier passed every held event", got[n:])
	}

	h.Publish(1, evs(9, "a"), 9)
	h.Stop()
	n = len(src.asked())
	h.Publish(1, evs(11, "a"), 11)
	time.Sleep(100 * time.Millisecond)
	if got := src.asked(); len(got) != n {
		t.Fatalf("asked to close %v after Stop", got[n:])
	}
}

// TestHubAsksToCloseWhatAFeedSkipped: a feed that resumes after idling
// skips to its partition's closed revision (Truncate), leaving what it
// skipped to the event logs, which watchers read only up to the frontier;
// the hub asks the other partitions to close it, at once and again while
// it waits, as it does for a held event.
func TestHubAsksToCloseWhatAFeedSkipped(t *testing.T) {
	src := &nopSource{}
	h := NewHub(HubConfig{AskAgainAfter: 20 * time.Millisecond}, src)
	h.AddPartition(1, nil, nil, 1)
	h.AddPartition(2, nil, nil, 1)
	h.watchAdded([]byte("a"), []byte{})
	h.Truncate(1, 5)
	if got := src.asked(); len(got) != 1 || got[0] != 4 {
		t.Fatalf("after partition 1's feed skipped to 5, asked to close %v, want [4]", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(src.asked()) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("asked to close %v while partition 2 held the frontier below 4 for 10s; want the request repeated", src.asked())
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.Publish(2, partition.RevEvents{}, 4)
	if f, _ := h.Frontier(); f != 4 {
		t.Fatalf("frontier %d, want 4", f)
	}
	n := len(src.asked())
	time.Sleep(100 * time.Millisecond)
	if got := src.asked(); len(got) > n+1 {
		t.Fatalf("asked to close %v after the frontier passed what was skipped", got[n:])
	}
	// A skip at or below the frontier owes nothing.
	h.Truncate(2, 3)
	time.Sleep(100 * time.Millisecond)
	if got := src.asked(); len(got) > n+1 {
		t.Fatalf("asked to close %v for a skip below the frontier", got[n:])
	}
}
