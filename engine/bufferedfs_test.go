package engine

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// countingFS counts the Write calls and bytes that reach the files it
// creates, by file kind (the name's extension).
type countingFS struct {
	vfs.FS
	mu     sync.Mutex
	writes map[string]int
	bytes  map[string]int
}

func newCountingFS(fs vfs.FS) *countingFS {
	return &countingFS{FS: fs, writes: map[string]int{}, bytes: map[string]int{}}
}

func kind(name string) string {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		return name[i:]
	}
	return ""
}

func (fs *countingFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil {
		return nil, err
	}
	return &countingFile{File: f, fs: fs, kind: kind(name)}, nil
}

func (fs *countingFS) counts(kind string) (writes, bytes int) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.writes[kind], fs.bytes[kind]
}

type countingFile struct {
	vfs.File
	fs   *countingFS
	kind string
}

func (f *countingFile) Write(p []byte) (int, error) {
	f.fs.mu.Lock()
	f.fs.writes[f.kind]++
	f.fs.bytes[f.kind] += len(p)
	f.fs.mu.Unlock()
	return f.File.Write(p)
}

func readAll(t *testing.T, fs vfs.FS, name string) []byte {
	t.Helper()
	f, err := fs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBufferedFSGathersSSTableWrites(t *testing.T) {
	mem := newCountingFS(vfs.NewMem())
	fs := bufferedFS{mem}
	f, err := fs.Create("000001.sst", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var want []byte
	for i := 0; i < 1000; i++ {
		block := make([]byte, 3000+rng.IntN(2000))
		for j := range block {
			block[j] = byte(rng.Uint32())
		}
		want = append(want, block...)
		if _, err := f.Write(block); err != nil {
			t.Fatal(err)
		}
	}
	// Whatever is asked of the file sees every byte written so far.
	if st, err := f.Stat(); err != nil || st.Size() != int64(len(want)) {
		t.Fatalf("Stat: size %v, err %v; want %d", st, err, len(want))
	}
	// A write larger than the buffer goes straight through. (vfs.File's
	// Write may change the slice it is given, and does in race builds:
	// want takes its copy first.)
	big := bytes.Repeat([]byte{7}, 2*sstWriteBuffer)
	want = append(append(want, "tail"...), big...)
	if _, err := f.Write([]byte("tail")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(big); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, mem, "000001.sst"); !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Fatalf("after Sync the file holds %d bytes, not the %d written (first difference at %d)", len(got), len(want), i)
	}
	for _, sync := range []func() error{f.SyncData, func() error { _, err := f.SyncTo(int64(len(want))); return err }} {
		if _, err := f.Write([]byte("more")); err != nil {
			t.Fatal(err)
		}
		want = append(want, "more"...)
		if err := sync(); err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, mem, "000001.sst"); !bytes.Equal(got, want) {
			t.Fatalf("after SyncData or SyncTo the file holds %d bytes, not the %d written", len(got), len(want))
		}
	}
	if _, err := f.Write([]byte("after sync")); err != nil {
		t.Fatal(err)
	}
	want = append(want, "after sync"...)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, mem, "000001.sst"); !bytes.Equal(got, want) {
		t.Fatalf("after Close the file holds %d bytes, not the %d written", len(got), len(want))
	}
	writes, n := mem.counts(".sst")
	if n != len(want) {
		t.Fatalf("%d bytes reached the file, want %d", n, len(want))
	}
	// 1002 writes of ~4 KiB: a write per 256 KiB, plus the flushes Stat,
	// Sync, SyncData and SyncTo forced and the large write that went straight
	// through.
	if max := len(want)/sstWriteBuffer + 7; writes > max {
		t.Fatalf("%d writes reached the sstable, want at most %d", writes, max)
	}

	// Other files are written through as they are.
	w, err := fs.Create("000002.log", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if _, err := w.Write([]byte("record")); err != nil {
			t.Fatal(err)
		}
	}
	if writes, _ := mem.counts(".log"); writes != 10 {
		t.Fatalf("%d writes reached the log, want 10 (unbuffered)", writes)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestEngineSSTableWritesAreGathered flushes and compacts a store through
// Open's filesystem and reads every key back after reopening it: the
// sstables are whole, and were written in large calls.
func TestEngineSSTableWritesAreGathered(t *testing.T) {
	mem := newCountingFS(vfs.NewMem())
	cfg := Config{Dir: "db", FS: mem, MemTableBytes: 4 << 20}
	db, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const keys = 6000
	value := func(i int) []byte { // 1 KiB that does not compress
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		v := make([]byte, 1024)
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		return v
	}
	for i := 0; i < keys; i++ {
		if err := db.Set([]byte(fmt.Sprintf("key-%08d", i)), value(i), pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Compact(context.Background(), []byte("key-"), []byte("key-~"), true); err != nil {
		t.Fatal(err)
	}
	writes, n := mem.counts(".sst")
	// Unbuffered, Pebble writes an sstable in ~4 KiB calls (n/4096 of
	// them); gathered, in 256 KiB ones plus a few per file.
	if n == 0 || writes > n/(64<<10)+20 {
		t.Fatalf("%d writes carried %d bytes of sstables, want at most %d", writes, n, n/(64<<10)+20)
	}
	t.Logf("%d writes carried %d bytes of sstables", writes, n)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i := 0; i < keys; i++ {
		v, closer, err := db.Get([]byte(fmt.Sprintf("key-%08d", i)))
		if err != nil {
			t.Fatalf("key %d after reopening: %v", i, err)
		}
		if !bytes.Equal(v, value(i)) {
			t.Fatalf("key %d after reopening: wrong value", i)
		}
		closer.Close()
	}
}

// TestStorageWritesYield checks that each block Pebble writes to an
// sstable or a blob file lets the goroutines waiting to run go first: on
// one processor, a goroutine that counts its turns gets one per write.
// Without the yield it gets a turn only when Go preempts the writer
// (every 10 ms), none over these few milliseconds of writes.
func TestStorageWritesYield(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	fs := bufferedFS{vfs.NewMem()}
	block := bytes.Repeat([]byte{'b'}, 4<<10)
	for _, name := range []string{"000001.sst", "000002.blob"} {
		f, err := fs.Create(name, vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		var turns atomic.Int64
		var stop atomic.Bool
		done := make(chan struct{})
		go func() {
			defer close(done)
			for !stop.Load() {
				turns.Add(1)
				runtime.Gosched()
			}
		}()
		const writes = 1000
		for range writes {
			if _, err := f.Write(block); err != nil {
				t.Fatal(err)
			}
		}
		stop.Store(true)
		<-done
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if n := turns.Load(); n < writes/2 {
			t.Errorf("%s: a waiting goroutine got %d turns during %d block writes, want one per write", name, n, writes)
		}
	}
}
