package etcdcompat

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Idle feeds.
//
// A node's hub exists for its watchers. Without any, the partitions' feeds
// into it (a stream from another node for each partition without a local
// replica, and the merge of every applied write) and the close requests
// it sends to keep its frontier moving are pure cost, and a cost every
// node pays for every write in the cluster: it would grow with the
// cluster size and cap write scaling. So a hub that has had no watcher for
// IdleFeedsAfter says its feeds are not wanted (Wanted), the feeders stop,
// and the hub stops poking partitions. When a watch is created again the
// feeders resume at each partition's current closed revision rather than
// replaying what they missed (Truncate: the hub treats the missed span as
// out of its ring, so a watcher that needs it reads the event logs, as
// one that fell behind the ring does).

// feedDemand tracks whether the hub's feeds are wanted.
type feedDemand struct {
	idleAfter time.Duration
	gauge     prometheus.Gauge // 1 while wanted

	mu       sync.Mutex
	watchers int           // protected by mu
	wanted   bool          // protected by mu
	changed  chan struct{} // closed when wanted changes; protected by mu
	timer    *time.Timer   // pending switch to unwanted; protected by mu
}

func newFeedDemand(idleAfter time.Duration) *feedDemand {
	// Feeds start wanted: a node's first watchers (kube-apiserver's) come
	// right after it starts, and catching up from startup is cheap.
	d := &feedDemand{idleAfter: idleAfter, wanted: true, changed: make(chan struct{})}
	d.gauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "brain_watch_feeds_wanted", Help: "1 while this node merges the partitions' events for its watchers; 0 after it had no watcher for --watch-feeds-idle-after."})
	d.gauge.Set(1)
	if idleAfter > 0 {
		// Under mu: a short idleAfter can fire before the assignment.
		d.mu.Lock()
		d.timer = time.AfterFunc(idleAfter, d.idle)
		d.mu.Unlock()
	}
	return d
}

// add changes the number of watchers by n.
func (d *feedDemand) add(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.watchers += n
	switch {
	case d.idleAfter <= 0:
	case d.watchers > 0:
		if d.timer != nil {
			d.timer.Stop()
			d.timer = nil
		}
		d.setLocked(true)
	case d.timer == nil:
		d.timer = time.AfterFunc(d.idleAfter, d.idle)
	}
}

func (d *feedDemand) idle() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.watchers == 0 {
		d.setLocked(false)
	}
	d.timer = nil
}

func (d *feedDemand) setLocked(wanted bool) {
	if d.wanted != wanted {
		d.wanted = wanted
		if wanted {
			d.gauge.Set(1)
		} else {
			d.gauge.Set(0)
		}
		close(d.changed)
		d.changed = make(chan struct{})
	}
}

func (d *feedDemand) get() (bool, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.wanted, d.changed
}

// Wanted reports whether the partitions' feeds into the hub should run,
// and returns a channel closed when that changes.
func (h *Hub) Wanted() (bool, <-chan struct{}) { return h.demand.get() }

// watchAdded and watchRemoved count open watches (metric and feed demand).
func (h *Hub) watchAdded() {
	h.watchers.Inc()
	h.demand.add(1)
}

func (h *Hub) watchRemoved(n int) {
	if n == 0 {
		return
	}
	h.watchers.Sub(float64(n))
	h.demand.add(-n)
}
