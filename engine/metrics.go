package engine

import (
	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// metricsCollector exports a Pebble's state at each scrape (one
// db.Metrics() call per scrape).
type metricsCollector struct {
	db                                                   *pebble.DB
	disk, readAmp, l0Sublevels, l0Files, debt, memtables *prometheus.Desc
	compactions, flushes                                 *prometheus.Desc
}

// NewMetricsCollector returns a collector of db's storage metrics:
// brain_pebble_disk_usage_bytes, _read_amplification, _l0_sublevels,
// _l0_files, _compaction_debt_bytes, _memtable_bytes, _compactions_total
// and _flushes_total. A growing L0 or compaction debt means writes outrun
// compactions (Pebble then slows writes down).
func NewMetricsCollector(db *pebble.DB) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("brain_pebble_"+name, help, nil, nil)
	}
	return &metricsCollector{
		db:          db,
		disk:        d("disk_usage_bytes", "Bytes the store uses on disk (sstables, WAL, manifests)."),
		readAmp:     d("read_amplification", "Sorted runs a point read may have to consult."),
		l0Sublevels: d("l0_sublevels", "Sublevels in L0 (write stalls past the stop threshold)."),
		l0Files:     d("l0_files", "Sstables in L0."),
		debt:        d("compaction_debt_bytes", "Estimated bytes compactions must rewrite to reach a stable LSM."),
		memtables:   d("memtable_bytes", "Bytes allocated by memtables."),
		compactions: d("compactions_total", "Compactions since the store opened."),
		flushes:     d("flushes_total", "Memtable flushes since the store opened."),
	}
}

func (c *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.disk, c.readAmp, c.l0Sublevels, c.l0Files, c.debt, c.memtables, c.compactions, c.flushes} {
		ch <- d
	}
}

func (c *metricsCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.db.Metrics()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	g(c.disk, float64(m.DiskSpaceUsage()))
	g(c.readAmp, float64(m.ReadAmp()))
	g(c.l0Sublevels, float64(m.Levels[0].Sublevels))
	g(c.l0Files, float64(m.Levels[0].TablesCount))
	g(c.debt, float64(m.Compact.EstimatedDebt))
	g(c.memtables, float64(m.MemTable.Size))
	ch <- prometheus.MustNewConstMetric(c.compactions, prometheus.CounterValue, float64(m.Compact.Count))
	ch <- prometheus.MustNewConstMetric(c.flushes, prometheus.CounterValue, float64(m.Flush.Count))
}
