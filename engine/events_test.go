package engine

import (
	"bytes"
	"log/slog"
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
	for round := 0; round < 2; round++ {
		for i := 0; i < 100; i++ {
			if err := db.Set([]byte{'k', byte(round), byte(i)}, bytes.Repeat([]byte{'v'}, 100), pebble.NoSync); err != nil {
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
	if strings.Contains(out, "level=DEBUG") {
		t.Errorf("debug lines at info:\n%s", out)
	}
}
