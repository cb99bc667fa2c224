package engine

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestOpenOnFullDiskFailsFast reopens a store whose write-ahead log holds
// unflushed writes (a crash) on a disk that takes no more data: Pebble's
// Open flushes the replayed log and retries that flush for ever, so the
// node hung, logging every attempt. Open must instead fail within seconds
// with ErrNoSpace, log the failure a bounded number of times, and leave
// the directory's files as they were (the failed flush's outputs
// removed, none created by retries); with space again the store opens
// with every write.
func TestOpenOnFullDiskFailsFast(t *testing.T) {
	mem := vfs.NewMem()
	db, err := Open(Config{Dir: "db", FS: mem, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	rnd := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 500; i++ {
		v := make([]byte, 2000)
		for j := range v {
			v[j] = byte(rnd.Uint32())
		}
		if err := db.Set([]byte(fmt.Sprintf("%c/k%04d", MVCCPrefix, i)), v, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	// Close does not flush: the next Open replays the log.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	list := func(fs vfs.FS) []string {
		names, err := fs.List("db")
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		return names
	}
	before := list(mem)

	// A full disk: files can be created, but writes to sstables and blob
	// files fail with ENOSPC (as on a real file system).
	var full atomic.Bool
	full.Store(true)
	var failed atomic.Int64
	fullFS := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if full.Load() && (op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileWriteAt) &&
			(strings.HasSuffix(op.Path, ".sst") || strings.HasSuffix(op.Path, ".blob")) {
			failed.Add(1)
			return fmt.Errorf("injected: %w", syscall.ENOSPC)
		}
		return nil
	}))
	var logged syncBuffer
	log := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelInfo}))
	start := time.Now()
	_, err = Open(Config{Dir: "db", FS: fullFS, Logger: log})
	took := time.Since(start)
	if !errors.Is(err, ErrNoSpace) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Open on a full disk: %v, want ErrNoSpace wrapping ENOSPC", err)
	}
	t.Logf("Open failed after %v: %v", took, err)
	if took > 10*time.Second {
		t.Errorf("Open on a full disk took %v to fail", took)
	}
	if failed.Load() == 0 {
		t.Fatal("no write failed: the test did not exercise a full disk")
	}
	// Let a retry that would spin run for a moment, then compare.
	time.Sleep(200 * time.Millisecond)
	if n := strings.Count(logged.String(), "level=ERROR") + strings.Count(logged.String(), "level=WARN"); n > 4 {
		t.Errorf("the failed open logged %d warnings and errors:\n%s", n, logged.String())
	}
	if after := list(mem); !slices.Equal(before, after) {
		t.Errorf("a failed open changed the directory:\nbefore %v\nafter  %v", before, after)
	}

	// The failed Open's Pebble still holds the store (the process would
	// exit); a copy opens once the disk has room, with every write.
	full.Store(false)
	cp := vfs.NewMem()
	if _, err := vfs.Clone(mem, cp, "db", "db"); err != nil {
		t.Fatal(err)
	}
	if err := cp.Remove("db/LOCK"); err != nil {
		t.Fatal(err)
	}
	db, err = Open(Config{Dir: "db", FS: cp, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("Open with room again: %v", err)
	}
	defer db.Close()
	for _, i := range []int{0, 499} {
		if _, closer, err := db.Get([]byte(fmt.Sprintf("%c/k%04d", MVCCPrefix, i))); err != nil {
			t.Fatalf("key %d after reopening: %v", i, err)
		} else {
			closer.Close()
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
