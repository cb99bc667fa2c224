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
	compactedBytes, compactionReadBytes                  *prometheus.Desc
	flushedBytes, ingestedBytes                          *prometheus.Desc
	blobFlushedBytes, blobCompactedBytes, blobFiles      *prometheus.Desc
}

// NewMetricsCollector returns a collector of db's storage metrics:
// brain_pebble_disk_usage_bytes, _read_amplification, _l0_sublevels,
// _l0_files, _compaction_debt_bytes, _memtable_bytes, _flushes_total,
// _compactions_total by kind, and the bytes that compactions wrote and
// read, that flushes wrote and that ingestions (replica snapshots) added,
// and the blob files' (separated values, separation.go): the live ones and
// the bytes flushes and compactions wrote to them. A
// growing L0 or compaction debt means writes outrun compactions (Pebble then
// slows writes down); compacted bytes per flushed byte is the engine's write
// amplification.
func NewMetricsCollector(db *pebble.DB) prometheus.Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("brain_pebble_"+name, help, labels, nil)
	}
	return &metricsCollector{
		db:                  db,
		disk:                d("disk_usage_bytes", "Bytes the store uses on disk (sstables, WAL, manifests)."),
		readAmp:             d("read_amplification", "Sorted runs a point read may have to consult."),
		l0Sublevels:         d("l0_sublevels", "Sublevels in L0 (write stalls past the stop threshold)."),
		l0Files:             d("l0_files", "Sstables in L0."),
		debt:                d("compaction_debt_bytes", "Estimated bytes compactions must rewrite to reach a stable LSM."),
		memtables:           d("memtable_bytes", "Bytes allocated by memtables."),
		compactions:         d("compactions_total", "Compactions since the store opened, by kind (Pebble's compaction types; move and delete_only rewrite no data).", "kind"),
		flushes:             d("flushes_total", "Memtable flushes since the store opened."),
		compactedBytes:      d("compacted_bytes_total", "Sstable bytes written by compactions since the store opened."),
		compactionReadBytes: d("compaction_read_bytes_total", "Sstable bytes read by compactions since the store opened."),
		flushedBytes:        d("flushed_bytes_total", "Sstable bytes written by memtable flushes since the store opened."),
		ingestedBytes:       d("ingested_bytes_total", "Sstable bytes ingested (replica snapshots) since the store opened."),
		blobFlushedBytes:    d("blob_flushed_bytes_total", "Bytes of separated values that memtable flushes wrote to blob files since the store opened."),
		blobCompactedBytes:  d("blob_compacted_bytes_total", "Bytes of separated values that compactions rewrote into new blob files since the store opened."),
		blobFiles:           d("blob_files", "Live blob files (separated values)."),
	}
}

func (c *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.disk, c.readAmp, c.l0Sublevels, c.l0Files, c.debt, c.memtables,
		c.compactions, c.flushes, c.compactedBytes, c.compactionReadBytes, c.flushedBytes, c.ingestedBytes,
		c.blobFlushedBytes, c.blobCompactedBytes, c.blobFiles} {
		ch <- d
	}
}

func (c *metricsCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.db.Metrics()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	n := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	g(c.disk, float64(m.DiskSpaceUsage()))
	g(c.readAmp, float64(m.ReadAmp()))
	g(c.l0Sublevels, float64(m.Levels[0].Sublevels))
	g(c.l0Files, float64(m.Levels[0].TablesCount))
	g(c.debt, float64(m.Compact.EstimatedDebt))
	g(c.memtables, float64(m.MemTable.Size))
	for _, k := range []struct {
		kind  string
		count int64
	}{
		{"default", m.Compact.DefaultCount},
		{"delete_only", m.Compact.DeleteOnlyCount},
		{"elision_only", m.Compact.ElisionOnlyCount},
		{"copy", m.Compact.CopyCount},
		{"move", m.Compact.MoveCount},
		{"read", m.Compact.ReadCount},
		{"tombstone_density", m.Compact.TombstoneDensityCount},
		{"rewrite", m.Compact.RewriteCount},
		{"multi_level", m.Compact.MultiLevelCount},
		{"blob_rewrite", m.Compact.BlobFileRewriteCount},
		{"counter_level", m.Compact.CounterLevelCount},
	} {
		n(c.compactions, float64(k.count), k.kind)
	}
	n(c.flushes, float64(m.Flush.Count))
	var compacted, read, flushed, ingested, blobFlushed, blobCompacted uint64
	for _, l := range m.Levels {
		compacted += l.TableBytesCompacted
		read += l.TableBytesRead
		flushed += l.TableBytesFlushed
		ingested += l.TableBytesIngested
		blobFlushed += l.BlobBytesFlushed
		blobCompacted += l.BlobBytesCompacted
	}
	n(c.compactedBytes, float64(compacted))
	n(c.compactionReadBytes, float64(read))
	n(c.flushedBytes, float64(flushed))
	n(c.ingestedBytes, float64(ingested))
	n(c.blobFlushedBytes, float64(blobFlushed))
	n(c.blobCompactedBytes, float64(blobCompacted))
	g(c.blobFiles, float64(m.BlobFiles.LiveCount))
}
