package etcdcompat

import (
	"bytes"
	"container/heap"
	"encoding/binary"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/brainkv/brain/internal/bugs"
	"github.com/brainkv/brain/internal/invariant"
	"github.com/brainkv/brain/partition"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// EventSource is what the hub needs from the store.
type EventSource interface {
	// RequestCloseSoon asks every partition for which skip (if not nil)
	// is false to close revision rev, for the watch frontier: partitions
	// whose leaders close it by themselves need not be asked.
	RequestCloseSoon(rev int64, skip func(id uint64) bool)
	// CurrentRevision returns the TSO's current revision.
	CurrentRevision() int64
	// CompactRevision returns the compaction revision.
	CompactRevision() int64
	// Events reads the event logs; see kvapi.Store.Events.
	Events(from, to int64, key, end []byte, maxRevs int) ([]partition.RevEvents, int64, error)
	// PrevValue loads the value of key's version at rev.
	PrevValue(key []byte, rev int64) ([]byte, error)
}

// HubConfig configures a Hub.
type HubConfig struct {
	// RingEvents and RingBytes bound the in-memory history of released
	// events; older events are read from the event logs. RingBytes counts
	// the events and what the ring caches for them to send (their
	// encodings per watch shape, prev_kv values loaded for them).
	// Defaults 100000 events and 256 MiB.
	RingEvents int
	RingBytes  int
	// IdleFeedsAfter is how long the hub keeps merging a partition no
	// watch covers any more (see hubidle.go). 0 means 30s; negative,
	// forever (every partition is always merged).
	IdleFeedsAfter time.Duration
	// AskAgainAfter is how long an event (or revisions a feed skipped)
	// may wait for the frontier before the hub asks the partitions to
	// close again; it asks again at that interval while it waits. 0 means
	// 1s.
	AskAgainAfter time.Duration
	Registerer    prometheus.Registerer
	// Logger receives the hub's warnings; nil discards them.
	Logger *slog.Logger
}

// Hub merges the partitions' feeds into one stream totally ordered by
// revision.
//
// Partitions publish events as they apply them, which is not revision order
// (neither across partitions nor, under concurrency, within one). The hub
// holds events in a heap until the frontier - the lowest closed revision of
// all partitions - passes them: then no event at or below the frontier can
// still arrive, and events up to it are released, in revision order, into a
// ring. Watchers read the ring from their own cursor; a watcher whose
// cursor fell out of the ring reads the event logs instead, so a slow
// watcher costs storage reads, never unbounded memory.
//
// Each released revision caches its events encoded per watch shape (range,
// filters, prev_kv), so N identical watches encode an event once (KEP-1152).
type Hub struct {
	cfg    HubConfig
	src    EventSource
	gauges demandGauges
	// view is mu's demand for readers without the lock (askToClose,
	// isPaused); replaced, never modified, when the demand changes.
	view atomic.Pointer[demandView]

	mu struct {
		sync.Mutex
		closed map[uint64]int64 // per partition; protected by mu
		// paused holds the partitions not merged: no watched range covers
		// them (hubidle.go); the frontier does not wait for them.
		paused map[uint64]bool // protected by mu
		// spans holds each partition's key span as the hub first learned
		// it (hubidle.go); protected by mu.
		spans map[uint64]keyRange
		// watched holds the ranges of the open watches, and of closed
		// ones for IdleFeedsAfter; protected by mu.
		watched map[keyRange]*rangeDemand
		// demandChanged is closed when paused changes; protected by mu.
		demandChanged chan struct{}
		// seen holds, per partition, the revisions above its closed
		// revision already taken (to drop duplicates); protected by mu.
		seen       map[uint64]map[int64]struct{}
		frontier   int64     // protected by mu
		pending    entryHeap // rev > frontier; protected by mu
		maxPending int64     // protected by mu
		lastPoke   int64     // protected by mu
		// skipped is the highest revision a feed skipped to the event
		// logs (Truncate) that the frontier has yet to pass, since
		// skippedAt: watchers wait for the frontier to read it there.
		skipped    int64     // protected by mu
		skippedAt  time.Time // protected by mu
		asking     bool      // askAgain is scheduled; protected by mu
		stopped    bool      // Stop was called; protected by mu
		ring       []*entry  // released, ascending; protected by mu
		ringStart  int64     // every released event >= ringStart is in ring
		ringEvents int
		ringBytes  int           // the ring's events' sizes (cached counts the rest)
		changed    chan struct{} // closed when frontier advances
	}

	lag      prometheus.Histogram
	watchers prometheus.Gauge
	catchups prometheus.Counter
	// catchupRetries counts event-log reads that failed for want of a
	// leader (or a replica) and are retried.
	catchupRetries prometheus.Counter
	// asksAgain counts close requests repeated for events held too long.
	asksAgain prometheus.Counter
	// slowCancels counts watchers canceled for falling behind compaction.
	slowCancels prometheus.Counter
	encodes     prometheus.Counter
	frames      prometheus.Counter
	// duplicates counts events dropped because a resumed or starting
	// feed subscription delivered them again.
	duplicates prometheus.Counter
	// pausedDrops counts events of paused partitions dropped below the
	// frontier.
	pausedDrops prometheus.Counter
	// prevUnreadable counts prev_kv values the hub could not load (the
	// event goes out without its prev_kv).
	prevUnreadable prometheus.Counter
	// merged counts the events the hub took into its merge (Merged).
	merged atomic.Int64
	// cached is the bytes the ring's entries cache to send (encodings,
	// loaded prev_kv values), counted against RingBytes: an entry adds
	// what it caches while in the ring, and eviction takes it off.
	cached atomic.Int64
}

// entry is one revision's events.
type entry struct {
	rev    int64
	events []*mvccpb.Event
	at     time.Time
	size   int

	// prevMissing: the events' PrevKv lack values; withPrev holds copies
	// with them, loaded the first time a prev_kv shape is encoded.
	prevMissing bool
	mu          sync.Mutex
	withPrev    []*mvccpb.Event // protected by mu
	// cached is what this entry added to Hub.cached, or -1 once it left
	// the ring: what it caches from then on is not counted (a watcher
	// may still be sending it). An atomic, not under mu: eviction runs
	// under the hub's lock, and an encoder may hold mu through storage
	// reads (withPrevValues).
	cached atomic.Int64
	// enc1 is the encoding for shape1, the first shape asked for: most
	// entries are sent in one shape (an apiserver watches each resource
	// prefix once), which needs no map. enc holds the other shapes'.
	shape1 shape              // protected by mu
	enc1   *encoded           // protected by mu
	enc    map[shape]*encoded // protected by mu
}

// shape identifies watches that receive identical event bytes.
type shape struct {
	key, end string
	single   bool // end == nil: one key
	prevKV   bool
	noPut    bool
	noDelete bool
}

func (s *shape) matches(ev *mvccpb.Event) bool {
	if s.noPut && ev.Type == mvccpb.PUT || s.noDelete && ev.Type == mvccpb.DELETE {
		return false
	}
	k := ev.Kv.Key
	if s.single {
		return string(k) == s.key
	}
	return bytes.Compare(k, []byte(s.key)) >= 0 && (s.end == "" || bytes.Compare(k, []byte(s.end)) < 0)
}

// encoded is the events of one revision matching a shape, each as a
// WatchResponse.events field (tag, length, Event); ends[i] is where event i
// ends, for fragmentation.
type encoded struct {
	b    []byte
	ends []int
}

// NewHub creates a hub.
func NewHub(cfg HubConfig, src EventSource) *Hub {
	if cfg.RingEvents == 0 {
		cfg.RingEvents = 100000
	}
	if cfg.RingBytes == 0 {
		cfg.RingBytes = 256 << 20
	}
	if cfg.IdleFeedsAfter == 0 {
		cfg.IdleFeedsAfter = 30 * time.Second
	}
	if cfg.AskAgainAfter == 0 {
		cfg.AskAgainAfter = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Hub{cfg: cfg, src: src, gauges: newDemandGauges()}
	h.view.Store(&demandView{merging: true})
	h.mu.closed = make(map[uint64]int64)
	h.mu.Lock()
	// Under mu: a short IdleFeedsAfter can fire before initDemandLocked
	// returns.
	h.initDemandLocked()
	h.mu.Unlock()
	h.mu.seen = make(map[uint64]map[int64]struct{})
	h.mu.changed = make(chan struct{})
	h.lag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "brain_watch_delivery_lag_seconds", Help: "Time from an event's apply to its first send to a watcher.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	})
	h.watchers = prometheus.NewGauge(prometheus.GaugeOpts{Name: "brain_watchers", Help: "Open watches."})
	h.slowCancels = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_slow_cancellations_total", Help: "Watches canceled (with the compaction revision, as etcd does) because they were still catching up when compaction removed the events they had yet to read."})
	h.catchups = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_storage_catchups_total", Help: "Reads of the event logs by watchers behind the in-memory ring."})
	h.catchupRetries = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_storage_catchup_retries_total", Help: "Event-log reads of watchers behind the ring that failed because a partition had no reachable leader or replica; the watch stays open and reads again."})
	h.asksAgain = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_close_requests_repeated_total", Help: "Close requests the watch hub sent again because an event, or revisions a feed skipped, had waited for the watch frontier longer than a second (the first request was lost with a leader change, or a partition closes slowly)."})
	h.encodes = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_event_encodes_total", Help: "Revisions encoded for a watch shape (once per revision and shape, shared by identical watches)."})
	h.frames = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_responses_total", Help: "Watch responses sent."})
	h.duplicates = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_feed_duplicates_total", Help: "Events a partition feed delivered twice (when a subscription starts or resumes) and the hub dropped."})
	h.pausedDrops = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_feed_paused_drops_total", Help: "Events of partitions this node had just stopped merging (no watch on it covers them) that its feed delivered before it stopped, below the watch frontier, and the hub dropped."})
	h.prevUnreadable = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_prev_values_unreadable_total", Help: "prev_kv values of watch events the hub could not load; the event was sent without its prev_kv."})
	if cfg.Registerer != nil {
		merged := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "brain_watch_events_merged_total", Help: "Events the watch hub took into its merge (not counting duplicates and events of paused partitions): what the node's watches cost it grows with their rate."},
			func() float64 { return float64(h.Merged()) })
		cfg.Registerer.MustRegister(h.prevUnreadable, h.lag, h.watchers, h.gauges.wanted, h.gauges.paused, h.catchups, h.catchupRetries, h.asksAgain, h.slowCancels, h.encodes, h.frames, h.duplicates, h.pausedDrops, merged, newHubCollector(h))
	}
	return h
}

// AddPartition registers a partition, its key span [start, end) (end
// empty: unbounded) and a closed revision it has certainly reached (0
// when unknown, for a partition fed from another node). Call for every
// partition before any publishes.
//
// A partition split off another is added (by its parent's feeder) before
// the parent's closed revision passes the split, so at or above the
// frontier. One added below the frontier - at startup, or after feeds
// idled, when no watcher was served past it - counts as closed at the
// frontier, and the events below are read from the event logs. Adding a
// known partition only raises its closed revision. A new partition is
// merged only if a watched range covers it (hubidle.go).
func (h *Hub) AddPartition(id uint64, start, end []byte, closed int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.mu.spans[id]; !ok {
		h.mu.spans[id] = keyRange{key: string(start), end: string(end)}
	}
	if c, ok := h.mu.closed[id]; ok {
		if closed > c {
			h.mu.closed[id] = closed
			h.advanceLocked()
		}
		return
	}
	if len(h.mu.closed) == 0 {
		h.mu.closed[id] = closed
		h.mu.frontier = closed
		h.mu.ringStart = max(h.mu.ringStart, closed+1)
		h.recomputeLocked()
		return
	}
	if closed < h.mu.frontier {
		closed = h.mu.frontier
		h.mu.ringStart = max(h.mu.ringStart, h.mu.frontier+1)
	}
	h.mu.closed[id] = closed
	h.recomputeLocked()
}

// SetHistoryStart tells the hub that every event with a revision >= rev
// will be published to it (the partitions' feed subscriptions start
// there); events below rev may already be applied (for instance before a
// restart) and are read from the event logs. Call it after the startup's
// AddPartition calls: the ring also starts above every partition's closed
// revision.
//
// A restarted node's replicas recover different closed revisions (each
// applied what it had before the node stopped), and the first partition
// added sets the frontier; a partition added above it keeps its own
// closed revision and its feed resumes above that, so its events between
// the frontier and its closed revision are in its event log and never
// published here. rev (the TSO replica's recovered revision) is usually
// above them all, but not when that replica lagged the partitions' when
// the node stopped: a watch resumed in that window was served from the
// ring without those events (chaos seed 514085).
func (h *Hub) SetHistoryStart(rev int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.mu.closed {
		rev = max(rev, c+1)
	}
	h.mu.ringStart = max(h.mu.ringStart, rev)
}

// minClosedLocked returns the lowest closed revision of the merged
// partitions. With none merged no watch covers anything, and what the hub
// holds (the events paused feeds delivered before they stopped, revisions
// skipped) is released, so nothing waits for a frontier that cannot move.
func (h *Hub) minClosedLocked() int64 {
	first := true
	var m int64
	for pid, c := range h.mu.closed {
		if h.mu.paused[pid] {
			continue
		}
		if first || c < m {
			m, first = c, false
		}
	}
	if first && len(h.mu.closed) > 0 {
		return max(h.mu.frontier, h.mu.maxPending, h.mu.skipped)
	}
	return m
}

// Publish implements partition.Feed: it takes one partition's events and
// closed revision from its feed subscription. Subscriptions overlap when
// they start or resume, so a revision may arrive twice; the hub keeps the
// first and drops an event at or below the partition's closed revision
// (it had it) or one it holds already, and a paused partition's event at
// or below the frontier (no watch covers it; see hubidle.go).
func (h *Hub) Publish(pid uint64, evs partition.RevEvents, closed int64) {
	h.mu.Lock()
	if evs.Rev != 0 {
		seen := h.mu.seen[pid]
		_, dup := seen[evs.Rev]
		switch {
		case h.mu.paused[pid] && evs.Rev <= h.mu.frontier:
			h.pausedDrops.Inc()
		case dup || evs.Rev <= h.mu.closed[pid] || bugs.On("skip-watch-event") && evs.Rev%50 == 0:
			h.duplicates.Inc()
		default:
			// The frontier is at most the partition's closed revision, so
			// a new event is above it.
			invariant.Check(evs.Rev > h.mu.frontier,
				"partition %d published revision %d at or below the watch frontier %d", pid, evs.Rev, h.mu.frontier)
			if seen == nil {
				seen = make(map[int64]struct{})
				h.mu.seen[pid] = seen
			}
			seen[evs.Rev] = struct{}{}
			e := &entry{rev: evs.Rev, events: evs.Events, at: time.Now(), prevMissing: evs.PrevValuesMissing}
			for _, ev := range evs.Events {
				e.size += ev.Size()
			}
			heap.Push(&h.mu.pending, e)
			h.mu.maxPending = max(h.mu.maxPending, evs.Rev)
			h.merged.Add(int64(len(evs.Events)))
		}
	}
	if closed > h.mu.closed[pid] {
		h.mu.closed[pid] = closed
		h.forgetSeenLocked(pid)
	}
	h.advanceLocked()
	poke := h.pokeLocked()
	h.mu.Unlock()
	h.askToClose(poke, false)
}

// Merged returns how many events the hub has taken into its merge (not
// counting duplicates and the dropped events of paused partitions): what
// this node's watches cost it grows with their rate.
func (h *Hub) Merged() int64 { return h.merged.Load() }

// forgetSeenLocked drops the revisions of partition pid at or below its
// closed revision from seen (they are dropped by that alone).
func (h *Hub) forgetSeenLocked(pid uint64) {
	c := h.mu.closed[pid]
	for r := range h.mu.seen[pid] {
		if r <= c {
			delete(h.mu.seen[pid], r)
		}
	}
}

// waitingLocked returns the highest revision the frontier must reach to
// release what the hub knows of - the events it holds, the revisions a
// feed skipped to the event logs - and since when the oldest of that has
// waited; want is 0 if nothing waits.
func (h *Hub) waitingLocked() (want int64, since time.Time) {
	if len(h.mu.pending) > 0 {
		want, since = h.mu.maxPending, h.mu.pending[0].at
	}
	if h.mu.skipped > h.mu.frontier {
		if want == 0 || h.mu.skippedAt.Before(since) {
			since = h.mu.skippedAt
		}
		want = max(want, h.mu.skipped)
	}
	return want, since
}

// pokeLocked returns the revision to ask the partitions to close now (0:
// none; each revision is asked once here, then again by askAgain while it
// waits), and schedules askAgain.
func (h *Hub) pokeLocked() int64 {
	want, _ := h.waitingLocked()
	if want == 0 || h.mu.stopped {
		return 0
	}
	if !h.mu.asking {
		h.mu.asking = true
		time.AfterFunc(h.cfg.AskAgainAfter, h.askAgain)
	}
	if want <= h.mu.lastPoke {
		return 0
	}
	h.mu.lastPoke = want
	return want
}

// askToClose asks the partitions to close rev (if not 0) while the hub has
// watchers. Idle partitions hold the frontier back; their leaders close up
// to the current revision they know, and a forwarded request tells them
// this node's.
func (h *Hub) askToClose(rev int64, again bool) {
	if rev != 0 && h.view.Load().merging {
		if again {
			h.asksAgain.Inc()
		}
		h.src.RequestCloseSoon(rev, h.isPaused)
	}
}

// askAgain runs while something waits for the frontier (waitingLocked):
// once the oldest of it has waited AskAgainAfter, it asks the partitions
// to close again. A close request is asked once and can be lost - the
// leader it reached lost its leadership before closing, a forwarded
// request failed - and the partition's new leader closes nothing by itself
// when its node has no watcher; without asking again the frontier, and
// this node's watches, would stop for good.
func (h *Hub) askAgain() {
	h.mu.Lock()
	want, since := h.waitingLocked()
	if want == 0 || h.mu.stopped {
		h.mu.asking = false
		h.mu.Unlock()
		return
	}
	var poke int64
	wait := h.cfg.AskAgainAfter - time.Since(since)
	if wait <= 0 {
		poke = want
		h.mu.lastPoke = max(h.mu.lastPoke, poke)
		wait = h.cfg.AskAgainAfter
	}
	time.AfterFunc(wait, h.askAgain)
	h.mu.Unlock()
	h.askToClose(poke, true)
}

// Stop stops the hub asking partitions to close revisions; call it before
// the event source stops.
func (h *Hub) Stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.stopped = true
}

// advanceLocked moves the frontier to the lowest closed revision and
// releases the events it passed.
func (h *Hub) advanceLocked() {
	nf := h.minClosedLocked()
	if nf <= h.mu.frontier {
		return
	}
	for len(h.mu.pending) > 0 && h.mu.pending[0].rev <= nf {
		e := heap.Pop(&h.mu.pending).(*entry)
		h.mu.ring = append(h.mu.ring, e)
		h.mu.ringEvents += len(e.events)
		h.mu.ringBytes += e.size
	}
	h.mu.frontier = nf
	h.evictLocked()
	close(h.mu.changed)
	h.mu.changed = make(chan struct{})
}

// ResumeFrom returns where partition pid's feed subscription must
// (re)start: after the closed revision the hub holds for it, and not below
// the ring's start (events below it are read from the event logs).
func (h *Hub) ResumeFrom(pid uint64) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(h.mu.closed[pid]+1, h.mu.ringStart)
}

// Truncate tells the hub that partition pid's events below rev will never
// arrive - compacted away, or skipped by a feed resuming after idling:
// watchers below rev read the event logs, and the partition counts as
// closed below rev. Watchers read there only up to the frontier, so the
// other partitions are asked to close rev-1 as for a held event: a write
// applied just before the skip could otherwise wait for the next write
// of idle partitions.
func (h *Hub) Truncate(pid uint64, rev int64) {
	h.mu.Lock()
	h.mu.ringStart = max(h.mu.ringStart, rev)
	if rev-1 > h.mu.closed[pid] {
		h.mu.closed[pid] = rev - 1
	}
	h.advanceLocked()
	if rev-1 > h.mu.frontier {
		if h.mu.skipped <= h.mu.frontier {
			h.mu.skippedAt = time.Now()
		}
		h.mu.skipped = max(h.mu.skipped, rev-1)
	}
	poke := h.pokeLocked()
	h.mu.Unlock()
	h.askToClose(poke, false)
}

func (h *Hub) evictLocked() {
	n := 0
	for n < len(h.mu.ring)-1 && (h.mu.ringEvents > h.cfg.RingEvents || h.mu.ringBytes+int(h.cached.Load()) > h.cfg.RingBytes) {
		e := h.mu.ring[n]
		h.mu.ringEvents -= len(e.events)
		h.mu.ringBytes -= e.size
		h.cached.Add(-e.cached.Swap(-1))
		h.mu.ringStart = max(h.mu.ringStart, e.rev+1)
		h.mu.ring[n] = nil
		n++
	}
	if n > 0 {
		h.mu.ring = h.mu.ring[n:]
	}
}

// Frontier returns the revision up to which events are released, and a
// channel closed when it next advances.
func (h *Hub) Frontier() (int64, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.frontier, h.mu.changed
}

// entries returns the released entries with revisions in [from, to]. ok is
// false if some of them are no longer in the ring.
func (h *Hub) entries(from, to int64) (out []*entry, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if from < h.mu.ringStart {
		return nil, false
	}
	ring := h.mu.ring
	i := sort.Search(len(ring), func(i int) bool { return ring[i].rev >= from })
	for ; i < len(ring) && ring[i].rev <= to; i++ {
		out = append(out, ring[i])
	}
	return out, true
}

// encodedFor returns e's events matching s, encoded; nil if none match.
func (h *Hub) encodedFor(e *entry, s *shape) *encoded {
	any := false
	for _, ev := range e.events {
		if s.matches(ev) {
			any = true
			break
		}
	}
	if !any {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.enc1 != nil && e.shape1 == *s {
		return e.enc1
	}
	if enc, ok := e.enc[*s]; ok {
		return enc
	}
	evs, added := e.events, 0
	if s.prevKV && e.prevMissing {
		if e.withPrev == nil {
			e.withPrev = h.withPrevValues(e.events)
			for _, ev := range e.withPrev {
				if ev.PrevKv != nil {
					added += len(ev.PrevKv.Value)
				}
			}
		}
		evs = e.withPrev
	}
	enc := encodeEvents(evs, s)
	added += len(enc.b)
	h.countCached(e, int64(added))
	switch {
	case e.enc1 == nil:
		e.shape1, e.enc1 = *s, enc
	case e.enc == nil:
		e.enc = map[shape]*encoded{*s: enc}
	default:
		e.enc[*s] = enc
	}
	h.encodes.Inc()
	return enc
}

// countCached adds n bytes e cached to Hub.cached, unless e was evicted.
// An eviction between the entry's add and the hub's takes the n off
// first: the hub's count is briefly low, never left high.
func (h *Hub) countCached(e *entry, n int64) {
	for {
		c := e.cached.Load()
		if c < 0 {
			return
		}
		if e.cached.CompareAndSwap(c, c+n) {
			h.cached.Add(n)
			return
		}
	}
}

// withPrevValues returns copies of events with the values of their
// prev_kv filled in (published events are shared, never modified). A value
// that cannot be read (compacted away) leaves the event without a prev_kv.
func (h *Hub) withPrevValues(events []*mvccpb.Event) []*mvccpb.Event {
	out := make([]*mvccpb.Event, len(events))
	for i, ev := range events {
		out[i] = ev
		if ev.PrevKv == nil {
			continue
		}
		c := *ev
		if v, err := h.src.PrevValue(ev.PrevKv.Key, ev.PrevKv.ModRevision); err != nil {
			h.prevUnreadable.Inc()
			h.cfg.Logger.Warn("prev_kv value unreadable; the event goes without it", "key", string(ev.PrevKv.Key), "prev_rev", ev.PrevKv.ModRevision, "rev", ev.Kv.ModRevision, "err", err)
			c.PrevKv = nil
		} else {
			kv := *ev.PrevKv
			kv.Value = v
			c.PrevKv = &kv
		}
		out[i] = &c
	}
	return out
}

// eventsField is the WatchResponse.events field tag (11, length-delimited).
const eventsField = 11<<3 | 2

func encodeEvents(events []*mvccpb.Event, s *shape) *encoded {
	// Sized first, so that the encoding is one allocation of its exact
	// size (a revision's events are usually one, of a Kubernetes object).
	sel := make([]*mvccpb.Event, 0, len(events))
	sizes := make([]int, 0, len(events))
	size := 0
	var lenBuf [binary.MaxVarintLen64]byte
	for _, ev := range events {
		if !s.matches(ev) {
			continue
		}
		if !s.prevKV && ev.PrevKv != nil {
			c := *ev
			c.PrevKv = nil
			ev = &c
		}
		n := ev.Size()
		size += 1 + binary.PutUvarint(lenBuf[:], uint64(n)) + n
		sel = append(sel, ev)
		sizes = append(sizes, n)
	}
	enc := &encoded{}
	if len(sel) == 0 {
		return enc
	}
	enc.b = make([]byte, 0, size)
	enc.ends = make([]int, 0, len(sel))
	for i, ev := range sel {
		n := sizes[i]
		enc.b = append(enc.b, eventsField)
		enc.b = binary.AppendUvarint(enc.b, uint64(n))
		off := len(enc.b)
		enc.b = enc.b[:off+n]
		if _, err := ev.MarshalToSizedBuffer(enc.b[off:]); err != nil {
			panic(err)
		}
		enc.ends = append(enc.ends, len(enc.b))
	}
	return enc
}

type entryHeap []*entry

func (h entryHeap) Len() int           { return len(h) }
func (h entryHeap) Less(i, j int) bool { return h[i].rev < h[j].rev }
func (h entryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *entryHeap) Push(x any)        { *h = append(*h, x.(*entry)) }
func (h *entryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// SetSource sets the hub's event source; call once, before the partitions
// start applying.
func (h *Hub) SetSource(src EventSource) { h.src = src }
