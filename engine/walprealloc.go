package engine

import "github.com/cockroachdb/pebble/v2/vfs"

// Pebble preallocates each new WAL file in one block of 110% of the
// memtable size (DB.walPreallocateSize: 70 MiB with brain's 64 MiB
// memtables) at its first write. But a new node's memtables start at 256
// KiB and double up to that size, each with a WAL file of its own, so a
// node that has taken its first 64 MiB of writes preallocated about nine
// such blocks for a few MiB of log. Where the data directory is a tmpfs
// (the scaling benchmark's containers) fallocate allocates and zeroes
// every page at once: in a profile of a fresh 6-node cluster under load
// it was 22 µs of node CPU per create (6 at 3 nodes, whose nodes are
// further along the doubling), and creates cost 1.2-1.9x more node CPU
// at 6 nodes than at 3 with it against 1.3x without (bench/scaling.sh,
// 2026-11-28). On disk file systems fallocate reserves blocks without
// writing them, which is what Pebble wants: a WAL sync that need not
// allocate.
//
// walFile keeps that, in proportion to what is written: it ignores
// Pebble's block request and preallocates walPreallocChunk at a time,
// ahead of the writes.

// walPreallocChunk is how far ahead of its writes a WAL file is
// preallocated.
const walPreallocChunk = 1 << 20

type walFile struct {
	vfs.File
	off int64 // bytes written through Write; preallocated up to off rounded up to a chunk
}

// Preallocate implements vfs.File: Pebble's request is dropped, as Write
// preallocates.
func (f *walFile) Preallocate(offset, length int64) error { return nil }

// Write implements io.Writer, first preallocating the chunks it reaches.
func (f *walFile) Write(p []byte) (int, error) {
	if have, end := chunkEnd(f.off), f.off+int64(len(p)); end > have {
		// Best effort, as Pebble's own: a file system that cannot
		// preallocate still takes the write.
		_ = f.File.Preallocate(have, chunkEnd(end)-have)
	}
	n, err := f.File.Write(p)
	f.off += int64(n)
	return n, err
}

// chunkEnd rounds off up to a multiple of walPreallocChunk.
func chunkEnd(off int64) int64 {
	return (off + walPreallocChunk - 1) / walPreallocChunk * walPreallocChunk
}
