package engine

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
)

// TestValueSeparation writes large user values, large raft log values and
// small user values, flushes, compacts and reopens the store. Only the large
// user values may go to blob files (counted by the collector); every value
// must read back as written after each step.
func TestValueSeparation(t *testing.T) {
	const n, large, small = 500, 1024, 100
	rng := rand.New(rand.NewPCG(3, 4))
	random := func(size int) []byte {
		v := make([]byte, size)
		for i := range v {
			v[i] = byte(rng.Uint32())
		}
		return v
	}
	want := map[string][]byte{}
	for i := 0; i < n; i++ {
		user := append([]byte{MVCCPrefix}, AppendKey(nil, []byte(fmt.Sprintf("/registry/pods/p%04d", i)))...)
		want[string(user)] = random(large)
		want[string(append([]byte{EventPrefix}, user[1:]...))] = random(small)
		want[string(append([]byte{RaftPrefix}, fmt.Sprintf("log%04d", i)...))] = random(large)
	}

	fs := vfs.NewMem()
	db, err := Open(Config{Dir: "db", FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	b := db.NewBatch()
	for k, v := range want {
		if err := b.Set([]byte(k), v, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	check := func(db *pebble.DB, step string) {
		t.Helper()
		for k, v := range want {
			got, closer, err := db.Get([]byte(k))
			if err != nil {
				t.Fatalf("%s: get %q: %v", step, k, err)
			}
			if !bytes.Equal(got, v) {
				t.Fatalf("%s: %q reads back %d bytes that differ from the %d written", step, k, len(got), len(v))
			}
			closer.Close()
		}
	}
	check(db, "in the memtable")
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewMetricsCollector(db))
	got := scrape(t, reg)
	// The large user values are separated: all of their bytes are in blob
	// files (random, so incompressible). The raft log's are not: with them
	// the blob files would hold twice as much.
	if blob := got["brain_pebble_blob_flushed_bytes_total"]; blob < n*large || blob > 1.5*n*large {
		t.Errorf("blob_flushed_bytes_total = %v, want the %d bytes of large user values (and not the raft log's)", blob, n*large)
	}
	if got["brain_pebble_blob_files"] < 1 {
		t.Errorf("blob_files = %v, want >= 1", got["brain_pebble_blob_files"])
	}
	if tables := got["brain_pebble_flushed_bytes_total"]; tables < n*large {
		t.Errorf("flushed_bytes_total = %v: the raft log's %d bytes of values are not in the sstables", tables, n*large)
	}
	check(db, "after a flush")
	if err := db.Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
		t.Fatal(err)
	}
	check(db, "after a compaction")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = Open(Config{Dir: "db", FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	check(db, "after reopening")
}

// TestValueSeparationOff: with a negative minimum, nothing goes to blob
// files.
func TestValueSeparationOff(t *testing.T) {
	db, err := Open(Config{Dir: "db", FS: vfs.NewMem(), ValueSeparationMinBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	v := bytes.Repeat([]byte{7}, 4096)
	for i := 0; i < 100; i++ {
		k := append([]byte{MVCCPrefix}, AppendKey(nil, []byte(fmt.Sprintf("k%d", i)))...)
		if err := db.Set(k, v, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if m := db.Metrics(); m.BlobFiles.LiveCount != 0 || m.Levels[0].BlobBytesFlushed != 0 {
		t.Errorf("%d blob files, %d bytes flushed to them; want none", m.BlobFiles.LiveCount, m.Levels[0].BlobBytesFlushed)
	}
}
