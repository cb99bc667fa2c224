package etcdcompat

import (
	"slices"
	"testing"
	"time"

	"github.com/brainkv/brain/partition"
)

// forgetNow drops a range's demand at once, as its idle timer would.
func forgetNow(h *Hub, r keyRange) {
	h.mu.Lock()
	d := h.mu.watched[r]
	h.mu.Unlock()
	if d != nil {
		h.forget(r, d)
	}
}

func wanted(h *Hub, pid uint64) bool {
	w, _ := h.Wanted(pid)
	return w
}

// TestFeedDemand: every partition is merged at start and paused after the
// idle time without watchers (not before); a watch resumes at once the
// partitions its range meets and only those; a partition stays merged for
// the idle time after its last watch closed, and for good while one is
// open or reopened within that time.
func TestFeedDemand(t *testing.T) {
	h := NewHub(HubConfig{IdleFeedsAfter: 100 * time.Millisecond}, &nopSource{})
	h.AddPartition(1, []byte("a"), []byte("m"), 1)
	h.AddPartition(2, []byte("m"), nil, 1)
	w, changed := h.Wanted(1)
	if !w || !wanted(h, 2) {
		t.Fatal("feeds not wanted at start")
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("feeds still wanted after the idle time without watchers")
	}
	if wanted(h, 1) || wanted(h, 2) {
		t.Fatal("changed, but still wanted")
	}
	_, changed = h.Wanted(1)
	h.watchAdded([]byte("b"), []byte("c"))
	select {
	case <-changed:
	default:
		t.Fatal("a watch did not change the demand")
	}
	if !wanted(h, 1) || wanted(h, 2) {
		t.Fatalf("watch on [b, c): wanted %v %v, want true false", wanted(h, 1), wanted(h, 2))
	}
	h.watchAdded([]byte("m"), nil) // one key, the first of partition 2
	if !wanted(h, 2) {
		t.Fatal("a watch on partition 2's first key did not resume it")
	}
	h.watchRemoved([]byte("m"), nil)
	time.Sleep(300 * time.Millisecond)
	if !wanted(h, 1) {
		t.Fatal("partition 1 paused with a watch open")
	}
	if wanted(h, 2) {
		t.Fatal("partition 2 still merged after its only watch closed and the idle time passed")
	}
	h.watchRemoved([]byte("b"), []byte("c"))
	if !wanted(h, 1) {
		t.Fatal("partition 1 paused at once when its last watch closed")
	}
	h.watchAdded([]byte("b"), []byte("c")) // reopened within the idle time
	time.Sleep(300 * time.Millisecond)
	if !wanted(h, 1) {
		t.Fatal("partition 1 paused although a watch reopened within the idle time")
	}

	never := NewHub(HubConfig{IdleFeedsAfter: -1}, &nopSource{})
	never.AddPartition(1, []byte("a"), []byte("m"), 1)
	never.AddPartition(2, []byte("m"), nil, 1)
	never.watchAdded([]byte("b"), []byte("c"))
	never.watchRemoved([]byte("b"), []byte("c"))
	forgetNow(never, everything)
	if !wanted(never, 1) || !wanted(never, 2) {
		t.Fatal("negative idle time: a feed paused")
	}
}

// TestPausedPartitionResumesWithoutGap: the frontier stops waiting for a
// paused partition; events its feed still delivers are kept above the
// frontier and dropped at or below it; a watch that resumes it holds the
// frontier until the partition's feed catches up, and the ring claims no
// revision the partition's events may be missing from (a watcher reads
// those from the event logs).
func TestPausedPartitionResumesWithoutGap(t *testing.T) {
	src := &nopSource{}
	h := NewHub(HubConfig{IdleFeedsAfter: time.Hour}, src)
	h.SetSource(src)
	h.AddPartition(1, []byte("a"), []byte("m"), 1)
	h.AddPartition(2, []byte("m"), nil, 1)
	h.watchAdded([]byte("a"), []byte("m"))
	forgetNow(h, everything)
	if !wanted(h, 1) || wanted(h, 2) {
		t.Fatalf("watch on [a, m): wanted %v %v, want true false", wanted(h, 1), wanted(h, 2))
	}
	if h.isPaused(1) || !h.isPaused(2) {
		t.Fatal("close requests would not skip exactly the paused partition")
	}
	h.Publish(1, evs(2, "b"), 2)
	h.Publish(2, evs(3, "n"), 3) // its feed has not stopped yet: above the frontier, kept
	h.Publish(1, evs(5, "c"), 6)
	if f, _ := h.Frontier(); f != 6 {
		t.Fatalf("frontier %d, want 6 (partition 2, closed at 3, is paused)", f)
	}
	h.Publish(2, evs(4, "o"), 4) // at or below the frontier: dropped
	h.Publish(2, evs(7, "p"), 7)
	h.Publish(1, partition.RevEvents{}, 8)
	if es, ok := h.entries(2, 8); !ok || !slices.Equal(revs(es), []int64{2, 3, 5, 7}) {
		t.Fatalf("released %v (ok %v), want [2 3 5 7]", revs(es), ok)
	}

	h.watchAdded([]byte("m"), []byte{})
	if !wanted(h, 2) || h.isPaused(2) {
		t.Fatal("a watch on [m, ...) did not resume partition 2")
	}
	if _, ok := h.entries(4, 8); ok {
		t.Fatal("after partition 2 resumed, the ring still claims revisions up to the frontier (its event 4 is not there)")
	}
	h.Publish(1, evs(10, "d"), 12)
	if f, _ := h.Frontier(); f != 8 {
		t.Fatalf("frontier %d, want 8: a resumed partition holds it until its feed reports", f)
	}
	h.Publish(2, evs(9, "q"), 0)
	h.Publish(2, partition.RevEvents{}, 11)
	es, ok := h.entries(9, 11)
	if f, _ := h.Frontier(); f != 11 || !ok || !slices.Equal(revs(es), []int64{9, 10}) {
		t.Fatalf("frontier %d, released %v (ok %v); want 11, [9 10]", f, revs(es), ok)
	}
}

// TestSplitKeepsParentMerged: a partition keeps the span it had when the
// hub learned it, so a watch on a child's keys keeps the parent merged
// (its feed may still owe events of those keys from before the split); a
// child no watch meets is paused.
func TestSplitKeepsParentMerged(t *testing.T) {
	h := NewHub(HubConfig{IdleFeedsAfter: time.Hour}, &nopSource{})
	h.AddPartition(1, []byte("a"), nil, 1)
	h.watchAdded([]byte("m"), []byte("n"))
	forgetNow(h, everything)
	h.AddPartition(2, []byte("k"), nil, 5) // split off partition 1 at k
	if !wanted(h, 1) || !wanted(h, 2) {
		t.Fatalf("watch on [m, n) after a split at k: wanted %v %v, want both", wanted(h, 1), wanted(h, 2))
	}
	h.AddPartition(2, []byte("x"), nil, 6) // a known partition keeps its span
	h.watchAdded([]byte("b"), []byte("c"))
	h.watchRemoved([]byte("m"), []byte("n"))
	forgetNow(h, rangeOf([]byte("m"), []byte("n")))
	if !wanted(h, 1) || wanted(h, 2) {
		t.Fatalf("watch on [b, c) only: wanted %v %v, want true false", wanted(h, 1), wanted(h, 2))
	}
}

// TestAllPausedReleasesHeld: with every partition paused nothing waits
// for the frontier - the events paused feeds delivered before stopping
// are released - so the hub stops asking partitions to close.
func TestAllPausedReleasesHeld(t *testing.T) {
	src := &nopSource{}
	h := NewHub(HubConfig{IdleFeedsAfter: time.Hour}, src)
	h.SetSource(src)
	h.AddPartition(1, []byte("a"), []byte("m"), 1)
	h.AddPartition(2, []byte("m"), nil, 1)
	h.Publish(1, evs(3, "b"), 0)
	forgetNow(h, everything)
	h.mu.Lock()
	want, _ := h.waitingLocked()
	h.mu.Unlock()
	if want != 0 {
		t.Fatalf("every partition paused, yet the hub waits for the frontier to reach %d", want)
	}
}
