package etcdcompat

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// hubCollector exports, at scrape time, where the hub's watch frontier is
// and what holds it: the frontier, the events waiting for it and, per
// partition, the closed revision the hub has from the partition's feed. A
// watch that stalls shows here as one partition's closed revision stuck
// below the held events.
type hubCollector struct {
	h        *Hub
	frontier *prometheus.Desc
	held     *prometheus.Desc
	oldest   *prometheus.Desc
	closed   *prometheus.Desc
}

func newHubCollector(h *Hub) *hubCollector {
	return &hubCollector{
		h:        h,
		frontier: prometheus.NewDesc("brain_watch_frontier_revision", "Revision up to which this node's watch hub has released events: every partition has closed it.", nil, nil),
		held:     prometheus.NewDesc("brain_watch_held_revisions", "Revisions with events this node's watch hub holds until every partition closes them.", nil, nil),
		oldest:   prometheus.NewDesc("brain_watch_oldest_held_seconds", "How long the oldest of what waits for the watch frontier (a held event, or revisions a feed skipped to the event logs) has waited (0 if nothing waits).", nil, nil),
		closed:   prometheus.NewDesc("brain_watch_partition_closed_revision", "Closed revision of each partition as this node's watch hub has it from the partition's feed; the lowest of the partitions it merges (brain_watch_feeds_paused) is the frontier.", []string{"partition"}, nil),
	}
}

func (c *hubCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.frontier
	ch <- c.held
	ch <- c.oldest
	ch <- c.closed
}

func (c *hubCollector) Collect(ch chan<- prometheus.Metric) {
	h := c.h
	h.mu.Lock()
	frontier, held := h.mu.frontier, len(h.mu.pending)
	var oldest float64
	if want, since := h.waitingLocked(); want != 0 {
		oldest = time.Since(since).Seconds()
	}
	closed := make(map[uint64]int64, len(h.mu.closed))
	for pid, rev := range h.mu.closed {
		closed[pid] = rev
	}
	h.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.frontier, prometheus.GaugeValue, float64(frontier))
	ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(held))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, oldest)
	for pid, rev := range closed {
		ch <- prometheus.MustNewConstMetric(c.closed, prometheus.GaugeValue, float64(rev), strconv.FormatUint(pid, 10))
	}
}
