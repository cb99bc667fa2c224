package etcdcompat

import (
	"bytes"
	"container/heap"
	"encoding/binary"
	"sort"
	"sync"
	"time"

	"github.com/brainkv/brain/internal/invariant"
	"github.com/brainkv/brain/partition"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// EventSource is what the hub needs from the store.
type EventSource interface {
	// RequestClose asks every partition to close revision rev.
	RequestClose(rev int64)
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
	// events; older events are read from the event logs. Defaults 100000
	// events and 256 MiB.
	RingEvents int
	RingBytes  int
	Registerer prometheus.Registerer
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
	cfg HubConfig
	src EventSource

	mu struct {
		sync.Mutex
		closed     map[uint64]int64 // per partition; protected by mu
		frontier   int64            // protected by mu
		pending    entryHeap        // rev > frontier; protected by mu
		maxPending int64            // protected by mu
		lastPoke   int64            // protected by mu
		ring       []*entry         // released, ascending; protected by mu
		ringStart  int64            // every released event >= ringStart is in ring
		ringEvents int
		ringBytes  int
		changed    chan struct{} // closed when frontier advances
	}

	lag      prometheus.Histogram
	watchers prometheus.Gauge
	catchups prometheus.Counter
	encodes  prometheus.Counter
	frames   prometheus.Counter
}

// entry is one revision's events.
type entry struct {
	rev    int64
	events []*mvccpb.Event
	at     time.Time
	size   int

	mu sync.Mutex
	// prevMissing: the events' PrevKv lack values, loaded the first time a
	// prev_kv shape is encoded. Protected by mu.
	prevMissing bool
	enc         map[shape]*encoded // protected by mu
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
	h := &Hub{cfg: cfg, src: src}
	h.mu.closed = make(map[uint64]int64)
	h.mu.changed = make(chan struct{})
	h.lag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "brain_watch_delivery_lag_seconds", Help: "Time from an event's apply to its first send to a watcher.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	})
	h.watchers = prometheus.NewGauge(prometheus.GaugeOpts{Name: "brain_watchers", Help: "Open watches."})
	h.catchups = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_storage_catchups_total", Help: "Reads of the event logs by watchers behind the in-memory ring."})
	h.encodes = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_event_encodes_total", Help: "Revisions encoded for a watch shape (once per revision and shape, shared by identical watches)."})
	h.frames = prometheus.NewCounter(prometheus.CounterOpts{Name: "brain_watch_responses_total", Help: "Watch responses sent."})
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(h.lag, h.watchers, h.catchups, h.encodes, h.frames)
	}
	return h
}

// AddPartition registers a partition and its closed revision. Call for
// every partition before any publishes.
func (h *Hub) AddPartition(id uint64, closed int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.closed[id] = closed
	h.mu.frontier = h.minClosedLocked()
	h.mu.ringStart = max(h.mu.ringStart, h.mu.frontier+1)
}

// SetHistoryStart tells the hub that every event with a revision >= rev
// will be published to it; events below rev may already be applied (for
// instance before a restart) and are read from the event logs. Call before
// the partitions start applying, with the TSO's recovered revision + 1.
func (h *Hub) SetHistoryStart(rev int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.ringStart = max(h.mu.ringStart, rev)
}

func (h *Hub) minClosedLocked() int64 {
	first := true
	var m int64
	for _, c := range h.mu.closed {
		if first || c < m {
			m, first = c, false
		}
	}
	return m
}

// Publish implements partition.Feed.
func (h *Hub) Publish(pid uint64, evs partition.RevEvents, closed int64) {
	h.mu.Lock()
	// An event at or below a revision every partition had closed means
	// the closed-revision promise is broken; watchers have moved past it.
	invariant.Check(evs.Rev == 0 || evs.Rev > h.mu.frontier,
		"partition %d published revision %d at or below the watch frontier %d", pid, evs.Rev, h.mu.frontier)
	if evs.Rev > h.mu.frontier {
		e := &entry{rev: evs.Rev, events: evs.Events, at: time.Now(), prevMissing: evs.PrevValuesMissing}
		for _, ev := range evs.Events {
			e.size += ev.Size()
		}
		heap.Push(&h.mu.pending, e)
		h.mu.maxPending = max(h.mu.maxPending, evs.Rev)
	}
	if closed > h.mu.closed[pid] {
		h.mu.closed[pid] = closed
	}
	if nf := h.minClosedLocked(); nf > h.mu.frontier {
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
	var poke int64
	if len(h.mu.pending) > 0 && h.mu.maxPending > h.mu.lastPoke {
		poke = h.mu.maxPending
		h.mu.lastPoke = poke
	}
	h.mu.Unlock()
	if poke != 0 {
		// Idle partitions hold the frontier back; ask them to close.
		h.src.RequestClose(max(poke, h.src.CurrentRevision()))
	}
}

func (h *Hub) evictLocked() {
	n := 0
	for n < len(h.mu.ring)-1 && (h.mu.ringEvents > h.cfg.RingEvents || h.mu.ringBytes > h.cfg.RingBytes) {
		e := h.mu.ring[n]
		h.mu.ringEvents -= len(e.events)
		h.mu.ringBytes -= e.size
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
	if enc, ok := e.enc[*s]; ok {
		return enc
	}
	if s.prevKV && e.prevMissing {
		h.loadPrevValues(e.events)
		e.prevMissing = false
	}
	enc := encodeEvents(e.events, s)
	if e.enc == nil {
		e.enc = make(map[shape]*encoded)
	}
	e.enc[*s] = enc
	h.encodes.Inc()
	return enc
}

// loadPrevValues fills in the values of events' prev_kv. A value that
// cannot be read (compacted away) leaves the event without a prev_kv.
func (h *Hub) loadPrevValues(events []*mvccpb.Event) {
	// Only PrevKv changes, under the entry's lock; matching reads the
	// other fields of the events without it.
	for _, ev := range events {
		if ev.PrevKv == nil {
			continue
		}
		if v, err := h.src.PrevValue(ev.PrevKv.Key, ev.PrevKv.ModRevision); err != nil {
			ev.PrevKv = nil
		} else {
			ev.PrevKv.Value = v
		}
	}
}

// eventsField is the WatchResponse.events field tag (11, length-delimited).
const eventsField = 11<<3 | 2

func encodeEvents(events []*mvccpb.Event, s *shape) *encoded {
	enc := &encoded{}
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
		enc.b = append(enc.b, eventsField)
		enc.b = binary.AppendUvarint(enc.b, uint64(n))
		off := len(enc.b)
		enc.b = append(enc.b, make([]byte, n)...)
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
