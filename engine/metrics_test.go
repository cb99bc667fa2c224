package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestMetricsCountFlushAndCompactionWork writes, flushes and compacts a
// store and checks that the collector's counters moved by what happened:
// bytes flushed, one default compaction (or more) that wrote bytes, and a
// compaction count by kind that sums to Pebble's total.
func TestMetricsCountFlushAndCompactionWork(t *testing.T) {
	db, err := Open(Config{Dir: "db", FS: vfs.NewMem(), MemTableBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewMetricsCollector(db))

	// Random values, so that compression cannot shrink the 200 KB a flush
	// writes below the check's bound.
	rng := rand.New(rand.NewPCG(1, 2))
	val := make([]byte, 100)
	for round := 0; round < 3; round++ {
		for i := 0; i < 2000; i++ {
			for j := range val {
				val[j] = byte(rng.Uint32())
			}
			if err := db.Set([]byte(fmt.Sprintf("k%06d", i)), val, pebble.NoSync); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Compact(context.Background(), []byte("k"), []byte("l"), true); err != nil {
		t.Fatal(err)
	}

	got := scrape(t, reg)
	if got["brain_pebble_flushes_total"] < 3 {
		t.Errorf("flushes_total = %v, want >= 3", got["brain_pebble_flushes_total"])
	}
	if got["brain_pebble_flushed_bytes_total"] < 3*2000*100/2 {
		t.Errorf("flushed_bytes_total = %v, too small for 3 flushes of 200 KB", got["brain_pebble_flushed_bytes_total"])
	}
	if got[`brain_pebble_compactions_total{kind="default"}`] < 1 {
		t.Errorf("no default compaction counted: %v", got)
	}
	if got["brain_pebble_compacted_bytes_total"] <= 0 || got["brain_pebble_compaction_read_bytes_total"] <= 0 {
		t.Errorf("compacted_bytes_total = %v, compaction_read_bytes_total = %v; want both > 0",
			got["brain_pebble_compacted_bytes_total"], got["brain_pebble_compaction_read_bytes_total"])
	}
	var sum float64
	for k, v := range got {
		if strings.HasPrefix(k, "brain_pebble_compactions_total{") {
			sum += v
		}
	}
	if want := float64(db.Metrics().Compact.Count); sum != want {
		t.Errorf("compactions by kind sum to %v, Pebble counted %v", sum, want)
	}
}

// scrape returns every sample of reg as "name" or `name{label="value"}`.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += fmt.Sprintf(`{%s=%q}`, l.GetName(), l.GetValue())
			}
			out[name] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}
