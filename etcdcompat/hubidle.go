package etcdcompat

import (
	"maps"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Feed demand: the hub merges only the partitions its watches cover.
//
// Merging a partition's events costs the node that does it for every write
// to the partition: a feed stream from another node when it has no replica
// here, the hub's heap and ring, and the close requests that move the
// frontier. If every node merged every partition, that cost per write would
// grow with the cluster size and cap write scaling; kube-apiserver watches
// each resource once per apiserver, spread over the endpoints, so a node
// needs only the partitions under the prefixes watched through it.
//
// So a partition whose key span meets no watched range - and met none
// within IdleFeedsAfter - is paused: the frontier no longer waits for it
// and its feed stops (Wanted). Events its feed still delivers before it
// stops are taken if they are above the frontier and dropped otherwise:
// no watch covers them, and the ring's start is raised past them when the
// partition resumes.
//
// A watch that opens on a paused partition's span resumes it before the
// watch is served (watchAdded, under the hub's lock): the partition counts
// as closed at the frontier, the ring starts above the frontier, so
// whatever the partition applied while paused is read from the event logs
// by a watch that needs it, and its feed resumes at its current closed
// revision (Truncate). The frontier waits for the partition again from
// that moment, so no event of it can be passed over.
//
// A partition's span is the one the hub first learned for it: from the
// routing table at startup, or from the split record its parent's feed
// delivered. It does not shrink when the partition splits again: the
// parent's feed may still owe events of the child's keys from before the
// split, and a watch on the child's keys keeps the parent merged, which is
// also how the hub learns of children split off while their parent was
// paused (the parent's resumed feed carries the split records before any
// of its events). A hub starts with every partition merged (a node's
// first watchers, kube-apiserver's, come right after it starts; the whole
// key space counts as watched until IdleFeedsAfter); with IdleFeedsAfter
// < 0 no partition is ever paused.

// keyRange is a watched range: [key, end), end "" unbounded.
type keyRange struct{ key, end string }

// everything is the whole key space.
var everything = keyRange{}

// rangeOf is a watch's range (end nil: one key; empty: unbounded).
func rangeOf(key, end []byte) keyRange {
	if end == nil {
		return keyRange{key: string(key), end: string(key) + "\x00"}
	}
	return keyRange{key: string(key), end: string(end)}
}

// demandView is a snapshot of which partitions are paused.
type demandView struct {
	paused  map[uint64]bool
	merging bool // some partition is merged
}

// overlaps reports whether r and o share a key.
func (r keyRange) overlaps(o keyRange) bool {
	return (r.end == "" || o.key < r.end) && (o.end == "" || r.key < o.end)
}

// rangeDemand is one watched range: its open watches, and the timer that
// forgets it IdleFeedsAfter after the last one closed.
type rangeDemand struct {
	watchers int
	timer    *time.Timer
}

// demandGauges export the demand.
type demandGauges struct {
	wanted prometheus.Gauge // 1 while some partition is merged
	paused prometheus.Gauge // partitions not merged
}

func newDemandGauges() demandGauges {
	return demandGauges{
		wanted: prometheus.NewGauge(prometheus.GaugeOpts{Name: "brain_watch_feeds_wanted", Help: "1 while this node merges some partition's events for its watchers; 0 when no watch was open on it for --watch-feeds-idle-after."}),
		paused: prometheus.NewGauge(prometheus.GaugeOpts{Name: "brain_watch_feeds_paused", Help: "Partitions whose events this node does not merge: no watch on it covered them for --watch-feeds-idle-after."}),
	}
}

// initDemandLocked starts the hub with the whole key space watched until
// IdleFeedsAfter.
func (h *Hub) initDemandLocked() {
	h.mu.spans = make(map[uint64]keyRange)
	h.mu.watched = make(map[keyRange]*rangeDemand)
	h.mu.paused = make(map[uint64]bool)
	h.mu.demandChanged = make(chan struct{})
	h.gauges.wanted.Set(1)
	d := &rangeDemand{}
	h.mu.watched[everything] = d
	if h.cfg.IdleFeedsAfter > 0 {
		d.timer = time.AfterFunc(h.cfg.IdleFeedsAfter, func() { h.forget(everything, d) })
	}
}

// watchAdded counts an open watch on [key, end) (end nil: one key; empty:
// unbounded) and resumes the partitions it covers, before the watch is
// served.
func (h *Hub) watchAdded(key, end []byte) {
	h.watchers.Inc()
	r := rangeOf(key, end)
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.mu.watched[r]
	if d == nil {
		d = &rangeDemand{}
		h.mu.watched[r] = d
	}
	d.watchers++
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	h.recomputeLocked()
}

// watchRemoved counts a closed watch on [key, end); its range stays
// watched for IdleFeedsAfter (a watch is often reopened at once).
func (h *Hub) watchRemoved(key, end []byte) {
	h.watchers.Dec()
	r := rangeOf(key, end)
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.mu.watched[r]
	if d == nil {
		return
	}
	d.watchers--
	if d.watchers == 0 && d.timer == nil && h.cfg.IdleFeedsAfter > 0 {
		d.timer = time.AfterFunc(h.cfg.IdleFeedsAfter, func() { h.forget(r, d) })
	}
}

// forget drops a range without watches after its idle time.
func (h *Hub) forget(r keyRange, d *rangeDemand) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.watched[r] != d || d.watchers > 0 {
		return // reopened (a timer Stop can miss the firing)
	}
	delete(h.mu.watched, r)
	h.recomputeLocked()
}

// wantedLocked reports whether partition pid is to be merged.
func (h *Hub) wantedLocked(pid uint64) bool {
	if h.cfg.IdleFeedsAfter < 0 {
		return true
	}
	span, ok := h.mu.spans[pid]
	if !ok {
		return true
	}
	for r := range h.mu.watched {
		if r.overlaps(span) {
			return true
		}
	}
	return false
}

// recomputeLocked pauses the partitions no watched range covers and
// resumes the ones one does (see the comment at the top).
func (h *Hub) recomputeLocked() {
	changed := false
	for pid, c := range h.mu.closed {
		want, paused := h.wantedLocked(pid), h.mu.paused[pid]
		switch {
		case want && paused:
			delete(h.mu.paused, pid)
			if c < h.mu.frontier {
				h.mu.closed[pid] = h.mu.frontier
				h.forgetSeenLocked(pid)
			}
			h.mu.ringStart = max(h.mu.ringStart, h.mu.frontier+1)
			changed = true
		case !want && !paused:
			h.mu.paused[pid] = true
			changed = true
		}
	}
	if !changed {
		return
	}
	v := &demandView{paused: maps.Clone(h.mu.paused), merging: len(h.mu.paused) < len(h.mu.closed)}
	h.view.Store(v)
	h.gauges.paused.Set(float64(len(v.paused)))
	if v.merging {
		h.gauges.wanted.Set(1)
	} else {
		h.gauges.wanted.Set(0)
	}
	close(h.mu.demandChanged)
	h.mu.demandChanged = make(chan struct{})
	h.advanceLocked()
}

// isPaused reports whether partition pid is paused, without the hub's
// lock: close requests for the frontier skip paused partitions.
func (h *Hub) isPaused(pid uint64) bool { return h.view.Load().paused[pid] }

// Wanted reports whether partition pid's feed into the hub should run,
// and returns a channel closed when the hub's demand next changes.
func (h *Hub) Wanted(pid uint64) (bool, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.mu.paused[pid], h.mu.demandChanged
}
