package engine

import (
	"bufio"
	"errors"
	"runtime"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Pebble writes an sstable through a 4 KiB bufio.Writer, and its blocks are
// about 4 KiB, so each block of a flush or a compaction is one write system
// call. On a node short of CPU those calls are a cost every write pays
// again at every level its data is rewritten: at one node a create that
// cost one read and one write call before the first flush cost about two of
// each once flushes and compactions ran (bench/scaling.sh, 32000 warm-up
// puts). bufferedFS gathers an sstable's writes into sstWriteBuffer-sized
// calls. Only sstables: the WAL and the MANIFEST are written in records
// that are synced at once, so a buffer would only add a copy.

// Flushes and compactions run on Pebble's own goroutines and write every
// file they make block by block; between two blocks they compute, and on a
// node with a CPU share below one processor (GOMAXPROCS 1) Go's scheduler
// lets such a goroutine run a whole time slice (10 ms) each turn, which at
// 0.1 CPU is a whole CFS period's quota. A 64 MiB memtable's flush at
// 0.1 CPU took 1.7-5.2 s, during which the node's raft groups, gRPC
// handlers and TSO got their turns only between those slices: in a 6-node
// benchmark round the cluster's create rate over the seconds in which the
// TSO leader's node flushed was 406/s, against 1077/s with no node
// flushing. So every write of an sstable or blob file block yields
// (runtime.Gosched) first: the storage work goes on once the goroutines
// that were waiting have had their turn, as background work should.

// sstWriteBuffer is how much of an sstable is gathered per write call.
const sstWriteBuffer = 256 << 10

// bufferedFS is a vfs.FS whose new sstables buffer their writes, and whose
// new WAL files preallocate as they grow (walFile).
type bufferedFS struct{ vfs.FS }

// Unwrap implements vfs.FS (vfs.Root).
func (fs bufferedFS) Unwrap() vfs.FS { return fs.FS }

// Create implements vfs.FS.
func (fs bufferedFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err == nil && strings.HasSuffix(name, ".log") {
		return &walFile{File: f}, nil // walprealloc.go
	}
	if err == nil && strings.HasSuffix(name, ".blob") {
		return yieldingFile{f}, nil
	}
	if err != nil || !strings.HasSuffix(name, ".sst") {
		return f, err
	}
	return &bufferedFile{File: f, w: bufio.NewWriterSize(f, sstWriteBuffer)}, nil
}

// yieldingFile is a blob file: it yields before each write, as
// bufferedFile does.
type yieldingFile struct{ vfs.File }

// Write implements io.Writer.
func (f yieldingFile) Write(p []byte) (int, error) {
	runtime.Gosched()
	return f.File.Write(p)
}

// bufferedFile holds written bytes until the buffer is full or anything
// else is asked of the file: every method that could observe the file's
// contents or size, or make them durable, writes the buffer out first, so
// to its users the file behaves as if every Write had gone through. A
// failed write sticks (bufio.Writer): Pebble abandons such a file.
type bufferedFile struct {
	vfs.File
	w *bufio.Writer
}

// Write implements io.Writer.
func (f *bufferedFile) Write(p []byte) (int, error) {
	runtime.Gosched()
	return f.w.Write(p)
}

// Close implements io.Closer.
func (f *bufferedFile) Close() error {
	err := f.w.Flush()
	return errors.Join(err, f.File.Close())
}

// Sync implements vfs.File.
func (f *bufferedFile) Sync() error {
	if err := f.w.Flush(); err != nil {
		return err
	}
	return f.File.Sync()
}

// SyncData implements vfs.File.
func (f *bufferedFile) SyncData() error {
	if err := f.w.Flush(); err != nil {
		return err
	}
	return f.File.SyncData()
}

// SyncTo implements vfs.File.
func (f *bufferedFile) SyncTo(length int64) (bool, error) {
	if err := f.w.Flush(); err != nil {
		return false, err
	}
	return f.File.SyncTo(length)
}

// Stat implements vfs.File.
func (f *bufferedFile) Stat() (vfs.FileInfo, error) {
	if err := f.w.Flush(); err != nil {
		return nil, err
	}
	return f.File.Stat()
}

// Read implements io.Reader.
func (f *bufferedFile) Read(p []byte) (int, error) {
	if err := f.w.Flush(); err != nil {
		return 0, err
	}
	return f.File.Read(p)
}

// ReadAt implements io.ReaderAt.
func (f *bufferedFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.w.Flush(); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

// WriteAt implements io.WriterAt.
func (f *bufferedFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.w.Flush(); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}
