package engine

import (
	"bytes"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestFlushesLoggedAtInfo checks a store whose logger is at info logs each
// memtable flush with its size and duration (a stall of the node's raft
// groups can then be lined up with them), and nothing of Pebble's at debug.
func TestFlushesLoggedAtInfo(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	db, err := Open(Config{Dir: "db", FS: vfs.NewMem(), MemTableBytes: 1 << 20, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rnd := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 2; round++ {
		for i := 0; i < 100; i++ {
			// Raft-log-like keys stay in the sstables; user data this
			// large goes to blob files.
			if err := db.Set([]byte{'k', byte(round), byte(i)}, bytes.Repeat([]byte{'v'}, 100), pebble.NoSync); err != nil {
				t.Fatal(err)
			}
			v := make([]byte, 1000)
			for j := range v {
				v[j] = byte(rnd.Uint32())
			}
			if err := db.Set([]byte{MVCCPrefix, byte(round), byte(i)}, v, pebble.NoSync); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	out := buf.String()
	if n := strings.Count(out, `msg="memtables flushed"`); n != 2 {
		t.Fatalf("%d flush lines for 2 flushes; the log:\n%s", n, out)
	}
	for _, want := range []string{"in_bytes=", "out_bytes=", "took=", "component=pebble"} {
		if !strings.Contains(out, want) {
			t.Errorf("flush line without %s:\n%s", want, out)
		}
	}
	// Each flush wrote 100 random 1000-byte values to a blob file, and the
	// rest to an sstable.
	sizes := regexp.MustCompile(`out_bytes=(\d+) blob_bytes=(\d+)`).FindAllStringSubmatch(out, -1)
	if len(sizes) != 2 {
		t.Fatalf("%d flush lines with out_bytes and blob_bytes, want 2:\n%s", len(sizes), out)
	}
	for _, m := range sizes {
		total, _ := strconv.Atoi(m[1])
		blob, _ := strconv.Atoi(m[2])
		if blob < 100*1000 || total <= blob {
			t.Errorf("a flush line says out_bytes=%d blob_bytes=%d; want its blob files (at least 100000 bytes) and its sstables counted", total, blob)
		}
	}
	if strings.Contains(out, "level=DEBUG") {
		t.Errorf("debug lines at info:\n%s", out)
	}
}
