package engine

import (
	"bufio"
	"errors"
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
	if err != nil || !strings.HasSuffix(name, ".sst") {
		return f, err
	}
	return &bufferedFile{File: f, w: bufio.NewWriterSize(f, sstWriteBuffer)}, nil
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
func (f *bufferedFile) Write(p []byte) (int, error) { return f.w.Write(p) }

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
