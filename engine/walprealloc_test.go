package engine

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// preallocFS records, for each WAL file it creates, how far the file was
// preallocated and how many bytes were written to it.
type preallocFS struct {
	vfs.FS
	mu       sync.Mutex
	prealloc map[string]int64 // the end of the furthest range preallocated
	written  map[string]int64
}

func (fs *preallocFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return &preallocFile{File: f, fs: fs, name: name}, nil
}

type preallocFile struct {
	vfs.File
	fs   *preallocFS
	name string
}

func (f *preallocFile) Preallocate(offset, length int64) error {
	f.fs.mu.Lock()
	f.fs.prealloc[f.name] = max(f.fs.prealloc[f.name], offset+length)
	f.fs.mu.Unlock()
	return f.File.Preallocate(offset, length)
}

func (f *preallocFile) Write(p []byte) (int, error) {
	n, err := f.File.Write(p)
	f.fs.mu.Lock()
	f.fs.written[f.name] += int64(n)
	f.fs.mu.Unlock()
	return n, err
}

// TestEngineWALPreallocatesAsItGrows: a WAL file is preallocated as far
// as it is written, and at most walPreallocChunk further, not Pebble's 110%
// of the memtable size (70 MiB here) at its first write.
func TestEngineWALPreallocatesAsItGrows(t *testing.T) {
	// On disk: Pebble does not preallocate files without a descriptor
	// (vfs.NewMem's).
	fs := &preallocFS{FS: vfs.Default, prealloc: map[string]int64{}, written: map[string]int64{}}
	db, err := Open(Config{Dir: t.TempDir(), FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	value := make([]byte, 1024)
	for i := 0; i < 3000; i++ { // about 3 MiB of log: several chunks
		if err := db.Set([]byte(fmt.Sprintf("key-%08d", i)), value, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.LogData(nil, pebble.Sync); err != nil { // every record written
		t.Fatal(err)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if len(fs.written) == 0 {
		t.Fatal("no WAL file was written")
	}
	var total int64
	for name, w := range fs.written {
		total += w
		p := fs.prealloc[name]
		if p < w || p > w+walPreallocChunk {
			t.Errorf("WAL %s: %d bytes written, preallocated to %d; want between %d and %d", name, w, p, w, w+walPreallocChunk)
		}
	}
	if total < 3<<20 {
		t.Fatalf("only %d bytes of WAL written", total)
	}
	t.Logf("%d WAL files, %d bytes written, preallocated to %v", len(fs.written), total, fs.prealloc)
}
