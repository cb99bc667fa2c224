package server

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// ballastName is the emergency ballast file in the data directory.
const ballastName = "EMERGENCY_BALLAST"

// A node keeps an emergency ballast: a preallocated file in its data
// directory that it deletes by itself at a start on a full disk, as
// CockroachDB does. brain is fail-stop on storage errors: when the disk
// fills, the node stops at its next failed write, with up to a memtable's
// worth of writes (64 MiB) in its write-ahead log. Opening the store
// replays that log and must flush it, which needs as much free space
// again: without the ballast, an operator who freed a little space (say
// 16 MiB) found that the node still could not start. With it, the start
// finds the space the flush needs; the operator must still free space
// before the disk fills again (the log says so), and the next start with
// room enough sets the ballast up again.
//
// BallastAuto as Config.EmergencyBallastBytes sizes the ballast by the
// disk (ballastSize).
const BallastAuto = -1

// ballastSize is the ballast's size for a disk of total bytes: 1% of the
// disk, at least memtable bytes (a memtable's flush), at most 256 MiB
// (the most a stopped node's log holds: 4 memtables) and 5% of the disk.
func ballastSize(total, memtable uint64) int64 {
	size := max(total/100, memtable)
	size = min(size, 256<<20, total/20)
	return int64(size)
}

// manageBallast keeps the ballast of size bytes (BallastAuto: ballastSize;
// 0: none) in dir: it removes it when the disk has less than size bytes
// free (the node is starting on a full disk), and creates it when the disk
// has at least twice size free. It reports what it did; failures are
// logged, never fatal (the ballast is a safety margin, not a requirement).
func manageBallast(fs vfs.FS, dir string, size int64, memtable uint64, log *slog.Logger) string {
	path := fs.PathJoin(dir, ballastName)
	du, err := fs.GetDiskUsage(dir)
	if err != nil {
		// An in-memory file system (tests) has no disk.
		log.Debug("could not read the data directory's disk usage; the emergency ballast is left as it is", "err", err)
		return "unknown"
	}
	switch size {
	case BallastAuto:
		size = ballastSize(du.TotalBytes, memtable)
	case 0:
		size = -1
	}
	var have int64
	if st, err := fs.Stat(path); err == nil {
		have = st.Size()
	} else if !errors.Is(err, os.ErrNotExist) {
		log.Warn("could not read the emergency ballast", "path", path, "err", err)
		return "unknown"
	}
	switch {
	case size < 0 && have > 0:
		if err := fs.Remove(path); err != nil {
			log.Warn("could not remove the emergency ballast", "path", path, "err", err)
			return "unknown"
		}
		return "removed (disabled)"
	case size < 0:
		return "none"
	case have > 0 && du.AvailBytes < uint64(size):
		if err := fs.Remove(path); err != nil {
			log.Error("the disk is full and the emergency ballast could not be removed", "path", path, "err", err)
			return "unknown"
		}
		log.Warn("the data directory's disk is nearly full: removed the emergency ballast so that the node can start; free space on it, or the node stops again when it fills",
			"path", path, "ballast_bytes", have, "free_bytes_before", du.AvailBytes)
		return fmt.Sprintf("removed (%d MiB freed)", have>>20)
	case have >= size:
		return "kept"
	case du.AvailBytes < 2*uint64(size-have):
		return "none (too little free space to set it up)"
	}
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err == nil {
		err = fillBallast(f, size)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		_ = fs.Remove(path)
		log.Warn("could not set up the emergency ballast", "path", path, "bytes", size, "err", err)
		return "none (failed)"
	}
	return fmt.Sprintf("set up (%d MiB)", size>>20)
}

// fillBallast makes f size bytes long with every block allocated:
// preallocated (Pebble's Preallocate keeps the file's size, so its last
// byte is written), or, where the file system cannot preallocate, written
// with zeros.
func fillBallast(f vfs.File, size int64) error {
	if f.Preallocate(0, size) == nil {
		_, err := f.WriteAt([]byte{0}, size-1)
		return err
	}
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(zeros)) {
		n := min(int64(len(zeros)), size-off)
		if _, err := f.Write(zeros[:n]); err != nil {
			return err
		}
	}
	return nil
}
